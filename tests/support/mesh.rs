//! The end-to-end test mesh: backends on distinct loopback addresses and the manifests that
//! describe them, written to a temporary directory that the ingester (or a standalone
//! server) follows. Edits rewrite files atomically, as a config management tool would.
//!
//! ```text
//! demo/web      port S -> web-v1 127.0.0.2:B (v1), web-v2 127.0.0.3:B (v2), web-v1b 127.0.0.7:B (added later)
//! demo/api      port S -> api-v1 127.0.0.4:B
//! httpbin.example  ServiceEntry STATIC, port 80 -> httpbin 127.0.0.5:B
//! vm.internal      ServiceEntry selecting WorkloadEntry app=vm, port 80 -> vm 127.0.0.6:B
//! Gateway istio-system/ingress, port G; VirtualService demo/frontend bound to it
//! Sidecar demo/client: egress 127.0.0.1:S, captureMode NONE, hosts ./*
//! HTTPRoute demo/web-gamma (GAMMA), parent Service web: /gamma -> api, the rest -> web
//! ```
//!
//! S is both the services' port and the sidecar's egress port: a sidecar listener on port P
//! routes to the services that have port P. Every backend listens on the same port B (an
//! EndpointSlice has one port for all its endpoints).

use crate::backend::Backend;
use crate::ports::{free_port_on, loopback};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use tempfile::TempDir;

/// Where `/switch` goes: the destination the dynamic test edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchTarget {
    /// `api` (the initial destination).
    Api,
    /// `httpbin.example` (the ServiceEntry).
    Httpbin,
    /// `vm.internal` (the WorkloadEntry-backed ServiceEntry).
    Vm,
}

impl SwitchTarget {
    fn host(self) -> &'static str {
        match self {
            SwitchTarget::Api => "api",
            SwitchTarget::Httpbin => "httpbin.example",
            SwitchTarget::Vm => "vm.internal",
        }
    }

    /// The backend that answers behind it.
    pub fn backend(self) -> &'static str {
        match self {
            SwitchTarget::Api => "api-v1",
            SwitchTarget::Httpbin => "httpbin",
            SwitchTarget::Vm => "vm",
        }
    }
}

/// A pod behind a Kubernetes service.
struct PodSpec {
    name: &'static str,
    app: &'static str,
    version: &'static str,
    ip: Ipv4Addr,
}

const WEB_PODS: [PodSpec; 3] = [
    PodSpec {
        name: "web-v1",
        app: "web",
        version: "v1",
        ip: Ipv4Addr::new(127, 0, 0, 2),
    },
    PodSpec {
        name: "web-v2",
        app: "web",
        version: "v2",
        ip: Ipv4Addr::new(127, 0, 0, 3),
    },
    // Added by `add_web_v1b`.
    PodSpec {
        name: "web-v1b",
        app: "web",
        version: "v1",
        ip: Ipv4Addr::new(127, 0, 0, 7),
    },
];

const API_POD: PodSpec = PodSpec {
    name: "api-v1",
    app: "api",
    version: "v1",
    ip: Ipv4Addr::new(127, 0, 0, 4),
};

const HTTPBIN_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);
const VM_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);

/// The test mesh: its manifest directory, ports, and running backends.
pub struct TestMesh {
    dir: TempDir,
    /// The Gateway server port (the gateway Envoy binds `0.0.0.0:<gateway_port>`).
    pub gateway_port: u16,
    /// The services' port and the sidecar egress listener's (`127.0.0.1:<egress_port>`).
    pub egress_port: u16,
    /// The port every backend listens on.
    pub backend_port: u16,
    backends: BTreeMap<String, Backend>,
    web_v1b: bool,
}

impl TestMesh {
    /// Picks free ports, starts the initial backends and writes every manifest.
    pub async fn start() -> TestMesh {
        let ips = [
            loopback(2),
            loopback(3),
            loopback(4),
            loopback(5),
            loopback(6),
            loopback(7),
        ];
        let backend_port = free_port_on(&ips);
        let gateway_port = free_port_on(&[Ipv4Addr::UNSPECIFIED]);
        let egress_port = free_port_on(&[Ipv4Addr::LOCALHOST, Ipv4Addr::UNSPECIFIED]);
        let dir = tempfile::tempdir().expect("manifest dir");
        let mut mesh = TestMesh {
            dir,
            gateway_port,
            egress_port,
            backend_port,
            backends: BTreeMap::new(),
            web_v1b: false,
        };
        for (name, ip) in [
            ("web-v1", WEB_PODS[0].ip),
            ("web-v2", WEB_PODS[1].ip),
            ("api-v1", API_POD.ip),
            ("httpbin", HTTPBIN_IP),
            ("vm", VM_IP),
        ] {
            mesh.start_backend(name, ip).await;
        }
        mesh.write_all();
        mesh
    }

    /// The manifest directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A running backend by name.
    pub fn backend(&self, name: &str) -> &Backend {
        &self.backends[name]
    }

    async fn start_backend(&mut self, name: &str, ip: Ipv4Addr) {
        let backend = Backend::start(name, SocketAddr::from((ip, self.backend_port))).await;
        self.backends.insert(name.to_string(), backend);
    }

    fn write(&self, file: &str, content: &str) {
        write_manifest(self.dir.path(), file, content);
    }

    fn write_all(&self) {
        self.write("namespaces.yaml", NAMESPACES);
        self.write("services.yaml", &self.services());
        self.write("api.yaml", &self.workload("api", &[&API_POD]));
        self.write_web();
        self.write("gateway.yaml", &self.gateway());
        self.write("destinationrule.yaml", DESTINATION_RULE);
        self.write("sidecar.yaml", &self.sidecar());
        self.write("serviceentries.yaml", &self.service_entries());
        self.write("gamma.yaml", &self.gamma_route());
        self.write_virtual_service(SwitchTarget::Api);
    }

    /// A Gateway API route for the mesh (GAMMA): its parent is the Service `web`.
    fn gamma_route(&self) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: web-gamma\n\
             \x20 namespace: demo\nspec:\n  parentRefs:\n  - {{group: \"\", kind: Service, name: web, port: {port}}}\n\
             \x20 rules:\n  - matches: [{{path: {{type: PathPrefix, value: /gamma}}}}]\n\
             \x20   backendRefs: [{{name: api, port: {port}}}]\n\
             \x20 - backendRefs: [{{name: web, port: {port}}}]\n",
            port = self.egress_port
        )
    }

    fn write_web(&self) {
        let n = if self.web_v1b { 3 } else { 2 };
        let pods: Vec<&PodSpec> = WEB_PODS[..n].iter().collect();
        self.write("web.yaml", &self.workload("web", &pods));
    }

    /// Starts backend `web-v1b` (127.0.0.7, version v1) and adds it, with its Pod, to the
    /// `web` EndpointSlice.
    pub async fn add_web_v1b(&mut self) {
        self.start_backend("web-v1b", WEB_PODS[2].ip).await;
        self.web_v1b = true;
        self.write_web();
    }

    /// Rewrites the VirtualService with `/switch` routed to `target`.
    pub fn write_virtual_service(&self, target: SwitchTarget) {
        self.write("virtualservice.yaml", &virtual_service(target));
    }

    fn services(&self) -> String {
        let service = |name: &str, ip: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: demo\n\
                 spec:\n  type: ClusterIP\n  clusterIP: {ip}\n  selector:\n    app: {name}\n  ports:\n\
                 \x20 - name: http\n    port: {port}\n    targetPort: {target}\n    protocol: TCP\n",
                port = self.egress_port,
                target = self.backend_port,
            )
        };
        format!(
            "{}---\n{}",
            service("web", "10.96.0.10"),
            service("api", "10.96.0.11")
        )
    }

    /// Pods and one EndpointSlice for `service`.
    fn workload(&self, service: &str, pods: &[&PodSpec]) -> String {
        let mut out = String::new();
        for pod in pods {
            out.push_str(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: demo\n  labels:\n\
                 \x20   app: {app}\n    version: {version}\nspec:\n  serviceAccountName: {app}\n\
                 \x20 containers:\n  - name: {app}\n    image: example.com/{app}:{version}\n\
                 status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n---\n",
                name = pod.name,
                app = pod.app,
                version = pod.version,
                ip = pod.ip,
            ));
        }
        out.push_str(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n\
             \x20 namespace: demo\n  labels:\n    kubernetes.io/service-name: {service}\n\
             addressType: IPv4\nports:\n- name: http\n  port: {port}\n  protocol: TCP\nendpoints:\n",
            port = self.backend_port,
        ));
        for pod in pods {
            out.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions:\n    ready: true\n  targetRef:\n\
                 \x20   kind: Pod\n    name: {name}\n    namespace: demo\n",
                ip = pod.ip,
                name = pod.name,
            ));
        }
        out
    }

    fn gateway(&self) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: ingress\n\
             \x20 namespace: istio-system\nspec:\n  selector:\n    istio: ingressgateway\n  servers:\n\
             \x20 - port:\n      number: {port}\n      name: http\n      protocol: HTTP\n\
             \x20   hosts:\n    - \"*\"\n",
            port = self.gateway_port
        )
    }

    fn sidecar(&self) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: client\n\
             \x20 namespace: demo\nspec:\n  workloadSelector:\n    labels:\n      app: client\n\
             \x20 egress:\n  - bind: 127.0.0.1\n    port:\n      number: {port}\n\
             \x20     protocol: HTTP\n      name: http\n    captureMode: NONE\n    hosts:\n    - \"./*\"\n",
            port = self.egress_port
        )
    }

    fn service_entries(&self) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: httpbin\n\
             \x20 namespace: demo\nspec:\n  hosts:\n  - httpbin.example\n  location: MESH_EXTERNAL\n\
             \x20 resolution: STATIC\n  ports:\n  - number: 80\n    name: http\n    protocol: HTTP\n\
             \x20 endpoints:\n  - address: {HTTPBIN_IP}\n    ports:\n      http: {port}\n\
             ---\n\
             apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: vm\n\
             \x20 namespace: demo\nspec:\n  hosts:\n  - vm.internal\n  location: MESH_INTERNAL\n\
             \x20 resolution: STATIC\n  ports:\n  - number: 80\n    name: http\n    protocol: HTTP\n\
             \x20 workloadSelector:\n    labels:\n      app: vm\n\
             ---\n\
             apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: vm-1\n\
             \x20 namespace: demo\nspec:\n  address: {VM_IP}\n  labels:\n    app: vm\n\
             \x20 ports:\n    http: {port}\n",
            port = self.backend_port
        )
    }
}

const NAMESPACES: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n\
                          apiVersion: v1\nkind: Namespace\nmetadata:\n  name: istio-system\n";

const DESTINATION_RULE: &str = r#"apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: web
  namespace: demo
spec:
  host: web
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
"#;

/// The gateway's routes, first match wins. Route names let tests find them in config dumps.
fn virtual_service(switch: SwitchTarget) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: frontend
  namespace: demo
spec:
  hosts:
  - "*"
  gateways:
  - istio-system/ingress
  http:
  - name: api
    match:
    - uri:
        prefix: /api
    route:
    - destination:
        host: api
  - name: canary
    match:
    - headers:
        x-canary:
          exact: "true"
    route:
    - destination:
        host: web
        subset: v2
  - name: weighted
    match:
    - uri:
        prefix: /weighted
    route:
    - destination:
        host: web
        subset: v1
      weight: 50
    - destination:
        host: web
        subset: v2
      weight: 50
  - name: rewrite
    match:
    - uri:
        prefix: /old
    rewrite:
      uri: /new
    route:
    - destination:
        host: web
        subset: v1
  - name: redirect
    match:
    - uri:
        exact: /moved-away
    redirect:
      uri: /elsewhere
      authority: other.example
  - name: slow
    match:
    - uri:
        prefix: /slow
    timeout: 3s
    retries:
      attempts: 2
      perTryTimeout: 1s
      retryOn: 5xx
    route:
    - destination:
        host: web
        subset: v1
  - name: httpbin
    match:
    - uri:
        prefix: /httpbin
    route:
    - destination:
        host: httpbin.example
  - name: vm
    match:
    - uri:
        prefix: /vm
    route:
    - destination:
        host: vm.internal
  - name: switch
    match:
    - uri:
        prefix: /switch
    route:
    - destination:
        host: {switch}
  - name: default
    route:
    - destination:
        host: web
        subset: v1
"#,
        switch = switch.host()
    )
}

/// Writes the manifest `file` in `dir` as a config management tool would: write then
/// rename, so the ingester never reads a half-written file. The temporary name is hidden
/// and not `.yaml`, so it is never read as a manifest.
pub fn write_manifest(dir: &Path, file: &str, content: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, content).expect("writing a manifest");
    std::fs::rename(&tmp, dir.join(file)).expect("renaming a manifest");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manifests_are_valid_multi_document_yaml() {
        let mut mesh = TestMesh::start().await;
        mesh.add_web_v1b().await;
        let mut kinds = Vec::new();
        for entry in std::fs::read_dir(mesh.dir()).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let docs = shoal_common::yaml::documents(&text)
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
            for v in docs {
                assert!(
                    v["metadata"]["name"].is_string(),
                    "{}: {v:?}",
                    path.display()
                );
                kinds.push(v["kind"].as_str().unwrap().to_string());
            }
        }
        kinds.sort();
        assert_eq!(
            kinds,
            [
                "DestinationRule",
                "EndpointSlice",
                "EndpointSlice",
                "Gateway",
                "HTTPRoute",
                "Namespace",
                "Namespace",
                "Pod",
                "Pod",
                "Pod",
                "Pod",
                "Service",
                "Service",
                "ServiceEntry",
                "ServiceEntry",
                "Sidecar",
                "VirtualService",
                "WorkloadEntry"
            ]
        );
        let web = std::fs::read_to_string(mesh.dir().join("web.yaml")).unwrap();
        assert!(web.contains("127.0.0.7"), "{web}");
        assert_eq!(mesh.backend("web-v1b").port(), mesh.backend_port);
    }
}
