//! The object store: the served resources (built-ins and CRD-defined), the objects, the global
//! revision counter, and the bounded event history that watches replay and paginated lists
//! read consistent snapshots from.
//!
//! Objects are `serde_json::Value`s keyed by (group, plural) and then (namespace, name), so a
//! custom resource served at several versions is one object (like a CRD with conversion
//! strategy `None`: only `apiVersion` changes between versions). Iteration is in key order,
//! namespace then name, as etcd returns `/registry/<resource>/<namespace>/<name>` keys.

use super::patch::{self, PatchKind};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::ops::Bound;

/// (group, plural): what objects are stored under, whatever version they are served at.
pub(crate) type GroupResource = (String, String);
/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub(crate) type ObjectKey = (String, String);

const CRD_GROUP: &str = "apiextensions.k8s.io";
const CRD_PLURAL: &str = "customresourcedefinitions";

/// How one resource is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceDef {
    pub(crate) group: String,
    /// Served versions, highest priority (the preferred version) first; never empty.
    pub(crate) versions: Vec<String>,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    /// Field selector fields besides `metadata.name` and `metadata.namespace`.
    pub(crate) fields: &'static [&'static str],
    /// Whether a `status` subresource is served.
    pub(crate) status_subresource: bool,
}

impl ResourceDef {
    pub(crate) fn gr(&self) -> GroupResource {
        (self.group.clone(), self.plural.clone())
    }

    pub(crate) fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// `pods`, or `virtualservices.networking.istio.io` (as error messages name resources).
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub(crate) fn preferred_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    fn is_namespaces(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    fn is_crds(&self) -> bool {
        self.group == CRD_GROUP && self.plural == CRD_PLURAL
    }

    /// The key of an object of this resource.
    pub(crate) fn key(&self, namespace: Option<&str>, name: &str) -> ObjectKey {
        let ns = if self.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        (ns.to_string(), name.to_string())
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    fields: &'static [&'static str],
    status: bool,
}

/// The built-in resources, in discovery order.
const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        fields: &["status.phase"],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        fields: &["spec.unschedulable"],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        fields: &["spec.clusterIP", "spec.type"],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        fields: &[],
        status: false,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        fields: &["type"],
        status: false,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        fields: &[],
        status: false,
    },
    Builtin {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        fields: &[],
        status: true,
    },
    Builtin {
        group: CRD_GROUP,
        version: "v1",
        plural: CRD_PLURAL,
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short_names: &["crd", "crds"],
        fields: &[],
        status: true,
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        fields: &[],
        status: false,
    },
    Builtin {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short_names: &[],
        fields: &[],
        status: false,
    },
];

impl Builtin {
    fn def(&self) -> ResourceDef {
        ResourceDef {
            group: self.group.into(),
            versions: vec![self.version.into()],
            plural: self.plural.into(),
            singular: self.singular.into(),
            kind: self.kind.into(),
            list_kind: format!("{}List", self.kind),
            namespaced: self.namespaced,
            short_names: self.short_names.iter().map(|s| s.to_string()).collect(),
            fields: self.fields,
            status_subresource: self.status,
        }
    }
}

/// The resource a CRD defines, if it is well-formed and serves at least one version.
fn crd_resource(crd: &Value) -> Option<ResourceDef> {
    let spec = crd.get("spec")?;
    let group = spec.get("group")?.as_str()?;
    let names = spec.get("names")?;
    let plural = names.get("plural")?.as_str()?;
    let kind = names.get("kind")?.as_str()?;
    let text = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from)
    };
    let versions_json = spec.get("versions")?.as_array()?;
    let mut versions: Vec<String> = versions_json
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
        .filter_map(|v| text(v.get("name")))
        .collect();
    if versions.is_empty()
        || BUILTINS
            .iter()
            .any(|b| b.group == group && b.plural == plural)
    {
        return None;
    }
    versions.sort_by(|a, b| version_priority(a, b));
    Some(ResourceDef {
        group: group.into(),
        versions,
        plural: plural.into(),
        singular: text(names.get("singular")).unwrap_or_else(|| kind.to_lowercase()),
        kind: kind.into(),
        list_kind: text(names.get("listKind")).unwrap_or_else(|| format!("{kind}List")),
        namespaced: spec.get("scope").and_then(Value::as_str) == Some("Namespaced"),
        short_names: names
            .get("shortNames")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        fields: &[],
        status_subresource: versions_json
            .iter()
            .any(|v| v.pointer("/subresources/status").is_some()),
    })
}

/// Kubernetes version priority (`v2` > `v1` > `v1beta2` > `v1beta1` > `v1alpha1` > anything
/// else, which sorts alphabetically): `Less` when `a` comes first.
pub(crate) fn version_priority(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        if rest[..digits].starts_with('0') {
            return None;
        }
        let tail = &rest[digits..];
        let (stage, minor) = if tail.is_empty() {
            return Some((2, major, 0));
        } else if let Some(m) = tail.strip_prefix("beta") {
            (1, m)
        } else if let Some(m) = tail.strip_prefix("alpha") {
            (0, m)
        } else {
            return None;
        };
        Some((stage, major, minor.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// What a watch event or a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as the watch cache keeps it: the object after (`None` when deleted) and
/// before (`None` when added) the change.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) gr: GroupResource,
    pub(crate) key: ObjectKey,
    pub(crate) kind: EventKind,
    pub(crate) object: Option<Value>,
    pub(crate) prev: Option<Value>,
}

/// Which objects a list or watch sees.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, key: &ObjectKey, object: &Value) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.0)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }

    /// Whether the filter has no label or field selector (then lists report
    /// `remainingItemCount`).
    pub(crate) fn no_selectors(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

/// One page of a list.
pub(crate) struct ListPage {
    /// The revision the page was read at.
    pub(crate) rv: u64,
    pub(crate) items: Vec<Value>,
    /// The key of the last item, when more matching items follow.
    pub(crate) next: Option<ObjectKey>,
    pub(crate) remaining: usize,
}

/// `DeleteOptions.preconditions`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// The state of one simulated cluster.
pub(crate) struct Store {
    objects: BTreeMap<GroupResource, BTreeMap<ObjectKey, Value>>,
    revision: u64,
    history: VecDeque<Event>,
    history_limit: usize,
    /// Watches and snapshots need every event after their revision: those at a revision
    /// below this one have been compacted away (410 Gone).
    oldest: u64,
    random: RandomState,
    counter: u64,
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = object.as_object_mut()?;
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Some(meta) = metadata_mut(object) {
        meta.insert(field.to_string(), value);
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Parses a resourceVersion.
pub(crate) fn parse_rv(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {text:?}: must be an integer"
        ))
    })
}

/// The object with `apiVersion` and `kind` of `res` at `version`.
pub(crate) fn present(object: &Value, res: &ResourceDef, version: &str) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), json!(res.api_version(version)));
        map.insert("kind".into(), json!(res.kind));
    }
    object
}

/// The object without `metadata` and `status`: a change there bumps `metadata.generation`.
fn generation_relevant(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        for field in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(field);
        }
    }
    object
}

fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn validate_name(res: &ResourceDef, name: &str) -> Result<(), String> {
    let ok = if res.is_namespaces() {
        is_dns_label(name, 63)
    } else if res.group.is_empty() && res.plural == "services" {
        is_dns_label(name, 63) && name.starts_with(|c: char| c.is_ascii_lowercase())
    } else {
        name.len() <= 253 && name.split('.').all(|label| is_dns_label(label, 63))
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 {} must consist of lower case \
             alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            if res.is_namespaces() { "label" } else { "subdomain" }
        ))
    }
}

/// Checks a CRD and fills in what the apiextensions server does: default names, and a status
/// saying the CRD is established.
fn prepare_crd(crd: &mut Value, old: Option<&Value>) -> Result<(), String> {
    let name = meta_str(crd, "name").unwrap_or_default().to_string();
    let spec = crd
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or("spec: Required value")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if group.is_empty() || !group.contains('.') {
        return Err(format!(
            "spec.group: Invalid value: {group:?}: should be a domain with at least one dot"
        ));
    }
    let scope = spec
        .get("scope")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        return Err(format!("spec.scope: Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""));
    }
    let names = spec
        .get_mut("names")
        .and_then(Value::as_object_mut)
        .ok_or("spec.names: Required value")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if plural.is_empty() || plural.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!("spec.names.plural: Invalid value: {plural:?}"));
    }
    if kind.is_empty() {
        return Err("spec.names.kind: Required value".into());
    }
    if name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
        ));
    }
    names
        .entry("singular")
        .or_insert_with(|| json!(kind.to_lowercase()));
    names
        .entry("listKind")
        .or_insert_with(|| json!(format!("{kind}List")));
    let names = Value::Object(names.clone());
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or(
            "spec.versions: Invalid value: must have exactly one version marked as storage version",
        )?;
    if versions.iter().any(|v| {
        v.get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    }) {
        return Err("spec.versions[].name: Required value".into());
    }
    let storage: Vec<&str> = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    let [storage] = storage[..] else {
        return Err(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
                .into(),
        );
    };
    let storage = storage.to_string();
    if let Some(old) = old {
        for (field, pointer) in [("spec.group", "/spec/group"), ("spec.scope", "/spec/scope")] {
            if old.pointer(pointer) != crd.pointer(pointer) {
                return Err(format!("{field}: Invalid value: field is immutable"));
            }
        }
    }
    let mut stored: Vec<Value> = old
        .and_then(|o| o.pointer("/status/storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !stored.contains(&json!(storage)) {
        stored.push(json!(storage));
    }
    let since = old
        .and_then(|o| o.pointer("/status/conditions/0/lastTransitionTime"))
        .cloned()
        .unwrap_or_else(|| json!(now()));
    if let Some(map) = crd.as_object_mut() {
        map.insert(
            "status".into(),
            json!({
                "acceptedNames": names,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": since},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": since},
                ],
                "storedVersions": stored,
            }),
        );
    }
    Ok(())
}

impl Store {
    pub(crate) fn new(history_limit: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            revision: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            oldest: 0,
            random: RandomState::new(),
            counter: 0,
        }
    }

    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    pub(crate) fn oldest(&self) -> u64 {
        self.oldest
    }

    /// Events after revision `after`, oldest first.
    pub(crate) fn events_after(&self, after: u64) -> impl Iterator<Item = &Event> {
        let start = self.history.partition_point(|e| e.rv <= after);
        self.history.range(start..)
    }

    /// Discards the event history and moves the revision on, so that every revision handed
    /// out so far is too old to watch from or to continue a list at.
    pub(crate) fn compact(&mut self) {
        self.revision += 1;
        self.history.clear();
        self.oldest = self.revision;
    }

    /// Every served resource: built-ins, then those of established CRDs.
    pub(crate) fn resources(&self) -> Vec<ResourceDef> {
        let crds = self
            .objects
            .get(&(CRD_GROUP.to_string(), CRD_PLURAL.to_string()));
        BUILTINS
            .iter()
            .map(Builtin::def)
            .chain(
                crds.into_iter()
                    .flat_map(|m| m.values())
                    .filter_map(crd_resource),
            )
            .collect()
    }

    /// The resource `plural` of `group`, if served (at any version).
    pub(crate) fn resource(&self, group: &str, plural: &str) -> Option<ResourceDef> {
        if let Some(b) = BUILTINS
            .iter()
            .find(|b| b.group == group && b.plural == plural)
        {
            return Some(b.def());
        }
        let crd = self
            .objects
            .get(&(CRD_GROUP.to_string(), CRD_PLURAL.to_string()))?
            .get(&(String::new(), format!("{plural}.{group}")))?;
        crd_resource(crd)
    }

    /// The resource of `kind` in `group`.
    pub(crate) fn resource_for_kind(&self, group: &str, kind: &str) -> Option<ResourceDef> {
        self.resources()
            .into_iter()
            .find(|r| r.group == group && r.kind == kind)
    }

    /// A resource named like `pods` or `gateways.networking.istio.io`.
    pub(crate) fn resource_named(&self, name: &str) -> Option<ResourceDef> {
        match name.split_once('.') {
            Some((plural, group)) => self.resource(group, plural),
            None => self.resource("", name),
        }
    }

    fn stored(&self, res: &ResourceDef, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(&res.gr())?.get(key)
    }

    pub(crate) fn get(
        &self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.stored(res, &res.key(namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// The objects of `gr` as they were at revision `at`, rebuilt from the current state by
    /// undoing the later events.
    fn snapshot(
        &self,
        gr: &GroupResource,
        at: u64,
    ) -> Result<Cow<'_, BTreeMap<ObjectKey, Value>>, ApiError> {
        let current = self.objects.get(gr);
        if at >= self.revision {
            return Ok(current.map(Cow::Borrowed).unwrap_or_default());
        }
        if at < self.oldest {
            return Err(ApiError::expired(format!(
                "too old resource version: {at} ({})",
                self.oldest
            )));
        }
        let mut map = current.cloned().unwrap_or_default();
        for event in self.history.iter().rev().take_while(|e| e.rv > at) {
            if event.gr != *gr {
                continue;
            }
            match (event.kind, &event.prev) {
                (EventKind::Modified | EventKind::Deleted, Some(prev)) => {
                    map.insert(event.key.clone(), prev.clone())
                }
                _ => map.remove(&event.key),
            };
        }
        Ok(Cow::Owned(map))
    }

    /// A page of the objects matching `filter` at revision `at` (`None`: now), after
    /// `start_after`, at most `limit` of them.
    pub(crate) fn list(
        &self,
        res: &ResourceDef,
        filter: &Filter,
        at: Option<u64>,
        limit: Option<usize>,
        start_after: Option<&ObjectKey>,
    ) -> Result<ListPage, ApiError> {
        let rv = at.unwrap_or(self.revision);
        let map = self.snapshot(&res.gr(), rv)?;
        let range = match start_after {
            Some(key) => map.range::<ObjectKey, _>((Bound::Excluded(key), Bound::Unbounded)),
            None => map.range::<ObjectKey, _>(..),
        };
        let mut page = ListPage {
            rv,
            items: Vec::new(),
            next: None,
            remaining: 0,
        };
        let mut last: Option<&ObjectKey> = None;
        for (key, object) in range.filter(|(k, o)| filter.matches(k, o)) {
            if limit.is_some_and(|l| page.items.len() >= l) {
                page.remaining += 1;
                if page.next.is_none() {
                    page.next = last.cloned();
                }
            } else {
                page.items.push(object.clone());
                last = Some(key);
            }
        }
        Ok(page)
    }

    fn uid(&mut self) -> String {
        self.counter += 1;
        let a = self.random.hash_one((self.counter, 1u8));
        let b = self.random.hash_one((self.counter, 2u8));
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.counter += 1;
        let mut n = self.random.hash_one(self.counter);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// Records a change at a new revision and returns the object as stored (for a delete:
    /// the last state, carrying the deletion's revision, as the real server returns it).
    fn commit(
        &mut self,
        gr: GroupResource,
        key: ObjectKey,
        kind: EventKind,
        object: Option<Value>,
        prev: Option<Value>,
    ) -> Value {
        self.revision += 1;
        let rv = self.revision;
        let stored = object.map(|mut o| {
            set_meta(&mut o, "resourceVersion", json!(rv.to_string()));
            self.objects
                .entry(gr.clone())
                .or_default()
                .insert(key.clone(), o.clone());
            o
        });
        if stored.is_none() {
            if let Some(map) = self.objects.get_mut(&gr) {
                map.remove(&key);
            }
        }
        let returned = stored.clone().unwrap_or_else(|| {
            let mut last = prev.clone().unwrap_or_else(|| json!({}));
            set_meta(&mut last, "resourceVersion", json!(rv.to_string()));
            last
        });
        self.history.push_back(Event {
            rv,
            gr,
            key,
            kind,
            object: stored,
            prev,
        });
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest = dropped.rv;
            }
        }
        returned
    }

    /// Checks `apiVersion` and `kind` of a request body against the endpoint, and sets them.
    fn check_type(res: &ResourceDef, version: &str, object: &mut Value) -> Result<(), ApiError> {
        let Some(map) = object.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON or YAML object",
            ));
        };
        let expected = res.api_version(version);
        match map.get("apiVersion") {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v.is_empty() || *v == expected => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({expected})",
                    other.as_str().unwrap_or("not a string")
                )))
            }
        }
        match map.get("kind") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k.is_empty() || *k == res.kind => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    other.as_str().unwrap_or("not a string"),
                    res.kind
                )))
            }
        }
        map.insert("apiVersion".into(), json!(expected));
        map.insert("kind".into(), json!(res.kind));
        match map.get("metadata") {
            None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err(ApiError::bad_request("metadata must be an object")),
        }
    }

    /// What the registry strategies add on create and update.
    fn prepare(
        &self,
        res: &ResourceDef,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let name = meta_str(object, "name").unwrap_or_default().to_string();
        if res.is_namespaces() {
            if let Some(meta) = metadata_mut(object) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if !labels.is_object() {
                    *labels = json!({});
                }
                labels["kubernetes.io/metadata.name"] = json!(name);
            }
            if let Some(map) = object.as_object_mut() {
                let spec = map.entry("spec").or_insert_with(|| json!({}));
                if spec.get("finalizers").is_none() && spec.is_object() {
                    spec["finalizers"] = json!(["kubernetes"]);
                }
                let status = map.entry("status").or_insert_with(|| json!({}));
                if status.get("phase").is_none() && status.is_object() {
                    status["phase"] = json!("Active");
                }
            }
        }
        if res.is_crds() {
            prepare_crd(object, old).map_err(|e| ApiError::invalid(res, &name, &e))?;
        }
        Ok(())
    }

    /// Creates an object (POST). `namespace` is the one of the request path, if any.
    pub(crate) fn create(
        &mut self,
        res: &ResourceDef,
        version: &str,
        namespace: Option<&str>,
        body: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut object = body;
        Self::check_type(res, version, &mut object)?;
        let name = match meta_str(&object, "name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match meta_str(&object, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => format!("{prefix}{}", self.random_suffix()),
                None => {
                    return Err(ApiError::invalid(
                        res,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ))
                }
            },
        };
        validate_name(res, &name).map_err(|e| ApiError::invalid(res, &name, &e))?;
        let body_ns = meta_str(&object, "namespace").filter(|n| !n.is_empty());
        let ns = if res.namespaced {
            let ns = match (namespace, body_ns) {
                (Some(path), Some(body)) if path != body => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                (Some(ns), _) | (None, Some(ns)) => ns.to_string(),
                (None, None) => return Err(ApiError::bad_request("a namespace is required to create this object")),
            };
            let namespaces = self
                .resource("", "namespaces")
                .ok_or_else(ApiError::no_route)?;
            if self
                .stored(&namespaces, &(String::new(), ns.clone()))
                .is_none()
            {
                return Err(ApiError::not_found(&namespaces, &ns));
            }
            Some(ns)
        } else {
            None
        };
        if meta_str(&object, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = res.key(ns.as_deref(), &name);
        if self.stored(res, &key).is_some() {
            return Err(ApiError::already_exists(res, &name));
        }
        let uid = self.uid();
        if let Some(meta) = metadata_mut(&mut object) {
            meta.insert("name".into(), json!(name));
            match &ns {
                Some(ns) => meta.insert("namespace".into(), json!(ns)),
                None => meta.remove("namespace"),
            };
            meta.insert("uid".into(), json!(uid));
            meta.insert("creationTimestamp".into(), json!(now()));
            meta.insert("generation".into(), json!(1));
            for field in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
            ] {
                meta.remove(field);
            }
        }
        self.prepare(res, &mut object, None)?;
        if dry_run {
            return Ok(object);
        }
        Ok(self.commit(res.gr(), key, EventKind::Added, Some(object), None))
    }

    /// Replaces an object (PUT), or only its status (`status_only`, PUT to `/status`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        res: &ResourceDef,
        version: &str,
        namespace: Option<&str>,
        name: &str,
        body: Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let key = res.key(namespace, name);
        let existing = self
            .stored(res, &key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let mut object = body;
        Self::check_type(res, version, &mut object)?;
        if let Some(body_name) = meta_str(&object, "name").filter(|n| !n.is_empty()) {
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let Some(body_ns) = meta_str(&object, "namespace").filter(|n| !n.is_empty()) {
            if res.namespaced && Some(body_ns) != namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        let current_rv = meta_str(&existing, "resourceVersion")
            .unwrap_or_default()
            .to_string();
        if let Some(rv) = meta_str(&object, "resourceVersion").filter(|rv| !rv.is_empty()) {
            parse_rv(rv)?;
            if rv != current_rv {
                return Err(ApiError::conflict(
                    res,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
        }
        let existing_uid = meta_str(&existing, "uid").unwrap_or_default().to_string();
        if let Some(uid) = meta_str(&object, "uid").filter(|u| !u.is_empty()) {
            if uid != existing_uid {
                return Err(ApiError::conflict(
                    res,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {existing_uid}"),
                ));
            }
        }
        let mut new = if status_only {
            let mut new = present(&existing, res, version);
            if let Some(map) = new.as_object_mut() {
                match object.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.remove("status"),
                };
            }
            new
        } else {
            if let (Some(map), Some(status)) = (object.as_object_mut(), existing.get("status")) {
                map.entry("status").or_insert_with(|| status.clone());
            }
            object
        };
        if let Some(meta) = metadata_mut(&mut new) {
            meta.insert("name".into(), json!(name));
            if let Some(ns) = namespace.filter(|_| res.namespaced) {
                meta.insert("namespace".into(), json!(ns));
            }
            for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                match existing.pointer(&format!("/metadata/{field}")) {
                    Some(v) => meta.insert(field.into(), v.clone()),
                    None => meta.remove(field),
                };
            }
        }
        self.prepare(res, &mut new, Some(&existing))?;
        if generation_relevant(&new) != generation_relevant(&existing) {
            let generation = existing
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            set_meta(&mut new, "generation", json!(generation + 1));
        }
        let unchanged = {
            let mut a = new.clone();
            let mut b = existing.clone();
            for o in [&mut a, &mut b] {
                if let Some(map) = o.as_object_mut() {
                    map.remove("apiVersion");
                }
            }
            a == b
        };
        if unchanged || dry_run {
            return Ok(new);
        }
        Ok(self.commit(
            res.gr(),
            key,
            EventKind::Modified,
            Some(new),
            Some(existing),
        ))
    }

    /// Patches an object (PATCH), or only its status. An apply patch creates the object when
    /// it does not exist; the flag says whether it did.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &mut self,
        res: &ResourceDef,
        version: &str,
        namespace: Option<&str>,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        status_only: bool,
        dry_run: bool,
    ) -> Result<(Value, bool), ApiError> {
        let key = res.key(namespace, name);
        let existing = self.stored(res, &key).map(|e| present(e, res, version));
        let patched = match kind {
            PatchKind::Apply => {
                let applied: Value = std::str::from_utf8(body)
                    .map_err(|e| e.to_string())
                    .and_then(|text| shoal_common::yaml::from_str(text).map_err(|e| e.to_string()))
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                if !applied.is_object() {
                    return Err(ApiError::bad_request("an apply patch must be an object"));
                }
                let Some(mut merged) = existing else {
                    if status_only {
                        return Err(ApiError::not_found(res, name));
                    }
                    let mut object = applied;
                    if let Some(body_name) = meta_str(&object, "name").filter(|n| *n != name) {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({body_name}) does not match the name on the URL ({name})"
                        )));
                    }
                    set_meta(&mut object, "name", json!(name));
                    return Ok((self.create(res, version, namespace, object, dry_run)?, true));
                };
                patch::merge_patch(&mut merged, &applied);
                merged
            }
            PatchKind::Merge | PatchKind::Strategic => {
                let doc: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut patched = existing.ok_or_else(|| ApiError::not_found(res, name))?;
                patch::merge_patch(&mut patched, &doc);
                patched
            }
            PatchKind::Json => {
                let doc: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut patched = existing.ok_or_else(|| ApiError::not_found(res, name))?;
                patch::json_patch(&mut patched, &doc).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
                patched
            }
        };
        Ok((
            self.update(res, version, namespace, name, patched, status_only, dry_run)?,
            false,
        ))
    }

    /// Deletes an object right away; deleting a namespace deletes everything in it, deleting
    /// a CRD deletes all its custom resources (each with its own DELETED event).
    pub(crate) fn delete(
        &mut self,
        res: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let key = res.key(namespace, name);
        let existing = self
            .stored(res, &key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let check = |what: &str, wanted: &Option<String>, field: &str| match wanted {
            Some(w) if Some(w.as_str()) != meta_str(&existing, field) => Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: {what} in precondition: {w}, {what} in object meta: {}",
                    meta_str(&existing, field).unwrap_or_default()
                ),
            )),
            _ => Ok(()),
        };
        check("UID", &preconditions.uid, "uid")?;
        check(
            "ResourceVersion",
            &preconditions.resource_version,
            "resourceVersion",
        )?;
        if res.is_namespaces() && ["default", "kube-system", "kube-public"].contains(&name) {
            return Err(ApiError::forbidden(
                res,
                name,
                "this namespace may not be deleted",
            ));
        }
        if dry_run {
            return Ok(existing);
        }
        let mut cascade: Vec<(GroupResource, ObjectKey)> = Vec::new();
        if res.is_namespaces() {
            for (gr, objects) in &self.objects {
                cascade.extend(
                    objects
                        .keys()
                        .filter(|k| k.0 == name)
                        .map(|k| (gr.clone(), k.clone())),
                );
            }
        }
        if res.is_crds() {
            if let Some(cr) = crd_resource(&existing) {
                let gr = cr.gr();
                let keys = self
                    .objects
                    .get(&gr)
                    .into_iter()
                    .flat_map(|m| m.keys().cloned());
                cascade.extend(keys.map(|k| (gr.clone(), k)));
            }
        }
        for (gr, key) in cascade {
            let prev = self.objects.get(&gr).and_then(|m| m.get(&key)).cloned();
            self.commit(gr, key, EventKind::Deleted, None, prev);
        }
        Ok(self.commit(res.gr(), key, EventKind::Deleted, None, Some(existing)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut v = vec![
            "v1alpha3", "foo", "v1beta1", "v1", "v2", "v10beta3", "v1alpha1", "bar",
        ];
        v.sort_by(|a, b| version_priority(a, b));
        assert_eq!(
            v,
            ["v2", "v1", "v10beta3", "v1beta1", "v1alpha3", "v1alpha1", "bar", "foo"]
        );
    }

    #[test]
    fn snapshots_undo_later_events_and_expire_after_compaction() {
        let mut store = Store::new(100);
        let ns = store.resource("", "namespaces").unwrap();
        let a = store
            .create(&ns, "v1", None, json!({"metadata": {"name": "a"}}), false)
            .unwrap();
        let at = store.revision();
        store
            .create(&ns, "v1", None, json!({"metadata": {"name": "b"}}), false)
            .unwrap();
        let mut relabeled = a.clone();
        relabeled["metadata"]["labels"]["x"] = json!("y");
        store
            .update(&ns, "v1", None, "a", relabeled, false, false)
            .unwrap();
        let page = store
            .list(&ns, &Filter::default(), Some(at), None, None)
            .unwrap();
        assert_eq!(page.items, vec![a]);
        assert_eq!(
            store
                .list(&ns, &Filter::default(), None, None, None)
                .unwrap()
                .items
                .len(),
            2
        );
        store.compact();
        let err = store
            .list(&ns, &Filter::default(), Some(at), None, None)
            .err()
            .unwrap();
        assert_eq!(err.code, 410);
    }

    #[test]
    fn history_is_bounded() {
        let mut store = Store::new(2);
        let ns = store.resource("", "namespaces").unwrap();
        for name in ["a", "b", "c", "d"] {
            store
                .create(&ns, "v1", None, json!({"metadata": {"name": name}}), false)
                .unwrap();
        }
        assert_eq!(store.events_after(0).count(), 2);
        assert_eq!(store.oldest(), 2);
    }
}
