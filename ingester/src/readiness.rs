//! Readiness: the ingester is ready once every required component has done its initial
//! sync (the local cluster, the config kinds, the multicluster secrets; the file source's
//! first scan), and each remote cluster has synced or had its time (`--remote-cluster-
//! timeout`). Once ready it stays ready: a cluster added later, or a watch that restarts,
//! does not flap readiness.

use crate::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Component {
    synced: bool,
    /// After this the component no longer holds back readiness.
    deadline: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    components: BTreeMap<String, Component>,
    ready: bool,
}

/// Shared readiness state. Cheap to clone.
#[derive(Clone)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
    metrics: Metrics,
}

impl Readiness {
    /// No components yet: register the required ones before serving `/ready`.
    pub fn new(metrics: Metrics) -> Readiness {
        Readiness {
            state: Arc::default(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A component that must sync before the ingester is ready.
    pub fn require(&self, name: &str) {
        self.register(name, None);
    }

    /// A component that holds back readiness until it syncs or `timeout` passes.
    pub fn require_within(&self, name: &str, timeout: Duration) {
        self.register(name, Some(Instant::now() + timeout));
    }

    fn register(&self, name: &str, deadline: Option<Instant>) {
        let component = Component {
            synced: false,
            deadline,
        };
        self.lock()
            .components
            .entry(name.to_string())
            .or_insert(component);
    }

    /// Marks a component synced.
    pub fn synced(&self, name: &str) {
        if let Some(c) = self.lock().components.get_mut(name) {
            c.synced = true;
        }
        self.is_ready();
    }

    /// Drops a component (a remote cluster that was removed).
    pub fn forget(&self, name: &str) {
        self.lock().components.remove(name);
    }

    /// Whether the ingester is ready (evaluating deadlines now).
    pub fn is_ready(&self) -> bool {
        let mut state = self.lock();
        if !state.ready {
            let now = Instant::now();
            state.ready = state
                .components
                .values()
                .all(|c| c.synced || c.deadline.is_some_and(|d| now >= d));
            if state.ready {
                tracing::info!("ready");
            }
        }
        self.metrics.ready.set(i64::from(state.ready));
        state.ready
    }

    /// The components still holding back readiness, for the `/ready` body.
    pub fn waiting_for(&self) -> Vec<String> {
        let now = Instant::now();
        self.lock()
            .components
            .iter()
            .filter(|(_, c)| !c.synced && c.deadline.is_none_or(|d| now < d))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ready_when_required_synced_and_remote_synced_or_timed_out() {
        let r = Readiness::new(Metrics::new());
        r.require("cluster Kubernetes");
        r.require("config");
        r.require_within("cluster remote", Duration::from_secs(30));
        assert!(!r.is_ready());
        r.synced("cluster Kubernetes");
        r.synced("config");
        assert!(!r.is_ready());
        assert_eq!(r.waiting_for(), vec!["cluster remote"]);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(r.is_ready());
        assert!(r.metrics.render().contains("shoal_ingester_ready 1"));
        // Latched: a new component does not make it unready.
        r.require("cluster late");
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn forgotten_component_no_longer_blocks() {
        let r = Readiness::new(Metrics::new());
        r.require("a");
        r.require("b");
        r.synced("a");
        assert!(!r.is_ready());
        r.forget("b");
        assert!(r.is_ready());
    }
}
