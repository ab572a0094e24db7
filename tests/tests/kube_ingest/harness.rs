//! Harness of the `kube_ingest` tests: the ingester as a process, a recorder of every bus
//! operation, and cluster fixtures.

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::bus::{Bucket, Op, StateBus, WatchEvent};
use shoal_common::Envelope;
use shoal_tests::eventually;
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::ports::free_addr;
use shoal_tests::process::Process;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::Command;
use tokio::task::JoinHandle;

pub const TIMEOUT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(50);

// ----- the ingester process -------------------------------------------------------------

/// A running `shoal-ingester --source kube` whose config cluster is given by a kubeconfig.
pub struct Ingester {
    process: Process,
    admin: SocketAddr,
}

impl Ingester {
    pub fn start(nats: &str, kubeconfig: &str, extra: &[&str]) -> Ingester {
        let dir = tempfile::tempdir().expect("ingester temp dir");
        let kubeconfig_path = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig).expect("writing the kubeconfig");
        Ingester::start_with_env(nats, Some(&kubeconfig_path), extra, dir)
    }

    pub fn start_with_env(
        nats: &str,
        kubeconfig: Option<&Path>,
        extra: &[&str],
        dir: tempfile::TempDir,
    ) -> Ingester {
        let admin = free_addr();
        let mut cmd = Command::new(shoal_tests::shoal::binary("shoal-ingester"));
        cmd.args(["--source", "kube", "--nats-url", nats])
            .args(["--admin-addr", &admin.to_string()])
            .args(extra)
            // Never fall back to a service account when the tests run in a pod.
            .env_remove("KUBERNETES_SERVICE_HOST")
            // Restarts here are kill -9 and the restarted process is another instance: it
            // waits for the lease to expire. A short lease keeps that wait short (a
            // `--lease-ttl` in `extra` wins).
            .env("SHOAL_LEASE_TTL", "3s")
            .env("RUST_BACKTRACE", "1")
            .env("NO_COLOR", "1");
        if let Some(path) = kubeconfig {
            cmd.env("KUBECONFIG", path);
        }
        if std::env::var_os("SHOAL_LOG").is_none() {
            cmd.env("SHOAL_LOG", "info,shoal_ingester=debug,async_nats=warn");
        }
        let process = Process::spawn(
            &format!("shoal-ingester-{}", admin.port()),
            cmd,
            dir,
            "run `cargo build --workspace --bins` first",
        );
        Ingester { process, admin }
    }

    /// Waits until `/ready` answers 200.
    pub async fn wait_ready(&mut self) {
        let admin = self.admin;
        let process = &mut self.process;
        let result = shoal_tests::eventually::try_eventually(TIMEOUT, POLL, || {
            let exited = process.exited();
            async move {
                if let Some(status) = exited {
                    return Ok(Err(format!("exited with {status}")));
                }
                match shoal_tests::http::get(admin, "/ready").await {
                    Ok(r) if r.status == 200 => Ok(Ok(())),
                    Ok(r) => Err(format!("/ready: {} {}", r.status, r.text())),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
        .and_then(|r| r);
        if let Err(e) = result {
            panic!("ingester not ready: {e}\n{}", self.process.log_tail());
        }
    }

    /// Waits until this ingester leads its fleet (`shoal_ingester_leader 1`).
    pub async fn wait_leader(&mut self) {
        let admin = self.admin;
        let result = shoal_tests::eventually::try_eventually(TIMEOUT, POLL, || async move {
            match shoal_tests::http::get(admin, "/metrics").await {
                Ok(r) if r.text().contains("\nshoal_ingester_leader 1") => Ok(()),
                Ok(_) => Err("not leading".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        if let Err(e) = result {
            panic!("ingester not leading: {e}\n{}", self.process.log_tail());
        }
    }

    /// Whether this ingester leads its fleet now, by its metrics.
    pub async fn leads(&self) -> bool {
        self.metrics().await.contains("\nshoal_ingester_leader 1")
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await
    }

    /// The body of an admin path.
    pub async fn get(&self, path: &str) -> String {
        let r = shoal_tests::http::get(self.admin, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        r.text()
    }

    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Freezes the process (SIGSTOP), as a stalled VM or a long GC pause would.
    pub async fn pause(&self) {
        self.process.pause().await;
    }

    /// Lets a paused process run again (SIGCONT).
    pub async fn resume(&self) {
        self.process.resume().await;
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Stops the ingester with SIGTERM and waits for it to exit.
    pub async fn terminate(&mut self) {
        let exited = self.process.terminate(Duration::from_secs(10)).await;
        assert!(
            exited,
            "no exit within 10 s of SIGTERM\n{}",
            self.process.log_tail()
        );
    }
}

// ----- the bus, as seen by a watcher ----------------------------------------------------

#[derive(Debug, Clone)]
pub struct Recorded {
    pub bucket: Bucket,
    pub key: String,
    pub op: Op,
    pub value: Bytes,
}

/// Every entry of every bucket, in arrival order per bucket: first the initial values,
/// then each live change.
pub struct BusRecorder {
    events: Arc<Mutex<Vec<Recorded>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl BusRecorder {
    pub async fn start(url: &str) -> BusRecorder {
        let bus = NatsBus::connect(&NatsOptions::new(url)).await.expect("bus");
        let events: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let mut tasks = Vec::new();
        let mut initial = Vec::new();
        for bucket in Bucket::ALL {
            let mut watch = bus.watch(bucket).await.expect("bus watch");
            let events = events.clone();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            initial.push(done_rx);
            tasks.push(tokio::spawn(async move {
                let mut done = Some(done_tx);
                while let Some(item) = watch.next().await {
                    match item.expect("bus watch item") {
                        WatchEvent::InitialDone => {
                            if let Some(done) = done.take() {
                                let _ = done.send(());
                            }
                        }
                        WatchEvent::Entry(e) => events.lock().unwrap().push(Recorded {
                            bucket,
                            key: e.key,
                            op: e.op,
                            value: e.value,
                        }),
                    }
                }
            }));
        }
        for done in initial {
            done.await.expect("initial values of a bucket");
        }
        BusRecorder { events, tasks }
    }

    /// A position in the event log.
    pub fn mark(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    /// The events after a mark.
    pub fn since(&self, mark: usize) -> Vec<Recorded> {
        self.events.lock().unwrap()[mark..].to_vec()
    }

    /// The current value of every key of a bucket.
    pub fn state(&self, bucket: Bucket) -> BTreeMap<String, Bytes> {
        let mut state = BTreeMap::new();
        for e in self
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.bucket == bucket)
        {
            match e.op {
                Op::Put => state.insert(e.key.clone(), e.value.clone()),
                Op::Delete => state.remove(&e.key),
            };
        }
        state
    }

    /// The Namespace label entries of `shoal-config` are left out ([`Self::namespace_keys`]):
    /// the tests that read config keys are about Istio and Gateway API objects.
    pub fn keys(&self, bucket: Bucket) -> Vec<String> {
        self.state(bucket)
            .into_keys()
            .filter(|k| bucket != Bucket::Config || !k.starts_with("Namespace."))
            .collect()
    }

    /// The keys of the Namespace label entries in `shoal-config`.
    pub fn namespace_keys(&self) -> Vec<String> {
        self.state(Bucket::Config)
            .into_keys()
            .filter(|k| k.starts_with("Namespace."))
            .collect()
    }

    /// The keys of a bucket without the fleets' own records (leases, sync markers): the
    /// clusters' records only.
    pub fn keys_but_leases(&self, bucket: Bucket) -> Vec<String> {
        self.state(bucket)
            .into_keys()
            .filter(|k| !is_lease(k) && shoal_common::keys::parse_synced_key(k).is_none())
            .collect()
    }

    /// The whole envelope of a key (body and stamps).
    pub fn envelope<T: serde::de::DeserializeOwned>(
        &self,
        bucket: Bucket,
        key: &str,
    ) -> Option<Envelope<T>> {
        let value = self.state(bucket).remove(key)?;
        Some(Envelope::<T>::decode(&value).expect("bus value decodes"))
    }

    pub fn decode<T: serde::de::DeserializeOwned>(&self, bucket: Bucket, key: &str) -> Option<T> {
        let value = self.state(bucket).remove(key)?;
        Some(
            Envelope::<T>::decode(&value)
                .expect("bus value decodes")
                .body,
        )
    }

    /// Waits until `check` holds for the recorded state.
    pub async fn until(&self, what: &str, check: impl Fn(&BusRecorder) -> bool) {
        eventually(TIMEOUT, POLL, || {
            let ok = check(self);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(format!("waiting for: {what}"))
                }
            }
        })
        .await
    }

    /// Waits until nothing new arrived for `quiet` (lease renewals do not count: they
    /// never stop).
    pub async fn settle(&self, quiet: Duration) {
        let activity = || {
            let events = self.events.lock().unwrap();
            events
                .iter()
                .filter(|e| !(e.bucket == Bucket::Meta && is_lease(&e.key)))
                .count()
        };
        let mut last = activity();
        loop {
            tokio::time::sleep(quiet).await;
            let now = activity();
            if now == last {
                return;
            }
            last = now;
        }
    }
}

impl Drop for BusRecorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The body of a `shoal-meta` cluster status.
#[derive(Debug, Deserialize)]
pub struct ClusterStatus {
    pub cluster: String,
    pub synced: bool,
    pub last_error: Option<String>,
}

/// Whether a `shoal-meta` key is a fleet's lease.
pub fn is_lease(key: &str) -> bool {
    key.starts_with("lease.")
}

pub fn describe(events: &[Recorded]) -> String {
    events
        .iter()
        .map(|e| format!("{:?} {}/{}", e.op, e.bucket, e.key))
        .collect::<Vec<_>>()
        .join("\n")
}

// ----- cluster fixtures -----------------------------------------------------------------

pub fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A namespace with a Service `web`, its EndpointSlice, its Pod and the Pod's Node (whose
/// locality is `<region>`/`<region>-a`).
pub fn populate(cluster: &KubeApiServer, ns: &str, labels: Value, region: &str) {
    cluster.apply(namespace(ns, labels)).unwrap();
    cluster
        .apply(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{region}"), "labels": {
                "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": format!("{region}-a"),
            }},
        }))
        .unwrap();
    cluster
        .apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": ns, "labels": {"app": "web", "version": "v1"}},
            "spec": {"serviceAccountName": "web-sa", "nodeName": format!("node-{region}"),
                     "containers": [{"name": "web", "image": "web:1"}]},
            "status": {"phase": "Running", "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}]},
        }))
        .unwrap();
    cluster
        .apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"clusterIP": "10.0.0.10", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
    cluster
        .apply(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-1", "namespace": ns}}],
        }))
        .unwrap();
}

/// The VirtualService CRD, like Istio's: three served versions, each with a `status`
/// subresource.
pub fn virtual_service_crd() -> Value {
    istio_crd("VirtualService", "virtualservices")
}

pub use shoal_tests::kubeapi::istio_crd;

pub fn virtual_service(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [format!("web.{ns}.svc.cluster.local")],
                 "http": [{"route": [{"destination": {"host": "web"}}]}]},
    })
}

/// A multicluster secret: cluster ID → kubeconfig.
pub fn remote_secret(name: &str, clusters: &[(&str, String)]) -> Secret {
    fleet_secret(name, clusters, None)
}

/// A multicluster secret of a fleet (its `shoal.io/fleet` label; `None`: unlabelled).
pub fn fleet_secret(name: &str, clusters: &[(&str, String)], fleet: Option<&str>) -> Secret {
    let data = clusters
        .iter()
        .map(|(id, kubeconfig)| (id.to_string(), ByteString(kubeconfig.clone().into_bytes())))
        .collect();
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "istio-system",
                     "labels": {"istio/multiCluster": "true"}},
    }))
    .unwrap();
    secret.data = Some(data);
    if let (Some(fleet), Some(labels)) = (fleet, secret.metadata.labels.as_mut()) {
        labels.insert("shoal.io/fleet".into(), fleet.into());
    }
    secret
}

/// A config cluster with `istio-system`.
pub async fn config_cluster() -> KubeApiServer {
    let cluster = KubeApiServer::builder().name("config").start().await;
    cluster.apply(namespace("istio-system", json!({}))).unwrap();
    cluster
}

pub fn svc_key(cluster: &str, ns: &str) -> String {
    format!("{cluster}.{ns}.web")
}

pub fn eps_key(cluster: &str, ns: &str) -> String {
    format!("{cluster}.{ns}.web.web-abc")
}
