//! The benchmark mesh: Kubernetes and Istio manifests generated into a directory that
//! `shoal-ingester --source file:DIR` follows, and the edits the benchmark measures.
//!
//! ```text
//! namespaces ns-0 .. ns-{N-1}, plus istio-system
//! services   svc-<j>.ns-<k> (S of them, round-robin over the namespaces), port 8080 `http`,
//!            each with E Pods and one EndpointSlice (addresses 10.16.0.0/12, never dialed)
//! shared     shared.istio-system: one more service, visible to every proxy
//! VirtualService ns-<k>/routes   for svc-0.ns-<k> (per namespace)
//! VirtualService istio-system/shared   for shared.istio-system (mesh-wide)
//! Sidecar    isolated: ns-<k>/default, egress hosts ["./*", "istio-system/*"]
//!            flat:     istio-system/default (root namespace), egress hosts ["*/*"]
//!            captured: none
//! ```
//!
//! In the isolated and flat scenarios every Sidecar has one egress listener on
//! 127.0.0.1:8080 with `captureMode: NONE` and the proxies say `INTERCEPTION_MODE: NONE`,
//! so each proxy gets one listener and one route table (`"8080"`) over RDS and a
//! VirtualService change has something to change. The isolated Sidecar is Istio's usual
//! recommendation (own namespace plus the control-plane namespace); the flat one admits
//! every service, like having no Sidecar at all.
//!
//! The captured scenario is what most Istio installations run: no Sidecar resource and
//! sidecars with iptables interception (no `INTERCEPTION_MODE`), so each proxy gets
//! `virtualOutbound`, `virtualInbound` and one outbound listener per destination. Its
//! services have more ports ([`service_ports`]): every tenth a TCP port `tcp-db` 9000
//! (listener `<ClusterIP>_9000`), every tenth another HTTP port `http-api` 9080 (listener
//! `0.0.0.0_9080`, route table `"9080"`), every fiftieth a port `stream` 7070 of unknown
//! protocol (sniffed: listener `<ClusterIP>_7070`, route table `"<host>:7070"`). Each
//! proxy carries the label `app: svc-<j>` of one service of its namespace, which selects
//! it, so it gets that service's inbound chains and `inbound|<port>||` clusters.
//!
//! Files are written atomically (write, then rename), one file per service, so an
//! endpoint change rewrites one small file.

use anyhow::Context;
use shoal_tests::kubeapi::KubeApiServer;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The services' (and the sidecar egress listener's) port.
pub const SERVICE_PORT: u16 = 8080;
/// The namespace of the shared service and the mesh-wide VirtualService.
pub const SYSTEM_NS: &str = "istio-system";
/// The shared service's name.
pub const SHARED_SERVICE: &str = "shared";
/// The mesh-wide VirtualService's name.
pub const SHARED_VS: &str = "shared";
/// The per-namespace VirtualService's name.
pub const NAMESPACE_VS: &str = "routes";
/// The route table every sidecar asks for (Istio names a sidecar route table by its port).
pub const ROUTE_NAME: &str = "8080";

/// Which mesh and which proxies a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ScenarioKind {
    /// One mesh-wide Sidecar admitting every service (`*/*`) with a `captureMode: NONE`
    /// egress listener; proxies with `INTERCEPTION_MODE: NONE`.
    Flat,
    /// One Sidecar per namespace admitting `./*` and `istio-system/*` with a
    /// `captureMode: NONE` egress listener; proxies with `INTERCEPTION_MODE: NONE`.
    Isolated,
    /// No Sidecar (every service visible); proxies with Istio's default interception
    /// (iptables REDIRECT: no `INTERCEPTION_MODE`), labelled so that one service selects
    /// each; some services with TCP and unknown-protocol ports.
    Captured,
}

impl ScenarioKind {
    /// Per-namespace Sidecar isolation.
    pub fn isolated(self) -> bool {
        self == ScenarioKind::Isolated
    }

    /// Captured sidecars.
    pub fn captured(self) -> bool {
        self == ScenarioKind::Captured
    }

    /// A short description, for the results table.
    pub fn describe(self) -> &'static str {
        match self {
            ScenarioKind::Flat => "flat (every service visible, INTERCEPTION_MODE NONE)",
            ScenarioKind::Isolated => "per-namespace Sidecar isolation (INTERCEPTION_MODE NONE)",
            ScenarioKind::Captured => {
                "captured sidecars (no Sidecar, iptables interception: virtualOutbound/virtualInbound)"
            }
        }
    }
}

impl std::fmt::Display for ScenarioKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScenarioKind::Flat => "flat",
            ScenarioKind::Isolated => "isolated",
            ScenarioKind::Captured => "captured",
        })
    }
}

/// How a service port's traffic is classified (Istio's port-name convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    /// `http*`: the shared `0.0.0.0_<port>` listener, route table `"<port>"`.
    Http,
    /// `tcp*`: a `<ClusterIP>_<port>` listener with `tcp_proxy`.
    Tcp,
    /// No protocol prefix: a sniffed `<ClusterIP>_<port>` listener, route table
    /// `"<host>:<port>"`.
    Sniffed,
}

/// One service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// The port's name.
    pub name: &'static str,
    /// The service port, also its `targetPort`.
    pub port: u16,
    /// Its protocol class.
    pub kind: PortKind,
}

/// Every service's port.
pub const HTTP_PORT: PortSpec = PortSpec {
    name: "http",
    port: SERVICE_PORT,
    kind: PortKind::Http,
};
/// Captured scenario: the TCP port of every tenth service.
pub const TCP_PORT: PortSpec = PortSpec {
    name: "tcp-db",
    port: 9000,
    kind: PortKind::Tcp,
};
/// Captured scenario: the second HTTP port of every tenth service.
pub const API_PORT: PortSpec = PortSpec {
    name: "http-api",
    port: 9080,
    kind: PortKind::Http,
};
/// Captured scenario: the unknown-protocol port of every fiftieth service.
pub const SNIFFED_PORT: PortSpec = PortSpec {
    name: "stream",
    port: 7070,
    kind: PortKind::Sniffed,
};

/// The ports of service `g` (global index; the shared service has only [`HTTP_PORT`]).
pub fn service_ports(g: usize, scenario: ScenarioKind) -> Vec<PortSpec> {
    let mut ports = vec![HTTP_PORT];
    if scenario.captured() {
        if g % 10 == 1 {
            ports.push(TCP_PORT);
        }
        if g % 10 == 2 {
            ports.push(API_PORT);
        }
        if g % 50 == 3 {
            ports.push(SNIFFED_PORT);
        }
    }
    ports
}

/// What a configured proxy should hold, derived from the mesh alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedShape {
    /// EDS assignments: one per port of every visible service.
    pub endpoints: usize,
    /// Listeners.
    pub listeners: usize,
    /// Route tables.
    pub routes: usize,
    /// `inbound|<port>||` clusters (captured: one per port of the proxy's own service).
    pub inbound_clusters: usize,
}

/// The shape of the generated mesh.
#[derive(Debug, Clone)]
pub struct MeshShape {
    /// Namespaces holding services and proxies.
    pub namespaces: usize,
    /// Services, spread round-robin over the namespaces (plus the shared one).
    pub services: usize,
    /// Endpoints (Pods) per service.
    pub endpoints: usize,
    /// Which Sidecars (and service ports) the mesh has.
    pub scenario: ScenarioKind,
}

/// One generated service.
#[derive(Debug, Clone)]
struct ServiceSpec {
    namespace: usize,
    /// Index within its namespace.
    index: usize,
    /// Global index (for addresses).
    global: usize,
    /// Its ports.
    ports: Vec<PortSpec>,
    /// Endpoints added by the benchmark, as IP addresses.
    added: Vec<String>,
}

/// The generated manifest directory and the edits applied to it.
pub struct BenchMesh {
    dir: PathBuf,
    shape: MeshShape,
    services: Vec<ServiceSpec>,
    /// With `--source kube`: the API server every manifest is also applied to.
    kube: Option<Arc<KubeApiServer>>,
}

/// The namespace name of namespace `k`.
pub fn namespace_name(k: usize) -> String {
    format!("ns-{k}")
}

/// The FQDN of service `index` in namespace `k`.
pub fn service_host(k: usize, index: usize) -> String {
    format!("svc-{index}.{}.svc.cluster.local", namespace_name(k))
}

/// The FQDN of the shared service.
pub fn shared_host() -> String {
    format!("{SHARED_SERVICE}.{SYSTEM_NS}.svc.cluster.local")
}

/// Istio's outbound cluster name for a host on the service port.
pub fn cluster_name(host: &str) -> String {
    format!("outbound|{SERVICE_PORT}||{host}")
}

/// The marker of change `k`: a route name and header value in the changed VirtualService.
pub fn vs_marker(k: usize) -> String {
    format!("bench-change-{k:05}")
}

/// The address of the endpoint added by endpoint change `k`. Both varying octets have
/// three digits, so no marker is a prefix of another and none occurs in the initial
/// addresses (10.16.0.0/12).
pub fn added_endpoint_ip(k: usize) -> String {
    format!("10.250.{}.{}", 100 + (k / 100) % 156, 100 + k % 100)
}

/// An address in 10.16.0.0/12 for pod `g` (global index).
fn pod_ip(g: usize) -> String {
    format!("10.{}.{}.{}", 16 + (g >> 16) % 16, (g >> 8) & 255, g & 255)
}

/// A ClusterIP for service `g` (global index); the shared service uses `g = services`.
fn cluster_ip(g: usize) -> String {
    format!("10.96.{}.{}", g / 250, g % 250 + 1)
}

/// Applies every object of the YAML `content` (manifest `name`) to `kube`.
fn apply_documents(kube: &KubeApiServer, name: &str, content: &str) -> anyhow::Result<()> {
    let docs = shoal_common::yaml::documents(content)
        .map_err(|e| anyhow::anyhow!("parsing {name}: {e}"))?;
    for doc in docs {
        kube.apply(doc)
            .map_err(|e| anyhow::anyhow!("applying {name} to the API server: {e:?}"))?;
    }
    Ok(())
}

impl BenchMesh {
    /// Writes every manifest of `shape` into `dir` (which must exist).
    /// With `kube` (`--source kube`), every manifest is also applied to that API server
    /// (the Istio CRDs the mesh uses first), now and on every later edit.
    pub fn write(
        dir: &Path,
        shape: MeshShape,
        kube: Option<Arc<KubeApiServer>>,
    ) -> anyhow::Result<BenchMesh> {
        anyhow::ensure!(shape.namespaces > 0, "--namespaces must be at least 1");
        anyhow::ensure!(shape.endpoints > 0, "--endpoints must be at least 1");
        anyhow::ensure!(
            shape.services >= shape.namespaces,
            "--services ({}) must be at least --namespaces ({}): every namespace needs a service",
            shape.services,
            shape.namespaces
        );
        anyhow::ensure!(
            (shape.services + 1) * shape.endpoints < 16 << 16,
            "too many endpoints for the 10.16.0.0/12 pod range"
        );
        let services = (0..shape.services)
            .map(|g| ServiceSpec {
                namespace: g % shape.namespaces,
                index: g / shape.namespaces,
                global: g,
                ports: service_ports(g, shape.scenario),
                added: Vec::new(),
            })
            .collect();
        if let Some(kube) = &kube {
            for (kind, plural) in [
                ("VirtualService", "virtualservices"),
                ("Sidecar", "sidecars"),
            ] {
                kube.apply(shoal_tests::kubeapi::istio_crd(kind, plural))
                    .map_err(|e| anyhow::anyhow!("creating the {kind} CRD: {e:?}"))?;
            }
        }
        let mesh = BenchMesh {
            dir: dir.to_path_buf(),
            shape,
            services,
            kube,
        };
        mesh.write_all()?;
        Ok(mesh)
    }

    /// The manifest directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shape.
    pub fn shape(&self) -> &MeshShape {
        &self.shape
    }

    /// How many services a proxy in namespace `k` sees (and so how many EDS clusters it
    /// gets): its namespace's services plus the shared one when isolated, every service
    /// when flat.
    pub fn visible_services(&self, k: usize) -> usize {
        self.visible(k).count() + 1
    }

    /// The generated services a proxy in namespace `k` sees (the shared one aside).
    fn visible(&self, k: usize) -> impl Iterator<Item = &ServiceSpec> {
        let isolated = self.shape.scenario.isolated();
        self.services
            .iter()
            .filter(move |s| !isolated || s.namespace == k)
    }

    /// The service whose selector matches proxy `proxy` in the captured scenario, as
    /// (namespace, index within it): the proxies of a namespace take its services in turn.
    /// The proxy's namespace is `proxy % namespaces`, as the benchmark spreads them.
    pub fn proxy_service(&self, proxy: usize) -> (usize, usize) {
        let ns = proxy % self.shape.namespaces;
        let in_ns = self.services.iter().filter(|s| s.namespace == ns).count();
        (ns, (proxy / self.shape.namespaces) % in_ns.max(1))
    }

    /// The label `app` value of proxy `proxy` (captured: its service's name; else `client`,
    /// which no service selects).
    pub fn proxy_app(&self, proxy: usize) -> String {
        if self.shape.scenario.captured() {
            format!("svc-{}", self.proxy_service(proxy).1)
        } else {
            "client".to_string()
        }
    }

    /// What proxy `proxy` (in namespace `proxy % namespaces`) holds once configured.
    pub fn expected_shape(&self, proxy: usize) -> ExpectedShape {
        let ns = proxy % self.shape.namespaces;
        if !self.shape.scenario.captured() {
            // The egress listener 127.0.0.1_8080 and its route table `8080`.
            return ExpectedShape {
                endpoints: self.visible_services(ns),
                listeners: 1,
                routes: 1,
                inbound_clusters: 0,
            };
        }
        // The shared service has port 8080 `http` only.
        let ports = || self.visible(ns).flat_map(|s| s.ports.iter());
        let http: std::collections::BTreeSet<u16> = ports()
            .filter(|p| p.kind == PortKind::Http)
            .map(|p| p.port)
            .chain([SERVICE_PORT])
            .collect();
        let tcp = ports().filter(|p| p.kind == PortKind::Tcp).count();
        let sniffed = ports().filter(|p| p.kind == PortKind::Sniffed).count();
        let (own_ns, own) = self.proxy_service(proxy);
        let inbound = self
            .services
            .iter()
            .find(|s| s.namespace == own_ns && s.index == own)
            .map_or(0, |s| s.ports.len());
        ExpectedShape {
            endpoints: ports().count() + 1,
            // virtualOutbound, virtualInbound, 0.0.0.0_<port> per HTTP port, one per TCP
            // and per sniffed service port.
            listeners: 2 + http.len() + tcp + sniffed,
            routes: http.len() + sniffed,
            inbound_clusters: inbound,
        }
    }

    /// How many keys the ingester publishes per bucket: (config, services, endpoints).
    pub fn expected_keys(&self) -> (usize, usize, usize) {
        let sidecars = match self.shape.scenario {
            ScenarioKind::Isolated => self.shape.namespaces,
            ScenarioKind::Flat => 1,
            ScenarioKind::Captured => 0,
        };
        let virtual_services = self.shape.namespaces + 1;
        let services = self.services.len() + 1;
        (sidecars + virtual_services, services, services)
    }

    /// The service an endpoint change `k` edits: (namespace, index within it). Changes walk
    /// over the namespaces so consecutive changes hit different proxies when isolated.
    pub fn endpoint_change_target(&self, k: usize) -> (usize, usize) {
        let ns = k % self.shape.namespaces;
        let in_ns: Vec<&ServiceSpec> = self.services.iter().filter(|s| s.namespace == ns).collect();
        let s = in_ns[(k / self.shape.namespaces) % in_ns.len()];
        (s.namespace, s.index)
    }

    /// Adds endpoint [`added_endpoint_ip`]`(k)` (with its Pod) to the EndpointSlice of
    /// service `index` in namespace `ns`, rewriting that service's file.
    pub fn add_endpoint(&mut self, ns: usize, index: usize, k: usize) -> anyhow::Result<()> {
        let spec = self
            .services
            .iter_mut()
            .find(|s| s.namespace == ns && s.index == index)
            .with_context(|| format!("no service svc-{index} in namespace {ns}"))?;
        spec.added.push(added_endpoint_ip(k));
        let spec = spec.clone();
        self.write_service(&spec)
    }

    /// Makes [`added_endpoint_ip`]`(k)` the one added endpoint of service `index` in
    /// namespace `ns` (replacing earlier ones), rewriting that service's file: a change that
    /// does not grow the mesh, for the soak.
    pub fn replace_endpoint(&mut self, ns: usize, index: usize, k: usize) -> anyhow::Result<()> {
        let spec = self
            .services
            .iter_mut()
            .find(|s| s.namespace == ns && s.index == index)
            .with_context(|| format!("no service svc-{index} in namespace {ns}"))?;
        spec.added = vec![added_endpoint_ip(k)];
        let spec = spec.clone();
        self.write_service(&spec)
    }

    /// Rewrites the VirtualService with a route named (and matching a header value) after
    /// the marker of change `k`: the mesh-wide one, or namespace 0's.
    pub fn change_virtual_service(&self, mesh_wide: bool, k: usize) -> anyhow::Result<()> {
        let marker = vs_marker(k);
        if mesh_wide {
            self.write_file(
                "vs-shared.yaml",
                &virtual_service(SYSTEM_NS, SHARED_VS, &shared_host(), Some(&marker)),
            )
        } else {
            self.write_namespace_vs(0, Some(&marker))
        }
    }

    fn write_file(&self, name: &str, content: &str) -> anyhow::Result<()> {
        if let Some(kube) = &self.kube {
            apply_documents(kube, name, content)?;
        }
        // Write then rename: the ingester never reads a half-written file; the temporary
        // name is hidden and not `.yaml`, so it is never read as a manifest.
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let path = self.dir.join(name);
        std::fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))
    }

    fn write_all(&self) -> anyhow::Result<()> {
        let mut namespaces = String::new();
        for k in 0..self.shape.namespaces {
            let _ = write!(
                namespaces,
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n---\n",
                namespace_name(k)
            );
        }
        let _ = write!(
            namespaces,
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {SYSTEM_NS}\n"
        );
        self.write_file("namespaces.yaml", &namespaces)?;
        for spec in &self.services {
            self.write_service(spec)?;
        }
        // The shared service: global index `services`, so its addresses do not collide.
        let shared = service_manifest(
            SYSTEM_NS,
            SHARED_SERVICE,
            &cluster_ip(self.services.len()),
            &[HTTP_PORT],
            &self.pod_ips(self.services.len(), &[]),
        );
        self.write_file("svc-shared.yaml", &shared)?;
        self.write_file(
            "vs-shared.yaml",
            &virtual_service(SYSTEM_NS, SHARED_VS, &shared_host(), None),
        )?;
        for k in 0..self.shape.namespaces {
            self.write_namespace_vs(k, None)?;
        }
        match self.shape.scenario {
            ScenarioKind::Isolated => {
                for k in 0..self.shape.namespaces {
                    let ns = namespace_name(k);
                    self.write_file(
                        &format!("sidecar-{ns}.yaml"),
                        &sidecar(&ns, &["./*", &format!("{SYSTEM_NS}/*")]),
                    )?;
                }
            }
            ScenarioKind::Flat => {
                self.write_file("sidecar-mesh.yaml", &sidecar(SYSTEM_NS, &["*/*"]))?;
            }
            // Istio's default: no Sidecar, every service visible, traffic captured.
            ScenarioKind::Captured => {}
        }
        Ok(())
    }

    fn write_namespace_vs(&self, k: usize, marker: Option<&str>) -> anyhow::Result<()> {
        let ns = namespace_name(k);
        self.write_file(
            &format!("vs-{ns}.yaml"),
            &virtual_service(&ns, NAMESPACE_VS, &service_host(k, 0), marker),
        )
    }

    fn pod_ips(&self, global: usize, added: &[String]) -> Vec<(String, String)> {
        let e = self.shape.endpoints;
        let mut pods: Vec<(String, String)> = (0..e)
            .map(|i| (format!("p{i}"), pod_ip(global * e + i)))
            .collect();
        for (i, ip) in added.iter().enumerate() {
            pods.push((format!("added{i}"), ip.clone()));
        }
        pods
    }

    fn write_service(&self, spec: &ServiceSpec) -> anyhow::Result<()> {
        let ns = namespace_name(spec.namespace);
        let name = format!("svc-{}", spec.index);
        let content = service_manifest(
            &ns,
            &name,
            &cluster_ip(spec.global),
            &spec.ports,
            &self.pod_ips(spec.global, &spec.added),
        );
        self.write_file(&format!("svc-{ns}-{}.yaml", spec.index), &content)
    }
}

/// A Service with `ports`, its Pods (`(suffix, ip)`) and one EndpointSlice listing them.
fn service_manifest(
    ns: &str,
    name: &str,
    vip: &str,
    ports: &[PortSpec],
    pods: &[(String, String)],
) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  type: ClusterIP\n  clusterIP: {vip}\n  selector:\n    app: {name}\n  ports:\n"
    );
    for p in ports {
        let _ = write!(
            out,
            "  - name: {}\n    port: {}\n    targetPort: {}\n    protocol: TCP\n",
            p.name, p.port, p.port
        );
    }
    out.push_str("---\n");
    for (suffix, ip) in pods {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-{suffix}\n  namespace: {ns}\n\
             \x20 labels:\n    app: {name}\nspec:\n  serviceAccountName: {name}\n\
             \x20 containers:\n  - name: app\n    image: example.com/{name}:1\n\
             status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n---\n"
        );
    }
    let _ = write!(
        out,
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n\
         \x20 namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {name}\n\
         addressType: IPv4\nports:\n"
    );
    for p in ports {
        let _ = write!(
            out,
            "- name: {}\n  port: {}\n  protocol: TCP\n",
            p.name, p.port
        );
    }
    out.push_str("endpoints:\n");
    for (suffix, ip) in pods {
        let _ = write!(
            out,
            "- addresses: [\"{ip}\"]\n  conditions:\n    ready: true\n  targetRef:\n\
             \x20   kind: Pod\n    name: {name}-{suffix}\n    namespace: {ns}\n"
        );
    }
    out
}

/// A VirtualService for `host` with a header-matched route and a default route; with a
/// marker, the header-matched route is named after it and matches it as header value.
fn virtual_service(ns: &str, name: &str, host: &str, marker: Option<&str>) -> String {
    let marker = marker.unwrap_or("bench-initial");
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n\
         \x20 namespace: {ns}\nspec:\n  hosts:\n  - {host}\n  http:\n\
         \x20 - name: {marker}\n    match:\n    - headers:\n        x-bench-change:\n\
         \x20         exact: \"{marker}\"\n    timeout: 3s\n    route:\n    - destination:\n\
         \x20       host: {host}\n  - name: default\n    route:\n    - destination:\n\
         \x20       host: {host}\n"
    )
}

/// A selector-less Sidecar in `ns` with one `captureMode: NONE` HTTP egress listener on
/// 127.0.0.1:8080 admitting `hosts`.
fn sidecar(ns: &str, hosts: &[&str]) -> String {
    let mut out = format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: default\n\
         \x20 namespace: {ns}\nspec:\n  egress:\n  - bind: 127.0.0.1\n    port:\n\
         \x20     number: {SERVICE_PORT}\n      protocol: HTTP\n      name: http\n\
         \x20   captureMode: NONE\n    hosts:\n"
    );
    for h in hosts {
        let _ = writeln!(out, "    - \"{h}\"");
    }
    out
}

/// Counts of generated objects by kind, for tests of the generator.
pub fn count_kinds(dir: &Path) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut kinds = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let docs = shoal_common::yaml::documents(&text)
            .with_context(|| format!("{} is not valid YAML", path.display()))?;
        for v in docs {
            let kind = v["kind"].as_str().unwrap_or("?").to_string();
            *kinds.entry(kind).or_insert(0) += 1;
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_the_documented_mesh() {
        let dir = tempfile::tempdir().unwrap();
        let mut mesh = BenchMesh::write(
            dir.path(),
            MeshShape {
                namespaces: 3,
                services: 7,
                endpoints: 2,
                scenario: ScenarioKind::Isolated,
            },
            None,
        )
        .unwrap();
        let (ns, index) = mesh.endpoint_change_target(4);
        mesh.add_endpoint(ns, index, 4).unwrap();
        mesh.change_virtual_service(true, 1).unwrap();
        let kinds = count_kinds(dir.path()).unwrap();
        let want: BTreeMap<String, usize> = [
            ("EndpointSlice", 8),
            ("Namespace", 4),
            ("Pod", 17),
            ("Service", 8),
            ("Sidecar", 3),
            ("VirtualService", 4),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(kinds, want);
        assert_eq!(mesh.expected_keys(), (7, 8, 8));
        // ns-0 has svc-0, svc-1, svc-2 (global 0, 3, 6); plus the shared service.
        assert_eq!(mesh.visible_services(0), 4);
        assert_eq!(mesh.visible_services(2), 3);
        let vs = std::fs::read_to_string(dir.path().join("vs-shared.yaml")).unwrap();
        assert!(vs.contains(&vs_marker(1)), "{vs}");
    }

    #[test]
    fn generates_the_captured_mesh() {
        let dir = tempfile::tempdir().unwrap();
        let mesh = BenchMesh::write(
            dir.path(),
            MeshShape {
                namespaces: 4,
                services: 20,
                endpoints: 2,
                scenario: ScenarioKind::Captured,
            },
            None,
        )
        .unwrap();
        let kinds = count_kinds(dir.path()).unwrap();
        assert_eq!(kinds.get("Sidecar"), None);
        assert_eq!(mesh.expected_keys(), (5, 21, 21));
        // Services g = 1 and 11 have tcp-db 9000, g = 2 and 12 http-api 9080, g = 3 (ns-3,
        // svc-0) stream 7070.
        let svc = std::fs::read_to_string(dir.path().join("svc-ns-1-0.yaml")).unwrap();
        assert!(svc.contains("name: tcp-db\n    port: 9000"), "{svc}");
        assert!(svc.contains("- name: tcp-db\n  port: 9000"), "{svc}");
        let svc = std::fs::read_to_string(dir.path().join("svc-ns-3-0.yaml")).unwrap();
        assert!(svc.contains("name: stream"), "{svc}");
        // 21 services with 26 ports; listeners: virtualOutbound, virtualInbound,
        // 0.0.0.0_8080, 0.0.0.0_9080, two <vip>_9000, one <vip>_7070; routes 8080, 9080 and
        // svc-0.ns-3.svc.cluster.local:7070.
        let want = ExpectedShape {
            endpoints: 26,
            listeners: 7,
            routes: 3,
            inbound_clusters: 1,
        };
        assert_eq!(mesh.expected_shape(0), want);
        // Proxy 5 is in ns-1 (svc-0 .. svc-4), selected by svc-1 (g = 5: port 8080 only);
        // proxy 1 by svc-0.ns-1 (g = 1: 8080 and 9000).
        assert_eq!(
            (mesh.proxy_service(5), mesh.proxy_app(5).as_str()),
            ((1, 1), "svc-1")
        );
        assert_eq!(mesh.expected_shape(1).inbound_clusters, 2);
    }

    #[test]
    fn markers_are_unique_and_never_prefixes() {
        let ips: Vec<String> = (0..600).map(added_endpoint_ip).collect();
        for (i, a) in ips.iter().enumerate() {
            for b in &ips[i + 1..] {
                assert!(
                    !b.contains(a.as_str()) && !a.contains(b.as_str()),
                    "{a} {b}"
                );
            }
        }
        assert!(!pod_ip(12345).starts_with("10.250."));
    }
}
