//! A stop the user asked for (SIGINT, SIGTERM), for commands that wind down themselves: the
//! request stays set, so a command that looks after the signal arrived still sees it.

use std::sync::OnceLock;

use tokio::sync::watch;

fn channel() -> &'static watch::Sender<Option<&'static str>> {
    static STOP: OnceLock<watch::Sender<Option<&'static str>>> = OnceLock::new();
    STOP.get_or_init(|| watch::channel(None).0)
}

/// Records that `signal` asked this process to stop.
pub fn request(signal: &'static str) {
    channel().send_replace(Some(signal));
}

/// Resolves with the signal once a stop is requested (at once if one was already).
pub async fn requested() -> &'static str {
    let mut receiver = channel().subscribe();
    let asked = receiver
        .wait_for(Option::is_some)
        .await
        .map(|signal| signal.unwrap_or("a signal"));
    // The sender is static: it is never dropped.
    asked.unwrap_or("a signal")
}
