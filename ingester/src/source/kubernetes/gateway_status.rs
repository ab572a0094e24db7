//! Gateway API status, as users read it with `kubectl get gateway` / `kubectl describe
//! httproute`: what istiod's gateway controller reports (`pilot/pkg/config/kube/gateway`),
//! computed from the ingester's view of the config cluster with the same attachment and
//! reference rules the server routes by ([`shoal_common::gateway_api`]), so that status and
//! traffic never disagree.
//!
//! - GatewayClass of controller `istio.io/gateway-controller`: `Accepted`.
//! - Gateway of such a class: `Accepted`, `Programmed` (its Service `<gateway>-<class>`
//!   exists and has ready endpoints) with `addresses` (the load balancer's, else the
//!   Service's hostname), and per listener `supportedKinds`, `attachedRoutes` and the
//!   conditions `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
//! - HTTPRoute, GRPCRoute, TCPRoute, TLSRoute: one `parents[]` entry per parentRef shoal
//!   serves (a Gateway of an Istio class, a missing Gateway, or a Service for the mesh) with
//!   `Accepted` and `ResolvedRefs` and the spec's reasons; other controllers' entries are
//!   kept.
//!
//! Only the fields shoal owns are written, with a merge patch to `/status`; a condition
//! keeps its `lastTransitionTime` while its status does not change, and an object whose
//! status already says what shoal would write gets no write ([`GatewayStatuses`]).

use super::object_status::StatusBook;
use super::reduce::ObjKey;
use super::store::KindStore;
use crate::admit::normalize::SERVICE_NAME_LABEL;
use crate::selector::{Labels, NAMESPACE_NAME_LABEL};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ApiResource;
use serde_json::{json, Map, Value};
use shoal_common::gateway_api as attach;
use shoal_common::model::{
    BackendRef, ConfigKind, ConfigObject, ConfigSpec, KubeGateway, Listener, ParentReference,
    ReferenceGrant, GATEWAY_API_GROUP, ISTIO_CLASS, ISTIO_CONTROLLER,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

/// The cluster's DNS domain, as in the hostnames istiod reports.
const DOMAIN: &str = "cluster.local";
/// The message of a listener condition that holds.
const NO_ERRORS: &str = "No errors found";

/// One condition as computed; its time and generation are added when it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Accepted`, `Programmed`, ...
    pub kind: &'static str,
    /// Its status.
    pub holds: bool,
    /// The spec's reason.
    pub reason: String,
    /// For people.
    pub message: String,
}

impl Condition {
    fn new(kind: &'static str, holds: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            kind,
            holds,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// One listener's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerReport {
    /// The listener's name.
    pub name: String,
    /// The route kinds it admits.
    pub supported_kinds: Vec<&'static str>,
    /// How many routes attach to it.
    pub attached_routes: u32,
    /// Its conditions.
    pub conditions: Vec<Condition>,
}

/// One parent's entry in a route's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentReport {
    /// The parentRef as the route wrote it.
    pub parent_ref: Value,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}

/// What shoal reports on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A GatewayClass.
    Class(Vec<Condition>),
    /// A Gateway.
    Gateway {
        /// `Accepted`, `Programmed`.
        conditions: Vec<Condition>,
        /// `(type, value)`; empty: not reported (an address once reported is kept).
        addresses: Vec<(&'static str, String)>,
        /// Per listener, in the spec's order.
        listeners: Vec<ListenerReport>,
    },
    /// A route: its parents shoal serves.
    Route(Vec<ParentReport>),
}

/// What the reports are computed from: the config cluster's Services, EndpointSlices and
/// Namespaces, and the selected namespaces (objects elsewhere are neither published nor
/// reported on).
pub struct World<'a> {
    /// Services.
    pub services: &'a KindStore<Box<Service>>,
    /// EndpointSlices.
    pub slices: &'a KindStore<Box<EndpointSlice>>,
    /// Namespaces, as their labels.
    pub namespaces: &'a KindStore<Labels>,
    /// The namespaces the discovery selectors select.
    pub selected: &'a BTreeSet<String>,
    /// Whether another cluster this ingester watches has the Service (namespace, name):
    /// a backend or parent there exists too, as the proxies route to it.
    pub elsewhere: &'a dyn Fn(&str, &str) -> bool,
}

impl World<'_> {
    fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services
            .get(&(namespace.to_string(), name.to_string()))
            .map(Box::as_ref)
    }

    /// Whether the Service exists in the config cluster or another watched cluster.
    fn service_exists(&self, namespace: &str, name: &str) -> bool {
        self.service(namespace, name).is_some() || (self.elsewhere)(namespace, name)
    }

    /// Whether any endpoint of the Service is ready.
    fn has_ready_endpoints(&self, namespace: &str, name: &str) -> bool {
        self.slices.in_namespace(namespace).any(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|n| n == name)
                && s.endpoints.iter().any(|e| {
                    !e.addresses.is_empty()
                        && e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
                })
        })
    }
}

fn kind_of(route: &ConfigSpec) -> Option<(&'static str, &[ParentReference], &[String])> {
    match route {
        ConfigSpec::HTTPRoute(r) => Some(("HTTPRoute", &r.parent_refs, &r.hostnames)),
        ConfigSpec::GRPCRoute(r) => Some(("GRPCRoute", &r.parent_refs, &r.hostnames)),
        ConfigSpec::TCPRoute(r) => Some(("TCPRoute", &r.parent_refs, &r.hostnames)),
        ConfigSpec::TLSRoute(r) => Some(("TLSRoute", &r.parent_refs, &r.hostnames)),
        _ => None,
    }
}

/// Every backendRef of a route, mirrors included.
fn backends(route: &ConfigSpec) -> Vec<&BackendRef> {
    fn mirrors(filters: &[shoal_common::model::HTTPRouteFilter]) -> Vec<&BackendRef> {
        filters
            .iter()
            .filter_map(|f| f.request_mirror.as_ref().map(|m| &m.backend_ref))
            .collect()
    }
    match route {
        ConfigSpec::HTTPRoute(r) => r
            .rules
            .iter()
            .flat_map(|rule| rule.backend_refs.iter().chain(mirrors(&rule.filters)))
            .collect(),
        ConfigSpec::GRPCRoute(r) => r
            .rules
            .iter()
            .flat_map(|rule| rule.backend_refs.iter().chain(mirrors(&rule.filters)))
            .collect(),
        ConfigSpec::TCPRoute(r) | ConfigSpec::TLSRoute(r) => {
            r.rules.iter().flat_map(|rule| &rule.backend_refs).collect()
        }
        _ => Vec::new(),
    }
}

/// A parentRef as the route wrote it (only the fields it set).
fn parent_ref_json(p: &ParentReference) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    };
    put("group", p.group.clone().map(Value::from));
    put("kind", p.kind.clone().map(Value::from));
    put("name", Some(Value::from(p.name.clone())));
    put("namespace", p.namespace.clone().map(Value::from));
    put("sectionName", p.section_name.clone().map(Value::from));
    put("port", p.port.map(Value::from));
    Value::Object(m)
}

fn is_service_parent(p: &ParentReference) -> bool {
    p.kind.as_deref() == Some("Service") && p.group.as_deref().is_none_or(str::is_empty)
}

/// "a", "a and b", "a, b, and c" (istiod's `HumanReadableJoin`).
fn human_join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// A Gateway API object the ingester refused: why (naming the field), and the parents a
/// route names (read leniently, so that its status can say so where its author looks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The reason, naming the field.
    pub reason: String,
    /// A route's parentRefs, as far as they could be read.
    pub parents: Vec<ParentReference>,
}

impl Rejection {
    /// The rejection of an object whose raw `spec` is `spec`.
    pub fn new(reason: &str, spec: Option<&Value>) -> Rejection {
        let parents = spec
            .and_then(|s| s.get("parentRefs"))
            .and_then(Value::as_array)
            .map(|refs| {
                refs.iter()
                    .filter_map(|r| serde_json::from_value(r.clone()).ok())
                    .collect()
            })
            .unwrap_or_default();
        Rejection {
            reason: reason.to_string(),
            parents,
        }
    }
}

/// The reports of every Gateway API object among `config` that shoal serves, and of the
/// `rejected` ones (whose last good version, if any, is among `config`): a refused
/// Gateway or class is not `Accepted`, a refused route's parents say why.
pub fn reports(
    config: &[&ConfigObject],
    world: &World<'_>,
    rejected: &BTreeMap<(ConfigKind, ObjKey), Rejection>,
) -> BTreeMap<(ConfigKind, ObjKey), Report> {
    let in_scope = |o: &&&ConfigObject| {
        o.meta.namespace.is_empty() || world.selected.contains(&o.meta.namespace)
    };
    let key = |o: &ConfigObject| (o.meta.namespace.clone(), o.meta.name.clone());
    let mut out = BTreeMap::new();
    // istiod owns the `istio` class whether or not its GatewayClass object exists.
    let mut classes: BTreeSet<&str> = BTreeSet::from([ISTIO_CLASS]);
    let mut grants: Vec<(&str, &ReferenceGrant)> = Vec::new();
    let mut hosts: BTreeSet<&str> = BTreeSet::new();
    for o in config.iter().filter(in_scope) {
        match &o.spec {
            ConfigSpec::GatewayClass(c) if c.controller_name == ISTIO_CONTROLLER => {
                classes.insert(&o.meta.name);
                out.insert(
                    (ConfigKind::GatewayClass, key(o)),
                    Report::Class(vec![Condition::new(
                        "Accepted",
                        true,
                        "Accepted",
                        "Handled by Istio controller",
                    )]),
                );
            }
            ConfigSpec::ReferenceGrant(g) => grants.push((&o.meta.namespace, g)),
            ConfigSpec::ServiceEntry(se) => hosts.extend(se.hosts.iter().map(String::as_str)),
            _ => {}
        }
    }
    // Every Gateway, and whether it is ours (of an Istio class).
    let gateways: BTreeMap<(&str, &str), (&KubeGateway, bool)> = config
        .iter()
        .filter(in_scope)
        .filter_map(|o| match &o.spec {
            ConfigSpec::KubeGateway(g) => Some((
                (o.meta.namespace.as_str(), o.meta.name.as_str()),
                (g, classes.contains(g.gateway_class_name.as_str())),
            )),
            _ => None,
        })
        .collect();
    // The selected namespaces' labels, with the name label the API server sets, as the
    // server reads them from the bus (`desired::namespace_entry`).
    let namespace_labels: BTreeMap<&str, Labels> = world
        .namespaces
        .iter()
        .filter(|((_, ns), _)| world.selected.contains(ns))
        .map(|((_, ns), labels)| {
            let mut labels = labels.clone();
            labels
                .entry(NAMESPACE_NAME_LABEL.to_string())
                .or_insert_with(|| ns.clone());
            (ns.as_str(), labels)
        })
        .collect();
    let labels_of = |ns: &str| namespace_labels.get(ns);
    // (gateway namespace, name, listener) → routes attached.
    let mut attached: BTreeMap<(&str, &str, &str), u32> = BTreeMap::new();
    for o in config.iter().filter(in_scope) {
        let Some((kind, parents, hostnames)) = kind_of(&o.spec) else {
            continue;
        };
        let route_ns = o.meta.namespace.as_str();
        let resolved = attach::resolve(
            backends(&o.spec),
            kind,
            route_ns,
            grants.iter().copied(),
            |name, ns| world.service_exists(ns, name),
            |host| hosts.contains(host),
        );
        let resolved_refs = match resolved {
            Ok(()) => Condition::new(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "All references resolved",
            ),
            Err(u) => Condition::new(
                "ResolvedRefs",
                false,
                u.reason(),
                unresolved_message(u, &o.spec, kind, route_ns, &grants, world, &hosts),
            ),
        };
        let mut seen = BTreeSet::new();
        let mut parent_reports = Vec::new();
        for p in parents {
            let parent_ref = parent_ref_json(p);
            if !seen.insert(parent_ref.to_string()) {
                continue; // a duplicate parentRef gets one entry
            }
            let accepted = if is_service_parent(p) {
                // GAMMA: the Service must exist (istiod's `referenceAllowed`).
                let svc_ns = p.namespace.as_deref().unwrap_or(route_ns);
                match world.service_exists(svc_ns, &p.name) {
                    true => Condition::new("Accepted", true, "Accepted", "Route was valid"),
                    false => Condition::new(
                        "Accepted",
                        false,
                        "NoMatchingParent",
                        format!("parent service: {:?} not found", p.name),
                    ),
                }
            } else if attach::is_gateway_parent(p)
                && p.group.as_deref().is_none_or(|g| g == GATEWAY_API_GROUP)
            {
                let gw_ns = p.namespace.as_deref().unwrap_or(route_ns);
                let gateway = gateways.get(&(gw_ns, p.name.as_str()));
                if gateway.is_some_and(|(_, ours)| !ours) {
                    continue; // another controller's Gateway: its status is theirs
                }
                let gateway = gateway.map(|(g, _)| *g);
                match attach::attach(
                    kind,
                    route_ns,
                    labels_of(route_ns),
                    hostnames,
                    p,
                    gw_ns,
                    gateway,
                ) {
                    Ok(listeners) => {
                        for a in listeners {
                            let (gw_ns, gw_name) = gateways
                                .get_key_value(&(gw_ns, p.name.as_str()))
                                .map(|(k, _)| *k)
                                .unwrap_or_default();
                            *attached
                                .entry((gw_ns, gw_name, a.listener.name.as_str()))
                                .or_default() += 1;
                        }
                        Condition::new("Accepted", true, "Accepted", "Route was valid")
                    }
                    Err(reason) => Condition::new(
                        "Accepted",
                        false,
                        reason.reason(),
                        not_accepted_message(reason, p, gw_ns),
                    ),
                }
            } else {
                continue; // not a parent shoal serves
            };
            parent_reports.push(ParentReport {
                parent_ref,
                conditions: vec![accepted, resolved_refs.clone()],
            });
        }
        out.insert((o.kind(), key(o)), Report::Route(parent_reports));
    }
    for (&(ns, name), (gw, ours)) in &gateways {
        if !ours {
            continue;
        }
        let listeners: Vec<ListenerReport> = gw
            .listeners
            .iter()
            .map(|l| {
                listener_report(
                    l,
                    ns,
                    &grants,
                    attached
                        .get(&(ns, name, l.name.as_str()))
                        .copied()
                        .unwrap_or(0),
                )
            })
            .collect();
        let valid = listeners
            .iter()
            .filter(|l| l.conditions.iter().any(|c| c.kind == "Accepted" && c.holds))
            .count();
        let accepted = match (valid, listeners.len()) {
            (v, n) if v == n => Condition::new("Accepted", true, "Accepted", "Resource accepted"),
            (0, _) if !listeners.is_empty() => Condition::new(
                "Accepted",
                false,
                "ListenersNotValid",
                "None of the Gateway's listeners are valid",
            ),
            _ => Condition::new(
                "Accepted",
                true,
                "ListenersNotValid",
                "One or more of the Gateway's listeners are invalid",
            ),
        };
        let (programmed, addresses) = programmed(ns, name, gw, world);
        out.insert(
            (ConfigKind::KubeGateway, (ns.to_string(), name.to_string())),
            Report::Gateway {
                conditions: vec![accepted, programmed],
                addresses,
                listeners,
            },
        );
    }
    for ((kind, (ns, name)), r) in rejected {
        if !ns.is_empty() && !world.selected.contains(ns) {
            continue;
        }
        let message = format!("refused by shoal: {}", r.reason);
        let report = match kind {
            ConfigKind::GatewayClass => Report::Class(vec![Condition::new(
                "Accepted",
                false,
                "Unsupported",
                message,
            )]),
            ConfigKind::KubeGateway => Report::Gateway {
                conditions: vec![
                    Condition::new("Accepted", false, "Invalid", message.clone()),
                    Condition::new("Programmed", false, "Invalid", message),
                ],
                addresses: Vec::new(),
                listeners: Vec::new(),
            },
            _ => {
                let ours = |p: &&ParentReference| {
                    let gw_ns = p.namespace.as_deref().unwrap_or(ns);
                    is_service_parent(p)
                        || (attach::is_gateway_parent(p)
                            && gateways
                                .get(&(gw_ns, p.name.as_str()))
                                .is_none_or(|(_, ours)| *ours))
                };
                let parents = r
                    .parents
                    .iter()
                    .filter(ours)
                    .map(|p| ParentReport {
                        parent_ref: parent_ref_json(p),
                        conditions: vec![
                            Condition::new("Accepted", false, "UnsupportedValue", message.clone()),
                            Condition::new(
                                "ResolvedRefs",
                                true,
                                "ResolvedRefs",
                                "All references resolved",
                            ),
                        ],
                    })
                    .collect();
                Report::Route(parents)
            }
        };
        out.insert((*kind, (ns.clone(), name.clone())), report);
    }
    out
}

fn not_accepted_message(reason: attach::NotAccepted, p: &ParentReference, gw_ns: &str) -> String {
    let parent = format!("{gw_ns}/{}", p.name);
    match reason {
        attach::NotAccepted::NoMatchingParent if p.section_name.is_some() || p.port.is_some() => {
            format!("no listener of parent {parent} matches the parentRef's sectionName/port")
        }
        attach::NotAccepted::NoMatchingParent => format!("parent {parent} not found"),
        attach::NotAccepted::NotAllowedByListeners => {
            format!("no listener of parent {parent} allows routes of this kind from this namespace")
        }
        attach::NotAccepted::NoMatchingListenerHostname => {
            format!("no hostname of the route matches a listener of parent {parent}")
        }
    }
}

/// Names the first backend with the reported problem.
fn unresolved_message(
    u: attach::Unresolved,
    route: &ConfigSpec,
    kind: &str,
    route_ns: &str,
    grants: &[(&str, &ReferenceGrant)],
    world: &World<'_>,
    hosts: &BTreeSet<&str>,
) -> String {
    for b in backends(route) {
        let ns = b.namespace.as_deref().unwrap_or(route_ns);
        let found = match attach::backend(b, kind, route_ns, grants.iter().copied()) {
            attach::Backend::Unresolved(x) => x == u,
            attach::Backend::Service { name, namespace } => {
                u == attach::Unresolved::BackendNotFound && !world.service_exists(&namespace, &name)
            }
            attach::Backend::Hostname(h) => {
                u == attach::Unresolved::BackendNotFound && !hosts.contains(h.as_str())
            }
        };
        if !found {
            continue;
        }
        return match u {
            attach::Unresolved::InvalidKind => format!(
                "referencing unsupported backendRef: group {:?} kind {:?}",
                b.group.as_deref().unwrap_or(""),
                b.kind.as_deref().unwrap_or("Service")
            ),
            attach::Unresolved::RefNotPermitted => format!(
                "backendRef {}/{} not accessible to a {kind} in namespace {route_ns:?} (missing a ReferenceGrant?)",
                ns, b.name
            ),
            attach::Unresolved::BackendNotFound => match b.kind.as_deref() {
                Some("Hostname") => format!("backend({}) not found", b.name),
                _ => format!("backend({}.{ns}.svc.{DOMAIN}) not found", b.name),
            },
        };
    }
    u.reason().to_string()
}

fn listener_report(
    l: &Listener,
    gw_ns: &str,
    grants: &[(&str, &ReferenceGrant)],
    attached_routes: u32,
) -> ListenerReport {
    let protocol_kinds = attach::default_kinds(l);
    let asked: Vec<&str> = l
        .allowed_routes
        .iter()
        .flat_map(|a| &a.kinds)
        .map(|k| k.kind.as_str())
        .collect();
    let supported_kinds: Vec<&'static str> = protocol_kinds
        .iter()
        .copied()
        .filter(|k| attach::admits_kind(l, k))
        .collect();
    let mut accepted = Condition::new("Accepted", true, "Accepted", NO_ERRORS);
    let mut programmed = Condition::new("Programmed", true, "Programmed", NO_ERRORS);
    let mut resolved = Condition::new("ResolvedRefs", true, "ResolvedRefs", NO_ERRORS);
    if protocol_kinds.is_empty() {
        accepted = Condition::new(
            "Accepted",
            false,
            "UnsupportedProtocol",
            format!("protocol {:?} is unsupported", l.protocol),
        );
        programmed = Condition::new("Programmed", false, "Invalid", "Unsupported protocol");
    } else if asked.iter().any(|k| !protocol_kinds.contains(k)) {
        resolved = Condition::new(
            "ResolvedRefs",
            false,
            "InvalidRouteKinds",
            format!(
                "Invalid route kinds; supported: {}",
                supported_kinds.join(", ")
            ),
        );
    }
    let terminates = l
        .tls
        .as_ref()
        .is_some_and(|t| t.mode.as_deref() != Some("Passthrough"));
    for r in l
        .tls
        .iter()
        .flat_map(|t| &t.certificate_refs)
        .filter(|_| terminates)
    {
        let ns = r.namespace.as_deref().unwrap_or(gw_ns);
        let problem = if r.group.as_deref().is_some_and(|g| !g.is_empty())
            || r.kind.as_deref().is_some_and(|k| k != "Secret")
        {
            Some((
                "InvalidCertificateRef",
                format!(
                    "invalid certificate reference {ns}/{}: only Secrets are supported",
                    r.name
                ),
            ))
        } else if !attach::granted(
            grants.iter().copied(),
            "Gateway",
            gw_ns,
            "Secret",
            ns,
            &r.name,
        ) {
            Some((
                "RefNotPermitted",
                format!(
                    "certificate reference {ns}/{} not permitted by any ReferenceGrant",
                    r.name
                ),
            ))
        } else {
            None
        };
        if let Some((reason, message)) = problem {
            resolved = Condition::new("ResolvedRefs", false, reason, message);
            programmed = Condition::new("Programmed", false, "Invalid", "Bad TLS configuration");
            break;
        }
    }
    ListenerReport {
        name: l.name.clone(),
        supported_kinds,
        attached_routes,
        conditions: vec![
            accepted,
            programmed,
            resolved,
            Condition::new("Conflicted", false, "NoConflicts", NO_ERRORS),
        ],
    }
}

/// The Gateway's `Programmed` condition and addresses: its Service `<name>-<class>` (what
/// the deployment creates, or the user made) exists and has ready endpoints.
fn programmed(
    ns: &str,
    name: &str,
    gw: &KubeGateway,
    world: &World<'_>,
) -> (Condition, Vec<(&'static str, String)>) {
    let svc_name = format!("{name}-{}", gw.gateway_class_name);
    let host = format!("{svc_name}.{ns}.svc.{DOMAIN}");
    let failed = |warning: String| {
        Condition::new(
            "Programmed",
            false,
            "AddressNotAssigned",
            format!("Failed to assign to any requested addresses: {warning}"),
        )
    };
    let Some(svc) = world.service(ns, &svc_name) else {
        return (failed(format!("hostname {host:?} not found")), Vec::new());
    };
    if !world.has_ready_endpoints(ns, &svc_name) {
        return (
            failed(format!("no instances found for hostname {host:?}")),
            Vec::new(),
        );
    }
    let service_ports: BTreeSet<i32> = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| p.port)
        .collect();
    let listener_ports: BTreeSet<u32> = gw.listeners.iter().map(|l| l.port).collect();
    let internal: Vec<String> = listener_ports
        .iter()
        .filter(|p| i32::try_from(**p).is_ok_and(|p| service_ports.contains(&p)))
        .map(|p| format!("{host}:{p}"))
        .collect();
    let external: Vec<(&'static str, String)> = svc
        .status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(("IPAddress", ip.clone())),
            (None, Some(h)) => Some(("Hostname", h.clone())),
            (None, None) => None,
        })
        .collect();
    let load_balancer = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    let assigned = human_join(&internal);
    if load_balancer && external.is_empty() {
        let warning = format!("address pending for hostname {host:?}");
        let message = if internal.is_empty() {
            format!("Failed to assign to any requested addresses: {warning}")
        } else {
            format!("Assigned to service(s) {assigned}, but failed to assign to all requested addresses: {warning}")
        };
        return (
            Condition::new("Programmed", false, "AddressNotAssigned", message),
            Vec::new(),
        );
    }
    let addresses = if external.is_empty() {
        vec![("Hostname", host.clone())]
    } else {
        external
    };
    let message = if internal.is_empty() {
        "Resource programmed".to_string()
    } else {
        format!("Resource programmed, assigned to service(s) {assigned}")
    };
    (
        Condition::new("Programmed", true, "Programmed", message),
        addresses,
    )
}

// ---------------------------------------------------------------------------------------
// Writing

/// The conditions `ours` as written: a condition keeps the `lastTransitionTime` it has
/// while its status does not change; conditions of other types in `current` are kept.
fn conditions_json(
    ours: &[Condition],
    current: Option<&Value>,
    generation: Option<i64>,
    now: &str,
    keep_others: bool,
) -> Value {
    let current: &[Value] = current.and_then(Value::as_array).map_or(&[], Vec::as_slice);
    let find = |kind: &str| current.iter().find(|c| c["type"] == kind);
    let mut out: Vec<Value> = ours
        .iter()
        .map(|c| {
            let status = if c.holds { "True" } else { "False" };
            let transition = find(c.kind)
                .filter(|old| old["status"] == status)
                .and_then(|old| old["lastTransitionTime"].as_str())
                .unwrap_or(now);
            let mut v = json!({
                "type": c.kind,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": transition,
            });
            if let Some(g) = generation {
                v["observedGeneration"] = json!(g);
            }
            v
        })
        .collect();
    if keep_others {
        out.extend(
            current
                .iter()
                .filter(|c| !ours.iter().any(|o| c["type"] == o.kind))
                .cloned(),
        );
    }
    Value::Array(out)
}

/// The status fields shoal owns for `report`, given the object's current status: what a
/// merge patch of `/status` sets.
pub fn owned_fields(
    report: &Report,
    status: Option<&Value>,
    generation: Option<i64>,
    now: &str,
) -> Map<String, Value> {
    let empty = Value::Null;
    let status = status.unwrap_or(&empty);
    let mut m = Map::new();
    match report {
        Report::Class(conditions) => {
            m.insert(
                "conditions".into(),
                conditions_json(conditions, status.get("conditions"), generation, now, true),
            );
        }
        Report::Gateway {
            conditions,
            addresses,
            listeners,
        } => {
            m.insert(
                "conditions".into(),
                conditions_json(conditions, status.get("conditions"), generation, now, true),
            );
            let current: &[Value] = status["listeners"].as_array().map_or(&[], Vec::as_slice);
            let listeners: Vec<Value> = listeners
                .iter()
                .map(|l| {
                    let old = current.iter().find(|c| c["name"] == l.name.as_str());
                    json!({
                        "name": l.name,
                        "supportedKinds": l.supported_kinds.iter()
                            .map(|k| json!({"group": GATEWAY_API_GROUP, "kind": k}))
                            .collect::<Vec<_>>(),
                        "attachedRoutes": l.attached_routes,
                        "conditions": conditions_json(&l.conditions, old.and_then(|o| o.get("conditions")), generation, now, false),
                    })
                })
                .collect();
            m.insert("listeners".into(), Value::Array(listeners));
            // An address is not reported until there is one, and then never removed.
            if !addresses.is_empty() {
                let addresses: Vec<Value> = addresses
                    .iter()
                    .map(|(kind, value)| json!({"type": kind, "value": value}))
                    .collect();
                m.insert("addresses".into(), Value::Array(addresses));
            }
        }
        Report::Route(parents) => {
            let current: &[Value] = status["parents"].as_array().map_or(&[], Vec::as_slice);
            let ours_entry = |p: &Value| p["controllerName"] == ISTIO_CONTROLLER;
            // Other controllers' entries stay, in place.
            let mut out: Vec<Value> = current.iter().filter(|p| !ours_entry(p)).cloned().collect();
            for p in parents {
                let old = current
                    .iter()
                    .find(|c| ours_entry(c) && c["parentRef"] == p.parent_ref);
                out.push(json!({
                    "parentRef": p.parent_ref,
                    "controllerName": ISTIO_CONTROLLER,
                    "conditions": conditions_json(&p.conditions, old.and_then(|o| o.get("conditions")), generation, now, false),
                }));
            }
            // A route none of whose parents is shoal's, and whose status has no parents,
            // is left alone (no write of an empty list to another controller's route).
            if !(parents.is_empty() && status.get("parents").is_none()) {
                m.insert("parents".into(), Value::Array(out));
            }
        }
    }
    m
}

/// An object's current status and generation, as the last watch event carried them.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    generation: Option<i64>,
    status: Value,
}

/// One watch event's object, as [`GatewayStatuses::observe`] records it.
#[derive(Debug)]
pub struct Event {
    /// Its generation.
    pub generation: Option<i64>,
    /// Its status.
    pub status: Option<Value>,
    /// Why the ingester refused this version, if it did.
    pub rejection: Option<Rejection>,
}

type Key = (ConfigKind, ObjKey);

#[derive(Debug, Default)]
struct Inner {
    observed: BTreeMap<Key, Observed>,
    /// The objects whose latest version was refused.
    rejected: BTreeMap<Key, Rejection>,
    /// What was last handed to the writer per object, and the status observed then: the
    /// same write is not queued again before the object's next event.
    queued: BTreeMap<Key, (Map<String, Value>, Observed)>,
}

/// The Gateway API objects' current statuses (from watch events) and the writes their
/// reports need. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct GatewayStatuses {
    inner: Arc<Mutex<Inner>>,
}

impl GatewayStatuses {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an object's status, generation and verdict from a watch event.
    pub fn observe(&self, kind: ConfigKind, key: ObjKey, event: Event) {
        let mut inner = self.lock();
        let key = (kind, key);
        match event.rejection {
            Some(r) => inner.rejected.insert(key.clone(), r),
            None => inner.rejected.remove(&key),
        };
        inner.observed.insert(
            key,
            Observed {
                generation: event.generation,
                status: event.status.unwrap_or(Value::Null),
            },
        );
    }

    /// The objects whose latest version was refused.
    pub fn rejected(&self) -> BTreeMap<Key, Rejection> {
        self.lock().rejected.clone()
    }

    /// Forgets a deleted object.
    pub fn forget(&self, kind: ConfigKind, key: &ObjKey) {
        let mut inner = self.lock();
        let key = (kind, key.clone());
        inner.observed.remove(&key);
        inner.rejected.remove(&key);
        inner.queued.remove(&key);
    }

    /// Forgets every object of a kind (its CRD is gone).
    pub fn forget_kind(&self, kind: ConfigKind) {
        let mut inner = self.lock();
        inner.observed.retain(|(k, _), _| *k != kind);
        inner.rejected.retain(|(k, _), _| *k != kind);
        inner.queued.retain(|(k, _), _| *k != kind);
    }

    /// Hands `book` the writes `reports` need: those whose owned fields differ from what
    /// the object's status says. `resources` serve each kind.
    pub fn reconcile(
        &self,
        reports: &BTreeMap<Key, Report>,
        resources: &BTreeMap<ConfigKind, Arc<ApiResource>>,
        book: &StatusBook,
        now: &str,
    ) -> usize {
        let mut inner = self.lock();
        let mut queued = 0;
        for (key, report) in reports {
            let Some(observed) = inner.observed.get(key).cloned() else {
                continue; // not seen by a watch (yet)
            };
            let Some(resource) = resources.get(&key.0) else {
                continue;
            };
            // Compared without the time a changed condition gets: only what it says.
            let timeless = owned_fields(report, Some(&observed.status), observed.generation, "");
            let current = observed.status.as_object();
            let up_to_date = timeless
                .iter()
                .all(|(k, v)| current.and_then(|c| c.get(k)) == Some(v));
            if up_to_date {
                inner.queued.remove(key);
                book.set(key.0, resource, key.1.clone(), None);
                continue;
            }
            if inner.queued.get(key) == Some(&(timeless.clone(), observed.clone())) {
                continue; // written or waiting; its event has not come back yet
            }
            let fields = owned_fields(report, Some(&observed.status), observed.generation, now);
            book.set(
                key.0,
                resource,
                key.1.clone(),
                Some(json!({"status": fields})),
            );
            inner.queued.insert(key.clone(), (timeless, observed));
            queued += 1;
        }
        queued
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::Change;
    use super::*;
    use shoal_common::model::ObjectMeta;

    fn obj(kind: &str, ns: &str, name: &str, yaml: &str) -> ConfigObject {
        let v: Value = shoal_common::yaml::from_str(yaml).expect("test yaml");
        let spec = match kind {
            "GatewayClass" => ConfigSpec::GatewayClass(serde_json::from_value(v).expect("class")),
            "Gateway" => ConfigSpec::KubeGateway(serde_json::from_value(v).expect("gw")),
            "HTTPRoute" => ConfigSpec::HTTPRoute(serde_json::from_value(v).expect("route")),
            "TCPRoute" => ConfigSpec::TCPRoute(serde_json::from_value(v).expect("tcp")),
            "ReferenceGrant" => {
                ConfigSpec::ReferenceGrant(serde_json::from_value(v).expect("grant"))
            }
            other => panic!("{other}"),
        };
        ConfigObject {
            meta: ObjectMeta {
                name: name.into(),
                namespace: ns.into(),
                ..Default::default()
            },
            spec,
        }
    }

    struct Cluster {
        services: KindStore<Box<Service>>,
        slices: KindStore<Box<EndpointSlice>>,
        namespaces: KindStore<Labels>,
        selected: BTreeSet<String>,
        rejected: BTreeMap<(ConfigKind, ObjKey), Rejection>,
    }

    impl Cluster {
        fn new() -> Self {
            let mut namespaces = KindStore::new("c", "Namespace");
            for ns in ["shop", "other"] {
                namespaces.apply(Change::Apply((String::new(), ns.into()), Ok(Labels::new())));
            }
            Cluster {
                services: KindStore::new("c", "Service"),
                slices: KindStore::new("c", "EndpointSlice"),
                namespaces,
                selected: ["shop".to_string(), "other".to_string()].into(),
                rejected: BTreeMap::new(),
            }
        }

        fn service(&mut self, ns: &str, name: &str, yaml: &str) {
            let svc: Service = shoal_common::yaml::from_str(&format!(
                "metadata: {{name: {name}, namespace: {ns}}}\n{yaml}"
            ))
            .expect("service");
            self.services
                .apply(Change::Apply((ns.into(), name.into()), Ok(Box::new(svc))));
        }

        fn ready_endpoint(&mut self, ns: &str, service: &str) {
            let slice: EndpointSlice = shoal_common::yaml::from_str(&format!(
                "metadata: {{name: {service}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {service}}}}}\n\
                 addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], conditions: {{ready: true}}}}]\n"
            ))
            .expect("slice");
            self.slices.apply(Change::Apply(
                (ns.into(), format!("{service}-1")),
                Ok(Box::new(slice)),
            ));
        }

        fn reports(&self, config: &[ConfigObject]) -> BTreeMap<(ConfigKind, ObjKey), Report> {
            let config: Vec<&ConfigObject> = config.iter().collect();
            reports(
                &config,
                &World {
                    services: &self.services,
                    slices: &self.slices,
                    namespaces: &self.namespaces,
                    selected: &self.selected,
                    elsewhere: &|_, _| false,
                },
                &self.rejected,
            )
        }
    }

    fn key(kind: ConfigKind, ns: &str, name: &str) -> (ConfigKind, ObjKey) {
        (kind, (ns.into(), name.into()))
    }

    type Reasons<'a> = Vec<(&'a str, bool, &'a str)>;

    fn reasons(conditions: &[Condition]) -> Reasons<'_> {
        conditions
            .iter()
            .map(|c| (c.kind, c.holds, c.reason.as_str()))
            .collect()
    }

    fn parents(r: &Report) -> Vec<(String, Reasons<'_>)> {
        let Report::Route(parents) = r else {
            panic!("not a route: {r:?}")
        };
        parents
            .iter()
            .map(|p| {
                (
                    p.parent_ref["name"].as_str().unwrap_or("").to_string(),
                    reasons(&p.conditions),
                )
            })
            .collect()
    }

    const GW: &str = "gatewayClassName: istio\nlisteners:\n\
        - {name: web, port: 80, protocol: HTTP, hostname: '*.example.com', allowedRoutes: {namespaces: {from: All}}}\n\
        - {name: same, port: 8080, protocol: HTTP}\n\
        - {name: tcp, port: 9000, protocol: TCP}\n";

    #[test]
    fn routes_get_the_specs_reasons_per_parent() {
        let mut cluster = Cluster::new();
        cluster.service("shop", "web", "spec: {ports: [{port: 80}]}");
        cluster.service("other", "db", "spec: {ports: [{port: 5432}]}");
        let config = vec![
            obj("Gateway", "shop", "gw", GW),
            obj("Gateway", "shop", "theirs", "gatewayClassName: nginx\nlisteners: [{name: a, port: 80, protocol: HTTP}]\n"),
            obj("HTTPRoute", "shop", "ok", "parentRefs: [{name: gw}, {name: theirs}]\nhostnames: [a.example.com]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
            obj("HTTPRoute", "shop", "missing-backend", "parentRefs: [{name: gw, sectionName: same}]\nrules: [{backendRefs: [{name: nope, port: 80}]}]\n"),
            obj("HTTPRoute", "shop", "ungranted", "parentRefs: [{name: gw, sectionName: same}]\nrules: [{backendRefs: [{name: db, namespace: other, port: 5432}]}]\n"),
            obj("HTTPRoute", "shop", "bad-host", "parentRefs: [{name: gw, sectionName: web}]\nhostnames: [a.example.org]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
            obj("HTTPRoute", "other", "not-allowed", "parentRefs: [{name: gw, namespace: shop, sectionName: same}]\nrules: [{backendRefs: [{name: db, port: 5432}]}]\n"),
            obj("HTTPRoute", "shop", "no-gateway", "parentRefs: [{name: ghost}]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
            obj("HTTPRoute", "shop", "mesh", "parentRefs: [{group: '', kind: Service, name: web, port: 80}]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
            obj("HTTPRoute", "shop", "mesh-ghost", "parentRefs: [{group: '', kind: Service, name: ghost}]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
            obj("TCPRoute", "shop", "tcp", "parentRefs: [{name: gw, sectionName: tcp}]\nrules: [{backendRefs: [{name: web, port: 80}]}]\n"),
        ];
        let r = cluster.reports(&config);
        let route = |name: &str| parents(&r[&key(ConfigKind::HTTPRoute, "shop", name)]);
        let ok = vec![
            ("Accepted", true, "Accepted"),
            ("ResolvedRefs", true, "ResolvedRefs"),
        ];
        // Another controller's Gateway gets no entry from shoal.
        assert_eq!(route("ok"), [("gw".to_string(), ok.clone())]);
        assert_eq!(
            route("missing-backend")[0].1,
            [
                ("Accepted", true, "Accepted"),
                ("ResolvedRefs", false, "BackendNotFound")
            ]
        );
        assert_eq!(
            route("ungranted")[0].1,
            [
                ("Accepted", true, "Accepted"),
                ("ResolvedRefs", false, "RefNotPermitted")
            ]
        );
        assert_eq!(
            route("bad-host")[0].1[0],
            ("Accepted", false, "NoMatchingListenerHostname")
        );
        assert_eq!(
            parents(&r[&key(ConfigKind::HTTPRoute, "other", "not-allowed")])[0].1[0],
            ("Accepted", false, "NotAllowedByListeners")
        );
        assert_eq!(
            route("no-gateway")[0].1[0],
            ("Accepted", false, "NoMatchingParent")
        );
        assert_eq!(route("mesh"), [("web".to_string(), ok.clone())]);
        assert_eq!(
            route("mesh-ghost")[0].1[0],
            ("Accepted", false, "NoMatchingParent")
        );
        assert_eq!(
            parents(&r[&key(ConfigKind::TCPRoute, "shop", "tcp")]),
            [("gw".to_string(), ok)]
        );

        // A grant from shop's HTTPRoutes resolves the cross-namespace backend.
        let mut granted = config.clone();
        granted.push(obj(
            "ReferenceGrant",
            "other",
            "g",
            "from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]\nto: [{group: '', kind: Service}]\n",
        ));
        let r = cluster.reports(&granted);
        assert_eq!(
            parents(&r[&key(ConfigKind::HTTPRoute, "shop", "ungranted")])[0].1[1],
            ("ResolvedRefs", true, "ResolvedRefs")
        );

        // The Gateway: listeners with their attached routes; another class's: nothing.
        let Report::Gateway { listeners, .. } = &r[&key(ConfigKind::KubeGateway, "shop", "gw")]
        else {
            panic!()
        };
        let attached: Vec<(&str, u32)> = listeners
            .iter()
            .map(|l| (l.name.as_str(), l.attached_routes))
            .collect();
        // web: ok; same: ok (no sectionName: every listener that takes it),
        // missing-backend, ungranted (the other namespace's is not allowed); tcp: the
        // TCPRoute.
        assert_eq!(attached, [("web", 1), ("same", 3), ("tcp", 1)]);
        assert_eq!(listeners[2].supported_kinds, ["TCPRoute"]);
        assert_eq!(listeners[0].supported_kinds, ["HTTPRoute", "GRPCRoute"]);
        assert!(!r.contains_key(&key(ConfigKind::KubeGateway, "shop", "theirs")));
    }

    #[test]
    fn gateways_are_programmed_once_their_service_has_ready_endpoints() {
        let mut cluster = Cluster::new();
        let config = vec![
            obj(
                "GatewayClass",
                "",
                "istio",
                "controllerName: istio.io/gateway-controller\n",
            ),
            obj(
                "GatewayClass",
                "",
                "nginx",
                "controllerName: example.com/nginx\n",
            ),
            obj("Gateway", "shop", "gw", GW),
        ];
        let gateway = |cluster: &Cluster| match cluster.reports(&config).remove(&key(
            ConfigKind::KubeGateway,
            "shop",
            "gw",
        )) {
            Some(Report::Gateway {
                conditions,
                addresses,
                ..
            }) => (conditions, addresses),
            other => panic!("{other:?}"),
        };
        let r = cluster.reports(&config);
        assert_eq!(
            r[&key(ConfigKind::GatewayClass, "", "istio")],
            Report::Class(vec![Condition::new(
                "Accepted",
                true,
                "Accepted",
                "Handled by Istio controller"
            )])
        );
        assert!(!r.contains_key(&key(ConfigKind::GatewayClass, "", "nginx")));

        let (conditions, addresses) = gateway(&cluster);
        assert_eq!(
            reasons(&conditions),
            [
                ("Accepted", true, "Accepted"),
                ("Programmed", false, "AddressNotAssigned")
            ]
        );
        assert!(
            conditions[1]
                .message
                .contains("\"gw-istio.shop.svc.cluster.local\" not found"),
            "{conditions:?}"
        );
        assert!(addresses.is_empty());

        cluster.service(
            "shop",
            "gw-istio",
            "spec: {type: ClusterIP, clusterIP: 10.1.0.9, ports: [{port: 80}, {port: 8080}]}",
        );
        let (conditions, _) = gateway(&cluster);
        assert!(
            conditions[1].message.contains("no instances found"),
            "{conditions:?}"
        );

        cluster.ready_endpoint("shop", "gw-istio");
        let (conditions, addresses) = gateway(&cluster);
        assert_eq!(reasons(&conditions)[1], ("Programmed", true, "Programmed"));
        assert_eq!(
            conditions[1].message,
            "Resource programmed, assigned to service(s) gw-istio.shop.svc.cluster.local:80 and gw-istio.shop.svc.cluster.local:8080"
        );
        assert_eq!(
            addresses,
            [("Hostname", "gw-istio.shop.svc.cluster.local".to_string())]
        );

        // A load balancer without an address yet is pending; with one, it is the address.
        cluster.service(
            "shop",
            "gw-istio",
            "spec: {type: LoadBalancer, ports: [{port: 80}]}",
        );
        let (conditions, addresses) = gateway(&cluster);
        assert_eq!(
            reasons(&conditions)[1],
            ("Programmed", false, "AddressNotAssigned")
        );
        assert!(
            conditions[1].message.contains("address pending"),
            "{conditions:?}"
        );
        assert!(addresses.is_empty());
        cluster.service("shop", "gw-istio", "spec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.7}]}}");
        let (conditions, addresses) = gateway(&cluster);
        assert_eq!(reasons(&conditions)[1], ("Programmed", true, "Programmed"));
        assert_eq!(addresses, [("IPAddress", "203.0.113.7".to_string())]);
    }

    #[test]
    fn listeners_report_invalid_kinds_and_certificate_refs() {
        let cluster = Cluster::new();
        let gw = "gatewayClassName: istio\nlisteners:\n\
            - {name: kinds, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: TCPRoute}]}}\n\
            - {name: cert, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: c, namespace: other}]}}\n\
            - {name: udp, port: 53, protocol: UDP}\n";
        let r = cluster.reports(&[obj("Gateway", "shop", "gw", gw)]);
        let Report::Gateway {
            conditions,
            listeners,
            ..
        } = &r[&key(ConfigKind::KubeGateway, "shop", "gw")]
        else {
            panic!()
        };
        assert_eq!(listeners[0].supported_kinds, ["HTTPRoute"]);
        assert_eq!(
            reasons(&listeners[0].conditions)[2],
            ("ResolvedRefs", false, "InvalidRouteKinds")
        );
        assert_eq!(
            reasons(&listeners[1].conditions)[1..3],
            [
                ("Programmed", false, "Invalid"),
                ("ResolvedRefs", false, "RefNotPermitted")
            ]
        );
        assert_eq!(
            reasons(&listeners[2].conditions)[0],
            ("Accepted", false, "UnsupportedProtocol")
        );
        assert_eq!(
            reasons(conditions)[0],
            ("Accepted", true, "ListenersNotValid")
        );
    }

    #[test]
    fn writes_keep_transition_times_and_other_controllers_entries() {
        let report = Report::Route(vec![ParentReport {
            parent_ref: json!({"name": "gw"}),
            conditions: vec![
                Condition::new("Accepted", true, "Accepted", "Route was valid"),
                Condition::new(
                    "ResolvedRefs",
                    false,
                    "BackendNotFound",
                    "backend(x) not found",
                ),
            ],
        }]);
        let current = json!({"parents": [
            {"parentRef": {"name": "other"}, "controllerName": "example.com/other", "conditions": []},
            {"parentRef": {"name": "gw"}, "controllerName": ISTIO_CONTROLLER, "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Route was valid",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
                {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "All references resolved",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]},
        ]});
        let fields = owned_fields(&report, Some(&current), Some(2), "2026-11-27T00:00:00Z");
        let parents = fields["parents"].as_array().unwrap();
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0]["controllerName"], "example.com/other");
        let conditions = &parents[1]["conditions"];
        assert_eq!(conditions[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(conditions[0]["observedGeneration"], 2);
        assert_eq!(conditions[1]["lastTransitionTime"], "2026-11-27T00:00:00Z");
        assert_eq!(conditions[1]["status"], "False");

        // A route none of whose parents is shoal's: nothing to write while its status has
        // no parents; shoal's stale entry is removed, another controller's kept.
        let none = Report::Route(Vec::new());
        assert!(owned_fields(&none, None, Some(1), "t").is_empty());
        let fields = owned_fields(&none, Some(&current), Some(1), "t");
        assert_eq!(fields["parents"].as_array().map(Vec::len), Some(1));
        assert_eq!(fields["parents"][0]["controllerName"], "example.com/other");

        // The writes: one while the status differs, none again before the next event, none
        // once the status says it.
        let statuses = GatewayStatuses::default();
        let book = StatusBook::default();
        let key = key(ConfigKind::HTTPRoute, "shop", "r");
        let resource = Arc::new(ApiResource::erase::<Service>(&()));
        let resources = BTreeMap::from([(ConfigKind::HTTPRoute, resource)]);
        let reports = BTreeMap::from([(key.clone(), report)]);
        let event = |status| Event {
            generation: Some(2),
            status: Some(status),
            rejection: None,
        };
        statuses.observe(key.0, key.1.clone(), event(current));
        assert_eq!(statuses.reconcile(&reports, &resources, &book, "t1"), 1);
        assert_eq!(book.len(), 1);
        assert_eq!(statuses.reconcile(&reports, &resources, &book, "t2"), 0);
        let written =
            json!({"parents": owned_fields(&reports[&key], None, Some(2), "t1")["parents"]});
        statuses.observe(key.0, key.1.clone(), event(written));
        assert_eq!(statuses.reconcile(&reports, &resources, &book, "t3"), 0);
        assert!(book.is_empty());
    }
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn refused_objects_say_why_where_their_authors_look() {
        let services = KindStore::new("c", "Service");
        let slices = KindStore::new("c", "EndpointSlice");
        let namespaces = KindStore::new("c", "Namespace");
        let selected = BTreeSet::from(["shop".to_string()]);
        let world = World {
            services: &services,
            slices: &slices,
            namespaces: &namespaces,
            selected: &selected,
            elsewhere: &|_, _| false,
        };
        let spec = json!({"parentRefs": [{"name": "gw"}, {"kind": "Service", "group": "", "name": "web"}, "junk"]});
        let key = |kind, ns: &str| (kind, (ns.to_string(), "r".to_string()));
        let rejected = BTreeMap::from([
            (
                key(ConfigKind::HTTPRoute, "shop"),
                Rejection::new(
                    "rules[0].filters[0].type: CORS is not supported",
                    Some(&spec),
                ),
            ),
            (
                key(ConfigKind::KubeGateway, "shop"),
                Rejection::new("spec.addresses: not supported", None),
            ),
            (
                key(ConfigKind::HTTPRoute, "elsewhere"),
                Rejection::new("unselected", None),
            ),
        ]);
        let r = reports(&[], &world, &rejected);
        assert_eq!(r.len(), 2, "{r:?}");
        let Report::Route(parents) = &r[&key(ConfigKind::HTTPRoute, "shop")] else {
            panic!()
        };
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0].conditions[0].reason, "UnsupportedValue");
        assert!(parents[0].conditions[0]
            .message
            .contains("rules[0].filters[0].type"));
        let Report::Gateway { conditions, .. } = &r[&key(ConfigKind::KubeGateway, "shop")] else {
            panic!()
        };
        assert_eq!(
            (conditions[0].holds, conditions[0].reason.as_str()),
            (false, "Invalid")
        );
    }
}
