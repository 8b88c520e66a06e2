//! The dead-letter list's tenancy: another owner's developer neither lists, shows,
//! re-drives nor drops an entry (404, as for an entry that does not exist: ids reveal nothing),
//! and nothing of the entry changes; its owner's developer may.

use crate::dlq::refused_entry;
use htfaas_functions::token::Scope;
use htfaas_tests::start_stack;

/// A developer token of `sub`.
fn api_token(dir: &std::path::Path, sub: &str) -> String {
    super::api_token(dir, sub, Scope::Developer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_cannot_see_redrive_or_drop_anothers_dead_letters() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    let entry = refused_entry(&admin, "m.dat").await;
    let mallory = admin.clone().with_token(api_token(dir.path(), "mallory"));
    assert!(mallory.dead_letters(None, None, true).await.expect("mallory's list").is_empty());
    let unknown = entry.id + 1000;
    for id in [entry.id, unknown] {
        for e in [
            mallory.dead_letter(id).await.map(|_| ()),
            mallory.redrive(id, Some(1)).await.map(|_| ()),
            mallory.drop_dead_letter(id, "mine now").await.map(|_| ()),
        ] {
            let e = format!("{:#}", e.expect_err("refused"));
            assert!(e.contains("404") && e.contains(&format!("dead-letter entry {id} not found")), "{e}");
        }
    }
    let after = admin.dead_letter(entry.id).await.expect("show");
    assert!(after.redrives.is_empty() && after.dropped.is_none(), "{after:?}");
    // Its owner sees it (and only hers).
    let carol = admin.clone().with_token(api_token(dir.path(), "carol"));
    let hers = carol.dead_letters(None, None, false).await.expect("carol's list");
    assert_eq!(hers.iter().map(|e| e.id).collect::<Vec<_>>(), [entry.id]);
    assert_eq!(carol.dead_letter(entry.id).await.expect("show").id, entry.id);
    stack.stop().await.expect("stop");
}
