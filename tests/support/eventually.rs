//! Polling assertions: "this becomes true within T", without fixed sleeps.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Calls `check` every `poll` until it returns `Ok`, and returns that value; panics with the
/// last error when `timeout` passes first. An attempt still running at the deadline is cut
/// off, so a hanging check cannot stretch the timeout.
pub async fn eventually<T, E, F, Fut>(timeout: Duration, poll: Duration, check: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    match try_eventually(timeout, poll, check).await {
        Ok(v) => v,
        Err(e) => panic!("not within {timeout:?}: {e}"),
    }
}

/// Like [`eventually`], but returns the last error instead of panicking.
pub async fn try_eventually<T, E, F, Fut>(
    timeout: Duration,
    poll: Duration,
    mut check: F,
) -> Result<T, String>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("never checked");
    loop {
        match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => return Err(format!("{last} (last attempt cut off at the deadline)")),
        }
        if Instant::now() + poll > deadline {
            return Err(last);
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_success() {
        let mut n = 0;
        let v = eventually(Duration::from_secs(5), Duration::from_millis(10), || {
            n += 1;
            let n = n;
            async move {
                if n >= 3 {
                    Ok(n)
                } else {
                    Err(format!("n = {n}"))
                }
            }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn reports_the_last_error() {
        let err = try_eventually(
            Duration::from_millis(200),
            Duration::from_millis(20),
            || async { Err::<(), _>("still no") },
        )
        .await
        .unwrap_err();
        assert_eq!(err, "still no");
    }
}
