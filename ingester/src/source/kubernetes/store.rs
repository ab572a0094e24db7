//! The watched objects of a cluster, with kube-rs watcher semantics for relists, and the
//! desired bus state computed from them.
//!
//! A relist is a reset, never a series of guessed deletes: `Init` starts a buffer,
//! `InitApply` fills it, and only `InitDone` swaps it in, so the store (and so the bus)
//! never lacks an object that still exists, not even while a relist is under way.

use super::reduce::{CrdInfo, ObjKey};
use crate::admit::normalize::Workloads;
use crate::desired::scope::Dirty;
use crate::desired::{self, DesiredState, StateKey};
use crate::error::InvalidObject;
use crate::selector::{DiscoverySelectors, Labels};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shoal_common::bus::Bucket;
use shoal_common::keys;
use shoal_common::model::{ConfigKind, ConfigObject};
use std::collections::{BTreeMap, BTreeSet};
use tracing::warn;

/// One change from a watch, with the object already reduced (or rejected).
///
/// The same steps as kube-runtime's `watcher::Event<K>`, which it is built from
/// ([`super::watch`]), but not that type: an object arrives keyed and reduced, or rejected
/// with its key (the store then keeps that key's previous version), and a delete carries
/// the key alone, whatever the deleted object would reduce to now. `Event<K>` would carry
/// whole objects in every step, deletes included.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<V> {
    /// A relist starts.
    Init,
    /// An object of the relist.
    InitApply(ObjKey, Result<V, InvalidObject>),
    /// The relist is complete.
    InitDone,
    /// An object was added or changed.
    Apply(ObjKey, Result<V, InvalidObject>),
    /// An object was deleted.
    Delete(ObjKey),
}

/// What a change touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// Nothing observable changed.
    Nothing,
    /// One object.
    Key(ObjKey),
    /// Possibly every object (a relist completed with differences).
    All,
}

/// The objects of one kind.
#[derive(Debug)]
pub struct KindStore<V> {
    live: BTreeMap<ObjKey, V>,
    /// The relist under way, if any.
    buffer: Option<BTreeMap<ObjKey, V>>,
    synced: bool,
    /// For logs: the cluster and kind.
    cluster: String,
    kind: String,
}

impl<V: Clone + PartialEq> KindStore<V> {
    /// An empty store that has not synced yet.
    pub fn new(cluster: &str, kind: &str) -> Self {
        KindStore {
            live: BTreeMap::new(),
            buffer: None,
            synced: false,
            cluster: cluster.to_string(),
            kind: kind.to_string(),
        }
    }

    /// Whether the first relist has completed.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// An object.
    pub fn get(&self, key: &ObjKey) -> Option<&V> {
        self.live.get(key)
    }

    /// Every object.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.live.values()
    }

    /// Every object with its key.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjKey, &V)> {
        self.live.iter()
    }

    /// The objects of one namespace.
    pub fn in_namespace<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a V> + 'a {
        self.live
            .range((namespace.to_string(), String::new())..)
            .take_while(move |((ns, _), _)| ns == namespace)
            .map(|(_, v)| v)
    }

    /// The namespaces that hold objects.
    pub fn namespaces(&self) -> BTreeSet<&str> {
        self.live.keys().map(|(ns, _)| ns.as_str()).collect()
    }

    /// Applies a change. A rejected object keeps its previous version (bad input never
    /// loses good state); it is logged.
    pub fn apply(&mut self, change: Change<V>) -> Touched {
        match change {
            Change::Init => {
                self.buffer = Some(BTreeMap::new());
                Touched::Nothing
            }
            Change::InitApply(key, value) => {
                if let Some(value) = self.accept(&key, value) {
                    self.buffer
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key, value);
                }
                Touched::Nothing
            }
            Change::InitDone => {
                let Some(buffer) = self.buffer.take() else {
                    // Cannot happen with kube-rs watchers; never treat it as "all deleted".
                    warn!(cluster = %self.cluster, kind = %self.kind, "relist ended without starting; ignored");
                    return Touched::Nothing;
                };
                let first = !self.synced;
                self.synced = true;
                let changed = buffer != self.live;
                self.live = buffer;
                if changed || first {
                    Touched::All
                } else {
                    Touched::Nothing
                }
            }
            Change::Apply(key, value) => {
                let Some(value) = self.accept(&key, value) else {
                    return Touched::Nothing;
                };
                if self.live.get(&key) == Some(&value) {
                    return Touched::Nothing;
                }
                self.live.insert(key.clone(), value);
                Touched::Key(key)
            }
            Change::Delete(key) => match self.live.remove(&key) {
                Some(_) => Touched::Key(key),
                None => Touched::Nothing,
            },
        }
    }

    /// The value to store for a possibly rejected object: the new one, or the previous.
    fn accept(&self, key: &ObjKey, value: Result<V, InvalidObject>) -> Option<V> {
        match value {
            Ok(value) => Some(value),
            Err(error) => {
                let previous = self.live.get(key).cloned();
                warn!(
                    cluster = %self.cluster,
                    kind = %self.kind,
                    namespace = %key.0,
                    name = %key.1,
                    %error,
                    kept_previous = previous.is_some(),
                    "skipping invalid object",
                );
                previous
            }
        }
    }
}

/// What a change of this cluster's objects leaves to recompute.
impl Dirty {
    /// Adds what a change touched: namespaced objects dirty their namespace, cluster-scoped
    /// ones (an empty namespace) everything.
    pub fn add_touched(&mut self, touched: &Touched) {
        match touched {
            Touched::Nothing => {}
            Touched::Key((ns, _)) if !ns.is_empty() => self.add_namespace(ns),
            Touched::Key(_) | Touched::All => self.add_all(),
        }
    }
}

/// The config kind of a `shoal-config` key.
pub fn key_config_kind((bucket, key): &StateKey) -> Option<ConfigKind> {
    match bucket {
        Bucket::Config => keys::parse_config_key(key).ok().map(|id| id.kind),
        _ => None,
    }
}

/// Whether namespace `ns` is selected, given the cluster's Namespaces.
pub fn selected(namespaces: &KindStore<Labels>, selectors: &DiscoverySelectors, ns: &str) -> bool {
    selectors.selects_namespace(ns, namespaces.get(&(String::new(), ns.to_string())))
}

/// The core objects of one cluster.
#[derive(Debug)]
pub struct ClusterStore {
    /// Namespaces, as their labels.
    pub namespaces: KindStore<Labels>,
    /// Services.
    pub services: KindStore<Box<Service>>,
    /// EndpointSlices.
    pub slices: KindStore<Box<EndpointSlice>>,
    /// Pods.
    pub pods: KindStore<Box<Pod>>,
    /// Nodes.
    pub nodes: KindStore<Box<Node>>,
}

impl ClusterStore {
    /// Empty stores for `cluster`.
    pub fn new(cluster: &str) -> Self {
        ClusterStore {
            namespaces: KindStore::new(cluster, "Namespace"),
            services: KindStore::new(cluster, "Service"),
            slices: KindStore::new(cluster, "EndpointSlice"),
            pods: KindStore::new(cluster, "Pod"),
            nodes: KindStore::new(cluster, "Node"),
        }
    }

    /// The cluster's network: the `topology.istio.io/network` label of its system
    /// namespace (istiod's `networkFromSystemNamespace`); empty when unlabelled.
    pub fn network(&self, system_namespace: &str) -> &str {
        self.namespaces
            .get(&(String::new(), system_namespace.to_string()))
            .and_then(|labels| labels.get(shoal_common::model::NETWORK_LABEL))
            .map_or("", String::as_str)
    }

    /// Whether every kind has completed its first relist.
    pub fn synced(&self) -> bool {
        self.namespaces.synced()
            && self.services.synced()
            && self.slices.synced()
            && self.pods.synced()
            && self.nodes.synced()
    }

    /// The desired services and endpoints of `cluster` in the dirty namespaces that the
    /// selectors select. Pods and Nodes of every namespace join the slices, as in the file
    /// source, so both compute the same state.
    pub fn desired(
        &self,
        cluster: &str,
        selectors: &DiscoverySelectors,
        dirty: &Dirty,
        system_namespace: &str,
    ) -> DesiredState {
        let network = self.network(system_namespace);
        let present = || {
            let mut present = self.services.namespaces();
            present.extend(self.slices.namespaces());
            present.extend(self.pods.namespaces());
            present
        };
        let namespaces: Vec<&str> = dirty
            .select(present)
            .into_iter()
            .filter(|ns| selected(&self.namespaces, selectors, ns))
            .collect();
        // Only the recomputed namespaces' pods are indexed: indexing all of a cluster's
        // pods (10 000 in the benchmark's mesh) was most of an endpoint change's round.
        let pods = namespaces
            .iter()
            .flat_map(|ns| self.pods.in_namespace(ns))
            .map(Box::as_ref);
        let elsewhere = |ns: &str, name: &str| {
            let key = (ns.to_string(), name.to_string());
            self.pods.get(&key).map(Box::as_ref)
        };
        let workloads =
            Workloads::new(pods, self.nodes.values().map(Box::as_ref)).with_pod_lookup(&elsewhere);
        let mut desired = DesiredState::new();
        for ns in namespaces {
            for svc in self.services.in_namespace(ns) {
                insert(
                    &mut desired,
                    desired::service_entry(svc, cluster),
                    cluster,
                    ns,
                );
            }
            // The pods the namespace's slices name; the others are published one set each
            // (ambient serves every pod with an IP), so a pod on a slice costs nothing more.
            let mut behind_service: BTreeSet<String> = BTreeSet::new();
            for slice in self.slices.in_namespace(ns) {
                let entry = desired::endpoints_entry(slice, cluster, &workloads, network);
                if let Ok(Some((_, desired::StateObject::Endpoints(set)))) = &entry {
                    behind_service.extend(set.endpoints.iter().map(|e| e.pod.clone()));
                }
                insert(&mut desired, entry, cluster, ns);
            }
            for pod in self.pods.in_namespace(ns) {
                let named = pod.metadata.name.as_ref();
                if named.is_none_or(|n| behind_service.contains(n)) {
                    continue;
                }
                if let Some(entry) = desired::lone_pod_entry(pod, cluster, &workloads, network) {
                    insert(&mut desired, Ok(Some(entry)), cluster, ns);
                }
            }
        }
        desired
    }
}

fn insert(
    desired: &mut DesiredState,
    entry: Result<Option<(StateKey, desired::StateObject)>, InvalidObject>,
    cluster: &str,
    namespace: &str,
) {
    match entry {
        Ok(Some((key, object))) => {
            desired.insert(key, object);
        }
        Ok(None) => {}
        // Reduction validated the object; logged rather than trusted away.
        Err(error) => warn!(%cluster, %namespace, %error, "skipping object"),
    }
}

/// The Istio config objects by kind, and the CRDs that say which kinds exist.
#[derive(Debug)]
pub struct ConfigStore {
    /// Istio CRDs, keyed by CRD name.
    pub crds: KindStore<CrdInfo>,
    /// Objects of each kind being watched.
    pub kinds: BTreeMap<ConfigKind, KindStore<Box<ConfigObject>>>,
}

impl ConfigStore {
    /// Empty stores.
    pub fn new(cluster: &str) -> Self {
        ConfigStore {
            crds: KindStore::new(cluster, "CustomResourceDefinition"),
            kinds: BTreeMap::new(),
        }
    }

    /// The desired config in the dirty namespaces that the selectors select, from the kinds
    /// whose first relist completed.
    pub fn desired(
        &self,
        namespaces: &KindStore<Labels>,
        selectors: &DiscoverySelectors,
        dirty: &Dirty,
    ) -> DesiredState {
        let mut desired = DesiredState::new();
        for store in self.kinds.values().filter(|s| s.synced()) {
            for ns in dirty.select(|| store.namespaces()) {
                // Cluster-scoped config (GatewayClass) has no namespace to select.
                if !ns.is_empty() && !selected(namespaces, selectors, ns) {
                    continue;
                }
                for config in store.in_namespace(ns) {
                    let (key, object) = desired::config_entry(config);
                    desired.insert(key, object);
                }
            }
        }
        desired
    }

    /// Whether the keys of a kind may be swept: its objects are known (first relist done),
    /// or it is not watched at all (its CRD is gone, so none of its keys are wanted).
    pub fn sweepable(&self, kind: ConfigKind) -> bool {
        self.kinds.get(&kind).is_none_or(KindStore::synced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjKey {
        (ns.to_string(), name.to_string())
    }

    fn store() -> KindStore<u32> {
        KindStore::new("c1", "Thing")
    }

    fn list(s: &mut KindStore<u32>, items: &[(&str, &str, u32)]) -> Touched {
        s.apply(Change::Init);
        for (ns, name, v) in items {
            s.apply(Change::InitApply(key(ns, name), Ok(*v)));
        }
        s.apply(Change::InitDone)
    }

    #[test]
    fn relist_swaps_only_at_init_done() {
        let mut s = store();
        assert_eq!(list(&mut s, &[("a", "x", 1), ("a", "y", 2)]), Touched::All);
        assert!(s.synced());
        // A relist in progress never removes live objects.
        s.apply(Change::Init);
        s.apply(Change::InitApply(key("a", "x"), Ok(1)));
        assert_eq!(
            s.get(&key("a", "y")),
            Some(&2),
            "still live during the relist"
        );
        assert_eq!(s.apply(Change::InitDone), Touched::All);
        assert_eq!(s.get(&key("a", "y")), None, "gone after InitDone");
        // An identical relist touches nothing.
        assert_eq!(list(&mut s, &[("a", "x", 1)]), Touched::Nothing);
    }

    #[test]
    fn unchanged_apply_touches_nothing_and_deletes_report_their_key() {
        let mut s = store();
        list(&mut s, &[("a", "x", 1)]);
        assert_eq!(
            s.apply(Change::Apply(key("a", "x"), Ok(1))),
            Touched::Nothing
        );
        assert_eq!(
            s.apply(Change::Apply(key("a", "x"), Ok(2))),
            Touched::Key(key("a", "x"))
        );
        assert_eq!(
            s.apply(Change::Delete(key("a", "x"))),
            Touched::Key(key("a", "x"))
        );
        assert_eq!(s.apply(Change::Delete(key("a", "x"))), Touched::Nothing);
    }

    #[test]
    fn invalid_objects_keep_their_previous_version() {
        let mut s = store();
        list(&mut s, &[("a", "x", 1)]);
        let bad = || Err(InvalidObject::new("bad"));
        assert_eq!(
            s.apply(Change::Apply(key("a", "x"), bad())),
            Touched::Nothing
        );
        assert_eq!(s.get(&key("a", "x")), Some(&1));
        // Also through a relist; a new invalid object is simply absent.
        s.apply(Change::Init);
        s.apply(Change::InitApply(key("a", "x"), bad()));
        s.apply(Change::InitApply(key("a", "new"), bad()));
        s.apply(Change::InitDone);
        assert_eq!(s.get(&key("a", "x")), Some(&1));
        assert_eq!(s.get(&key("a", "new")), None);
    }

    #[test]
    fn init_done_without_init_is_ignored() {
        let mut s = store();
        list(&mut s, &[("a", "x", 1)]);
        assert_eq!(s.apply(Change::InitDone), Touched::Nothing);
        assert_eq!(s.get(&key("a", "x")), Some(&1));
    }

    #[test]
    fn namespace_ranges() {
        let mut s = store();
        list(
            &mut s,
            &[("a", "x", 1), ("ab", "y", 2), ("b", "z", 3), ("", "n", 4)],
        );
        assert_eq!(s.in_namespace("a").copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.in_namespace("").copied().collect::<Vec<_>>(), vec![4]);
        assert_eq!(
            s.namespaces().into_iter().collect::<Vec<_>>(),
            vec!["", "a", "ab", "b"]
        );
    }

    #[test]
    fn dirty_scopes_keys_by_namespace() {
        let mut d = Dirty::default();
        assert!(d.is_empty());
        d.add_touched(&Touched::Key(key("ns1", "x")));
        let svc = |ns| (Bucket::Services, keys::service_key("c1", ns, "s"));
        let cfg = |ns| {
            (
                Bucket::Config,
                keys::config_key(ConfigKind::Gateway, ns, "g"),
            )
        };
        assert!(d.contains_key(&svc("ns1")) && d.contains_key(&cfg("ns1")));
        assert!(!d.contains_key(&svc("ns2")));
        assert!(!d.contains_key(&(Bucket::Services, "garbage".into())));
        d.add_touched(&Touched::Key(key("", "node-a")));
        assert!(d.contains_key(&svc("ns2")) && d.contains_key(&(Bucket::Services, "x".into())));
        d.add_namespace("ns3");
        assert!(d.contains_namespace("anything"));
    }

    fn service(ns: &str) -> Box<Service> {
        let svc: Service = shoal_common::yaml::from_str(&format!(
            "metadata: {{name: web, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80}}]}}"
        ))
        .unwrap();
        Box::new(svc)
    }

    /// A store of cluster `c1` whose Namespaces are listed: `a`, labelled `mesh: on`.
    fn store_with_namespace_a() -> ClusterStore {
        let mut store = ClusterStore::new("c1");
        store.namespaces.apply(Change::Init);
        let labels: Labels = [("mesh".to_string(), "on".to_string())].into();
        store
            .namespaces
            .apply(Change::InitApply(key("", "a"), Ok(labels)));
        store.namespaces.apply(Change::InitDone);
        store
    }

    #[test]
    fn cluster_desired_state_follows_selection_and_scope() {
        let mut store = store_with_namespace_a();
        store.services.apply(Change::Init);
        for ns in ["a", "b"] {
            store
                .services
                .apply(Change::InitApply(key(ns, "web"), Ok(service(ns))));
        }
        store.services.apply(Change::InitDone);
        assert!(!store.synced(), "slices, pods and nodes not listed yet");

        let all = Dirty::everything();
        let keys_of = |d: DesiredState| d.into_keys().map(|(_, k)| k).collect::<Vec<_>>();
        let everything = DiscoverySelectors::all();
        assert_eq!(
            keys_of(store.desired("c1", &everything, &all, "istio-system")),
            vec!["c1.a.web", "c1.b.web"]
        );
        let selectors = crate::source::mesh_config::parse(
            std::path::Path::new("mesh"),
            "discoverySelectors: [{matchLabels: {mesh: 'on'}}]",
        )
        .unwrap();
        assert_eq!(
            keys_of(store.desired("c1", &selectors, &all, "istio-system")),
            vec!["c1.a.web"]
        );
        let mut only_b = Dirty::default();
        only_b.add_namespace("b");
        assert_eq!(
            keys_of(store.desired("c1", &everything, &only_b, "istio-system")),
            vec!["c1.b.web"]
        );
        assert!(store
            .desired("c1", &selectors, &only_b, "istio-system")
            .is_empty());
    }

    /// The cluster's network is the label of its system namespace (the configured one),
    /// carried by every endpoint set.
    #[test]
    fn endpoint_sets_carry_the_system_namespace_network() {
        let mut store = ClusterStore::new("c1");
        store.namespaces.apply(Change::Init);
        let labels: Labels = [(
            shoal_common::model::NETWORK_LABEL.to_string(),
            "net1".to_string(),
        )]
        .into();
        store
            .namespaces
            .apply(Change::InitApply(key("", "mesh-system"), Ok(labels)));
        store.namespaces.apply(Change::InitDone);
        assert_eq!(store.network("mesh-system"), "net1");
        assert_eq!(store.network("istio-system"), "");
        let slice: EndpointSlice = shoal_common::yaml::from_str(
            "metadata: {name: web-1, namespace: a, labels: {kubernetes.io/service-name: web}}\n\
             addressType: IPv4\nports: [{name: http, port: 80}]\n\
             endpoints: [{addresses: [10.0.0.1]}]",
        )
        .unwrap();
        store.slices.apply(Change::Init);
        store
            .slices
            .apply(Change::InitApply(key("a", "web-1"), Ok(Box::new(slice))));
        store.slices.apply(Change::InitDone);
        let all = Dirty::everything();
        let networks: Vec<String> = store
            .desired("c1", &DiscoverySelectors::all(), &all, "mesh-system")
            .into_values()
            .filter_map(|o| match o {
                desired::StateObject::Endpoints(set) => Some(set.network),
                _ => None,
            })
            .collect();
        assert_eq!(networks, ["net1"]);
    }

    fn pod(ns: &str, name: &str, extra_spec: &str, status: &str) -> Box<Pod> {
        Box::new(
            shoal_common::yaml::from_str(&format!(
                "metadata: {{name: {name}, namespace: {ns}}}\n\
                 spec: {{nodeName: n1, serviceAccountName: sa, containers: [{{name: c}}]{extra_spec}}}\n\
                 status: {status}"
            ))
            .unwrap(),
        )
    }

    /// Pods no slice names are published one set each (service `-pod`); pods on a slice,
    /// pending pods without an IP, host-network pods and pods of unselected namespaces
    /// are not.
    #[test]
    fn pods_behind_no_service_are_published_alone() {
        let mut store = store_with_namespace_a();
        let running = |ip: &str| {
            format!(
                "{{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: 'True'}}]}}"
            )
        };
        store.pods.apply(Change::Init);
        for (ns, name, spec, status) in [
            ("a", "lone", String::new(), running("10.0.0.2")),
            ("a", "behind", String::new(), running("10.0.0.1")),
            (
                "a",
                "pending",
                String::new(),
                "{phase: Pending}".to_string(),
            ),
            (
                "a",
                "host",
                ", hostNetwork: true".to_string(),
                running("10.9.0.1"),
            ),
            ("b", "unselected", String::new(), running("10.0.0.3")),
        ] {
            store.pods.apply(Change::InitApply(
                key(ns, name),
                Ok(pod(ns, name, &spec, &status)),
            ));
        }
        store.pods.apply(Change::InitDone);
        let slice: EndpointSlice = shoal_common::yaml::from_str(
            "metadata: {name: web-1, namespace: a, labels: {kubernetes.io/service-name: web}}\n\
             addressType: IPv4\nports: [{name: http, port: 80}]\n\
             endpoints: [{addresses: [10.0.0.1], targetRef: {kind: Pod, name: behind}}]",
        )
        .unwrap();
        store.slices.apply(Change::Init);
        store
            .slices
            .apply(Change::InitApply(key("a", "web-1"), Ok(Box::new(slice))));
        store.slices.apply(Change::InitDone);
        let all = Dirty::everything();
        let selectors = crate::source::mesh_config::parse(
            std::path::Path::new("mesh"),
            "discoverySelectors: [{matchLabels: {mesh: 'on'}}]",
        )
        .unwrap();
        let desired = store.desired("c1", &selectors, &all, "istio-system");
        let keys: Vec<&str> = desired.keys().map(|(_, k)| k.as_str()).collect();
        assert_eq!(keys, ["c1.a.-pod.lone", "c1.a.web.web-1"]);
        let Some(desired::StateObject::Endpoints(set)) =
            desired.get(&(Bucket::Endpoints, "c1.a.-pod.lone".to_string()))
        else {
            panic!("{desired:?}")
        };
        let ep = &set.endpoints[0];
        assert_eq!(
            (ep.address.as_str(), ep.pod.as_str(), ep.node.as_str()),
            ("10.0.0.2", "lone", "n1")
        );
        assert!(ep.ready);
        assert_eq!(ep.service_account, "sa");
    }

    #[test]
    fn config_kinds_are_sweepable_once_synced_or_unwatched() {
        let mut config = ConfigStore::new("c1");
        assert!(config.sweepable(ConfigKind::Gateway), "not watched");
        config
            .kinds
            .insert(ConfigKind::Gateway, KindStore::new("c1", "Gateway"));
        assert!(
            !config.sweepable(ConfigKind::Gateway),
            "first relist under way"
        );
        let gateways = config.kinds.get_mut(&ConfigKind::Gateway).unwrap();
        gateways.apply(Change::Init);
        gateways.apply(Change::InitDone);
        assert!(config.sweepable(ConfigKind::Gateway));
    }
}
