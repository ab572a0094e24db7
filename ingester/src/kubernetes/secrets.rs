//! Multicluster secrets (Istio's convention): Secrets labelled `istio/multiCluster=true` in
//! the system namespace, each data key a cluster ID and each value a kubeconfig.
//!
//! [`plan`] is the pure part: from the secrets and the clusters running now, which
//! clusters to add, update (a changed kubeconfig, by sha256) and remove, and which IDs
//! conflict. The [`SecretController`] carries the plan out with cluster tasks.

use super::cluster::{self, readiness_name, ClusterContext, ClusterHandle};
use super::orphans;
use super::reduce::{self, ObjKey, SecretData};
use super::store::{KindStore, Touched};
use super::watch::{self, Sink, Tagged, TaskGuard, Update};
use super::KubeSourceError;
use crate::status::StatusWriter;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The label that marks a multicluster Secret.
pub const MULTICLUSTER_LABEL: &str = "istio/multiCluster";

/// The readiness component of the secrets watch.
pub const READINESS: &str = "multicluster secrets";

/// The secret that a cluster ID is taken from, and its kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The secret (namespace, name).
    pub secret: ObjKey,
    /// sha256 of the kubeconfig.
    pub sha: [u8; 32],
    /// The kubeconfig.
    pub kubeconfig: Arc<Vec<u8>>,
}

/// A change to the set of remote clusters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterChange {
    /// A new cluster ID.
    Add(String),
    /// The kubeconfig of a running cluster changed.
    Update(String),
    /// A cluster ID is gone.
    Remove(String),
}

/// A cluster ID that a secret cannot have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The cluster ID.
    pub cluster: String,
    /// The secret whose key is ignored.
    pub secret: ObjKey,
    /// The secret that owns the ID, or `None` when the ID is the local cluster's.
    pub owner: Option<ObjKey>,
}

/// The outcome of [`plan`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every remote cluster ID and where it comes from, after the changes.
    pub assigned: BTreeMap<String, Assignment>,
    /// The changes, removals first.
    pub changes: Vec<ClusterChange>,
    /// IDs that were ignored.
    pub conflicts: Vec<Conflict>,
}

/// Plans the remote clusters for `secrets`, given the current assignment. A cluster ID
/// stays with the secret that has it now while that secret still has it; otherwise the
/// first secret (by namespace and name) having it gets it, and later ones conflict. The
/// local cluster's ID is never taken from a secret.
pub fn plan<'a>(
    current: &BTreeMap<String, Assignment>,
    secrets: impl IntoIterator<Item = (&'a ObjKey, &'a SecretData)>,
    local: &str,
) -> Plan {
    let secrets: BTreeMap<&ObjKey, &SecretData> = secrets.into_iter().collect();
    let assignment = |secret: &ObjKey, kubeconfig: &Vec<u8>| Assignment {
        secret: secret.clone(),
        sha: Sha256::digest(kubeconfig).into(),
        kubeconfig: Arc::new(kubeconfig.clone()),
    };
    let mut out = Plan::default();
    // Sticky ownership first.
    for (id, a) in current {
        if let Some(kubeconfig) = secrets.get(&a.secret).and_then(|data| data.get(id)) {
            out.assigned
                .insert(id.clone(), assignment(&a.secret, kubeconfig));
        }
    }
    for (secret, data) in &secrets {
        for (id, kubeconfig) in data.iter() {
            if id == local {
                out.conflicts.push(Conflict {
                    cluster: id.clone(),
                    secret: (*secret).clone(),
                    owner: None,
                });
                continue;
            }
            match out.assigned.get(id) {
                Some(owner) if &owner.secret == *secret => {}
                Some(owner) => out.conflicts.push(Conflict {
                    cluster: id.clone(),
                    secret: (*secret).clone(),
                    owner: Some(owner.secret.clone()),
                }),
                None => {
                    out.assigned
                        .insert(id.clone(), assignment(secret, kubeconfig));
                }
            }
        }
    }
    for id in current.keys() {
        if !out.assigned.contains_key(id) {
            out.changes.push(ClusterChange::Remove(id.clone()));
        }
    }
    for (id, a) in &out.assigned {
        match current.get(id) {
            None => out.changes.push(ClusterChange::Add(id.clone())),
            Some(old) if old.sha != a.sha => out.changes.push(ClusterChange::Update(id.clone())),
            Some(_) => {}
        }
    }
    out
}

/// Builds a client from a kubeconfig held in a secret.
pub async fn client_from_kubeconfig(
    cluster: &str,
    kubeconfig: &[u8],
) -> Result<Client, KubeSourceError> {
    let invalid = |reason: String| KubeSourceError::RemoteKubeconfig {
        cluster: cluster.to_string(),
        reason,
    };
    let text = std::str::from_utf8(kubeconfig).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    Client::try_from(config).map_err(|e| invalid(e.to_string()))
}

/// Watches the multicluster secrets and runs a cluster task per remote cluster.
pub struct SecretController {
    ctx: ClusterContext,
    local: String,
    timeout: Duration,
    secrets: KindStore<SecretData>,
    assigned: BTreeMap<String, Assignment>,
    running: BTreeMap<String, ClusterHandle>,
    rx: mpsc::Receiver<Tagged>,
    _watch: TaskGuard,
    synced: bool,
}

impl SecretController {
    /// Starts watching the secrets in `namespace` with `client`.
    pub fn start(
        ctx: ClusterContext,
        client: Client,
        namespace: &str,
        local: &str,
        timeout: Duration,
    ) -> SecretController {
        let (tx, rx) = mpsc::channel(64);
        let sink = Sink {
            tx,
            generation: 0,
            cluster: local.to_string(),
            metrics: ctx.metrics.clone(),
        };
        let selector = format!("{MULTICLUSTER_LABEL}=true");
        let watch = watch::spawn(
            Api::<Secret>::namespaced(client, namespace),
            watcher::Config::default().labels(&selector),
            "Secret".into(),
            sink,
            |secret| Ok(Some(reduce::secret(secret))),
            Update::Secret,
        );
        SecretController {
            ctx,
            local: local.to_string(),
            timeout,
            secrets: KindStore::new(local, "Secret"),
            assigned: BTreeMap::new(),
            running: BTreeMap::new(),
            rx,
            _watch: watch,
            synced: false,
        }
    }

    /// Runs until the process exits.
    pub async fn run(mut self) {
        let mut leadership = self.ctx.leadership.clone();
        loop {
            let update = tokio::select! {
                tagged = self.rx.recv() => match tagged {
                    Some(Tagged { update, .. }) => update,
                    None => return,
                },
                // A new term sweeps what was removed while another replica led (or none).
                () = leadership.changed() => {
                    if self.synced {
                        self.sweep_orphans().await;
                    }
                    continue;
                }
            };
            let Update::Secret(change) = update else {
                continue; // watch health: logged by the watch
            };
            let touched = self.secrets.apply(change);
            if !self.secrets.synced() || (touched == Touched::Nothing && self.synced) {
                continue;
            }
            self.reconcile().await;
            if !self.synced {
                // Remote clusters known at startup are registered for readiness above.
                self.synced = true;
                self.ctx.readiness.synced(READINESS);
                self.sweep_orphans().await;
            }
        }
    }

    async fn sweep_orphans(&self) {
        let mut managed: BTreeSet<String> = self.assigned.keys().cloned().collect();
        managed.insert(self.local.clone());
        orphans::sweep(&self.ctx, &managed).await;
    }

    async fn reconcile(&mut self) {
        let plan = plan(&self.assigned, self.secrets.iter(), &self.local);
        for c in &plan.conflicts {
            let secret = format!("{}/{}", c.secret.0, c.secret.1);
            match &c.owner {
                None => {
                    warn!(cluster = %c.cluster, %secret, "multicluster secret names the local cluster; ignored")
                }
                Some(owner) => warn!(
                    cluster = %c.cluster,
                    %secret,
                    owner = %format!("{}/{}", owner.0, owner.1),
                    "cluster ID is already taken from another secret; ignored",
                ),
            }
        }
        for change in plan.changes {
            match change {
                ClusterChange::Remove(id) => self.remove(&id).await,
                ClusterChange::Add(id) => {
                    if let Some(a) = plan.assigned.get(&id) {
                        self.add(&id, a).await;
                    }
                }
                ClusterChange::Update(id) => {
                    if let Some(a) = plan.assigned.get(&id) {
                        self.update(&id, a).await;
                    }
                }
            }
        }
        self.assigned = plan.assigned;
    }

    async fn add(&mut self, id: &str, a: &Assignment) {
        info!(cluster = %id, secret = %a.secret.1, "adding remote cluster");
        match client_from_kubeconfig(id, &a.kubeconfig).await {
            Ok(client) => {
                self.ctx
                    .readiness
                    .require_within(&readiness_name(id), self.timeout);
                let handle = cluster::spawn(self.ctx.clone(), id.to_string(), client, false);
                self.running.insert(id.to_string(), handle);
            }
            Err(error) => {
                warn!(%error, "cannot start remote cluster; waiting for a new kubeconfig");
                self.status(id)
                    .await
                    .set(false, Some(error.to_string()))
                    .await;
            }
        }
    }

    async fn update(&mut self, id: &str, a: &Assignment) {
        if !self.running.contains_key(id) {
            return self.add(id, a).await;
        }
        match client_from_kubeconfig(id, &a.kubeconfig).await {
            Ok(client) => {
                if let Some(handle) = self.running.get(id) {
                    handle.rotate(client).await;
                }
            }
            // The cluster task owns its status while it runs; the log says it all.
            Err(error) => {
                warn!(%error, "new kubeconfig is unusable; the cluster keeps its current one")
            }
        }
    }

    async fn remove(&mut self, id: &str) {
        info!(cluster = %id, "removing remote cluster");
        match self.running.remove(id) {
            Some(handle) => handle.stop(true).await,
            // Never started (bad kubeconfig): only its status is on the bus.
            None => self.status(id).await.delete().await,
        }
    }

    async fn status(&self, id: &str) -> StatusWriter {
        let ctx = &self.ctx;
        StatusWriter::load(ctx.bus.clone(), &ctx.fleet, id, ctx.leadership.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str) -> ObjKey {
        ("istio-system".to_string(), name.to_string())
    }

    fn data(pairs: &[(&str, &str)]) -> SecretData {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn run(current: &BTreeMap<String, Assignment>, secrets: &[(&str, SecretData)]) -> Plan {
        let secrets: Vec<(ObjKey, SecretData)> = secrets
            .iter()
            .map(|(n, d)| (secret(n), d.clone()))
            .collect();
        plan(current, secrets.iter().map(|(k, d)| (k, d)), "local")
    }

    #[test]
    fn added_changed_removed() {
        let p = run(
            &BTreeMap::new(),
            &[("s1", data(&[("a", "kc-a"), ("b", "kc-b")]))],
        );
        assert_eq!(
            p.changes,
            vec![
                ClusterChange::Add("a".into()),
                ClusterChange::Add("b".into())
            ]
        );
        assert!(p.conflicts.is_empty());

        let same = run(
            &p.assigned,
            &[("s1", data(&[("a", "kc-a"), ("b", "kc-b")]))],
        );
        assert!(same.changes.is_empty());
        assert_eq!(same.assigned, p.assigned);

        let next = run(&p.assigned, &[("s1", data(&[("a", "kc-a2")]))]);
        assert_eq!(
            next.changes,
            vec![
                ClusterChange::Remove("b".into()),
                ClusterChange::Update("a".into())
            ]
        );
        assert_eq!(next.assigned["a"].kubeconfig.as_slice(), b"kc-a2");

        let gone = run(&next.assigned, &[]);
        assert_eq!(gone.changes, vec![ClusterChange::Remove("a".into())]);
        assert!(gone.assigned.is_empty());
    }

    #[test]
    fn duplicate_ids_stay_with_their_first_secret() {
        // s2 sorts after s1, so s1 wins at first...
        let p = run(
            &BTreeMap::new(),
            &[
                ("s1", data(&[("a", "kc-1")])),
                ("s2", data(&[("a", "kc-2")])),
            ],
        );
        assert_eq!(p.assigned["a"].secret, secret("s1"));
        assert_eq!(
            p.conflicts,
            vec![Conflict {
                cluster: "a".into(),
                secret: secret("s2"),
                owner: Some(secret("s1")),
            }]
        );
        // ...and an owner keeps its ID even when an earlier-sorting secret adds it later.
        let owned_by_s2 = run(&BTreeMap::new(), &[("s2", data(&[("a", "kc-2")]))]);
        let p = run(
            &owned_by_s2.assigned,
            &[
                ("s0", data(&[("a", "kc-0")])),
                ("s2", data(&[("a", "kc-2")])),
            ],
        );
        assert!(p.changes.is_empty());
        assert_eq!(p.assigned["a"].secret, secret("s2"));
        assert_eq!(p.conflicts.len(), 1);
        // When the owner drops it, the other secret takes it over: an update.
        let p = run(
            &p.assigned,
            &[("s0", data(&[("a", "kc-0")])), ("s2", data(&[]))],
        );
        assert_eq!(p.changes, vec![ClusterChange::Update("a".into())]);
        assert_eq!(p.assigned["a"].secret, secret("s0"));
    }

    #[test]
    fn same_kubeconfig_from_another_secret_is_no_change() {
        let p = run(&BTreeMap::new(), &[("s1", data(&[("a", "kc")]))]);
        let moved = run(&p.assigned, &[("s2", data(&[("a", "kc")]))]);
        assert!(moved.changes.is_empty(), "{:?}", moved.changes);
        assert_eq!(moved.assigned["a"].secret, secret("s2"));
    }

    #[test]
    fn local_cluster_id_is_never_taken() {
        let p = run(
            &BTreeMap::new(),
            &[("s1", data(&[("local", "kc"), ("a", "kc")]))],
        );
        assert_eq!(p.changes, vec![ClusterChange::Add("a".into())]);
        assert_eq!(p.conflicts[0].owner, None);
    }

    #[tokio::test]
    async fn bad_kubeconfigs_are_errors_naming_the_cluster() {
        for bad in [
            &b"\xff"[..],
            b"clusters: 3",
            b"apiVersion: v1\nkind: Config\n",
        ] {
            let Err(err) = client_from_kubeconfig("east", bad).await else {
                panic!("{bad:?} gave a client")
            };
            assert!(err.to_string().contains("\"east\""), "{err}");
        }
    }
}
