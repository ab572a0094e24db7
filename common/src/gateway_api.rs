//! The Gateway API's attachment and reference rules, as istiod's gateway controller applies
//! them (`pilot/pkg/config/kube/gateway`): which listeners of a Gateway a route attaches
//! to, the hostnames both allow, who may refer across namespaces (ReferenceGrant), and the
//! condition reasons a route's parent status carries when it does not attach or a backend
//! does not resolve.
//!
//! Pure decisions on the model, no Envoy or Kubernetes types, so that the server's
//! translation (what is routed) and the ingester's status writer (what users read with
//! kubectl) decide with the same functions and never disagree.

use crate::model::{
    BackendRef, KubeGateway, Listener, ParentReference, ReferenceGrant, GATEWAY_API_GROUP,
};
use std::collections::BTreeMap;

/// Why a route is not `Accepted` by a parent (the spec's reasons for `Accepted=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAccepted {
    /// The parent does not exist (or is not of a class shoal serves), or no listener has
    /// the parentRef's `sectionName`/`port`.
    NoMatchingParent,
    /// Listeners match the parentRef but none admits the route's kind or namespace.
    NotAllowedByListeners,
    /// A listener admits the route but shares no hostname with it.
    NoMatchingListenerHostname,
}

impl NotAccepted {
    /// The reason as the spec spells it.
    pub fn reason(self) -> &'static str {
        match self {
            NotAccepted::NoMatchingParent => "NoMatchingParent",
            NotAccepted::NotAllowedByListeners => "NotAllowedByListeners",
            NotAccepted::NoMatchingListenerHostname => "NoMatchingListenerHostname",
        }
    }
}

/// Why a route's references are not all resolved (the spec's reasons for
/// `ResolvedRefs=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// A backend of a kind shoal cannot resolve.
    InvalidKind,
    /// A cross-namespace backend without a ReferenceGrant.
    RefNotPermitted,
    /// A backend Service that does not exist.
    BackendNotFound,
}

impl Unresolved {
    /// The reason as the spec spells it.
    pub fn reason(self) -> &'static str {
        match self {
            Unresolved::InvalidKind => "InvalidKind",
            Unresolved::RefNotPermitted => "RefNotPermitted",
            Unresolved::BackendNotFound => "BackendNotFound",
        }
    }
}

/// One listener a route attaches to, with the hosts both allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerAttachment<'a> {
    /// The listener.
    pub listener: &'a Listener,
    /// The hostnames both the listener and the route allow (`*` for any).
    pub hosts: Vec<String>,
}

/// The route kinds a listener admits by default: those of its protocol.
pub fn default_kinds(l: &Listener) -> &'static [&'static str] {
    match l.protocol.as_str() {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TLS" if l.tls.as_ref().and_then(|t| t.mode.as_deref()) == Some("Passthrough") => {
            &["TLSRoute"]
        }
        "TLS" => &["TLSRoute", "TCPRoute"],
        "TCP" => &["TCPRoute"],
        _ => &[],
    }
}

/// Whether a listener admits routes of `kind` (its `allowedRoutes.kinds`, within those of
/// its protocol).
pub fn admits_kind(l: &Listener, kind: &str) -> bool {
    match l.allowed_routes.as_ref().filter(|a| !a.kinds.is_empty()) {
        Some(a) => {
            a.kinds.iter().any(|k| {
                k.kind == kind
                    && k.group.as_deref().unwrap_or(GATEWAY_API_GROUP) == GATEWAY_API_GROUP
            }) && default_kinds(l).contains(&kind)
        }
        None => default_kinds(l).contains(&kind),
    }
}

/// Whether a listener of a Gateway in `gw_ns` admits routes from `route_ns`
/// (`allowedRoutes.namespaces`).
pub fn admits_namespace(
    l: &Listener,
    gw_ns: &str,
    route_ns: &str,
    route_ns_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let namespaces = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match namespaces.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
        "All" => true,
        "Same" => gw_ns == route_ns,
        "Selector" => selector_admits(l, route_ns_labels),
        _ => false,
    }
}

/// `allowedRoutes.namespaces.from: Selector`: the route's namespace labels match the
/// listener's selector. A namespace with no published labels (unknown, or not selected by
/// the discovery selectors) matches no selector; an invalid selector (refused by the
/// ingester) matches nothing rather than all.
fn selector_admits(l: &Listener, route_ns_labels: Option<&BTreeMap<String, String>>) -> bool {
    let selector = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.selector.as_ref());
    match (selector, route_ns_labels) {
        (Some(selector), Some(labels)) => selector.matches(labels),
        _ => false,
    }
}

/// The hostnames both a listener and a route allow (Gateway API hostname intersection);
/// `None` when they share none.
pub fn intersect_hosts(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    let Some(l) = listener.filter(|l| !l.is_empty() && *l != "*") else {
        return Some(if route.is_empty() {
            vec!["*".into()]
        } else {
            route.to_vec()
        });
    };
    if route.is_empty() {
        return Some(vec![l.to_string()]);
    }
    let covers = |pattern: &str, host: &str| match pattern.strip_prefix('*') {
        // `*.example.com` covers `a.example.com` and `*.a.example.com`, not `example.com`.
        Some(suffix) => {
            host.strip_prefix('*').unwrap_or(host).ends_with(suffix) && host.len() > suffix.len()
        }
        None => pattern == host,
    };
    let mut out: Vec<String> = Vec::new();
    for r in route {
        let host = if covers(l, r) {
            r.clone()
        } else if covers(r, l) {
            l.to_string()
        } else {
            continue;
        };
        if !out.contains(&host) {
            out.push(host);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `p` names a Gateway (rather than a Service, for the mesh).
pub fn is_gateway_parent(p: &ParentReference) -> bool {
    p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
}

/// The listeners of `gateway` (in `gw_ns`; `None` when it does not exist or is not of a
/// class shoal serves) that a route of `kind` in `route_ns` with `hostnames` attaches to
/// through the parentRef `p`, or why it attaches to none.
pub fn attach<'a>(
    kind: &str,
    route_ns: &str,
    route_ns_labels: Option<&BTreeMap<String, String>>,
    hostnames: &[String],
    p: &ParentReference,
    gw_ns: &str,
    gateway: Option<&'a KubeGateway>,
) -> Result<Vec<ListenerAttachment<'a>>, NotAccepted> {
    let Some(gw) = gateway else {
        return Err(NotAccepted::NoMatchingParent);
    };
    let mut named = false;
    let mut allowed = false;
    let mut out = Vec::new();
    for l in &gw.listeners {
        if p.section_name.as_ref().is_some_and(|s| *s != l.name)
            || p.port.is_some_and(|port| port != l.port)
        {
            continue;
        }
        named = true;
        if !admits_kind(l, kind) || !admits_namespace(l, gw_ns, route_ns, route_ns_labels) {
            continue;
        }
        allowed = true;
        let hosts = if kind == "TCPRoute" {
            Some(vec!["*".to_string()])
        } else {
            intersect_hosts(l.hostname.as_deref(), hostnames)
        };
        if let Some(hosts) = hosts {
            out.push(ListenerAttachment { listener: l, hosts });
        }
    }
    match (named, allowed, out.is_empty()) {
        (false, _, _) => Err(NotAccepted::NoMatchingParent),
        (true, false, _) => Err(NotAccepted::NotAllowedByListeners),
        (true, true, true) => Err(NotAccepted::NoMatchingListenerHostname),
        _ => Ok(out),
    }
}

/// Whether `grants` (each with its namespace) let an object of the Gateway API `from_kind`
/// in `from_ns` refer to the core `to_kind` `name` in `to_ns`.
pub fn granted<'a>(
    grants: impl IntoIterator<Item = (&'a str, &'a ReferenceGrant)>,
    from_kind: &str,
    from_ns: &str,
    to_kind: &str,
    to_ns: &str,
    name: &str,
) -> bool {
    from_ns == to_ns
        || grants.into_iter().any(|(ns, g)| {
            ns == to_ns
                && g.from.iter().any(|f| {
                    f.group == GATEWAY_API_GROUP && f.kind == from_kind && f.namespace == from_ns
                })
                && g.to.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == name)
                })
        })
}

/// How a backendRef resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A Service, by name and namespace (which may not exist: see [`resolve`]).
    Service {
        /// Its name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// Istio's `Hostname` kind: a host, typically a ServiceEntry's.
    Hostname(String),
    /// Not resolvable.
    Unresolved(Unresolved),
}

/// How `b`, on a route of `route_kind` in `route_ns`, resolves. Existence is not checked
/// here (the server cannot know it; see [`resolve`]).
pub fn backend<'a>(
    b: &BackendRef,
    route_kind: &str,
    route_ns: &str,
    grants: impl IntoIterator<Item = (&'a str, &'a ReferenceGrant)>,
) -> Backend {
    let group = b.group.as_deref().unwrap_or("");
    let kind = b.kind.as_deref().unwrap_or("Service");
    match (group, kind) {
        ("", "Service") => {}
        ("networking.istio.io", "Hostname") => return Backend::Hostname(b.name.clone()),
        _ => return Backend::Unresolved(Unresolved::InvalidKind),
    }
    let ns = b.namespace.as_deref().unwrap_or(route_ns);
    if !granted(grants, route_kind, route_ns, "Service", ns, &b.name) {
        return Backend::Unresolved(Unresolved::RefNotPermitted);
    }
    Backend::Service {
        name: b.name.clone(),
        namespace: ns.to_string(),
    }
}

/// The first reason a route's backends do not all resolve, in the spec's order of
/// severity (istiod reports one): an invalid kind, then a reference not permitted, then a
/// missing Service. `service_exists(name, namespace)` and `host_exists(host)` answer from
/// the caller's view of the mesh.
pub fn resolve<'a, 'g>(
    backends: impl IntoIterator<Item = &'a BackendRef>,
    route_kind: &str,
    route_ns: &str,
    grants: impl IntoIterator<Item = (&'g str, &'g ReferenceGrant)> + Clone,
    service_exists: impl Fn(&str, &str) -> bool,
    host_exists: impl Fn(&str) -> bool,
) -> Result<(), Unresolved> {
    let mut worst: Option<Unresolved> = None;
    let rank = |u: Unresolved| match u {
        Unresolved::InvalidKind => 0,
        Unresolved::RefNotPermitted => 1,
        Unresolved::BackendNotFound => 2,
    };
    for b in backends {
        let found = match backend(b, route_kind, route_ns, grants.clone()) {
            Backend::Service { name, namespace } => {
                (!service_exists(&name, &namespace)).then_some(Unresolved::BackendNotFound)
            }
            Backend::Hostname(h) => (!host_exists(&h)).then_some(Unresolved::BackendNotFound),
            Backend::Unresolved(u) => Some(u),
        };
        if let Some(u) = found {
            if worst.is_none_or(|w| rank(u) < rank(w)) {
                worst = Some(u);
            }
        }
    }
    worst.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        AllowedRoutes, ReferenceGrantFrom, ReferenceGrantTo, RouteGroupKind, RouteLabelSelector,
        RouteNamespaces,
    };

    fn listener(name: &str, port: u32, protocol: &str, hostname: Option<&str>) -> Listener {
        Listener {
            name: name.into(),
            port,
            protocol: protocol.into(),
            hostname: hostname.map(Into::into),
            ..Default::default()
        }
    }

    fn gateway() -> KubeGateway {
        KubeGateway {
            gateway_class_name: "istio".into(),
            listeners: vec![
                listener("http", 80, "HTTP", Some("*.example.com")),
                listener("tcp", 9000, "TCP", None),
            ],
        }
    }

    fn parent(section: Option<&str>) -> ParentReference {
        ParentReference {
            name: "gw".into(),
            section_name: section.map(Into::into),
            ..Default::default()
        }
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_route_attaches_to_the_listeners_that_admit_it() {
        let gw = gateway();
        let got = attach(
            "HTTPRoute",
            "ns",
            None,
            &hosts(&["a.example.com"]),
            &parent(None),
            "ns",
            Some(&gw),
        )
        .expect("attached");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].listener.name, "http");
        assert_eq!(got[0].hosts, hosts(&["a.example.com"]));
        let tcp = attach(
            "TCPRoute",
            "ns",
            None,
            &[],
            &parent(Some("tcp")),
            "ns",
            Some(&gw),
        )
        .expect("tcp");
        assert_eq!(tcp[0].hosts, hosts(&["*"]));
    }

    #[test]
    fn not_accepted_reasons_are_the_specs() {
        let gw = gateway();
        let p = parent(None);
        assert_eq!(
            attach("HTTPRoute", "ns", None, &[], &p, "ns", None),
            Err(NotAccepted::NoMatchingParent)
        );
        assert_eq!(
            attach(
                "HTTPRoute",
                "ns",
                None,
                &[],
                &parent(Some("nope")),
                "ns",
                Some(&gw)
            ),
            Err(NotAccepted::NoMatchingParent)
        );
        // Another namespace, `from: Same` by default.
        assert_eq!(
            attach("HTTPRoute", "other", None, &[], &p, "ns", Some(&gw)),
            Err(NotAccepted::NotAllowedByListeners)
        );
        // A kind no listener admits.
        assert_eq!(
            attach("TLSRoute", "ns", None, &[], &p, "ns", Some(&gw)),
            Err(NotAccepted::NotAllowedByListeners)
        );
        assert_eq!(
            attach(
                "HTTPRoute",
                "ns",
                None,
                &hosts(&["example.org"]),
                &p,
                "ns",
                Some(&gw)
            ),
            Err(NotAccepted::NoMatchingListenerHostname)
        );
        assert_eq!(
            NotAccepted::NoMatchingListenerHostname.reason(),
            "NoMatchingListenerHostname"
        );
    }

    #[test]
    fn allowed_routes_kinds_and_namespaces() {
        let mut l = listener("http", 80, "HTTP", None);
        l.allowed_routes = Some(AllowedRoutes {
            namespaces: Some(RouteNamespaces {
                from: Some("All".into()),
                selector: None,
            }),
            kinds: vec![RouteGroupKind {
                group: None,
                kind: "GRPCRoute".into(),
            }],
        });
        assert!(admits_kind(&l, "GRPCRoute"));
        assert!(!admits_kind(&l, "HTTPRoute"));
        assert!(admits_namespace(&l, "gw", "any", None));
        if let Some(n) = l
            .allowed_routes
            .as_mut()
            .and_then(|a| a.namespaces.as_mut())
        {
            n.from = Some("Selector".into());
        }
        // A namespace without published labels matches no selector; one with them is
        // admitted when they match (matchLabels here).
        assert!(!admits_namespace(&l, "gw", "gw", None));
        if let Some(n) = l
            .allowed_routes
            .as_mut()
            .and_then(|a| a.namespaces.as_mut())
        {
            n.selector = Some(RouteLabelSelector {
                match_labels: BTreeMap::from([("expose".to_string(), "yes".to_string())]),
                ..Default::default()
            });
        }
        let labels = BTreeMap::from([("expose".to_string(), "yes".to_string())]);
        assert!(admits_namespace(&l, "gw", "apps", Some(&labels)));
        assert!(!admits_namespace(&l, "gw", "apps", Some(&BTreeMap::new())));
    }

    #[test]
    fn hostname_intersection() {
        assert_eq!(intersect_hosts(None, &[]), Some(hosts(&["*"])));
        assert_eq!(intersect_hosts(Some("a.com"), &[]), Some(hosts(&["a.com"])));
        assert_eq!(
            intersect_hosts(
                Some("*.example.com"),
                &hosts(&["*.com", "b.example.com", "example.com"])
            ),
            Some(hosts(&["*.example.com", "b.example.com"]))
        );
        assert_eq!(intersect_hosts(Some("a.com"), &hosts(&["b.com"])), None);
    }

    fn grant(name: Option<&str>) -> ReferenceGrant {
        ReferenceGrant {
            from: vec![ReferenceGrantFrom {
                group: GATEWAY_API_GROUP.into(),
                kind: "HTTPRoute".into(),
                namespace: "routes".into(),
            }],
            to: vec![ReferenceGrantTo {
                group: String::new(),
                kind: "Service".into(),
                name: name.map(Into::into),
            }],
        }
    }

    fn backend_ref(name: &str, ns: Option<&str>, kind: Option<&str>) -> BackendRef {
        BackendRef {
            name: name.into(),
            namespace: ns.map(Into::into),
            kind: kind.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn resolved_refs_reasons_are_the_specs() {
        let g = grant(Some("svc"));
        let grants = [("backends", &g)];
        let exists = |name: &str, ns: &str| (name, ns) == ("svc", "backends") || ns == "routes";
        let none = |_: &str| false;
        let check = |b: BackendRef, grants: &[(&str, &ReferenceGrant)]| {
            resolve(
                [&b],
                "HTTPRoute",
                "routes",
                grants.iter().copied(),
                exists,
                none,
            )
        };
        assert_eq!(check(backend_ref("local", None, None), &grants), Ok(()));
        assert_eq!(
            check(backend_ref("svc", Some("backends"), None), &grants),
            Ok(())
        );
        assert_eq!(
            check(backend_ref("svc", Some("backends"), None), &[]),
            Err(Unresolved::RefNotPermitted)
        );
        // The grant names another Service.
        assert_eq!(
            check(backend_ref("other", Some("backends"), None), &grants),
            Err(Unresolved::RefNotPermitted)
        );
        assert_eq!(
            check(backend_ref("gone", Some("elsewhere"), None), &[]),
            Err(Unresolved::RefNotPermitted)
        );
        assert_eq!(
            check(backend_ref("x", None, Some("Pod")), &grants),
            Err(Unresolved::InvalidKind)
        );
        assert_eq!(
            check(backend_ref("svc.example", None, Some("Hostname")), &grants),
            Err(Unresolved::InvalidKind),
            "Hostname needs Istio's group"
        );
        let missing = resolve(
            [
                &backend_ref("svc", Some("backends"), None),
                &backend_ref("x", None, Some("Pod")),
            ],
            "HTTPRoute",
            "routes",
            [],
            |_, _| false,
            none,
        );
        assert_eq!(
            missing,
            Err(Unresolved::InvalidKind),
            "the worst reason is reported"
        );
        let not_found = resolve(
            [&backend_ref("gone", None, None)],
            "HTTPRoute",
            "routes",
            [],
            |_, _| false,
            none,
        );
        assert_eq!(not_found, Err(Unresolved::BackendNotFound));
        assert_eq!(Unresolved::BackendNotFound.reason(), "BackendNotFound");
    }
}
