//! What both binaries do the same way as processes: wait for the signal that stops them,
//! and print the error that ended them.

/// Resolves on SIGTERM (how Kubernetes stops a pod) or ctrl-c, naming the signal.
pub async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            },
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only ctrl-c stops the process");
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "ctrl-c"
    }
}

/// An error and its causes on one line. Messages often embed their cause already, so each
/// cause is added only when the message so far does not contain it.
pub fn error_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message = format!("{message}: {cause_text}");
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner: {0}")]
    struct Inner(String);

    #[test]
    fn each_cause_is_printed_once() {
        let error = Outer(Inner("disk full".into()));
        assert_eq!(error_message(&error), "outer: inner: disk full");
        #[derive(Debug, thiserror::Error)]
        #[error("cannot start: {0}")]
        struct Embeds(#[source] Inner);
        let error = Embeds(Inner("x".into()));
        assert_eq!(error_message(&error), "cannot start: inner: x");
    }
}
