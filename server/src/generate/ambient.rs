//! Ambient mode's layer 4: what ztunnel reads. Two types, one mesh-wide view (every
//! ztunnel gets every address and policy, as from istiod):
//!
//! - `istio.workload.Address`: a `Workload` per pod behind a Kubernetes service (named
//!   `<cluster>//Pod/<namespace>/<pod>`; pods behind no Service too) and a `Service` per
//!   Kubernetes service or ServiceEntry host (named `<namespace>/<hostname>`);
//! - `istio.security.Authorization`: each ALLOW or DENY AuthorizationPolicy (named
//!   `<namespace>/<name>`), converted as istiod's ambient index converts it
//!   (`pilot/pkg/serviceregistry/ambient/authorization.go`): what layer 4 cannot enforce
//!   fails closed — an ALLOW rule with HTTP fields is dropped (it matches nothing), a DENY
//!   rule keeps only its layer 4 parts (it denies more).
//!
//! A stream subscribed to `*` gets everything; an on-demand ztunnel (`XDS_ON_DEMAND`)
//! names resources, by their name or by `<network>/<ip>` (the workload or service with
//! that address, served under its own name).

use super::Resource;
use crate::index::endpoints::EndpointIndex;
use crate::index::push_context::PushContext;
use crate::index::service::ServiceSource;
use shoal_common::model::{AuthorizationAction, AuthorizationPolicy, TargetPort};
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

    /// Whether a requested on-demand name asks for this resource.
    fn requested_by(&self, name: &str, resource_name: &str) -> bool {
        if name == resource_name {
            return true;
        }
        if name.starts_with(NODE_PREFIX) {
            return false;
        }
        // `<network>/<ip>`: shoal knows one network, the default (empty) one.
        let Some(ip) = name.rsplit_once('/').map(|(_, ip)| ip) else {
            return false;
        };
        match self {
            AmbientKey::Workload(w) => w.addresses.iter().any(|a| a == ip),
            AmbientKey::Service(s) => s.addresses.iter().any(|a| a == ip),
            AmbientKey::Authorization(_) => false,
        }
    }
}

/// A pod, as the endpoints of the services it is behind describe it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WorkloadKey {
    /// The cluster it runs in.
    pub cluster: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod IPs.
    pub addresses: Vec<String>,
    /// istio-cni redirected it to ztunnel: reached over HBONE.
    pub ambient: bool,
    /// The pod says it terminates HBONE itself (`networking.istio.io/tunnel` lists
    /// `http`); not honoured, see [`workload`].
    pub native_tunnel: bool,
    /// Service account.
    pub service_account: String,
    /// Node.
    pub node: String,
    /// The mesh's trust domain.
    pub trust_domain: String,
    /// Ready in every slice it is in.
    pub ready: bool,
    /// Canonical service name and revision (telemetry).
    pub canonical: (String, String),
    /// `<ns>/<hostname>` → (service port, target port).
    pub services: BTreeMap<String, BTreeSet<(u32, u32)>>,
    /// `<ns>/<name>` of the workload-selector policies that select the pod.
    pub authorization_policies: Vec<String>,
}

impl WorkloadKey {
    /// istiod's workload uid.
    pub fn uid(&self) -> String {
        format!("{}//Pod/{}/{}", self.cluster, self.namespace, self.name)
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
    let all: Vec<AmbientKey> = match ty {
        XdsType::Address => {
            let mut keys: Vec<AmbientKey> = workloads(ctx, endpoints)
                .into_iter()
                .map(|w| AmbientKey::Workload(Arc::new(w)))
                .collect();
            keys.extend(services(ctx).map(|s| AmbientKey::Service(Arc::new(s))));
            keys
        }
        XdsType::Authorization => authorizations(ctx)
            .map(|a| AmbientKey::Authorization(Arc::new(a)))
            .collect(),
        _ => return Vec::new(),
    };
    if names.iter().any(|n| n == WILDCARD) {
        return all;
    }
    // What istiod sends an on-demand ztunnel unasked: the workloads of its node, and the
    // pods behind the Services it subscribed to.
    let nodes: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix(NODE_PREFIX))
        .collect();
    all.into_iter()
        .filter(|k| {
            let own = k.name();
            names.iter().any(|n| k.requested_by(n, &own))
                || match k {
                    AmbientKey::Workload(w) => {
                        nodes.contains(&w.node.as_str())
                            || w.services.keys().any(|s| names.contains(s))
                    }
                    _ => false,
                }
        })
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
        AmbientKey::Workload(w) => Resource::new(
            XdsType::Address,
            name,
            &pb::Address {
                r#type: Some(pb::address::Type::Workload(workload(w))),
            },
        ),
        AmbientKey::Service(s) => Resource::new(
            XdsType::Address,
            name,
            &pb::Address {
                r#type: Some(pb::address::Type::Service(service(s))),
            },
        ),
        AmbientKey::Authorization(a) => {
            Resource::new(XdsType::Authorization, name, &authorization(a))
        }
    }
}

/// The pods behind Kubernetes services, one workload per (cluster, namespace, pod);
/// endpoints without a pod name (not from a pod) are left out.
fn workloads(ctx: &PushContext, endpoints: &EndpointIndex) -> Vec<WorkloadKey> {
    let mut out: BTreeMap<(String, String, String), WorkloadKey> = BTreeMap::new();
    for (host, shards) in endpoints.iter() {
        let service = ctx.services.get(host);
        for set in shards.values() {
            for ep in &set.endpoints {
                if ep.pod.is_empty() {
                    continue;
                }
                let id = (set.cluster.clone(), set.namespace.clone(), ep.pod.clone());
                let w = out.entry(id).or_insert_with(|| WorkloadKey {
                    cluster: set.cluster.clone(),
                    namespace: set.namespace.clone(),
                    name: ep.pod.clone(),
                    ambient: ep.ambient,
                    native_tunnel: supports_http_tunnel(&ep.labels),
                    service_account: ep.service_account.clone(),
                    node: ep.node.clone(),
                    trust_domain: ctx.mesh.trust_domain.clone(),
                    ready: true,
                    canonical: canonical(&ep.labels, &ep.pod),
                    authorization_policies: selecting_policies(ctx, &set.namespace, &ep.labels),
                    ..WorkloadKey::default()
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
    out.into_values().collect()
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

/// The ALLOW/DENY policies of the workload's namespace whose selector selects its labels.
fn selecting_policies(
    ctx: &PushContext,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    ctx.authorization_policies
        .get(namespace)
        .into_iter()
        .flatten()
        .filter(|p| converted(&p.spec))
        .filter(|p| {
            p.spec
                .selector
                .as_ref()
                .is_some_and(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
        })
        .map(|p| format!("{}/{}", p.meta.namespace, p.meta.name))
        .collect()
}

/// Kubernetes services and ServiceEntry hosts (istiod's ambient index serves both: a
/// ServiceEntry host is a `Service` named `<ns>/<host>` with the entry's addresses).
/// A host a Kubernetes Service already has, or one defined again in another namespace,
/// is served once, as the push context keeps it.
fn services(ctx: &PushContext) -> impl Iterator<Item = ServiceKey> + '_ {
    ctx.services.values().map(|s| {
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
/// the pod (its annotation). Namespace enrollment (`istio.io/dataplane-mode`) is
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
            pod = %w.uid(),
            "pod asks for native HBONE (networking.istio.io/tunnel), which shoal's sidecars do not terminate: served without a tunnel"
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
        network: String::new(),
        tunnel_protocol: tunnel as i32,
        native_tunnel: false,
        trust_domain: w.trust_domain.clone(),
        service_account: if w.service_account.is_empty() {
            "default".to_string()
        } else {
            w.service_account.clone()
        },
        node: w.node.clone(),
        canonical_name: w.canonical.0.clone(),
        canonical_revision: w.canonical.1.clone(),
        workload_type: pb::WorkloadType::Pod as i32,
        workload_name: w.name.clone(),
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
