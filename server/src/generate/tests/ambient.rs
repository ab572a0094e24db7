//! ztunnel's Address and Authorization resources (istiod's ambient index).

use crate::testutil::*;
use prost::Message as _;
use shoal_common::model::Endpoint;
use shoal_proto::istio_workload::{self as pb, address::Type, string_match::MatchType};
use shoal_proto::XdsType;
use std::collections::BTreeMap;

fn pod(ip: &str, name: &str, node: &str, ambient: bool, app: &str) -> Endpoint {
    Endpoint {
        pod: name.into(),
        node: node.into(),
        ambient,
        service_account: format!("{app}-sa"),
        ..endpoint(ip, &[("app", app)])
    }
}

fn mesh() -> Mesh {
    let mut svc = service("demo", "server", &[("tcp", 9000)]);
    svc.cluster_ips = vec!["10.96.0.10".into()];
    Mesh::new()
        .with_service(svc)
        .with_slice(slice(
            "demo",
            "server",
            "server-a",
            &[("tcp", 8080)],
            vec![
                pod("10.1.0.10", "server-1", "node-1", true, "server"),
                pod("10.1.0.11", "server-2", "node-2", false, "server"),
            ],
        ))
        .with_config(authorization_policy(
            "demo",
            "allow-client",
            r#"
selector: {matchLabels: {app: server}}
action: ALLOW
rules:
- from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]
  to: [{operation: {ports: ["8080"]}}]
- from: [{source: {namespaces: [demo]}}]
  to: [{operation: {methods: [GET]}}]
"#,
        ))
        .with_config(authorization_policy(
            "demo",
            "deny-http",
            r#"
action: DENY
rules:
- to: [{operation: {paths: ["/admin"]}}]
  from: [{source: {notNamespaces: ["demo*"]}}]
"#,
        ))
        .with_config(authorization_policy(
            "istio-system",
            "audit",
            "action: AUDIT\nrules: [{}]\n",
        ))
}

fn addresses(names: &[&str]) -> BTreeMap<String, pb::Address> {
    gen(
        XdsType::Address,
        &ztunnel_proxy(),
        &mesh().snapshot(),
        names,
    )
    .iter()
    .map(|r| {
        assert_eq!(r.any.type_url, shoal_proto::ADDRESS_TYPE);
        (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap())
    })
    .collect()
}

fn workload(a: &pb::Address) -> &pb::Workload {
    match &a.r#type {
        Some(Type::Workload(w)) => w,
        other => panic!("not a workload: {other:?}"),
    }
}

#[test]
fn wildcard_serves_every_pod_and_service() {
    let all = addresses(&["*"]);
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        [
            "Kubernetes//Pod/demo/server-1",
            "Kubernetes//Pod/demo/server-2",
            "demo/server.demo.svc.cluster.local",
        ]
    );
    let w = workload(&all["Kubernetes//Pod/demo/server-1"]);
    assert_eq!(w.uid, "Kubernetes//Pod/demo/server-1");
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 10]]);
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert_eq!(w.service_account, "server-sa");
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.node, "node-1");
    assert_eq!(w.namespace, "demo");
    assert_eq!(w.authorization_policies, ["demo/allow-client"]);
    let ports = &w.services["demo/server.demo.svc.cluster.local"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (9000, 8080));
    // Not redirected by istio-cni: plain traffic.
    let w2 = workload(&all["Kubernetes//Pod/demo/server-2"]);
    assert_eq!(w2.tunnel_protocol, pb::TunnelProtocol::None as i32);
    assert!(!w.native_tunnel && !w2.native_tunnel);
    let Some(Type::Service(s)) = &all["demo/server.demo.svc.cluster.local"].r#type else {
        panic!("not a service");
    };
    assert_eq!(s.addresses[0].address, vec![10, 96, 0, 10]);
    assert_eq!(
        (s.ports[0].service_port, s.hostname.as_str()),
        (9000, "server.demo.svc.cluster.local")
    );
}

#[test]
fn on_demand_names_by_name_or_address() {
    assert!(addresses(&[]).is_empty());
    let by_ip = addresses(&["/10.1.0.11"]);
    assert_eq!(
        by_ip.keys().collect::<Vec<_>>(),
        ["Kubernetes//Pod/demo/server-2"]
    );
    // A service asked for by its address comes with its workloads (istiod's `Lookup`).
    let by_vip = addresses(&["/10.96.0.10"]);
    assert_eq!(
        by_vip.keys().collect::<Vec<_>>(),
        [
            "Kubernetes//Pod/demo/server-1",
            "Kubernetes//Pod/demo/server-2",
            "demo/server.demo.svc.cluster.local"
        ]
    );
}

/// An on-demand answer names each resource's `<network>/<ip>` names as delta `aliases`
/// (istiod's `AddressInfo.Aliases`), whatever name it was asked by; a wildcard answer
/// has none.
#[test]
fn on_demand_answers_carry_aliases() {
    let snap = mesh().snapshot();
    let aliases = |names: &[&str]| -> BTreeMap<String, Vec<String>> {
        gen(XdsType::Address, &ztunnel_proxy(), &snap, names)
            .into_iter()
            .map(|r| (r.name, r.aliases))
            .collect()
    };
    let by_ip = aliases(&["/10.1.0.11"]);
    assert_eq!(by_ip["Kubernetes//Pod/demo/server-2"], ["/10.1.0.11"]);
    let by_name = aliases(&["Kubernetes//Pod/demo/server-1"]);
    assert_eq!(by_name["Kubernetes//Pod/demo/server-1"], ["/10.1.0.10"]);
    let by_vip = aliases(&["/10.96.0.10"]);
    assert_eq!(
        by_vip["demo/server.demo.svc.cluster.local"],
        ["/10.96.0.10"]
    );
    assert_eq!(by_vip["Kubernetes//Pod/demo/server-2"], ["/10.1.0.11"]);
    assert!(aliases(&["*"]).values().all(Vec::is_empty));
    // The delta entry carries them; the version does not depend on them.
    let wildcard = gen(XdsType::Address, &ztunnel_proxy(), &snap, &["*"]);
    let on_demand = gen(XdsType::Address, &ztunnel_proxy(), &snap, &["/10.1.0.11"]);
    let plain = wildcard
        .iter()
        .find(|r| r.name == on_demand[0].name)
        .unwrap();
    assert_eq!(plain.version, on_demand[0].version);
    let entry = shoal_proto::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse::decode(
        on_demand[0].delta_entry().clone(),
    )
    .unwrap();
    assert_eq!(entry.resources[0].aliases, ["/10.1.0.11"]);
}

/// WorkloadEntries are workloads, named as istiod names them, behind the ServiceEntries
/// and Kubernetes Services of their namespace that select them; a ServiceEntry's
/// `workloadSelector` puts its host in the services of the pods it selects too.
#[test]
fn workload_entries_are_workloads() {
    let mut k8s = service("demo", "vm-svc", &[("http", 80)]);
    k8s.selector = labels(&[("app", "vm")]);
    k8s.ports[0].target_port = Some(shoal_common::model::TargetPort::Number(8080));
    let mut vm = workload_entry(
        "demo",
        "vm-1",
        r#"
address: 10.2.0.5
labels: {app: vm, version: v2}
serviceAccount: vm-sa
network: vm-net
ports: {tcp: 5433}
"#,
    );
    vm.meta
        .annotations
        .insert("ambient.istio.io/redirection".into(), "enabled".into());
    vm.meta
        .labels
        .insert("service.istio.io/workload-name".into(), "vms".into());
    let snapshot = mesh()
        .with_service(k8s)
        .with_config(service_entry(
            "demo",
            "db",
            r#"
hosts: [db.example.com]
addresses: [240.0.0.5]
ports: [{number: 5432, name: tcp, protocol: TCP, targetPort: 6432}]
resolution: STATIC
location: MESH_INTERNAL
workloadSelector: {labels: {app: vm}}
"#,
        ))
        .with_config(service_entry(
            "demo",
            "cache",
            r#"
hosts: [cache.example.com]
ports: [{number: 6379, name: redis, protocol: TCP}]
resolution: STATIC
workloadSelector: {labels: {app: server}}
"#,
        ))
        .with_config(vm)
        .with_config(workload_entry(
            "demo",
            "by-name",
            "address: vm.example.com
",
        ))
        .with_config(workload_entry(
            "other",
            "elsewhere",
            "address: 10.3.0.1
labels: {app: vm}
",
        ))
        .with_config(workload_entry(
            "demo",
            "no-address",
            "labels: {app: vm}
",
        ))
        .snapshot();
    let get = |names: &[&str]| -> BTreeMap<String, pb::Address> {
        gen(XdsType::Address, &ztunnel_proxy(), &snapshot, names)
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect()
    };
    let all = get(&["*"]);
    let uid = "Kubernetes/networking.istio.io/WorkloadEntry/demo/vm-1";
    let w = workload(&all[uid]);
    assert_eq!(w.uid, uid);
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("vm-1", "demo"));
    assert_eq!(w.addresses, vec![vec![10, 2, 0, 5]]);
    assert_eq!(w.network, "vm-net");
    assert_eq!(w.service_account, "vm-sa");
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert_eq!(w.workload_name, "vms");
    assert_eq!(
        (w.canonical_name.as_str(), w.canonical_revision.as_str()),
        ("vm", "v2")
    );
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.status, pb::WorkloadStatus::Healthy as i32);
    let services: BTreeMap<&str, Vec<(u32, u32)>> = w
        .services
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                v.ports
                    .iter()
                    .map(|p| (p.service_port, p.target_port))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        services,
        BTreeMap::from([
            // The entry's port named `tcp` is the WorkloadEntry's port `tcp`.
            ("demo/db.example.com", vec![(5432, 5433)]),
            // The Service's numeric target port (the entry has no port named `http`).
            ("demo/vm-svc.demo.svc.cluster.local", vec![(80, 8080)]),
        ])
    );
    // A DNS name: a workload with a hostname, no addresses; no annotation: no tunnel.
    let by_name = workload(&all["Kubernetes/networking.istio.io/WorkloadEntry/demo/by-name"]);
    assert!(by_name.addresses.is_empty());
    assert_eq!(by_name.hostname, "vm.example.com");
    assert_eq!(by_name.tunnel_protocol, pb::TunnelProtocol::None as i32);
    assert!(by_name.services.is_empty());
    // Selection stays in the namespace; an entry without an address is not served.
    let elsewhere = workload(&all["Kubernetes/networking.istio.io/WorkloadEntry/other/elsewhere"]);
    assert!(elsewhere.services.is_empty(), "{elsewhere:?}");
    assert!(!all.contains_key("Kubernetes/networking.istio.io/WorkloadEntry/demo/no-address"));
    // The pods the second entry selects have its host among their services (its port,
    // no targetPort: the port itself).
    let pod = workload(&all["Kubernetes//Pod/demo/server-1"]);
    let cache = &pod.services["demo/cache.example.com"].ports;
    assert_eq!((cache[0].service_port, cache[0].target_port), (6379, 6379));
    assert!(pod
        .services
        .contains_key("demo/server.demo.svc.cluster.local"));
    // On demand: found by `<its network>/<ip>` only, and with the service that selects it.
    assert_eq!(get(&["vm-net/10.2.0.5"]).keys().collect::<Vec<_>>(), [uid]);
    assert!(get(&["/10.2.0.5"]).is_empty());
    assert_eq!(
        get(&["/240.0.0.5"]).keys().collect::<Vec<_>>(),
        [uid, "demo/db.example.com"]
    );
}

#[test]
fn on_demand_gets_its_nodes_workloads_and_subscribed_services_pods() {
    // What istiod sends an on-demand ztunnel unasked (`AdditionalPodSubscriptions`).
    let node = crate::generate::ambient::node_name("node-1");
    assert_eq!(
        addresses(&[&node]).keys().collect::<Vec<_>>(),
        ["Kubernetes//Pod/demo/server-1"]
    );
    assert!(addresses(&[&crate::generate::ambient::node_name("node-9")]).is_empty());
    assert_eq!(
        addresses(&["demo/server.demo.svc.cluster.local"])
            .keys()
            .collect::<Vec<_>>(),
        [
            "Kubernetes//Pod/demo/server-1",
            "Kubernetes//Pod/demo/server-2",
            "demo/server.demo.svc.cluster.local"
        ]
    );
}

#[test]
fn sidecars_get_no_ambient_types() {
    let snap = mesh().snapshot();
    let p = sidecar_proxy("demo", &[]);
    assert!(gen(XdsType::Address, &p, &snap, &["*"]).is_empty());
    assert!(gen(XdsType::Authorization, &p, &snap, &["*"]).is_empty());
    // And a ztunnel no Envoy types.
    assert!(gen(XdsType::Cluster, &ztunnel_proxy(), &snap, &[]).is_empty());
}

#[test]
fn authorization_fails_closed_on_http_fields() {
    let out: BTreeMap<String, pb::Authorization> = gen(
        XdsType::Authorization,
        &ztunnel_proxy(),
        &mesh().snapshot(),
        &["*"],
    )
    .iter()
    .map(|r| {
        (
            r.name.clone(),
            pb::Authorization::decode(&*r.any.value).unwrap(),
        )
    })
    .collect();
    // AUDIT needs a waypoint: not served.
    assert_eq!(
        out.keys().collect::<Vec<_>>(),
        ["demo/allow-client", "demo/deny-http"]
    );
    let allow = &out["demo/allow-client"];
    assert_eq!(allow.scope, pb::Scope::WorkloadSelector as i32);
    assert_eq!(allow.action, pb::Action::Allow as i32);
    // The rule with `methods` is dropped: it would allow more than it says.
    assert_eq!(allow.rules.len(), 1);
    let clauses = &allow.rules[0].clauses;
    assert_eq!(clauses[0].matches[0].destination_ports, [8080]);
    assert_eq!(
        clauses[1].matches[0].principals[0].match_type,
        Some(MatchType::Exact("cluster.local/ns/demo/sa/client".into()))
    );
    let deny = &out["demo/deny-http"];
    assert_eq!(deny.scope, pb::Scope::Namespace as i32);
    assert_eq!(deny.action, pb::Action::Deny as i32);
    // The DENY keeps its layer 4 part (denies more): every caller outside demo*.
    assert_eq!(deny.rules.len(), 1);
    let from = &deny.rules[0].clauses[1].matches[0];
    assert_eq!(
        from.not_namespaces[0].match_type,
        Some(MatchType::Prefix("demo".into()))
    );
}

/// istiod's `setTunnelProtocol` would serve a pod labelled
/// `networking.istio.io/tunnel: http` as native HBONE; shoal's sidecars terminate no
/// HBONE, so it is served without a tunnel (see `generate::ambient::workload`), and a
/// pod with istio-cni's annotation stays HBONE whatever its labels.
#[test]
fn native_tunnel_label_is_not_honoured() {
    let mut native = pod("10.1.0.20", "native-1", "node-1", false, "native");
    native
        .labels
        .insert("networking.istio.io/tunnel".into(), "h2c,http".into());
    let mut redirected = pod("10.1.0.21", "redirected-1", "node-1", true, "native");
    redirected
        .labels
        .insert("networking.istio.io/tunnel".into(), "http".into());
    let mesh = Mesh::new()
        .with_service(service("demo", "native", &[("tcp", 9000)]))
        .with_slice(slice(
            "demo",
            "native",
            "native-a",
            &[("tcp", 8080)],
            vec![native, redirected],
        ));
    let all: BTreeMap<String, pb::Address> =
        gen(XdsType::Address, &ztunnel_proxy(), &mesh.snapshot(), &["*"])
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect();
    let w = workload(&all["Kubernetes//Pod/demo/native-1"]);
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::None as i32);
    assert!(!w.native_tunnel);
    let w = workload(&all["Kubernetes//Pod/demo/redirected-1"]);
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert!(!w.native_tunnel);
}

/// A pod behind no Service (published as its own `-pod` set) is a workload without
/// services; while it is also on a Service's slice (the moment it joins one) it is still
/// one workload, with that service.
#[test]
fn pods_behind_no_service_are_workloads() {
    use shoal_common::model::NO_SERVICE;
    let lone = |mesh: Mesh| {
        mesh.with_slice(slice(
            "demo",
            NO_SERVICE,
            "client-1",
            &[],
            vec![pod("10.1.0.20", "client-1", "node-1", true, "server")],
        ))
    };
    let snapshot = lone(mesh()).snapshot();
    let all: BTreeMap<String, pb::Address> =
        gen(XdsType::Address, &ztunnel_proxy(), &snapshot, &["*"])
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect();
    let w = workload(&all["Kubernetes//Pod/demo/client-1"]);
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 20]]);
    assert!(w.services.is_empty(), "{w:?}");
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert_eq!(
        (w.node.as_str(), w.service_account.as_str()),
        ("node-1", "server-sa")
    );
    assert_eq!(w.status, pb::WorkloadStatus::Healthy as i32);
    // Selected by labels like any pod.
    assert_eq!(w.authorization_policies, ["demo/allow-client"]);
    // No service named `-pod` is served.
    assert_eq!(all.len(), 4, "{:?}", all.keys().collect::<Vec<_>>());

    let both = lone(mesh()).with_slice(slice(
        "demo",
        "server",
        "server-b",
        &[("tcp", 8080)],
        vec![pod("10.1.0.20", "client-1", "node-1", true, "server")],
    ));
    let all: Vec<(String, pb::Address)> =
        gen(XdsType::Address, &ztunnel_proxy(), &both.snapshot(), &["*"])
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .filter(|(n, _)| n.ends_with("/client-1"))
            .collect();
    assert_eq!(all.len(), 1);
    let w = workload(&all[0].1);
    assert_eq!(
        w.services.keys().collect::<Vec<_>>(),
        ["demo/server.demo.svc.cluster.local"]
    );
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 20]]);
}

/// A ServiceEntry host is a `Service` named `<ns>/<host>`, with the entry's addresses and
/// ports (its `targetPort` where given), found on demand by its address too.
#[test]
fn service_entries_are_services() {
    let snapshot = mesh()
        .with_config(service_entry(
            "demo",
            "db",
            r#"
hosts: [db.example.com]
addresses: [240.0.0.5]
ports: [{number: 5432, name: tcp, protocol: TCP, targetPort: 6432}]
resolution: STATIC
location: MESH_INTERNAL
"#,
        ))
        .snapshot();
    let get = |names: &[&str]| -> BTreeMap<String, pb::Address> {
        gen(XdsType::Address, &ztunnel_proxy(), &snapshot, names)
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect()
    };
    let all = get(&["*"]);
    let Some(Type::Service(s)) = &all["demo/db.example.com"].r#type else {
        panic!("{all:?}");
    };
    assert_eq!(s.hostname, "db.example.com");
    assert_eq!(s.addresses[0].address, vec![240, 0, 0, 5]);
    assert_eq!(
        (s.ports[0].service_port, s.ports[0].target_port),
        (5432, 6432)
    );
    assert_eq!(
        get(&["/240.0.0.5"]).keys().collect::<Vec<_>>(),
        ["demo/db.example.com"]
    );
}

/// A ServiceEntry's inline endpoints are workloads behind each of its hosts, named
/// `<cluster>/networking.istio.io/ServiceEntry/<ns>/<name>/<address>`; a DNS entry without
/// endpoints has one hostname workload per host (istiod's `serviceEntryWorkloadBuilder`).
#[test]
fn service_entry_endpoints_are_workloads() {
    let mut api = service_entry(
        "demo",
        "api",
        r#"
hosts: [api.example.com, api2.example.com]
addresses: [240.0.0.7]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: STATIC
endpoints:
- {address: 10.4.0.1, ports: {https: 8443}, serviceAccount: api}
- {address: api.internal}
"#,
    );
    api.meta.labels.insert("app".into(), "api".into());
    let snapshot = mesh()
        .with_config(api)
        .with_config(service_entry(
            "demo",
            "ext",
            "hosts: [httpbin.org]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: DNS\n",
        ))
        .with_config(service_entry(
            "demo",
            "selected",
            "hosts: [sel.example.com]\nports: [{number: 80, name: http, protocol: HTTP}]\n\
             resolution: DNS\nworkloadSelector: {labels: {app: none}}\n",
        ))
        .snapshot();
    let all: BTreeMap<String, pb::Address> =
        gen(XdsType::Address, &ztunnel_proxy(), &snapshot, &["*"])
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect();
    let prefix = "Kubernetes/networking.istio.io/ServiceEntry/demo/";
    let entries: Vec<&str> = all.keys().filter_map(|k| k.strip_prefix(prefix)).collect();
    assert_eq!(
        entries,
        ["api/10.4.0.1", "api/api.internal", "ext/httpbin.org"]
    );
    let ip = workload(&all[&format!("{prefix}api/10.4.0.1")]);
    assert_eq!(
        (ip.name.as_str(), ip.workload_name.as_str()),
        ("api", "api")
    );
    assert_eq!(ip.addresses, vec![vec![10, 4, 0, 1]]);
    assert_eq!(ip.service_account, "api");
    assert_eq!(ip.canonical_name, "api");
    let ports = |w: &pb::Workload| -> BTreeMap<String, Vec<(u32, u32)>> {
        w.services
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.ports
                        .iter()
                        .map(|p| (p.service_port, p.target_port))
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(
        ports(ip),
        BTreeMap::from([
            ("demo/api.example.com".to_string(), vec![(443, 8443)]),
            ("demo/api2.example.com".to_string(), vec![(443, 8443)]),
        ])
    );
    let named = workload(&all[&format!("{prefix}api/api.internal")]);
    assert!(named.addresses.is_empty());
    assert_eq!(named.hostname, "api.internal");
    assert_eq!(ports(named)["demo/api.example.com"], [(443, 443)]);
    let dns = workload(&all[&format!("{prefix}ext/httpbin.org")]);
    assert_eq!(dns.hostname, "httpbin.org");
    assert_eq!(
        ports(dns),
        BTreeMap::from([("demo/httpbin.org".to_string(), vec![(80, 80)])])
    );
    assert_eq!(dns.tunnel_protocol, pb::TunnelProtocol::None as i32);
}

/// A root-namespace policy with a selector selects workloads of every namespace (as for
/// sidecars, and istiod's `buildWorkloadPolicies`): ztunnel enforces a selector policy
/// only on the workloads that list it, so leaving it out would not enforce it.
#[test]
fn root_namespace_selector_policies_select_every_namespace() {
    let snapshot = mesh()
        .with_config(authorization_policy(
            "istio-system",
            "deny-server",
            "selector: {matchLabels: {app: server}}\naction: DENY\nrules: [{from: [{source: {namespaces: [bad]}}]}]\n",
        ))
        .with_config(authorization_policy(
            "other",
            "elsewhere",
            "selector: {matchLabels: {app: server}}\nrules: [{}]\n",
        ))
        .snapshot();
    let all: BTreeMap<String, pb::Address> =
        gen(XdsType::Address, &ztunnel_proxy(), &snapshot, &["*"])
            .iter()
            .map(|r| (r.name.clone(), pb::Address::decode(&*r.any.value).unwrap()))
            .collect();
    let w = workload(&all["Kubernetes//Pod/demo/server-1"]);
    assert_eq!(
        w.authorization_policies,
        ["demo/allow-client", "istio-system/deny-server"]
    );
}
