//! Attach-token renewal over a session: an EP that renews is told when to ask; asked too early
//! it is refused (and the refusal is counted as a bad frame); asked in time it gets a token
//! of the same credential with a later expiry, which attaches, keeps its session past the first
//! token's expiry, and is revoked with it.

use super::*;
use htfaas_functions::time::now_ms;

/// The claims of a token, read without checking (the test checks what the scheduler signed by
/// attaching with it).
fn claims_of(token: &str) -> AttachClaims {
    let payload = token.split('.').nth(1).expect("payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64");
    serde_json::from_slice(&bytes).expect("claims")
}

fn renewing_hello(name: &str) -> EpMsg {
    match hello_msg(name, 2, None) {
        EpMsg::Hello(h) => EpMsg::Hello(Hello { renews_attach: true, ..h }),
        _ => unreachable!("hello_msg makes a hello"),
    }
}

async fn next_msg(ws: &mut Ws) -> SchedulerMsg {
    serde_json::from_str(&next_text(ws).await).expect("SchedulerMsg")
}

#[tokio::test]
async fn a_renewed_attach_token_is_the_same_credential_with_a_later_expiry_and_revoked_with_it() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let (token, first) = fx.attach_token_with_claims(6);
    let mut ep = server.attach(Some(&token)).await.expect("attach");
    send(&mut ep, &renewing_hello("ep-1")).await;
    let lease = match next_msg(&mut ep).await {
        SchedulerMsg::Welcome { attach: Some(lease), .. } => lease,
        other => panic!("expected a welcome with a lease, got {other:?}"),
    };
    assert!(lease.expires_in_ms <= 6000, "{lease:?}");
    let renew_in = lease.renew_in_ms.expect("the scheduler renews");
    assert!(renew_in < lease.expires_in_ms, "{lease:?}");

    // Too early: refused, and the token stays as it is.
    send(&mut ep, &EpMsg::RenewAttach).await;
    match next_msg(&mut ep).await {
        SchedulerMsg::AttachRenewRefused { reason } => assert!(reason.contains("asked too early"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // In time: a new token of the same credential, living as long again.
    tokio::time::sleep(Duration::from_millis(renew_in)).await;
    send(&mut ep, &EpMsg::RenewAttach).await;
    let (renewed, lease) = match next_msg(&mut ep).await {
        SchedulerMsg::AttachRenewed { token, lease } => (token, lease),
        other => panic!("expected a renewed token, got {other:?}"),
    };
    let claims = claims_of(&renewed);
    assert_eq!(
        (&claims.jti, &claims.sub, &claims.owner, &claims.annex),
        (&first.jti, &first.sub, &first.owner, &first.annex)
    );
    assert!(claims.exp > first.exp, "later: {} after {}", claims.exp, first.exp);
    assert_eq!(claims.exp - claims.iat, first.exp - first.iat, "as long as the first");
    assert!(lease.renew_in_ms.is_some(), "and renewed again in its turn: {lease:?}");

    // The session outlives the first token: past its expiry it is still attached.
    let first_exp_ms = first.exp * 1000;
    while now_ms() <= first_exp_ms + 500 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, eps) = server.get("/v1/eps", Some(ADMIN)).await;
    assert!(eps.to_string().contains("ep-1"), "still attached: {eps}");
    // The renewed token attaches (the first one would too, within the verifier's leeway).
    let mut again = server.attach(Some(&renewed)).await.expect("attach with the renewed token");
    hello(&mut again, "ep-2", 1).await;

    // Revoking the credential revokes the renewed token: both sessions close, it attaches no more.
    server.revoke(RevocationTarget::Jti(first.jti.clone()), "leaked").await;
    assert_eq!(expect_close(&mut ep).await, (4403, "attach token revoked: leaked".to_owned()));
    assert_eq!(expect_close(&mut again).await, (4403, "attach token revoked: leaked".to_owned()));
    assert_attach_refused_with(&server, Some(&renewed), 403, "attach token revoked: leaked", "renewed, revoked").await;
    server.stop().await;
}

#[tokio::test]
async fn an_ep_asking_again_and_again_for_a_new_attach_token_is_closed() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let mut ep = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    send(&mut ep, &renewing_hello("ep-1")).await;
    assert!(matches!(next_msg(&mut ep).await, SchedulerMsg::Welcome { .. }));
    // Each early ask is refused and counted; past the bad-frame limit the session closes.
    for _ in 0..=htfaas_scheduler::ep_link::MAX_BAD_FRAMES {
        send(&mut ep, &EpMsg::RenewAttach).await;
    }
    loop {
        match tokio::time::timeout(WAIT, ep.next()).await.expect("an answer in time") {
            Some(Ok(Message::Text(t))) => {
                let msg: SchedulerMsg = serde_json::from_str(t.as_str()).expect("SchedulerMsg");
                assert!(matches!(msg, SchedulerMsg::AttachRenewRefused { .. }), "{msg:?}");
            }
            Some(Ok(Message::Close(Some(f)))) => {
                assert_eq!(f.reason.as_str(), "too many bad frames");
                break;
            }
            other => panic!("expected refusals then a close, got {other:?}"),
        }
    }
    server.stop().await;
}
