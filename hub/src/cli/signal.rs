//! SIGTERM/SIGINT handling of the long-running commands (`kleym hub`, `kleym spoke`): both
//! stop the same way, by cancelling their shutdown token.

use kleym_spoke::reconciler::CancellationToken;

/// Cancels `shutdown` on the first SIGTERM or SIGINT (Ctrl-C), logging it. Must run inside
/// a Tokio runtime.
pub fn cancel_on_signal(shutdown: CancellationToken) {
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received, shutting down");
        shutdown.cancel();
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            // No SIGTERM handler could be installed: Ctrl-C still stops the process.
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
