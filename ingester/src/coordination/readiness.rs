//! Readiness: the ingester is ready once every required component has done its initial
//! sync (the local cluster, the config kinds, the multicluster secrets; the file source's
//! first scan), and each remote cluster has synced or had its time (`--remote-cluster-
//! timeout`). Once ready it stays ready: a cluster added later, or a watch that restarts,
//! does not flap readiness.

use crate::coordination::lease::Leadership;
use crate::coordination::metrics::CoordinationMetrics;
use shoal_common::bus::{Bucket, StateBus};
use shoal_common::keys;
use shoal_common::synced::{self, SyncedBody};
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
    metrics: CoordinationMetrics,
}

impl Readiness {
    /// No components yet: register the required ones before serving `/ready`.
    pub fn new(metrics: CoordinationMetrics) -> Readiness {
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

/// Once the ingester is ready and leads its fleet, writes the fleet's sync marker
/// (`synced.<fleet>` in `shoal-meta`, see [`shoal_common::synced`]) unless it is there
/// already: servers started with `--expect-fleets` wait for it before they serve. Returns
/// once the marker is on the bus.
pub async fn announce_synced(
    bus: Arc<dyn StateBus>,
    fleet: String,
    readiness: Readiness,
    leadership: Leadership,
) {
    let key = keys::synced_key(&fleet);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(epoch) = leadership.current().filter(|_| readiness.is_ready()) else {
            continue;
        };
        match bus.get(Bucket::Meta, &key).await {
            Ok(Some(entry))
                if synced::decode(&entry.value).is_ok_and(|e| e.body.fleet == fleet) =>
            {
                tracing::debug!(%fleet, "fleet sync marker already on the bus");
                return;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, %fleet, "cannot read the fleet sync marker; retrying");
                continue;
            }
        }
        let body = SyncedBody {
            fleet: fleet.clone(),
            since_ms: shoal_common::envelope::now_ms(),
        };
        let value = match synced::encode(epoch, &body) {
            Ok(v) => v,
            Err(error) => {
                tracing::error!(%error, "cannot encode the fleet sync marker");
                return;
            }
        };
        match bus.put(Bucket::Meta, &key, value.into()).await {
            Ok(_) => {
                tracing::info!(%fleet, "fleet synced: marker written for the servers");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, %fleet, "cannot write the fleet sync marker; retrying")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Registry;

    #[tokio::test(start_paused = true)]
    async fn ready_when_required_synced_and_remote_synced_or_timed_out() {
        let r = Readiness::new(CoordinationMetrics::register(&Registry::new()));
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
        let r = Readiness::new(CoordinationMetrics::register(&Registry::new()));
        r.require("a");
        r.require("b");
        r.synced("a");
        assert!(!r.is_ready());
        r.forget("b");
        assert!(r.is_ready());
    }

    #[tokio::test]
    async fn the_sync_marker_is_written_once_ready() {
        let bus: Arc<dyn StateBus> = Arc::new(shoal_common::MemoryBus::new());
        let r = Readiness::new(CoordinationMetrics::register(&Registry::new()));
        r.require("a");
        let task = tokio::spawn(announce_synced(
            bus.clone(),
            "east".into(),
            r.clone(),
            Leadership::always(),
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let key = keys::synced_key("east");
        assert!(
            bus.get(Bucket::Meta, &key).await.unwrap().is_none(),
            "not ready yet"
        );
        r.synced("a");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("written")
            .expect("task");
        let entry = bus.get(Bucket::Meta, &key).await.unwrap().expect("marker");
        assert_eq!(synced::decode(&entry.value).unwrap().body.fleet, "east");
    }
}
