//! Multicluster secrets (Istio's convention): Secrets labelled `istio/multiCluster=true` in
//! the system namespace, each data key a cluster ID and each value a kubeconfig.
//!
//! A Secret belongs to the fleet its label `shoal.io/fleet` names; Secrets without the
//! label belong to the fleet that takes unlabelled Secrets (`--unlabelled-secrets`). A
//! fleet watches only its own Secrets ([`selectors`]): the API server never sends it the
//! others.
//!
//! [`plan`] is the pure part: from the secrets and the clusters running now, which
//! clusters to add, update (a changed kubeconfig, by sha256) and remove, and which IDs
//! conflict. The [`SecretController`] carries the plan out with cluster tasks, for the
//! clusters no other live fleet owns ([`crate::coordination::ownership`]); a cluster that
//! leaves the fleet is retired ([`orphans::retire`]): handed over without a delete, or
//! deleted.

use super::cluster::{self, readiness_name, ClusterHandle};
use super::cluster_status::StatusWriter;
use super::context::ClusterContext;
use super::metrics::WatchKind;
use super::orphans;
use super::reduce::{self, ObjKey, SecretData};
use super::store::{KindStore, Touched};
use super::watch::{self, Sink, Tagged, Update};
use super::{with_user_agent, KubeSourceError};
use crate::coordination::ownership::{OwnerEvents, Standing};
use crate::task::TaskGuard;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use shoal_common::time::sleep_until;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

/// The label that marks a multicluster Secret.
pub const MULTICLUSTER_LABEL: &str = "istio/multiCluster";

/// The label that assigns a multicluster Secret to a fleet.
pub const FLEET_LABEL: &str = "shoal.io/fleet";

/// A burst of Secret changes (a Secret relabelled moves between this fleet's two watches)
/// is reconciled once, this long after its first change.
const SETTLE: Duration = Duration::from_millis(250);

/// The label selectors of the Secrets of `fleet`: those labelled with its name, and with
/// `unlabelled` also those without the label (a selector cannot OR, so that is a second
/// watch).
pub fn selectors(fleet: &str, unlabelled: bool) -> Vec<String> {
    let mut out = vec![format!("{MULTICLUSTER_LABEL}=true,{FLEET_LABEL}={fleet}")];
    if unlabelled {
        out.push(format!("{MULTICLUSTER_LABEL}=true,!{FLEET_LABEL}"));
    }
    out
}

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
/// local cluster's ID (when this fleet publishes the local cluster) is never taken from a
/// secret.
pub fn plan<'a>(
    current: &BTreeMap<String, Assignment>,
    secrets: impl IntoIterator<Item = (&'a ObjKey, &'a SecretData)>,
    local: Option<&str>,
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
            if Some(id.as_str()) == local {
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
    user_agent: &str,
) -> Result<Client, KubeSourceError> {
    let invalid = |reason: String| KubeSourceError::RemoteKubeconfig {
        cluster: cluster.to_string(),
        reason: super::redact_config_error(&reason),
    };
    let text = std::str::from_utf8(kubeconfig).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    // A Secret is at most 1 MiB, but nesting costs the YAML parser time quadratic in
    // depth: refused in one pass first (see `shoal_common::yaml_depth`).
    shoal_common::yaml_depth::check(text, shoal_common::yaml_depth::MAX_DEPTH)
        .map_err(|e| invalid(format!("kubeconfig {e}")))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    Client::try_from(with_user_agent(config, user_agent)).map_err(|e| invalid(e.to_string()))
}

/// Configuration of a [`SecretController`].
#[derive(Debug, Clone)]
pub struct SecretsConfig {
    /// Where the multicluster Secrets are.
    pub namespace: String,
    /// The local cluster's ID when this fleet publishes it (no secret may take it).
    pub local: Option<String>,
    /// Whether this fleet takes the Secrets without a fleet label.
    pub unlabelled: bool,
    /// How long a remote cluster may hold back readiness.
    pub timeout: Duration,
    /// How long a cluster that leaves the fleet waits for another fleet to take it over.
    pub handover_timeout: Duration,
    /// The `User-Agent` of the remote clusters' clients.
    pub user_agent: String,
}

/// Watches this fleet's multicluster secrets and runs a cluster task per remote cluster
/// it owns.
pub struct SecretController {
    ctx: ClusterContext,
    cfg: SecretsConfig,
    /// One store per watch (see [`selectors`]); the watch's index is its generation.
    stores: Vec<KindStore<SecretData>>,
    assigned: BTreeMap<String, Assignment>,
    running: BTreeMap<String, ClusterHandle>,
    /// Assigned clusters that another live fleet owns: not watched, by owner.
    refused: BTreeMap<String, String>,
    /// Clusters being handed over or deleted ([`orphans::retire`]).
    retiring: BTreeMap<String, TaskGuard>,
    rx: mpsc::Receiver<Tagged>,
    _watches: Vec<TaskGuard>,
    synced: bool,
    reconcile_at: Option<Instant>,
    owner_events: OwnerEvents,
}

impl SecretController {
    /// Starts watching this fleet's secrets with `client`.
    pub fn start(ctx: ClusterContext, client: Client, cfg: SecretsConfig) -> SecretController {
        let (tx, rx) = mpsc::channel(64);
        let local = cfg.local.clone().unwrap_or_default();
        let mut stores = Vec::new();
        let mut watches = Vec::new();
        for (generation, selector) in selectors(&ctx.fleet, cfg.unlabelled)
            .into_iter()
            .enumerate()
        {
            info!(namespace = %cfg.namespace, %selector, "watching multicluster secrets");
            let sink = Sink {
                tx: tx.clone(),
                generation: generation as u64,
                cluster: local.clone(),
                metrics: ctx.metrics.clone(),
            };
            watches.push(watch::spawn(
                Api::<Secret>::namespaced(client.clone(), &cfg.namespace),
                watcher::Config::default().labels(&selector),
                WatchKind::MulticlusterSecret,
                sink,
                |secret| Ok(Some(reduce::secret(secret))),
                Update::Secret,
            ));
            stores.push(KindStore::new(&local, "Secret"));
        }
        SecretController {
            owner_events: ctx.owners.events(),
            ctx,
            cfg,
            stores,
            assigned: BTreeMap::new(),
            running: BTreeMap::new(),
            refused: BTreeMap::new(),
            retiring: BTreeMap::new(),
            rx,
            _watches: watches,
            synced: false,
            reconcile_at: None,
        }
    }

    /// Runs until the process exits.
    pub async fn run(mut self) {
        let mut leadership = self.ctx.leadership.clone();
        loop {
            let reconcile_at = self.reconcile_at;
            tokio::select! {
                tagged = self.rx.recv() => match tagged {
                    Some(Tagged { generation, update: Update::Secret(change) }) => {
                        self.apply(generation, change).await;
                    }
                    Some(_) => {} // watch health: logged by the watch
                    None => return,
                },
                () = sleep_until(reconcile_at), if reconcile_at.is_some() => {
                    self.reconcile_at = None;
                    self.reconcile().await;
                }
                // A new term retires what left the fleet while another replica led (or none).
                () = leadership.changed() => {
                    if self.synced {
                        self.sweep_orphans().await;
                    }
                }
                () = self.owner_events.next() => {
                    if self.synced {
                        self.recheck().await;
                    }
                }
            }
        }
    }

    async fn apply(&mut self, generation: u64, change: super::store::Change<SecretData>) {
        let Some(store) = usize::try_from(generation)
            .ok()
            .and_then(|i| self.stores.get_mut(i))
        else {
            return;
        };
        let touched = store.apply(change);
        if !self.stores.iter().all(KindStore::synced) {
            return;
        }
        if !self.synced {
            // Remote clusters known at startup are registered for readiness here.
            self.reconcile().await;
            self.synced = true;
            self.ctx.readiness.synced(READINESS);
            self.sweep_orphans().await;
        } else if touched != Touched::Nothing && self.reconcile_at.is_none() {
            self.reconcile_at = Some(Instant::now() + SETTLE);
        }
    }

    /// Retires the clusters on the bus that this fleet published and no longer manages
    /// (only the leader does).
    async fn sweep_orphans(&mut self) {
        self.retiring.retain(|_, task| !task.is_finished());
        if !self.ctx.leadership.leads() {
            return;
        }
        let mut managed: BTreeSet<String> = self.assigned.keys().cloned().collect();
        managed.extend(self.cfg.local.clone());
        for cluster in orphans::candidates(&self.ctx, &managed).await {
            if !self.retiring.contains_key(&cluster) {
                self.retire(&cluster);
            }
        }
    }

    fn retire(&mut self, id: &str) {
        if !self.ctx.leadership.leads() {
            return; // the leader does it, or the sweep of the next term
        }
        let task = tokio::spawn(orphans::retire(
            self.ctx.clone(),
            id.to_string(),
            self.cfg.handover_timeout,
        ));
        self.retiring.insert(id.to_string(), TaskGuard::new(task));
    }

    async fn reconcile(&mut self) {
        let secrets = self.stores.iter().flat_map(KindStore::iter);
        let plan = plan(&self.assigned, secrets, self.cfg.local.as_deref());
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
        self.assigned = plan.assigned;
        for change in plan.changes {
            match change {
                ClusterChange::Remove(id) => self.remove(&id).await,
                ClusterChange::Add(id) => {
                    // Back before it was handed over: the retirement stops.
                    self.retiring.remove(&id);
                    if let Some(a) = self.assigned.get(&id).cloned() {
                        self.add(&id, &a).await;
                    }
                }
                ClusterChange::Update(id) => {
                    if let Some(a) = self.assigned.get(&id).cloned() {
                        self.update(&id, &a).await;
                    }
                }
            }
        }
    }

    /// Starts a remote cluster, unless another live fleet owns it.
    async fn add(&mut self, id: &str, a: &Assignment) {
        if let Standing::Taken(owner) = self.ctx.owners.standing(id) {
            return self.refuse(id, owner);
        }
        info!(cluster = %id, secret = %a.secret.1, "adding remote cluster");
        match client_from_kubeconfig(id, &a.kubeconfig, &self.cfg.user_agent).await {
            Ok(client) => {
                self.ctx
                    .readiness
                    .require_within(&readiness_name(id), self.cfg.timeout);
                let handle = cluster::spawn(self.ctx.clone(), id.to_string(), client, false);
                self.running.insert(id.to_string(), handle);
            }
            Err(error) => {
                warn!(%error, "cannot start remote cluster; waiting for a new kubeconfig");
                // Its status says why, if this fleet may write it.
                if self.ctx.leadership.leads() && self.ctx.owners.claim(id).await.is_ok() {
                    self.status(id)
                        .await
                        .set(false, Some(error.to_string()))
                        .await;
                }
            }
        }
    }

    fn refuse(&mut self, id: &str, owner: String) {
        if self.refused.get(id) != Some(&owner) {
            warn!(
                cluster = %id,
                fleet = %self.ctx.fleet,
                %owner,
                "not watching the cluster: another fleet whose lease is current owns it \
                 (briefly while it hands the cluster over; lasting when two fleets are assigned it)"
            );
            self.ctx.metrics.cluster_refused(id, &owner);
            self.refused.insert(id.to_string(), owner);
        }
    }

    async fn update(&mut self, id: &str, a: &Assignment) {
        if self.refused.contains_key(id) {
            return; // started with the new kubeconfig if it is ever released
        }
        if !self.running.contains_key(id) {
            return self.add(id, a).await;
        }
        match client_from_kubeconfig(id, &a.kubeconfig, &self.cfg.user_agent).await {
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

    /// A cluster left this fleet: stop watching it; the leader retires it.
    async fn remove(&mut self, id: &str) {
        info!(cluster = %id, "remote cluster is no longer this fleet's");
        if let Some(handle) = self.running.remove(id) {
            handle.stop().await;
        }
        if self.refused.remove(id).is_some() {
            self.ctx.metrics.cluster_removed(id);
            return; // another fleet owns it: nothing of it is this fleet's
        }
        self.ctx.readiness.forget(&readiness_name(id));
        self.retire(id);
    }

    /// The owner records changed (or a recheck is due): refused clusters that were
    /// released (or whose owner's lease lapsed) start; running ones that another live
    /// fleet took over stop.
    async fn recheck(&mut self) {
        let refused: Vec<(String, String)> = self
            .refused
            .iter()
            .map(|(c, o)| (c.clone(), o.clone()))
            .collect();
        for (id, owner) in refused {
            match self.ctx.owners.standing(&id) {
                Standing::Taken(now) if now == owner => {}
                Standing::Taken(now) => {
                    self.refused.remove(&id);
                    self.refuse(&id, now);
                }
                standing => {
                    info!(cluster = %id, ?standing, previous = %owner, "the cluster's owner let it go; starting it");
                    self.refused.remove(&id);
                    if let Some(a) = self.assigned.get(&id).cloned() {
                        self.add(&id, &a).await;
                    }
                }
            }
        }
        let taken: Vec<(String, String)> = self
            .running
            .keys()
            .filter_map(|id| match self.ctx.owners.standing(id) {
                Standing::Taken(owner) => Some((id.clone(), owner)),
                _ => None,
            })
            .collect();
        for (id, owner) in taken {
            warn!(cluster = %id, %owner, "another fleet took the cluster over; not watching it any more");
            if let Some(handle) = self.running.remove(&id) {
                handle.stop().await;
            }
            self.ctx.readiness.forget(&readiness_name(&id));
            self.refuse(&id, owner);
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

    #[tokio::test]
    async fn kubeconfig_errors_never_carry_its_values() {
        let token = "eyJhbGciOiJSUzI1NiJ9.secret-token";
        // A mistyped field whose value is the token: the parser quotes it.
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters: []\nusers:\n- name: u\n  user: {token}\n"
        );
        let error = client_from_kubeconfig("east", kubeconfig.as_bytes(), "ua")
            .await
            .err()
            .expect("an invalid kubeconfig")
            .to_string();
        assert!(!error.contains("secret-token"), "{error}");
        assert!(error.contains("east"), "{error}");
    }

    /// kube parses kubeconfigs with serde-saphyr, whose errors render the input around
    /// the error after their first line: syntax, type and duplicate-key errors alike keep
    /// only a line and column.
    #[tokio::test]
    async fn kubeconfig_parse_errors_of_every_kind_never_carry_its_values() {
        let head = "apiVersion: v1\nkind: Config\nclusters: []\nusers:\n- name: u\n";
        for user in [
            "  user: {token: [secret-token]}\n",
            "  user: {token: secret-token, token: secret-token}\n",
            "  user: {token: \"secret-token\"\n",
            "  user: {token: secret-token}\n  secret-token\n",
            "  user: {token: !!binary secret-token}\n",
        ] {
            let error = client_from_kubeconfig("east", format!("{head}{user}").as_bytes(), "ua")
                .await
                .err()
                .expect("an invalid kubeconfig")
                .to_string();
            assert!(!error.contains("secret-token"), "{user}: {error}");
            assert!(
                error.contains("east") && error.contains("line "),
                "{user}: {error}"
            );
        }
    }

    #[tokio::test]
    async fn a_deeply_nested_kubeconfig_is_refused_before_parsing() {
        let kubeconfig = format!("apiVersion: v1\nclusters: {}\n", "[".repeat(100_000));
        let started = std::time::Instant::now();
        let error = client_from_kubeconfig("east", kubeconfig.as_bytes(), "ua")
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert!(
            error.contains("east") && error.contains("nested deeper"),
            "{error}"
        );
    }

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
        plan(current, secrets.iter().map(|(k, d)| (k, d)), Some("local"))
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

    #[test]
    fn selectors_of_a_fleet() {
        assert_eq!(
            selectors("edge", false),
            vec!["istio/multiCluster=true,shoal.io/fleet=edge"]
        );
        assert_eq!(
            selectors("default", true),
            vec![
                "istio/multiCluster=true,shoal.io/fleet=default",
                "istio/multiCluster=true,!shoal.io/fleet"
            ]
        );
    }

    #[test]
    fn without_a_local_cluster_every_id_is_remote() {
        let secrets = [(secret("s1"), data(&[("local", "kc")]))];
        let p = plan(&BTreeMap::new(), secrets.iter().map(|(k, d)| (k, d)), None);
        assert_eq!(p.changes, vec![ClusterChange::Add("local".into())]);
        assert!(p.conflicts.is_empty());
    }

    #[tokio::test]
    async fn bad_kubeconfigs_are_errors_naming_the_cluster() {
        for bad in [
            &b"\xff"[..],
            b"clusters: 3",
            b"apiVersion: v1\nkind: Config\n",
        ] {
            let Err(err) = client_from_kubeconfig("east", bad, "shoal-test").await else {
                panic!("{bad:?} gave a client")
            };
            assert!(err.to_string().contains("\"east\""), "{err}");
        }
    }
}
