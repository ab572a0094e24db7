//! The file source's objects: the last good objects of every manifest file, and the desired
//! state computed from them for the namespaces a change touched (so a Pod's new labels
//! reach every endpoint set of its namespace that references the Pod, without tracking who
//! references whom; no object refers to another namespace's, see [`ManifestStore::touch`]).

use super::manifest::{ManifestObject, ParsedFile, ParsedObject};
use crate::admit::normalize::Workloads;
use crate::desired::scope::Dirty;
use crate::desired::{
    config_entry, credentials, endpoints_entry, lone_pod_entry, service_entry, DesiredState,
    StateObject,
};
use crate::error::IngestError;
use crate::object::ObjectId;
use crate::selector::{DiscoverySelectors, Labels};
use shoal_common::credential::CredentialKeys;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tracing::warn;

/// Computes the desired state of `cluster` from parsed objects (with the file each came
/// from, in a stable order), keeping only objects in namespaces `selectors` select. An
/// object defined twice is taken from its last definition.
///
/// Secrets become sealed gateway credentials when a Gateway in their namespace names them
/// and `credential_keys` is given ([`credentials`]).
pub fn desired_state<'a>(
    objects: impl IntoIterator<Item = (&'a Path, &'a ParsedObject)>,
    cluster: &str,
    selectors: &DiscoverySelectors,
    credential_keys: Option<&CredentialKeys>,
) -> DesiredState {
    let mut by_id: BTreeMap<&ObjectId, (&Path, &ParsedObject)> = BTreeMap::new();
    for (path, obj) in objects {
        if let Some((first, _)) = by_id.insert(&obj.id, (path, obj)) {
            warn!(
                file = %path.display(),
                document = %obj.document,
                object = %obj.id,
                first_file = %first.display(),
                "object is defined more than once; the later definition wins"
            );
        }
    }
    let objects: Vec<(&Path, &ParsedObject)> = by_id.into_values().collect();

    let pods = objects.iter().filter_map(|(_, o)| match &o.object {
        ManifestObject::Pod(p) => Some(p.as_ref()),
        _ => None,
    });
    let nodes = objects.iter().filter_map(|(_, o)| match &o.object {
        ManifestObject::Node(n) => Some(n.as_ref()),
        _ => None,
    });
    let workloads = Workloads::new(pods, nodes);
    let namespaces: BTreeMap<&str, Labels> = objects
        .iter()
        .filter_map(|(_, o)| match &o.object {
            ManifestObject::Namespace(ns) => Some((
                o.id.name.as_str(),
                ns.metadata.labels.clone().unwrap_or_default(),
            )),
            _ => None,
        })
        .collect();
    let selected =
        |namespace: &str| selectors.selects_namespace(namespace, namespaces.get(namespace));
    // The directory's cluster is on the network its system namespace's label names, as a
    // Kubernetes cluster's is.
    let network = namespaces
        .get(shoal_common::defaults::SYSTEM_NAMESPACE)
        .and_then(|labels| labels.get(shoal_common::model::NETWORK_LABEL))
        .map_or("", String::as_str);

    let mut desired = DesiredState::new();
    for (path, obj) in &objects {
        if obj.id.kind.is_namespaced() && !selected(&obj.id.namespace) {
            continue;
        }
        // Parsing validated these objects, so normalization errors are not expected; they
        // are logged rather than trusted away.
        let entry = match &obj.object {
            ManifestObject::Config(config) => Ok(Some(config_entry(config))),
            ManifestObject::Service(svc) => service_entry(svc, cluster),
            ManifestObject::EndpointSlice(slice) => {
                endpoints_entry(slice, cluster, &workloads, network)
            }
            ManifestObject::Namespace(ns) => Ok(selected(&obj.id.name).then(|| {
                crate::desired::namespace_entry(
                    &obj.id.name,
                    ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                )
            })),
            ManifestObject::Pod(_) | ManifestObject::Node(_) | ManifestObject::Secret(_) => {
                Ok(None)
            }
        };
        match entry {
            Ok(Some((key, object))) => {
                desired.insert(key, object);
            }
            Ok(None) => {}
            Err(error) => warn!(
                file = %path.display(),
                document = %obj.document,
                object = %obj.id,
                %error,
                "skipping object",
            ),
        }
    }
    // Pods that no slice names are published one set each (ambient serves every pod with
    // an IP), as the Kubernetes source publishes them.
    let behind_service: BTreeSet<(String, String)> = desired
        .values()
        .filter_map(|o| match o {
            StateObject::Endpoints(set) => Some(set),
            _ => None,
        })
        .flat_map(|set| {
            set.endpoints
                .iter()
                .map(|e| (set.namespace.clone(), e.pod.clone()))
        })
        .collect();
    for (_, obj) in &objects {
        let ManifestObject::Pod(pod) = &obj.object else {
            continue;
        };
        let id = (obj.id.namespace.clone(), obj.id.name.clone());
        if !selected(&obj.id.namespace) || behind_service.contains(&id) {
            continue;
        }
        if let Some((key, object)) = lone_pod_entry(pod, cluster, &workloads, network) {
            desired.insert(key, object);
        }
    }
    let gateways = desired.values().filter_map(|o| match o {
        StateObject::Config(c) => Some(c.clone()),
        _ => None,
    });
    let referenced = credentials::referenced(gateways);
    let secrets = objects.iter().filter_map(|(_, o)| match &o.object {
        ManifestObject::Secret(s) if selected(&o.id.namespace) => Some(s.as_ref()),
        _ => None,
    });
    desired.extend(credentials::entries(
        cluster,
        secrets,
        &referenced,
        credential_keys,
    ));
    desired
}

/// The last good objects of every manifest file.
///
/// Bad input never loses good state: a file that does not parse keeps its previous
/// objects, and a rejected document whose identity is known keeps that object's previous
/// version; either lasts until the input is fixed (or the file removed).
#[derive(Debug, Default)]
pub struct ManifestStore {
    files: BTreeMap<PathBuf, Vec<ParsedObject>>,
    /// Seals the gateway credentials of [`desired_state`]; without it none is published.
    credential_keys: Option<std::sync::Arc<CredentialKeys>>,
}

impl ManifestStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Seals gateway credentials with these keys from now on.
    pub fn set_credential_keys(&mut self, keys: Option<std::sync::Arc<CredentialKeys>>) {
        self.credential_keys = keys;
    }

    /// Takes in the new parse of a file, logging what was rejected.
    pub fn apply(&mut self, path: &Path, parsed: Result<ParsedFile, IngestError>) {
        let file = path.display();
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(error) => {
                let kept = self.files.get(path).map_or(0, Vec::len);
                warn!(
                    %file,
                    %error,
                    kept,
                    "file does not parse; keeping its previously published objects",
                );
                return;
            }
        };
        let previous = self.files.remove(path).unwrap_or_default();
        let mut objects = parsed.objects;
        for rejected in parsed.errors {
            let kept = rejected.id.as_ref().and_then(|id| {
                // The file may now define the object validly elsewhere; that one wins.
                if objects.iter().any(|o| &o.id == id) {
                    return None;
                }
                previous.iter().find(|o| &o.id == id)
            });
            warn!(
                %file,
                document = %rejected.document,
                error = %rejected.error,
                kept_previous = kept.is_some(),
                "skipping invalid document"
            );
            if let Some(old) = kept {
                objects.push(old.clone());
            }
        }
        self.files.insert(path.to_path_buf(), objects);
    }

    /// Whether taking in this parse of a file would drop objects the file has now (a
    /// parse that fails keeps them all, as does a rejected document of known identity).
    pub fn would_drop(&self, path: &Path, parsed: &Result<ParsedFile, IngestError>) -> bool {
        let (Some(previous), Ok(parsed)) = (self.files.get(path), parsed) else {
            return false;
        };
        previous.iter().any(|old| {
            !parsed.objects.iter().any(|o| o.id == old.id)
                && !parsed.errors.iter().any(|e| e.id.as_ref() == Some(&old.id))
        })
    }

    /// Forgets a removed file; true when it was known.
    pub fn remove(&mut self, path: &Path) -> bool {
        self.files.remove(path).is_some()
    }

    /// The current objects of a file.
    pub fn objects(&self, path: &Path) -> Option<&[ParsedObject]> {
        self.files.get(path).map(Vec::as_slice)
    }

    /// The desired state of `cluster` from every file's objects, in every namespace.
    pub fn desired_state(&self, cluster: &str) -> DesiredState {
        self.desired_state_selected(cluster, &DiscoverySelectors::all())
    }

    /// The desired state of `cluster` from every file's objects in the namespaces that
    /// `selectors` select.
    pub fn desired_state_selected(
        &self,
        cluster: &str,
        selectors: &DiscoverySelectors,
    ) -> DesiredState {
        self.desired_state_scoped(cluster, selectors, &Dirty::everything())
    }

    /// [`ManifestStore::desired_state_selected`] for the keys `dirty` scopes: the objects
    /// of its namespaces, with every Namespace and Node (which say what is selected, the
    /// network and localities). A scoped publish round with `dirty` as its scope then
    /// makes the bus match the whole desired state, at the cost of those namespaces.
    pub fn desired_state_scoped(
        &self,
        cluster: &str,
        selectors: &DiscoverySelectors,
        dirty: &Dirty,
    ) -> DesiredState {
        let in_scope = |o: &ParsedObject| match &o.object {
            ManifestObject::Namespace(_) | ManifestObject::Node(_) => true,
            _ if o.id.kind.is_namespaced() => dirty.contains_namespace(&o.id.namespace),
            _ => dirty.is_all(),
        };
        let objects = self.files.iter().flat_map(|(path, objs)| {
            objs.iter()
                .filter(|o| in_scope(o))
                .map(move |o| (path.as_path(), o))
        });
        let mut desired =
            desired_state(objects, cluster, selectors, self.credential_keys.as_deref());
        if !dirty.is_all() {
            desired.retain(|key, _| dirty.contains_key(key));
        }
        desired
    }

    /// Adds to `dirty` what a change of this file's current objects makes to recompute:
    /// each object's namespace (a Namespace's own), or everything for a Node (every
    /// endpoint's locality), the system namespace (the cluster's network) and a
    /// cluster-scoped config object. Call it before and after the file changes.
    ///
    /// Nothing else crosses namespaces: endpoints join pods of their own namespace, and a
    /// Gateway's credentials are Secrets of its own namespace.
    pub fn touch(&self, path: &Path, dirty: &mut Dirty) {
        for o in self.files.get(path).into_iter().flatten() {
            match &o.object {
                ManifestObject::Node(_) => dirty.add_all(),
                ManifestObject::Namespace(_)
                    if o.id.name == shoal_common::defaults::SYSTEM_NAMESPACE =>
                {
                    dirty.add_all()
                }
                ManifestObject::Namespace(_) => dirty.add_namespace(&o.id.name),
                _ if o.id.kind.is_namespaced() => dirty.add_namespace(&o.id.namespace),
                _ => dirty.add_all(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file::manifest::{parse_file, test_path};
    use shoal_common::bus::Bucket;
    use shoal_common::envelope::Envelope;
    use shoal_common::keys;
    use shoal_common::model::{ConfigSpec, EndpointSet, Protocol};

    const BOOKINFO: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: bookinfo}
spec: {clusterIP: 10.0.0.5, ports: [{name: http, port: 9080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-1, namespace: bookinfo, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
  - addresses: [10.1.0.1]
    targetRef: {kind: Pod, name: reviews-v1}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: bookinfo, labels: {version: v1}}
spec: {containers: [], serviceAccountName: bookinfo-reviews}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
"#;

    fn store_with(files: &[(&str, &str)]) -> ManifestStore {
        let mut store = ManifestStore::new();
        for (name, text) in files {
            let path = test_path(name);
            store.apply(&path, parse_file(&path, text));
        }
        store
    }

    fn endpoints(state: &DesiredState) -> &EndpointSet {
        let key = (
            Bucket::Endpoints,
            keys::endpoints_key("c1", "bookinfo", "reviews", "reviews-1"),
        );
        match state.get(&key) {
            Some(StateObject::Endpoints(set)) => set,
            other => panic!("no endpoint set: {other:?}"),
        }
    }

    /// The system namespace's label is the cluster's network, carried by every endpoint
    /// set; a pod's own label (kept with its labels) overrides it per endpoint; an
    /// east-west gateway Service keeps its external addresses.
    #[test]
    fn networks_and_gateway_addresses() {
        let extra = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system, labels: {topology.istio.io/network: net1}}
---
apiVersion: v1
kind: Service
metadata: {name: eastwest, namespace: istio-system, labels: {topology.istio.io/network: net1}}
spec: {type: LoadBalancer, externalIPs: [192.0.2.9], ports: [{name: tls, port: 15443}]}
status: {loadBalancer: {ingress: [{ip: 192.0.2.1}, {hostname: gw.example}]}}
"#;
        let state =
            store_with(&[("bookinfo.yaml", BOOKINFO), ("net.yaml", extra)]).desired_state("c1");
        let set = endpoints(&state);
        assert_eq!(set.network, "net1");
        assert_eq!(set.network_of(&set.endpoints[0]), "net1");
        let mut relabelled = set.endpoints[0].clone();
        relabelled
            .labels
            .insert(shoal_common::model::NETWORK_LABEL.into(), "net2".into());
        assert_eq!(set.network_of(&relabelled), "net2");
        let key = (
            Bucket::Services,
            keys::service_key("c1", "istio-system", "eastwest"),
        );
        let Some(StateObject::Service(gw)) = state.get(&key) else {
            panic!("no gateway service")
        };
        assert_eq!(
            gw.external_addresses,
            ["192.0.2.1", "gw.example", "192.0.2.9"]
        );
    }

    #[test]
    fn builds_keys_for_every_bucket() {
        let state = store_with(&[("bookinfo.yaml", BOOKINFO)]).desired_state("c1");
        let keys: Vec<(Bucket, &str)> = state.keys().map(|(b, k)| (*b, k.as_str())).collect();
        assert_eq!(
            keys,
            vec![
                (Bucket::Config, "DestinationRule.bookinfo.reviews"),
                (Bucket::Services, "c1.bookinfo.reviews"),
                (Bucket::Endpoints, "c1.bookinfo.reviews.reviews-1"),
            ]
        );
        let Some(StateObject::Service(svc)) = state.values().nth(1) else {
            panic!("no service")
        };
        assert_eq!(svc.cluster, "c1");
        assert_eq!(svc.ports[0].protocol, Protocol::Http);
        let set = endpoints(&state);
        assert_eq!(set.cluster, "c1");
        assert_eq!(set.endpoints[0].service_account, "bookinfo-reviews");
    }

    /// A selected Namespace publishes its labels (for Gateway API namespace selectors); an
    /// unselected one publishes nothing.
    #[test]
    fn namespaces_publish_their_labels_when_selected() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {expose: 'yes'}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: hidden}\n";
        let store = store_with(&[("ns.yaml", text)]);
        let key = |name: &str| (Bucket::Config, format!("Namespace.-.{name}"));
        let state = store.desired_state("c1");
        let Some(StateObject::Config(apps)) = state.get(&key("apps")) else {
            panic!("no Namespace entry: {state:?}")
        };
        assert!(matches!(apps.spec, ConfigSpec::Namespace(_)));
        assert_eq!(apps.meta.labels["expose"], "yes");
        assert_eq!(apps.meta.labels["kubernetes.io/metadata.name"], "apps");
        assert!(state.contains_key(&key("hidden")));
        let list: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> =
            shoal_common::yaml::from_str("[{matchLabels: {expose: 'yes'}}]").unwrap();
        let selectors = DiscoverySelectors::new(&list).unwrap();
        let state = store.desired_state_selected("c1", &selectors);
        assert!(state.contains_key(&key("apps")));
        assert!(!state.contains_key(&key("hidden")));
    }

    #[test]
    fn pod_label_change_in_another_file_changes_the_endpoint_set() {
        let (svc, pod) = BOOKINFO
            .split_once("---\napiVersion: v1\nkind: Pod")
            .unwrap();
        let pod = format!("apiVersion: v1\nkind: Pod{pod}");
        let mut store = store_with(&[("svc.yaml", svc), ("pod.yaml", &pod)]);
        let before = store.desired_state("c1");
        assert_eq!(endpoints(&before).endpoints[0].labels["version"], "v1");

        let path = test_path("pod.yaml");
        let pod = pod.replace("version: v1}", "version: v2}");
        store.apply(&path, parse_file(&path, &pod));
        let after = store.desired_state("c1");
        assert_eq!(endpoints(&after).endpoints[0].labels["version"], "v2");
    }

    #[test]
    fn unparseable_file_keeps_its_objects() {
        let mut store = store_with(&[("bookinfo.yaml", BOOKINFO)]);
        let before = store.desired_state("c1");
        let path = test_path("bookinfo.yaml");
        store.apply(&path, parse_file(&path, "kind: [half-written"));
        assert_eq!(store.desired_state("c1"), before);
        assert!(store.remove(&path));
        assert!(store.desired_state("c1").is_empty());
    }

    #[test]
    fn bad_document_keeps_previous_version_while_others_update() {
        let mut store = store_with(&[("bookinfo.yaml", BOOKINFO)]);
        let path = test_path("bookinfo.yaml");
        // The DestinationRule loses its host (invalid), the Service changes its port.
        let edited = BOOKINFO
            .replace("spec: {host: reviews, ", "spec: {")
            .replace(
                "ports: [{name: http, port: 9080}]}",
                "ports: [{name: grpc, port: 9090}]}",
            );
        store.apply(&path, parse_file(&path, &edited));
        let state = store.desired_state("c1");
        let dr = &state[&(
            Bucket::Config,
            "DestinationRule.bookinfo.reviews".to_string(),
        )];
        assert!(
            matches!(dr, StateObject::Config(c) if matches!(&c.spec, ConfigSpec::DestinationRule(d) if d.host == "reviews"))
        );
        let svc = &state[&(Bucket::Services, "c1.bookinfo.reviews".to_string())];
        assert!(matches!(svc, StateObject::Service(s) if s.ports[0].port == 9090));

        // A bad document with no previous version is simply absent.
        let fresh = test_path("fresh.yaml");
        let bad = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: x}\nspec: {}\n";
        store.apply(&fresh, parse_file(&fresh, bad));
        assert_eq!(store.objects(&fresh).map(<[_]>::len), Some(0));
    }

    #[test]
    fn body_round_trips_through_the_envelope() {
        let state = store_with(&[("bookinfo.yaml", BOOKINFO)]).desired_state("c1");
        for ((bucket, _), object) in &state {
            let bytes = Envelope::new("f", 0, 1, object).encode().unwrap();
            let decoded = StateObject::decode(*bucket, &bytes).unwrap().unwrap();
            assert_eq!(&decoded, object);
            assert_eq!(
                decoded.encode_body().unwrap(),
                object.encode_body().unwrap()
            );
        }
    }
}
