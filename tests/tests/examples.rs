//! The examples in `docs/examples` stay true: the bootstraps (the captured-sidecar template
//! rendered as scripts/captured-demo.sh renders it) are valid Envoy config and the same as
//! the ones the tests use, the manifests parse, and the example mesh works. The captured
//! demo itself runs in tests/tests/quickstart_captured.rs.
#![forbid(unsafe_code)]

use shoal_tests::bootstrap::{bootstrap, bootstrap_with, with_sds, AdsMode, Node};
use shoal_tests::http::Request;
use shoal_tests::netns;
use shoal_tests::ports::{free_port, free_port_on, loopback};
use shoal_tests::{eventually, Backend, Envoy, ShoalServer};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn bootstraps_are_valid_envoy_config() {
    for name in ["gateway.yaml", "gateway-api.yaml", "sidecar.yaml"] {
        let path = examples().join("bootstrap").join(name);
        if let Err(out) = shoal_tests::envoy::validate(&path).await {
            panic!("{} is not valid Envoy config:\n{out}", path.display());
        }
    }
}

#[test]
fn bootstraps_match_the_ones_the_tests_use() {
    let xds = [SocketAddr::from(([127, 0, 0, 1], 15010))];
    for (name, node, admin) in [
        ("gateway.yaml", Node::gateway(), 15000),
        ("gateway-api.yaml", gateway_api_node(), 15002),
        ("sidecar.yaml", Node::sidecar(), 15001),
    ] {
        let path = examples().join("bootstrap").join(name);
        let documented: serde_json::Value = shoal_common::yaml::from_str(&read(&path)).unwrap();
        let generated: serde_json::Value =
            shoal_common::yaml::from_str(&istio_agent_socket(&bootstrap(&node, admin, &xds)))
                .unwrap();
        assert_eq!(
            documented,
            generated,
            "{} differs from support/bootstrap.rs",
            path.display()
        );
    }
}

/// The Envoy of the example's Gateway API Gateway `istio-system/web`.
fn gateway_api_node() -> Node {
    Node {
        id: "router~127.0.0.1~web-1.istio-system~istio-system.svc.cluster.local".into(),
        cluster: "web".into(),
        namespace: "istio-system".into(),
        labels: vec![(
            "gateway.networking.k8s.io/gateway-name".into(),
            "web".into(),
        )],
        ..Node::gateway()
    }
}

/// A pod of `docs/examples/captured`, as its Pod manifest says.
struct CapturedPod {
    name: String,
    ip: String,
    labels: Vec<(String, String)>,
}

fn captured_pods() -> Vec<CapturedPod> {
    let docs = manifests(&examples().join("captured"));
    let pods: Vec<CapturedPod> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "Pod")
        .map(|(_, d)| CapturedPod {
            name: d["metadata"]["name"].as_str().expect("pod name").into(),
            ip: d["status"]["podIP"].as_str().expect("podIP").into(),
            labels: d["metadata"]["labels"]
                .as_object()
                .expect("pod labels")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("label value").into()))
                .collect(),
        })
        .collect();
    assert_eq!(pods.len(), 3, "productpage, reviews-v1, reviews-v2");
    pods
}

/// `captured-sidecar.yaml` with its placeholders filled in, as scripts/captured-demo.sh does.
fn render_captured(pod: &CapturedPod, xds: SocketAddr) -> String {
    let app = pod
        .labels
        .iter()
        .find(|(k, _)| k == "app")
        .map(|(_, v)| v.as_str())
        .expect("app label");
    let labels = pod
        .labels
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = read(&examples().join("bootstrap/captured-sidecar.yaml"))
        .replace("${POD_NAME}", &pod.name)
        .replace("${POD_IP}", &pod.ip)
        .replace("${APP}", app)
        .replace("${LABELS}", &format!("{{{labels}}}"))
        .replace("${XDS_ADDRESS}", &xds.ip().to_string())
        .replace("${XDS_PORT}", &xds.port().to_string());
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(!line.contains("${"), "unfilled placeholder: {line}");
    }
    text
}

const CAPTURED_XDS: ([u8; 4], u16) = ([198, 18, 0, 254], 15010);

#[tokio::test]
async fn captured_sidecar_bootstrap_renders_to_valid_envoy_config() {
    let dir = tempfile::tempdir().unwrap();
    for pod in captured_pods() {
        let path = dir.path().join(format!("{}.yaml", pod.name));
        std::fs::write(&path, render_captured(&pod, SocketAddr::from(CAPTURED_XDS))).unwrap();
        if let Err(out) = shoal_tests::envoy::validate(&path).await {
            panic!(
                "captured-sidecar.yaml rendered for {} is not valid Envoy config:\n{out}",
                pod.name
            );
        }
    }
}

/// A test bootstrap with its `sds-grpc` cluster on istio-agent's socket, where the documented
/// bootstraps have it (the tests serve their own; see `shoal_tests::sds`).
fn istio_agent_socket(bootstrap: &str) -> String {
    with_sds(
        bootstrap,
        Path::new("./var/run/secrets/workload-spiffe-uds/socket"),
    )
}

/// The template is what tests/tests/captured.rs runs: Istio's node identity without
/// INTERCEPTION_MODE, the admin on the pod IP, port 15000.
#[test]
fn captured_sidecar_bootstrap_matches_the_one_the_tests_use() {
    let xds = SocketAddr::from(CAPTURED_XDS);
    for pod in captured_pods() {
        let labels: Vec<(&str, &str)> = pod
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut node = Node::captured(&pod.ip, &pod.name, "shop", &labels);
        // Istio names the node cluster after the app (canonical service), not the pod.
        let app = labels.iter().find(|(k, _)| *k == "app").unwrap().1;
        node.cluster = format!("{app}.shop");
        let generated = netns::admin_on(
            &istio_agent_socket(&bootstrap_with(
                &node,
                netns::ADMIN_PORT,
                &[xds],
                AdsMode::Sotw,
            )),
            pod.ip.parse().unwrap(),
        );
        let generated: serde_json::Value = shoal_common::yaml::from_str(&generated).unwrap();
        let documented: serde_json::Value =
            shoal_common::yaml::from_str(&render_captured(&pod, xds)).unwrap();
        assert_eq!(
            documented, generated,
            "captured-sidecar.yaml rendered for {} differs from support/bootstrap.rs",
            pod.name
        );
    }
}

#[test]
fn captured_manifests_parse() {
    let docs = manifests(&examples().join("captured"));
    let kinds: Vec<&str> = docs
        .iter()
        .map(|(_, d)| d["kind"].as_str().expect("kind"))
        .collect();
    for kind in [
        "Namespace",
        "Service",
        "Pod",
        "EndpointSlice",
        "VirtualService",
        "DestinationRule",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in the captured example");
    }
    // On mesh-netns.sh's network 0: pods 198.18.0.2-253, ClusterIPs in 198.19.0.0/16.
    for (path, doc) in &docs {
        if let Some(ip) = doc["status"]["podIP"].as_str() {
            let host: u8 = ip
                .strip_prefix("198.18.0.")
                .and_then(|h| h.parse().ok())
                .unwrap_or_else(|| panic!("{}: pod IP {ip}", path.display()));
            assert!((2..=253).contains(&host), "{}: {ip}", path.display());
        }
        if let Some(ip) = doc["spec"]["clusterIP"].as_str() {
            assert!(ip.starts_with("198.19."), "{}: {ip}", path.display());
        }
    }
}

/// Every document of every manifest in `dir`, as YAML values.
fn manifests(dir: &Path) -> Vec<(PathBuf, serde_json::Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let text = read(&path);
        let values = shoal_common::yaml::documents(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        docs.extend(values.into_iter().map(|v| (path.clone(), v)));
    }
    docs
}

#[test]
fn mesh_manifests_parse() {
    let docs = manifests(&examples().join("mesh"));
    let mut kinds: Vec<&str> = Vec::new();
    for (path, doc) in &docs {
        assert!(doc["apiVersion"].is_string(), "{}: {doc:?}", path.display());
        assert!(
            doc["metadata"]["name"].is_string(),
            "{}: {doc:?}",
            path.display()
        );
        kinds.push(doc["kind"].as_str().expect("kind"));
    }
    for kind in [
        "Namespace",
        "Service",
        "Pod",
        "EndpointSlice",
        "Gateway",
        "VirtualService",
        "DestinationRule",
        "Sidecar",
        "ServiceEntry",
        "HTTPRoute",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in the example mesh");
    }
}

/// The example mesh on free ports: the documented ports (gateway 8080, sidecar 9080,
/// backends 18080, shoal 15010, admin 15000/15001) replaced in copies of the files.
struct ExamplePorts {
    gateway: u16,
    gateway_api: u16,
    egress: u16,
    backend: u16,
}

fn copy_mesh(to: &Path, ports: &ExamplePorts) {
    for entry in std::fs::read_dir(examples().join("mesh")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = read(&path)
            .replace("18080", "@BACKEND@")
            .replace("8080", &ports.gateway.to_string())
            .replace("9080", &ports.egress.to_string())
            .replace("8090", &ports.gateway_api.to_string())
            .replace("@BACKEND@", &ports.backend.to_string());
        std::fs::write(to.join(path.file_name().unwrap()), text).unwrap();
    }
}

fn example_bootstrap(name: &str, admin: u16, xds: SocketAddr) -> String {
    read(&examples().join("bootstrap").join(name))
        .replace("port_value: 15000", &format!("port_value: {admin}"))
        .replace("port_value: 15001", &format!("port_value: {admin}"))
        .replace("port_value: 15002", &format!("port_value: {admin}"))
        .replace("port_value: 15010", &format!("port_value: {}", xds.port()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_mesh_routes_as_documented() {
    let ips = [loopback(2), loopback(3), loopback(4)];
    let ports = ExamplePorts {
        gateway: free_port_on(&[Ipv4Addr::UNSPECIFIED]),
        gateway_api: free_port_on(&[Ipv4Addr::UNSPECIFIED]),
        egress: free_port(),
        backend: free_port_on(&ips),
    };
    let mut backends = Vec::new();
    for (name, ip) in ["web-v1", "web-v2", "api-v1"].into_iter().zip(ips) {
        backends.push(Backend::start(name, SocketAddr::from((ip, ports.backend))).await);
    }
    let dir = tempfile::tempdir().unwrap();
    copy_mesh(dir.path(), &ports);
    let server = ShoalServer::standalone(dir.path()).await;
    let gateway = Envoy::start(&example_bootstrap(
        "gateway.yaml",
        free_port(),
        server.xds_addr(),
    ))
    .await;
    let sidecar = Envoy::start(&example_bootstrap(
        "sidecar.yaml",
        free_port(),
        server.xds_addr(),
    ))
    .await;
    let gateway_api = Envoy::start(&example_bootstrap(
        "gateway-api.yaml",
        free_port(),
        server.xds_addr(),
    ))
    .await;
    gateway
        .wait_listener(&format!("0.0.0.0_{}", ports.gateway))
        .await;
    gateway_api
        .wait_listener(&format!("0.0.0.0_{}", ports.gateway_api))
        .await;
    sidecar
        .wait_listener(&format!("127.0.0.1_{}", ports.egress))
        .await;

    let g = SocketAddr::from(([127, 0, 0, 1], ports.gateway));
    let e = SocketAddr::from(([127, 0, 0, 1], ports.egress));
    let k = SocketAddr::from(([127, 0, 0, 1], ports.gateway_api));
    let checks = [
        // The Gateway API gateway (80-gateway-api.yaml).
        (k, Request::get("/api/x"), "api-v1"),
        (g, Request::get("/api/x"), "api-v1"),
        (g, Request::get("/").header("x-canary", "true"), "web-v2"),
        (e, Request::get("/").host("api"), "api-v1"),
    ];
    for (addr, req, want) in checks {
        eventually(
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async {
                let r = req.send(addr).await?;
                let backend = r.json()?["backend"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if r.status == 200 && backend == want {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!(
                        "{} {:?}: {} {}",
                        req.path,
                        req.host,
                        r.status,
                        r.text()
                    ))
                }
            },
        )
        .await;
    }
    // The Gateway API route's default rule: the Service web (v1 or v2).
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            let r = Request::get("/").send(k).await?;
            match r.json()?["backend"].as_str() {
                Some(b) if b.starts_with("web-") => Ok(()),
                other => Err(anyhow::anyhow!("answered by {other:?}")),
            }
        },
    )
    .await;
    // The default route splits 90/10: v1 must at least show up.
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            let r = Request::get("/").send(g).await?;
            match r.json()?["backend"].as_str() {
                Some("web-v1") => Ok(()),
                other => Err(anyhow::anyhow!("answered by {other:?}")),
            }
        },
    )
    .await;
    for envoy in [&gateway, &gateway_api, &sidecar] {
        assert_eq!(envoy.stat_sum("update_rejected").await, 0);
    }
}
