//! Ambient mode: a client speaking what ztunnel speaks against a real `shoal-server`
//! (standalone mode, issuer keys from a JWKS file): delta ADS over TLS with a bearer token
//! for both ambient types, updates on pod/service/policy/WorkloadEntry changes, on-demand
//! names (with their aliases), and the
//! CA's impersonation for the pods of the ztunnel's own node (and its refusals).

use prost::Message;
use shoal_proto::istio_workload::{self as pb, address::Type};
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
use shoal_tests::pki::{self, ServerPki, TokenSigner};
use shoal_tests::ports::free_addr;
use shoal_tests::shoal::ShoalServer;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(30);
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const SERVER_1: &str = "Kubernetes//Pod/demo/server-1";
const SERVICE: &str = "demo/server.demo.svc.cluster.local";
const CLIENT_0: &str = "Kubernetes//Pod/demo/client-0";

fn pod(name: &str, ip: &str, node: &str) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: demo
  labels: {{app: server}}
  annotations: {{ambient.istio.io/redirection: enabled}}
spec: {{serviceAccountName: server, nodeName: {node}, containers: [{{name: app, image: app}}]}}
status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}
"#
    )
}

/// The manifests: the `server` service with `pods` (name, IP), on node-1 unless named
/// `*-n2`, and an ALLOW policy for `principal`.
fn manifests(dir: &Path, pods: &[(&str, &str)], service_port: u16, principal: &str) {
    manifests_with(dir, pods, service_port, principal, "");
}

/// The manifests of [`manifests`] plus `extra` (more objects, each starting with `---`).
fn manifests_with(
    dir: &Path,
    pods: &[(&str, &str)],
    service_port: u16,
    principal: &str,
    extra: &str,
) {
    let mut yaml = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: server, namespace: demo}}
spec:
  clusterIP: 10.96.0.10
  selector: {{app: server}}
  ports: [{{name: tcp, port: {service_port}, targetPort: 8080}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: allow-client, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: server}}}}
  action: ALLOW
  rules:
  - from: [{{source: {{principals: ["{principal}"]}}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: server-a, namespace: demo, labels: {{kubernetes.io/service-name: server}}}}
addressType: IPv4
ports: [{{name: tcp, port: 8080}}]
endpoints:
"#
    );
    for (name, ip) in pods {
        yaml.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  targetRef: {{kind: Pod, name: {name}, namespace: demo}}\n"
        ));
    }
    for (name, ip) in pods {
        let node = if name.ends_with("-n2") {
            "node-2"
        } else {
            "node-1"
        };
        yaml.push_str(&pod(name, ip, node));
    }
    yaml.push_str(extra);
    write(dir, &yaml);
}

fn write(dir: &Path, yaml: &str) {
    // Written beside, then renamed: the watcher never reads half a file.
    let tmp = dir.join(".mesh.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join("mesh.yaml")).unwrap();
}

/// The next push of workload `name`; it must not be removed meanwhile (a pod that joins or
/// leaves a Service stays one workload).
async fn next_workload(z: &mut Ztunnel, name: &str) -> pb::Workload {
    loop {
        let r = z.recv().await;
        assert!(
            !r.removed_resources.iter().any(|n| n == name),
            "{name} removed: {r:?}"
        );
        if let Some(Type::Workload(w)) = addresses(&r).remove(name) {
            return w;
        }
    }
}

/// A bound token of `istio-system/ztunnel` on `node`, as the kubelet projects it.
fn ztunnel_token(signer: &TokenSigner, node: Option<&str>) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut k8s = serde_json::json!({
        "namespace": "istio-system",
        "serviceaccount": {"name": "ztunnel", "uid": "1"},
        "pod": {"name": "ztunnel-1", "uid": "2"},
    });
    if let Some(node) = node {
        k8s["node"] = serde_json::json!({"name": node, "uid": "3"});
    }
    signer.sign(&serde_json::json!({
        "aud": ["istio-ca"], "iss": ISSUER, "iat": now, "nbf": now, "exp": now + 3600,
        "sub": "system:serviceaccount:istio-system:ztunnel",
        "kubernetes.io": k8s,
    }))
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req.metadata_mut()
        .insert("clusterid", "Kubernetes".parse().unwrap());
    req
}

/// A delta ADS stream as ztunnel opens it.
struct Ztunnel {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Ztunnel {
    async fn connect(addr: SocketAddr, pki: &ServerPki, token: &str) -> Ztunnel {
        let channel = pki::tls_channel(addr, pki::client_config(&pki.ca.cert_pem, None))
            .await
            .expect("TLS channel");
        let (tx, rx) = mpsc::channel(8);
        let responses = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(with_token(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                token,
            ))
            .await
            .expect("stream opens")
            .into_inner();
        Ztunnel { tx, responses }
    }

    async fn subscribe(&mut self, url: &str, sub: &[&str], unsub: &[&str]) {
        let string = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let fields = [
            ("NAMESPACE", "istio-system"),
            ("NAME", "ztunnel-1"),
            ("NODE_NAME", "node-1"),
            ("CLUSTER_ID", "Kubernetes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), string(v)))
        .collect();
        let req = DeltaDiscoveryRequest {
            node: Some(Node {
                id: "ztunnel~10.1.0.3~ztunnel-1.istio-system~istio-system.svc.cluster.local".into(),
                metadata: Some(Struct { fields }),
                ..Node::default()
            }),
            type_url: url.into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        self.tx.send(req).await.unwrap();
    }

    /// The next response, ACKed.
    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        let r = tokio::time::timeout(TIMEOUT, self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream ok")
            .expect("stream open");
        let ack = DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        };
        self.tx.send(ack).await.unwrap();
        r
    }
}

fn addresses(r: &DeltaDiscoveryResponse) -> BTreeMap<String, Type> {
    assert_eq!(r.type_url, shoal_proto::ADDRESS_TYPE);
    r.resources
        .iter()
        .map(|res| {
            let any = res.resource.as_ref().expect("a resource");
            let a = pb::Address::decode(&*any.value).expect("an Address");
            (res.name.clone(), a.r#type.expect("workload or service"))
        })
        .collect()
}

async fn create_certificate(
    addr: SocketAddr,
    pki: &ServerPki,
    token: &str,
    impersonate: &str,
) -> Result<Vec<String>, tonic::Status> {
    let channel = pki::tls_channel(addr, pki::client_config(&pki.ca.cert_pem, None))
        .await
        .expect("TLS channel");
    let headers = [
        ("authorization", format!("Bearer {token}")),
        ("clusterid", "Kubernetes".to_string()),
    ];
    pki::create_certificate_as(channel, Some(impersonate), &headers)
        .await
        .map(|(chain, _key)| chain)
}

async fn metric(server: &ShoalServer, series: &str) -> f64 {
    let text = server.admin_get("/metrics").await.expect("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_gets_addresses_policies_and_its_nodes_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::create_dir(&mesh).unwrap();
    let client = "cluster.local/ns/demo/sa/client";
    manifests(&mesh, &[("server-1", "10.1.0.10")], 9000, client);
    let signer = TokenSigner::new(ISSUER, "key-1");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, signer.jwks().to_string()).unwrap();
    let pki = ServerPki::new();
    let tls = free_addr();
    let mut args: Vec<String> = [
        "--standalone",
        mesh.to_str().unwrap(),
        "--token-issuer",
        ISSUER,
        "--token-issuer-jwks",
        jwks.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(pki.server_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ShoalServer::start(&args).await;
    let token = ztunnel_token(&signer, Some("node-1"));

    // Wildcard, both types, over TLS with the token.
    let mut z = Ztunnel::connect(tls, &pki, &token).await;
    z.subscribe(shoal_proto::ADDRESS_TYPE, &[], &[]).await;
    let first = addresses(&z.recv().await);
    assert_eq!(
        first.keys().collect::<Vec<_>>(),
        [SERVER_1, SERVICE],
        "{first:?}"
    );
    let Type::Workload(w) = &first[SERVER_1] else {
        panic!("{first:?}")
    };
    assert_eq!(w.addresses, [vec![10, 1, 0, 10]]);
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert_eq!(
        (w.node.as_str(), w.service_account.as_str()),
        ("node-1", "server")
    );
    assert_eq!(w.authorization_policies, ["demo/allow-client"]);
    let Type::Service(s) = &first[SERVICE] else {
        panic!("{first:?}")
    };
    assert_eq!(s.addresses[0].address, [10, 96, 0, 10]);
    assert_eq!(
        (s.ports[0].service_port, s.ports[0].target_port),
        (9000, 8080)
    );
    z.subscribe(shoal_proto::AUTHORIZATION_TYPE, &[], &[]).await;
    let authz = z.recv().await;
    assert_eq!(authz.type_url, shoal_proto::AUTHORIZATION_TYPE);
    assert_eq!(authz.resources.len(), 1);
    assert_eq!(authz.resources[0].name, "demo/allow-client");

    // A new pod (on node-2): only it is pushed.
    manifests(
        &mesh,
        &[("server-1", "10.1.0.10"), ("server-2-n2", "10.1.0.11")],
        9000,
        client,
    );
    let r = z.recv().await;
    let pushed = addresses(&r);
    assert_eq!(
        pushed.keys().collect::<Vec<_>>(),
        ["Kubernetes//Pod/demo/server-2-n2"]
    );
    // A service change (port), then a policy change: each pushed as what changed.
    manifests(
        &mesh,
        &[("server-1", "10.1.0.10"), ("server-2-n2", "10.1.0.11")],
        9001,
        "cluster.local/ns/demo/sa/other",
    );
    let mut seen_service = false;
    let mut seen_policy = false;
    while !(seen_service && seen_policy) {
        let r = z.recv().await;
        if r.type_url == shoal_proto::AUTHORIZATION_TYPE {
            let p = pb::Authorization::decode(&*r.resources[0].resource.as_ref().unwrap().value)
                .unwrap();
            let m = &p.rules[0].clauses[0].matches[0];
            assert_eq!(
                m.principals[0].match_type,
                Some(pb::string_match::MatchType::Exact(
                    "cluster.local/ns/demo/sa/other".into()
                ))
            );
            seen_policy = true;
        } else if let Some(Type::Service(s)) = addresses(&r).get(SERVICE) {
            assert_eq!(s.ports[0].service_port, 9001);
            seen_service = true;
        }
    }

    // A pod behind no Service is a workload of its own; it gets a Service (still one
    // workload, now with the service), loses it (still a workload), and is deleted.
    let pods = [("server-1", "10.1.0.10"), ("server-2-n2", "10.1.0.11")];
    let other = "cluster.local/ns/demo/sa/other";
    let lone = r#"---
apiVersion: v1
kind: Pod
metadata: {name: client-0, namespace: demo, labels: {app: client}, annotations: {ambient.istio.io/redirection: enabled}}
spec: {serviceAccountName: client, nodeName: node-1, containers: [{name: app, image: app}]}
status: {phase: Running, podIP: 10.1.0.20, podIPs: [{ip: 10.1.0.20}], conditions: [{type: Ready, status: "True"}]}
"#;
    let client_service = r#"---
apiVersion: v1
kind: Service
metadata: {name: client, namespace: demo}
spec:
  clusterIP: 10.96.0.20
  selector: {app: client}
  ports: [{name: tcp, port: 7000, targetPort: 7000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: client-a, namespace: demo, labels: {kubernetes.io/service-name: client}}
addressType: IPv4
ports: [{name: tcp, port: 7000}]
endpoints:
- addresses: ["10.1.0.20"]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: client-0, namespace: demo}
"#;
    manifests_with(&mesh, &pods, 9001, other, lone);
    let w = next_workload(&mut z, CLIENT_0).await;
    assert_eq!(w.addresses, [vec![10, 1, 0, 20]]);
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    assert_eq!(
        (
            w.node.as_str(),
            w.service_account.as_str(),
            w.namespace.as_str()
        ),
        ("node-1", "client", "demo")
    );
    assert_eq!(w.status, pb::WorkloadStatus::Healthy as i32);
    assert!(w.services.is_empty(), "{w:?}");
    manifests_with(
        &mesh,
        &pods,
        9001,
        other,
        &format!("{lone}{client_service}"),
    );
    let w = next_workload(&mut z, CLIENT_0).await;
    assert_eq!(
        w.services.keys().collect::<Vec<_>>(),
        ["demo/client.demo.svc.cluster.local"]
    );
    assert_eq!(w.addresses, [vec![10, 1, 0, 20]]);
    manifests_with(&mesh, &pods, 9001, other, lone);
    let w = next_workload(&mut z, CLIENT_0).await;
    assert!(w.services.is_empty(), "{w:?}");
    manifests(&mesh, &pods, 9001, other);
    loop {
        let r = z.recv().await;
        if r.removed_resources.iter().any(|n| n == CLIENT_0) {
            break;
        }
        assert!(!addresses(&r).contains_key(CLIENT_0), "{r:?}");
    }

    // A ServiceEntry host is a Service address.
    let se = r#"---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: demo}
spec:
  hosts: [db.example.com]
  addresses: [240.0.0.5]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  location: MESH_INTERNAL
"#;
    manifests_with(&mesh, &pods, 9001, other, se);
    let s = loop {
        if let Some(Type::Service(s)) = addresses(&z.recv().await).remove("demo/db.example.com") {
            break s;
        }
    };
    assert_eq!(s.addresses[0].address, [240, 0, 0, 5]);
    assert_eq!(s.ports[0].service_port, 5432);

    // A WorkloadEntry the ServiceEntry selects is a workload behind it; deleted, removed.
    let vm = r#"---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: demo}
spec:
  hosts: [db.example.com]
  addresses: [240.0.0.5]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  location: MESH_INTERNAL
  workloadSelector: {labels: {app: db}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: db-vm, namespace: demo, annotations: {ambient.istio.io/redirection: enabled}}
spec:
  address: 10.2.0.5
  labels: {app: db}
  serviceAccount: db
  ports: {tcp: 6432}
"#;
    const DB_VM: &str = "Kubernetes/networking.istio.io/WorkloadEntry/demo/db-vm";
    manifests_with(&mesh, &pods, 9001, other, vm);
    let w = next_workload(&mut z, DB_VM).await;
    assert_eq!(w.addresses, [vec![10, 2, 0, 5]]);
    assert_eq!(w.service_account, "db");
    assert_eq!(w.tunnel_protocol, pb::TunnelProtocol::Hbone as i32);
    let ports = &w.services["demo/db.example.com"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (5432, 6432));
    manifests_with(&mesh, &pods, 9001, other, se);
    loop {
        let r = z.recv().await;
        if r.removed_resources.iter().any(|n| n == DB_VM) {
            break;
        }
        assert!(!addresses(&r).contains_key(DB_VM), "{r:?}");
    }

    // On demand: `*` out, which still sends the workloads of the ztunnel's node (its
    // NODE_NAME, node-1), as istiod does; then one address by IP.
    let mut od = Ztunnel::connect(tls, &pki, &token).await;
    od.subscribe(shoal_proto::ADDRESS_TYPE, &["*"], &["*"])
        .await;
    let local = addresses(&od.recv().await);
    assert!(!local.is_empty());
    for (name, address) in &local {
        let Type::Workload(w) = address else {
            panic!("{name}: not a workload")
        };
        assert_eq!(w.node, "node-1", "{name}");
    }
    od.subscribe(shoal_proto::ADDRESS_TYPE, &["/10.1.0.11"], &[])
        .await;
    let r = od.recv().await;
    let one = addresses(&r);
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        ["Kubernetes//Pod/demo/server-2-n2"]
    );
    // Under its own name, with the name it was asked by as an alias (as istiod sends it).
    assert_eq!(r.resources[0].aliases, ["/10.1.0.11"]);
    // An address that names nothing is answered at once, as removed (as istiod does).
    od.subscribe(shoal_proto::ADDRESS_TYPE, &["/10.9.9.9"], &[])
        .await;
    let r = od.recv().await;
    assert!(r.resources.is_empty(), "{r:?}");
    assert_eq!(r.removed_resources, ["/10.9.9.9"]);

    // The CA: a pod of node-1's identity, with a chain ending at the root.
    let chain = create_certificate(
        tls,
        &pki,
        &token,
        "spiffe://cluster.local/ns/demo/sa/server",
    )
    .await
    .expect("impersonation for a pod on the ztunnel's node");
    assert!(chain.len() >= 2);
    assert_eq!(chain.last().unwrap().trim(), pki.ca.cert_pem.trim());
    // Refusals: an identity with no pod on node-1, a token without a node.
    let other = create_certificate(
        tls,
        &pki,
        &token,
        "spiffe://cluster.local/ns/demo/sa/client",
    )
    .await
    .unwrap_err();
    assert_eq!(other.code(), Code::Unauthenticated, "{other:?}");
    let nameless = ztunnel_token(&signer, None);
    let unknown = create_certificate(
        tls,
        &pki,
        &nameless,
        "spiffe://cluster.local/ns/demo/sa/server",
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), Code::Unauthenticated, "{unknown:?}");
    for (result, n) in [
        ("issued", 1.0),
        ("impersonation_not_on_node", 1.0),
        ("impersonation_unknown_node", 1.0),
    ] {
        let series = format!("shoal_ca_requests_total{{result=\"{result}\"}}");
        assert_eq!(metric(&server, &series).await, n, "{series}");
    }
    assert_eq!(
        metric(&server, "shoal_xds_connections{proxy_type=\"ztunnel\"}").await,
        2.0
    );
}
