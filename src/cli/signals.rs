//! The long-running commands' signals: SIGINT and SIGTERM as cancellation tokens. Must not know:
//! what a component does when it is cancelled.

use tokio_util::sync::CancellationToken;

/// Cancels the token on the first SIGINT or SIGTERM.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal received; shutting down");
        t.cancel();
    });
    token
}

/// `htfaas ep`'s signals: the first SIGTERM cancels the first token (drain: finish running
/// jobs, take no new one); SIGINT, or a second SIGTERM, cancels the second (stop now).
pub fn on_ep_signals() -> (CancellationToken, CancellationToken) {
    let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
    let (d, s) = (drain.clone(), stop.clone());
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                None
            }
        };
        let mut int = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::error!("cannot listen for SIGINT: {e}");
                None
            }
        };
        loop {
            tokio::select! {
                Some(()) = async { term.as_mut()?.recv().await } => {
                    if d.is_cancelled() {
                        tracing::info!("second SIGTERM: stopping now");
                        break;
                    }
                    tracing::info!("SIGTERM: draining (SIGINT or another SIGTERM stops now)");
                    d.cancel();
                }
                Some(()) = async { int.as_mut()?.recv().await } => {
                    tracing::info!("SIGINT: stopping now");
                    break;
                }
                else => return,
            }
        }
        s.cancel();
    });
    (drain, stop)
}
