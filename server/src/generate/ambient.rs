//! Ambient mode's layer 4: what ztunnel reads. Two types, one mesh-wide view (every
//! ztunnel gets every address and policy, as from istiod):
//!
//! - `istio.workload.Address`: a `Workload` per pod behind a Kubernetes service (named
//!   `<cluster>//Pod/<namespace>/<pod>`; pods behind no Service too), per WorkloadEntry
//!   (`<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>`), per ServiceEntry
//!   endpoint (`<cluster>/networking.istio.io/ServiceEntry/<namespace>/<name>/<address>`),
//!   and a `Service`
//!   per Kubernetes service or ServiceEntry host (named `<namespace>/<hostname>`);
//! - `istio.security.Authorization`: each ALLOW or DENY AuthorizationPolicy (named
//!   `<namespace>/<name>`), converted as istiod's ambient index converts it
//!   (`pilot/pkg/serviceregistry/ambient/authorization.go`): what layer 4 cannot enforce
//!   fails closed — an ALLOW rule with HTTP fields is dropped (it matches nothing), a DENY
//!   rule keeps only its layer 4 parts (it denies more).
//!
//! A stream subscribed to `*` gets everything; an on-demand ztunnel (`XDS_ON_DEMAND`)
//! names resources, by their name or by `<network>/<ip>` (the workload or service with
//! that address, served under its own name with its `<network>/<ip>` names as delta
//! `aliases`, as istiod's `WorkloadGenerator` sends them).

use super::Resource;
use crate::index::config::Config;
use crate::index::endpoints::EndpointIndex;
use crate::index::hosts::labels_match;
use crate::index::push_context::PushContext;
use crate::index::service::{ServiceSource, ServiceView};
use shoal_common::model::{
    AuthorizationAction, AuthorizationPolicy, Resolution, ServiceEntry, TargetPort, WorkloadEntry,
    AMBIENT_REDIRECTION_ANNOTATION,
};
use shoal_proto::istio_workload as pb;
use shoal_proto::XdsType;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// The name a wildcard subscription is generated under (see `xds::delta`): every resource.
pub const WILDCARD: &str = "*";

/// The inputs of one ambient resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AmbientKey {
    /// A pod.
    Workload(Arc<WorkloadKey>),
    /// A Kubernetes service or a ServiceEntry host.
    Service(Arc<ServiceKey>),
    /// An AuthorizationPolicy.
    Authorization(Arc<AuthorizationKey>),
}

impl AmbientKey {
    fn name(&self) -> String {
        match self {
            AmbientKey::Workload(w) => w.uid(),
            AmbientKey::Service(s) => format!("{}/{}", s.namespace, s.hostname),
            AmbientKey::Authorization(a) => format!("{}/{}", a.namespace, a.name),
        }
    }

    /// Whether a requested on-demand name asks for this resource: its own name, or
    /// `<network>/<ip>` for one of its addresses (istiod's `Lookup`). A workload of the
    /// default (empty) network, which every pod is to shoal, answers an address in any
    /// network; one with a network of its own (a WorkloadEntry's `network`) only in it.
    fn requested_by(&self, name: &str, resource_name: &str) -> bool {
        if name == resource_name {
            return true;
        }
        if name.starts_with(NODE_PREFIX) {
            return false;
        }
        let Some((network, ip)) = name.split_once('/') else {
            return false;
        };
        match self {
            AmbientKey::Workload(w) => {
                (w.network.is_empty() || w.network == network)
                    && w.addresses.iter().any(|a| a == ip)
            }
            AmbientKey::Service(s) => s.addresses.iter().any(|a| a == ip),
            AmbientKey::Authorization(_) => false,
        }
    }
}

/// What a workload is made from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum WorkloadSource {
    /// A pod (its endpoints).
    #[default]
    Pod,
    /// A WorkloadEntry.
    WorkloadEntry,
    /// One of a ServiceEntry's endpoints, by its address as written (or, for a DNS entry
    /// without endpoints, one of its hosts).
    ServiceEntry(String),
}

/// A pod, as the endpoints of the services it is behind describe it, or a WorkloadEntry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WorkloadKey {
    /// Pod or WorkloadEntry.
    pub source: WorkloadSource,
    /// The cluster it runs in.
    pub cluster: String,
    /// Namespace.
    pub namespace: String,
    /// Pod or WorkloadEntry name.
    pub name: String,
    /// The name of its workload (the pod's own name; a WorkloadEntry's
    /// `service.istio.io/workload-name` label, else its name).
    pub workload_name: String,
    /// IPs.
    pub addresses: Vec<String>,
    /// A DNS name instead of addresses (a WorkloadEntry whose address is not an IP).
    pub hostname: String,
    /// Its network: empty (the default network) for pods, a WorkloadEntry's `network`.
    pub network: String,
    /// istio-cni redirected it to ztunnel (for a WorkloadEntry: it carries the annotation
    /// itself): reached over HBONE.
    pub ambient: bool,
    /// It says it terminates HBONE itself (`networking.istio.io/tunnel` lists `http`);
    /// not honoured, see [`workload`].
    pub native_tunnel: bool,
    /// Service account (a pod's is `default` when empty; a WorkloadEntry's is sent as
    /// given, as istiod does: ztunnel reads an empty one as `default`).
    pub service_account: String,
    /// Node.
    pub node: String,
    /// The mesh's trust domain.
    pub trust_domain: String,
    /// Ready in every slice it is in (a WorkloadEntry is always healthy, as in istiod).
    pub ready: bool,
    /// Canonical service name and revision (telemetry).
    pub canonical: (String, String),
    /// `<ns>/<hostname>` → (service port, target port).
    pub services: BTreeMap<String, BTreeSet<(u32, u32)>>,
    /// `<ns>/<name>` of the workload-selector policies that select it.
    pub authorization_policies: Vec<String>,
    /// Sent to an on-demand ztunnel: with its `<network>/<ip>` names as aliases.
    pub aliases: bool,
}

impl WorkloadKey {
    /// istiod's workload uid.
    pub fn uid(&self) -> String {
        match &self.source {
            WorkloadSource::Pod => {
                format!("{}//Pod/{}/{}", self.cluster, self.namespace, self.name)
            }
            WorkloadSource::WorkloadEntry => format!(
                "{}/networking.istio.io/WorkloadEntry/{}/{}",
                self.cluster, self.namespace, self.name
            ),
            WorkloadSource::ServiceEntry(address) => format!(
                "{}/networking.istio.io/ServiceEntry/{}/{}/{}",
                self.cluster, self.namespace, self.name, address
            ),
        }
    }
}

/// A Kubernetes service or a ServiceEntry host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    /// Service name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// FQDN.
    pub hostname: String,
    /// ClusterIPs of every cluster, sorted.
    pub addresses: Vec<String>,
    /// (port, target port number; 0 when the target port is named or absent).
    pub ports: Vec<(u32, u32)>,
    /// Sent to an on-demand ztunnel: with its `<network>/<ip>` names as aliases.
    pub aliases: bool,
}

/// An AuthorizationPolicy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AuthorizationKey {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The mesh's root namespace (a policy there without a selector is global).
    pub root_namespace: String,
    /// The policy.
    pub spec: AuthorizationPolicy,
}

/// The keys of `ty` for a ztunnel: everything when `names` holds [`WILDCARD`], else the
/// named resources. Other types have none.
pub fn keys(
    ty: XdsType,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
    names: &[String],
) -> Vec<AmbientKey> {
    let wildcard = names.iter().any(|n| n == WILDCARD);
    // istiod names an on-demand answer's other names (`aliases`); a wildcard one has none.
    let aliases = !wildcard;
    let all: Vec<AmbientKey> = match ty {
        XdsType::Address => {
            let mut keys: Vec<AmbientKey> = workloads(ctx, endpoints, aliases)
                .into_iter()
                .map(|w| AmbientKey::Workload(Arc::new(w)))
                .collect();
            keys.extend(services(ctx, aliases).map(|s| AmbientKey::Service(Arc::new(s))));
            keys
        }
        XdsType::Authorization => authorizations(ctx)
            .map(|a| AmbientKey::Authorization(Arc::new(a)))
            .collect(),
        _ => return Vec::new(),
    };
    if wildcard {
        return all;
    }
    // What istiod sends an on-demand ztunnel unasked: the workloads of its node, and the
    // workloads behind the Services it asked for (by name or by address, as istiod's
    // `Lookup` answers a service with its workloads).
    let nodes: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix(NODE_PREFIX))
        .collect();
    let asked: Vec<bool> = all
        .iter()
        .map(|k| {
            let own = k.name();
            names.iter().any(|n| k.requested_by(n, &own))
        })
        .collect();
    let services: BTreeSet<String> = all
        .iter()
        .zip(&asked)
        .filter(|(k, asked)| **asked && matches!(k, AmbientKey::Service(_)))
        .map(|(k, _)| k.name())
        .collect();
    all.into_iter()
        .zip(asked)
        .filter(|(k, asked)| {
            *asked
                || match k {
                    AmbientKey::Workload(w) => {
                        nodes.contains(&w.node.as_str())
                            || w.services.keys().any(|s| services.contains(s))
                    }
                    _ => false,
                }
        })
        .map(|(k, _)| k)
        .collect()
}

/// Names an on-demand ztunnel's subscription is given for its node (see
/// `Session::intern`); no resource has a name of this form.
const NODE_PREFIX: &str = "\u{0}node/";

/// The subscription name that selects the workloads on `node`.
pub fn node_name(node: &str) -> String {
    format!("{NODE_PREFIX}{node}")
}

/// Builds a resource from its key.
pub fn build(key: &AmbientKey) -> Resource {
    let name = key.name();
    match key {
        AmbientKey::Workload(w) => address(
            name,
            pb::address::Type::Workload(workload(w)),
            w.aliases.then(|| alias_names(&w.network, &w.addresses)),
        ),
        AmbientKey::Service(s) => address(
            name,
            pb::address::Type::Service(service(s)),
            s.aliases.then(|| alias_names("", &s.addresses)),
        ),
        AmbientKey::Authorization(a) => {
            Resource::new(XdsType::Authorization, name, &authorization(a))
        }
    }
}

/// An `Address` resource, with its on-demand aliases if any.
fn address(name: String, address: pb::address::Type, aliases: Option<Vec<String>>) -> Resource {
    let r = Resource::new(
        XdsType::Address,
        name,
        &pb::Address {
            r#type: Some(address),
        },
    );
    match aliases {
        Some(aliases) => r.with_aliases(aliases),
        None => r,
    }
}

/// istiod's `AddressInfo.Aliases`: `<network>/<ip>` for each address, the IP written as
/// ztunnel writes it when it asks.
fn alias_names(network: &str, addresses: &[String]) -> Vec<String> {
    addresses
        .iter()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| format!("{network}/{ip}"))
        .collect()
}

/// The pods behind Kubernetes services, one workload per (cluster, namespace, pod);
/// endpoints without a pod name (not from a pod) are left out. Then the WorkloadEntries.
/// A ServiceEntry's `workloadSelector` puts its host in the `services` of the pods and
/// WorkloadEntries of its namespace it selects; a Kubernetes Service's selector, in those
/// of the WorkloadEntries (its pods come with its EndpointSlices), as istiod's ambient
/// index does (`PILOT_ENABLE_SERVICEENTRY_SELECT_PODS`,
/// `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`, both on by default).
fn workloads(ctx: &PushContext, endpoints: &EndpointIndex, aliases: bool) -> Vec<WorkloadKey> {
    let selecting = selecting_services(ctx);
    // By (cluster, namespace, pod): the workload and its pod's labels.
    let mut out: BTreeMap<(String, String, String), (WorkloadKey, &Labels)> = BTreeMap::new();
    for (host, shards) in endpoints.iter() {
        let service = ctx.services.get(host);
        for set in shards.values() {
            for ep in &set.endpoints {
                if ep.pod.is_empty() {
                    continue;
                }
                let id = (set.cluster.clone(), set.namespace.clone(), ep.pod.clone());
                let (w, _) = out.entry(id).or_insert_with(|| {
                    let w = WorkloadKey {
                        source: WorkloadSource::Pod,
                        cluster: set.cluster.clone(),
                        namespace: set.namespace.clone(),
                        name: ep.pod.clone(),
                        workload_name: ep.pod.clone(),
                        ambient: ep.ambient,
                        native_tunnel: supports_http_tunnel(&ep.labels),
                        service_account: if ep.service_account.is_empty() {
                            "default".to_string()
                        } else {
                            ep.service_account.clone()
                        },
                        node: ep.node.clone(),
                        trust_domain: ctx.mesh.trust_domain.clone(),
                        ready: true,
                        canonical: canonical(&ep.labels, &ep.pod),
                        authorization_policies: selecting_policies(ctx, &set.namespace, &ep.labels),
                        aliases,
                        ..WorkloadKey::default()
                    };
                    (w, &ep.labels)
                });
                if !w.addresses.contains(&ep.address) {
                    w.addresses.push(ep.address.clone());
                    w.addresses.sort();
                }
                w.ready &= ep.ready;
                let Some(service) = service else { continue };
                let ports = w
                    .services
                    .entry(format!("{}/{}", service.namespace, service.hostname))
                    .or_default();
                // The slice's port of the same name is the target port of a service port.
                for sp in &service.ports {
                    let target = set
                        .ports
                        .iter()
                        .find(|p| p.name == sp.name)
                        .map(|p| u32::from(p.port))
                        .unwrap_or(0);
                    ports.insert((u32::from(sp.port), target));
                }
            }
        }
    }
    let mut workloads: Vec<WorkloadKey> = Vec::with_capacity(out.len());
    for (_, (mut w, labels)) in out {
        // Kubernetes Services select pods through their EndpointSlices (above).
        for svc in selecting.get(w.namespace.as_str()).into_iter().flatten() {
            if matches!(svc.source, ServiceSource::ServiceEntry { .. })
                && labels_match(&svc.selector, labels)
            {
                w.services
                    .entry(format!("{}/{}", svc.namespace, svc.hostname))
                    .or_default()
                    .extend(entry_ports(svc, None));
            }
        }
        workloads.push(w);
    }
    workloads.extend(
        ctx.workload_entries
            .iter()
            .filter_map(|we| workload_entry(ctx, &selecting, we, aliases)),
    );
    for se in &ctx.service_entries {
        workloads.extend(service_entry_workloads(ctx, se, aliases));
    }
    workloads
}

/// A ServiceEntry's inline endpoints as workloads, as istiod's
/// `serviceEntryWorkloadBuilder`: each behind every host of the entry, with the entry's
/// name, labels (canonical names, policies, tunnel) and namespace, and the endpoint's
/// address, network, service account and ports. A DNS entry without endpoints or
/// `workloadSelector` has one implicit endpoint per host: the host itself, as a hostname
/// workload behind that host only (ztunnel resolves it). A host whose served definition is
/// not a ServiceEntry of this namespace (a Kubernetes Service, or a definition kept from
/// another namespace) is not one of the entry's services; an entry left with none has no
/// workloads (istiod: "pruned by deduplication").
fn service_entry_workloads(
    ctx: &PushContext,
    se: &Config<ServiceEntry>,
    aliases: bool,
) -> Vec<WorkloadKey> {
    let spec = &se.spec;
    let implicit = spec.endpoints.is_empty()
        && matches!(
            spec.resolution,
            Some(Resolution::Dns | Resolution::DnsRoundRobin)
        )
        && spec.workload_selector.is_none();
    if spec.endpoints.is_empty() && !implicit {
        return Vec::new();
    }
    let namespace = &se.meta.namespace;
    let services: Vec<&ServiceView> = spec
        .hosts
        .iter()
        .filter_map(|h| ctx.services.get(h))
        .filter(|s| {
            s.namespace == *namespace && matches!(s.source, ServiceSource::ServiceEntry { .. })
        })
        .map(|s| &**s)
        .collect();
    let endpoints: Vec<(WorkloadEntry, Vec<&ServiceView>)> = if implicit {
        services
            .iter()
            .map(|s| {
                let ep = WorkloadEntry {
                    address: s.hostname.clone(),
                    ..WorkloadEntry::default()
                };
                (ep, vec![*s])
            })
            .collect()
    } else if services.is_empty() {
        Vec::new()
    } else {
        spec.endpoints
            .iter()
            .map(|ep| (ep.clone(), services.clone()))
            .collect()
    };
    let labels = &se.meta.labels;
    let policies = selecting_policies(ctx, namespace, labels);
    endpoints
        .into_iter()
        .filter(|(ep, _)| !ep.address.is_empty())
        .map(|(ep, services)| {
            let (addresses, hostname) = match ep.address.parse::<IpAddr>() {
                Ok(ip) => (vec![ip.to_string()], String::new()),
                Err(_) => (Vec::new(), ep.address.clone()),
            };
            WorkloadKey {
                source: WorkloadSource::ServiceEntry(ep.address.clone()),
                cluster: shoal_common::defaults::CLUSTER_ID.to_string(),
                namespace: namespace.clone(),
                name: se.meta.name.clone(),
                workload_name: se.meta.name.clone(),
                canonical: canonical(labels, &se.meta.name),
                addresses,
                hostname,
                network: ep.network.clone().unwrap_or_default(),
                ambient: se
                    .meta
                    .annotations
                    .get(AMBIENT_REDIRECTION_ANNOTATION)
                    .is_some_and(|v| v == "enabled"),
                native_tunnel: supports_http_tunnel(labels),
                service_account: ep.service_account.clone().unwrap_or_default(),
                node: String::new(),
                trust_domain: ctx.mesh.trust_domain.clone(),
                ready: true,
                services: services
                    .iter()
                    .map(|svc| {
                        (
                            format!("{}/{}", svc.namespace, svc.hostname),
                            entry_ports(svc, Some(&ep.ports)),
                        )
                    })
                    .collect(),
                authorization_policies: policies.clone(),
                aliases,
            }
        })
        .collect()
}

type Labels = BTreeMap<String, String>;

/// The services of each namespace that select their workloads by labels: Kubernetes
/// Services by `selector`, ServiceEntries by `workloadSelector`. An empty selector selects
/// nothing (istiod's `FilterSelectsNonEmpty`).
fn selecting_services(ctx: &PushContext) -> BTreeMap<&str, Vec<&ServiceView>> {
    let mut out: BTreeMap<&str, Vec<&ServiceView>> = BTreeMap::new();
    for svc in ctx.services.values() {
        if !svc.selector.is_empty() {
            out.entry(svc.namespace.as_str()).or_default().push(svc);
        }
    }
    out
}

/// The (service port, target port) pairs of `svc` for a workload with named `ports` (a
/// WorkloadEntry's; `None` for a pod, whose container ports shoal does not keep), as
/// istiod's `constructServicesFromWorkloadEntry` / `constructServices`: a ServiceEntry
/// port goes to the workload port of its name, else its `targetPort`, else itself; a
/// Service port with a named `targetPort` to the workload port of that name (left out if
/// the workload has none), else to the workload port named like the service port, else
/// to its numeric `targetPort` (the port itself when unset).
fn entry_ports(svc: &ServiceView, ports: Option<&BTreeMap<String, u32>>) -> BTreeSet<(u32, u32)> {
    let named = |name: &str| ports.and_then(|p| p.get(name).copied());
    let mut out = BTreeSet::new();
    for p in &svc.ports {
        let port = u32::from(p.port);
        let target = match (&svc.source, &p.target_port) {
            (ServiceSource::ServiceEntry { .. }, _) => named(&p.name).unwrap_or_else(|| {
                svc.target_ports
                    .get(&p.port)
                    .map_or(port, |t| u32::from(*t))
            }),
            (ServiceSource::Kubernetes, Some(TargetPort::Name(n))) => match named(n) {
                Some(t) => t,
                None => continue,
            },
            (ServiceSource::Kubernetes, Some(TargetPort::Number(n))) => {
                named(&p.name).unwrap_or(u32::from(*n))
            }
            (ServiceSource::Kubernetes, None) => named(&p.name).unwrap_or(port),
        };
        out.insert((port, target));
    }
    out
}

/// The label a WorkloadEntry names its workload by (istiod's
/// `WorkloadNameFromWorkloadEntry`).
const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

/// A WorkloadEntry as istiod's ambient index serves it (`workloadEntryWorkloadBuilder`).
/// Its cluster is the default cluster ID: config on the bus belongs to no cluster, and
/// istiod names a WorkloadEntry by its config cluster, the local one by default. One
/// without an address is left out (ztunnel refuses a workload with neither an address
/// nor a hostname, and refusing one resource keeps it unready).
fn workload_entry(
    ctx: &PushContext,
    selecting: &BTreeMap<&str, Vec<&ServiceView>>,
    we: &Config<WorkloadEntry>,
    aliases: bool,
) -> Option<WorkloadKey> {
    let spec = &we.spec;
    if spec.address.is_empty() {
        return None;
    }
    let (addresses, hostname) = match spec.address.parse::<IpAddr>() {
        Ok(ip) => (vec![ip.to_string()], String::new()),
        Err(_) => (Vec::new(), spec.address.clone()),
    };
    let namespace = &we.meta.namespace;
    let services = selecting
        .get(namespace.as_str())
        .into_iter()
        .flatten()
        .filter(|svc| labels_match(&svc.selector, &spec.labels))
        .map(|svc| {
            (
                format!("{}/{}", svc.namespace, svc.hostname),
                entry_ports(svc, Some(&spec.ports)),
            )
        })
        .collect();
    let workload_name = spec
        .labels
        .get(WORKLOAD_NAME_LABEL)
        .cloned()
        .unwrap_or_else(|| we.meta.name.clone());
    Some(WorkloadKey {
        source: WorkloadSource::WorkloadEntry,
        cluster: shoal_common::defaults::CLUSTER_ID.to_string(),
        namespace: namespace.clone(),
        name: we.meta.name.clone(),
        canonical: canonical(&spec.labels, &workload_name),
        workload_name,
        addresses,
        hostname,
        network: spec.network.clone().unwrap_or_default(),
        ambient: we
            .meta
            .annotations
            .get(AMBIENT_REDIRECTION_ANNOTATION)
            .is_some_and(|v| v == "enabled"),
        native_tunnel: supports_http_tunnel(&spec.labels),
        service_account: spec.service_account.clone().unwrap_or_default(),
        node: String::new(),
        trust_domain: ctx.mesh.trust_domain.clone(),
        ready: true,
        services,
        authorization_policies: selecting_policies(ctx, namespace, &spec.labels),
        aliases,
    })
}

/// istiod's canonical service labels, else the `app`/`version` labels, else the pod name
/// and `latest`.
fn canonical(labels: &BTreeMap<String, String>, pod: &str) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    (
        first(&[
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ])
        .unwrap_or_else(|| pod.to_string()),
        first(&[
            "service.istio.io/canonical-revision",
            "app.kubernetes.io/version",
            "version",
        ])
        .unwrap_or_else(|| "latest".to_string()),
    )
}

/// The ALLOW/DENY policies with a selector that selects the workload's labels, of its
/// namespace and of the root namespace (istiod's `buildWorkloadPolicies`, as sidecars get
/// them in `generate::authz`), sorted by name. ztunnel applies a workload-selector policy
/// only to the workloads that list it: one left out is not enforced.
fn selecting_policies(
    ctx: &PushContext,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    let root = ctx.mesh.root_namespace.as_str();
    let namespaces: &[&str] = if namespace == root {
        &[root]
    } else {
        &[root, namespace]
    };
    let mut out: Vec<String> = namespaces
        .iter()
        .flat_map(|ns| ctx.authorization_policies.get(*ns).into_iter().flatten())
        .filter(|p| converted(&p.spec))
        .filter(|p| {
            p.spec
                .selector
                .as_ref()
                .is_some_and(|s| labels_match(&s.match_labels, labels))
        })
        .map(|p| format!("{}/{}", p.meta.namespace, p.meta.name))
        .collect();
    out.sort();
    out
}

/// Kubernetes services and ServiceEntry hosts (istiod's ambient index serves both: a
/// ServiceEntry host is a `Service` named `<ns>/<host>` with the entry's addresses).
/// A host a Kubernetes Service already has, or one defined again in another namespace,
/// is served once, as the push context keeps it.
fn services(ctx: &PushContext, aliases: bool) -> impl Iterator<Item = ServiceKey> + '_ {
    ctx.services.values().map(move |s| {
        let mut addresses: Vec<String> = match s.source {
            ServiceSource::Kubernetes => s.cluster_vips.values().flatten().cloned().collect(),
            ServiceSource::ServiceEntry { .. } => s.vips.clone(),
        };
        addresses.sort();
        addresses.dedup();
        ServiceKey {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            hostname: s.hostname.clone(),
            addresses,
            ports: s
                .ports
                .iter()
                .map(|p| {
                    let target = match &p.target_port {
                        Some(TargetPort::Number(n)) => u32::from(*n),
                        Some(TargetPort::Name(_)) => 0,
                        // A ServiceEntry's `targetPort`, where it has one.
                        None => s.target_ports.get(&p.port).map_or(0, |t| u32::from(*t)),
                    };
                    (u32::from(p.port), target)
                })
                .collect(),
            aliases,
        }
    })
}

/// Whether a policy is served to ztunnel: istiod converts ALLOW and DENY only (AUDIT and
/// CUSTOM need a waypoint).
fn converted(p: &AuthorizationPolicy) -> bool {
    matches!(
        p.action,
        AuthorizationAction::Allow | AuthorizationAction::Deny
    )
}

fn authorizations(ctx: &PushContext) -> impl Iterator<Item = AuthorizationKey> + '_ {
    ctx.authorization_policies
        .values()
        .flatten()
        .filter(|p| converted(&p.spec))
        .map(|p| AuthorizationKey {
            name: p.meta.name.clone(),
            namespace: p.meta.namespace.clone(),
            root_namespace: ctx.mesh.root_namespace.clone(),
            spec: p.spec.clone(),
        })
}

fn ip_bytes(ip: &str) -> Option<Vec<u8>> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => Some(v4.octets().to_vec()),
        IpAddr::V6(v6) => Some(v6.octets().to_vec()),
    }
}

fn port_list(ports: &BTreeSet<(u32, u32)>) -> pb::PortList {
    pb::PortList {
        ports: ports
            .iter()
            .map(|(service_port, target_port)| pb::Port {
                service_port: *service_port,
                target_port: *target_port,
            })
            .collect(),
    }
}

/// The pod label a workload that terminates HBONE itself carries (istiod's
/// `model.TunnelLabel`): a comma-separated list of tunnel types.
const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";

/// istiod's `SupportsTunnel(labels, "http")`.
fn supports_http_tunnel(labels: &BTreeMap<String, String>) -> bool {
    labels
        .get(TUNNEL_LABEL)
        .is_some_and(|v| v.split(',').any(|t| t == "http"))
}

/// istiod's `setTunnelProtocol`, less native tunnels: HBONE when istio-cni redirected
/// the pod (its annotation; a WorkloadEntry carrying the same annotation is HBONE too,
/// as in istiod). Namespace enrollment (`istio.io/dataplane-mode`) is
/// istio-cni's decision, seen here through the annotation it sets once the redirection
/// is in place, as istiod sees it.
///
/// istiod also serves a pod labelled `networking.istio.io/tunnel: http` (the sidecar
/// injector's label when `ISTIO_META_ENABLE_HBONE` is set) as HBONE with
/// `native_tunnel`: ztunnel then sends to the sidecar's HBONE listener on 15008. shoal
/// builds no such listener for sidecars, so serving istiod's answer would send
/// ztunnel's traffic to a port nothing terminates; the pod is served as plain (no
/// tunnel), which a PERMISSIVE sidecar accepts, and the difference is logged.
fn workload(w: &WorkloadKey) -> pb::Workload {
    if w.native_tunnel && !w.ambient {
        tracing::debug!(
            workload = %w.uid(),
            "workload asks for native HBONE (networking.istio.io/tunnel), which shoal's sidecars do not terminate: served without a tunnel"
        );
    }
    let tunnel = if w.ambient {
        pb::TunnelProtocol::Hbone
    } else {
        pb::TunnelProtocol::None
    };
    let status = if w.ready {
        pb::WorkloadStatus::Healthy
    } else {
        pb::WorkloadStatus::Unhealthy
    };
    pb::Workload {
        uid: w.uid(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        addresses: w.addresses.iter().filter_map(|a| ip_bytes(a)).collect(),
        hostname: w.hostname.clone(),
        network: w.network.clone(),
        tunnel_protocol: tunnel as i32,
        native_tunnel: false,
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        node: w.node.clone(),
        canonical_name: w.canonical.0.clone(),
        canonical_revision: w.canonical.1.clone(),
        // istiod serves a WorkloadEntry as a pod too.
        workload_type: pb::WorkloadType::Pod as i32,
        workload_name: w.workload_name.clone(),
        authorization_policies: w.authorization_policies.clone(),
        status: status as i32,
        cluster_id: w.cluster.clone(),
        services: super::ordered_map(
            w.services
                .iter()
                .map(|(k, ports)| (k.clone(), port_list(ports)))
                .collect(),
        ),
    }
}

fn service(s: &ServiceKey) -> pb::Service {
    pb::Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        addresses: s
            .addresses
            .iter()
            .filter_map(|a| ip_bytes(a))
            .map(|address| pb::NetworkAddress {
                network: String::new(),
                address,
            })
            .collect(),
        ports: s
            .ports
            .iter()
            .map(|(service_port, target_port)| pb::Port {
                service_port: *service_port,
                target_port: *target_port,
            })
            .collect(),
        subject_alt_names: Vec::new(),
    }
}

/// The condition keys layer 4 can enforce.
const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

fn authorization(a: &AuthorizationKey) -> pb::Authorization {
    let spec = &a.spec;
    let scope = match &spec.selector {
        Some(_) => pb::Scope::WorkloadSelector,
        None if a.namespace == a.root_namespace => pb::Scope::Global,
        None => pb::Scope::Namespace,
    };
    let action = match spec.action {
        AuthorizationAction::Deny => pb::Action::Deny,
        _ => pb::Action::Allow,
    };
    let rules = spec
        .rules
        .iter()
        .filter_map(|r| rule(action, r, &a.namespace))
        .collect();
    pb::Authorization {
        name: a.name.clone(),
        namespace: a.namespace.clone(),
        scope: scope as i32,
        action: action as i32,
        rules,
    }
}

/// One rule as clauses (its `to`, its `from`, each condition); `None` for an ALLOW rule
/// with fields layer 4 cannot check (it must match nothing, not more).
fn rule(
    action: pb::Action,
    r: &shoal_common::model::AuthorizationRule,
    namespace: &str,
) -> Option<pb::Rule> {
    let mut l7 = false;
    let mut clauses = Vec::new();
    let to: Vec<pb::Match> =
        r.to.iter()
            .map(|t| {
                let op = &t.operation;
                l7 |= !(op.hosts.is_empty()
                    && op.not_hosts.is_empty()
                    && op.methods.is_empty()
                    && op.not_methods.is_empty()
                    && op.paths.is_empty()
                    && op.not_paths.is_empty());
                pb::Match {
                    destination_ports: ports(&op.ports),
                    not_destination_ports: ports(&op.not_ports),
                    ..Default::default()
                }
            })
            .collect();
    let from: Vec<pb::Match> = r
        .from
        .iter()
        .map(|f| {
            let s = &f.source;
            l7 |= !(s.request_principals.is_empty()
                && s.not_request_principals.is_empty()
                && s.remote_ip_blocks.is_empty());
            pb::Match {
                namespaces: strings(&s.namespaces),
                not_namespaces: strings(&s.not_namespaces),
                principals: strings(&s.principals),
                not_principals: strings(&s.not_principals),
                source_ips: ip_blocks(&s.ip_blocks),
                not_source_ips: ip_blocks(&s.not_ip_blocks),
                service_accounts: accounts(&s.service_accounts, namespace),
                not_service_accounts: accounts(&s.not_service_accounts, namespace),
                ..Default::default()
            }
        })
        .collect();
    if !to.is_empty() {
        clauses.push(pb::Clause { matches: to });
    }
    if !from.is_empty() {
        clauses.push(pb::Clause { matches: from });
    }
    for c in &r.when {
        l7 |= !L4_WHEN_KEYS.contains(&c.key.as_str());
        let pick = |key: &str, values: &[String]| -> Vec<String> {
            if c.key == key {
                values.to_vec()
            } else {
                Vec::new()
            }
        };
        clauses.push(pb::Clause {
            matches: vec![pb::Match {
                namespaces: strings(&pick("source.namespace", &c.values)),
                not_namespaces: strings(&pick("source.namespace", &c.not_values)),
                principals: strings(&pick("source.principal", &c.values)),
                not_principals: strings(&pick("source.principal", &c.not_values)),
                source_ips: ip_blocks(&pick("source.ip", &c.values)),
                not_source_ips: ip_blocks(&pick("source.ip", &c.not_values)),
                destination_ports: ports(&pick("destination.port", &c.values)),
                not_destination_ports: ports(&pick("destination.port", &c.not_values)),
                ..Default::default()
            }],
        });
    }
    if action == pb::Action::Allow && l7 {
        return None;
    }
    Some(pb::Rule { clauses })
}

/// Istio's string patterns: `*` any, `*x` suffix, `x*` prefix, else exact.
fn strings(values: &[String]) -> Vec<pb::StringMatch> {
    use pb::string_match::MatchType;
    values
        .iter()
        .map(|v| {
            let m = if v == "*" {
                MatchType::Presence(())
            } else if let Some(s) = v.strip_prefix('*') {
                MatchType::Suffix(s.to_string())
            } else if let Some(p) = v.strip_suffix('*') {
                MatchType::Prefix(p.to_string())
            } else {
                MatchType::Exact(v.clone())
            };
            pb::StringMatch {
                match_type: Some(m),
            }
        })
        .collect()
}

/// Port numbers; the ingester admits only numbers, anything else is skipped.
fn ports(values: &[String]) -> Vec<u32> {
    values
        .iter()
        .filter_map(|v| v.parse::<u16>().ok().map(u32::from))
        .collect()
}

/// `ip` or `ip/len`; malformed ones are skipped (the ingester rejects them).
fn ip_blocks(values: &[String]) -> Vec<pb::IpBlock> {
    values
        .iter()
        .filter_map(|v| {
            let (ip, len) = match v.split_once('/') {
                Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
                None => (v.as_str(), None),
            };
            let address = ip_bytes(ip)?;
            let length = len.unwrap_or(address.len() as u32 * 8);
            Some(pb::IpBlock { address, length })
        })
        .collect()
}

/// `ns/sa`, or `sa` in the policy's namespace.
fn accounts(values: &[String], namespace: &str) -> Vec<pb::ServiceAccountMatch> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => pb::ServiceAccountMatch {
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            },
            None => pb::ServiceAccountMatch {
                namespace: namespace.to_string(),
                service_account: v.clone(),
            },
        })
        .collect()
}
