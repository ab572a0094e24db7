//! Values built from files and rebuilt when the files' contents change, without a
//! restart: the TLS port's certificate ([`crate::security::tls`]) and the workload CA
//! ([`crate::security::ca`]).
//!
//! The files are read every [`INTERVAL`]; when their contents differ from the last read,
//! the value is rebuilt and used from then on. A set that does not build (a certificate
//! written before its key, a bad file) is logged, counted with `result="error"`, and the
//! previous value stays in use until the files change again. Kubernetes Secret volumes
//! update all files at once (an atomic symlink swap), so a mounted Secret never shows a
//! half-written set.

use prometheus::IntCounterVec;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often the files are checked for changes.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The current value, shared with its reloader.
pub struct Reloading<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Reloading<T> {
    fn clone(&self) -> Self {
        Reloading(self.0.clone())
    }
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Starts with `value`.
    pub fn new(value: T) -> Self {
        Reloading(Arc::new(RwLock::new(Arc::new(value))))
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value (for values renewed by their owner rather than from files).
    pub fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }

    /// Rebuilds the value with `build` whenever the contents of `paths` change, forever.
    /// `results` counts each build by `result` (`ok`, also for the first, and `error`).
    pub async fn follow<E: std::fmt::Display>(
        self,
        what: &'static str,
        paths: Vec<PathBuf>,
        build: impl Fn() -> Result<T, E>,
        results: IntCounterVec,
    ) {
        let mut seen = fingerprint(&paths);
        results.with_label_values(&["ok"]).inc();
        loop {
            tokio::time::sleep(INTERVAL).await;
            let now = fingerprint(&paths);
            if now == seen {
                continue;
            }
            seen = now;
            match build() {
                Ok(value) => {
                    self.set(value);
                    results.with_label_values(&["ok"]).inc();
                    tracing::info!(what, "reloaded from its changed files");
                }
                Err(error) => {
                    results.with_label_values(&["error"]).inc();
                    tracing::error!(what, %error, "files changed but cannot be used; still using the previous ones");
                }
            }
        }
    }
}

/// A fingerprint of the files' contents (a missing file counts as empty).
fn fingerprint(paths: &[PathBuf]) -> [u8; 32] {
    let mut h = Sha256::new();
    for path in paths {
        let content = std::fs::read(path).unwrap_or_default();
        h.update((content.len() as u64).to_be_bytes());
        h.update(content);
    }
    h.finalize().into()
}
