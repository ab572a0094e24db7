//! Waiting on an optional deadline, for the `select!` loops that have a timer only
//! sometimes (a debounce, a drain, a retry).

use tokio::time::Instant;

/// Sleeps until `deadline`, or forever when there is none (a `select!` branch that never
/// fires).
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
