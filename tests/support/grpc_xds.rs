//! Proxyless gRPC processes: gRPC's own xDS client from the `grpcio` wheel (PyPI), and
//! plain gRPC backends, both Python scripts in `support/grpc_xds/` (scripts/test.sh
//! installs grpcio). The client follows a gRPC xDS bootstrap written here, as istio-agent
//! writes it for proxyless pods (`GENERATOR: grpc`).

use crate::eventually::eventually;
use crate::http;
use crate::ports::free_addr;
use crate::process::Process;
use serde_json::{json, Value};
use shoal_proto::pb::envoy::admin::v3::ClientResourceStatus;
use shoal_proto::pb::envoy::service::status::v3::ClientStatusResponse;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::Command;

const HINT: &str =
    "python3 with grpcio is needed: python3 -m pip install grpcio (scripts/test.sh does)";

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("support/grpc_xds")
        .join(name)
}

fn python(script_name: &str) -> Command {
    let mut cmd = Command::new("python3");
    // Unbuffered, so "ready" and tracebacks reach the log at once.
    cmd.arg("-u").arg(script(script_name));
    cmd
}

async fn wait_ready(process: &mut Process) {
    eventually(Duration::from_secs(20), Duration::from_millis(50), || {
        process.assert_running();
        let ready = process.log().lines().any(|l| l == "ready");
        async move {
            if ready {
                Ok(())
            } else {
                Err("not ready yet")
            }
        }
    })
    .await;
}

/// Plain gRPC servers (no xDS) answering `/echo.Echo/Call` with their name.
pub struct GrpcBackends {
    process: Process,
}

impl GrpcBackends {
    /// Starts one server per `(name, address)` and waits until all listen.
    pub async fn start(servers: &[(&str, SocketAddr)]) -> GrpcBackends {
        let mut cmd = python("backend.py");
        for (name, addr) in servers {
            cmd.arg(format!("{name}={addr}"));
        }
        GrpcBackends::spawn(cmd, tempfile::tempdir().expect("backend dir")).await
    }

    /// Starts an xDS-enabled server `name` on `addr` (plaintext), following `bootstrap`:
    /// it serves once the control plane sent its listener
    /// `xds.istio.io/grpc/lds/inbound/<addr>`.
    pub async fn start_xds(name: &str, addr: SocketAddr, bootstrap: &Value) -> GrpcBackends {
        let dir = tempfile::tempdir().expect("backend dir");
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, bootstrap.to_string()).expect("writing the gRPC bootstrap");
        let mut cmd = python("backend.py");
        cmd.arg(format!("xds:{name}={addr}"))
            .env("GRPC_XDS_BOOTSTRAP", &path)
            .env("GRPC_VERBOSITY", "ERROR");
        GrpcBackends::spawn(cmd, dir).await
    }

    async fn spawn(cmd: Command, dir: tempfile::TempDir) -> GrpcBackends {
        let mut process = Process::spawn("grpc-backends", cmd, dir, HINT);
        wait_ready(&mut process).await;
        GrpcBackends { process }
    }

    /// The process.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }
}

/// A proxyless node as istio-agent's gRPC bootstrap describes it.
pub struct ProxylessNode<'a> {
    /// Pod IP (node id).
    pub ip: &'a str,
    /// Pod name.
    pub pod: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Workload labels.
    pub labels: &'a [(&'a str, &'a str)],
}

impl ProxylessNode<'_> {
    /// The node id, `sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub fn id(&self) -> String {
        let ns = self.namespace;
        format!(
            "sidecar~{}~{}.{ns}~{ns}.svc.cluster.local",
            self.ip, self.pod
        )
    }
}

/// A workload's certificate files, as istio-agent writes them for gRPC's `file_watcher`
/// certificate provider.
pub struct CertFiles {
    /// The certificate chain, PEM.
    pub cert: PathBuf,
    /// The private key, PEM.
    pub key: PathBuf,
    /// The mesh root, PEM.
    pub root: PathBuf,
}

impl CertFiles {
    /// Writes `chain` (leaf first), `key` and `root` into `dir`.
    pub fn write(dir: &std::path::Path, chain: &[String], key: &str, root: &str) -> CertFiles {
        let files = CertFiles {
            cert: dir.join("cert-chain.pem"),
            key: dir.join("key.pem"),
            root: dir.join("root-cert.pem"),
        };
        std::fs::write(&files.cert, chain.concat()).expect("writing the chain");
        std::fs::write(&files.key, key).expect("writing the key");
        std::fs::write(&files.root, root).expect("writing the root");
        files
    }
}

/// The gRPC xDS bootstrap of a proxyless node talking to shoal's plaintext xDS port, as
/// istio-agent writes it (`server_listener_resource_name_template`, `GENERATOR: grpc`).
pub fn bootstrap(xds: SocketAddr, node: &ProxylessNode<'_>) -> Value {
    bootstrap_with_certs(xds, node, None)
}

/// [`bootstrap`] with the certificate provider instance `default` (`file_watcher` on
/// `certs`), which shoal's TLS settings for proxyless nodes name.
pub fn bootstrap_with_certs(
    xds: SocketAddr,
    node: &ProxylessNode<'_>,
    certs: Option<&CertFiles>,
) -> Value {
    let labels: BTreeMap<&str, &str> = node.labels.iter().copied().collect();
    let providers = match certs {
        Some(c) => json!({"default": {
            "plugin_name": "file_watcher",
            "config": {
                "certificate_file": c.cert,
                "private_key_file": c.key,
                "ca_certificate_file": c.root,
                "refresh_interval": "900s",
            },
        }}),
        None => json!({}),
    };
    json!({
        "certificate_providers": providers,
        "xds_servers": [{
            "server_uri": xds.to_string(),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {
            "id": node.id(),
            "metadata": {
                "GENERATOR": "grpc",
                "NAMESPACE": node.namespace,
                "LABELS": labels,
                "INSTANCE_IPS": node.ip,
            },
            "locality": {},
        },
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
    })
}

/// What a batch of calls returned: answers by backend name, failures by status.
#[derive(Debug, Default)]
pub struct Calls {
    /// Successful calls by the backend that answered.
    pub backends: BTreeMap<String, u64>,
    /// Failed calls by `CODE: details` (the client stops a batch at the first failure).
    pub errors: BTreeMap<String, u64>,
}

impl Calls {
    /// Whether every call succeeded and each was answered by one of `names`.
    pub fn only(&self, names: &[&str]) -> bool {
        self.errors.is_empty()
            && !self.backends.is_empty()
            && self.backends.keys().all(|b| names.contains(&b.as_str()))
    }
}

/// gRPC's xDS client (`grpcio`), one channel per target, driven over a local HTTP port.
pub struct GrpcClient {
    process: Process,
    control: SocketAddr,
}

impl GrpcClient {
    /// Starts the client with `bootstrap` as its `GRPC_XDS_BOOTSTRAP`.
    pub async fn start(bootstrap: &Value) -> GrpcClient {
        let dir = tempfile::tempdir().expect("client dir");
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, bootstrap.to_string()).expect("writing the gRPC bootstrap");
        let control = free_addr();
        let mut cmd = python("client.py");
        cmd.arg(control.port().to_string())
            .env("GRPC_XDS_BOOTSTRAP", &path)
            // gRPC's own logs of xDS (NACKs, resource errors) go to the process log.
            .env("GRPC_VERBOSITY", "ERROR");
        let mut process = Process::spawn("grpc-client", cmd, dir, HINT);
        wait_ready(&mut process).await;
        GrpcClient { process, control }
    }

    /// Makes `n` calls to `target` with `headers` over xDS credentials (mutual TLS where
    /// the cluster says so, else plaintext); stops at the first failure.
    pub async fn call(
        &self,
        target: &str,
        n: u32,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Calls> {
        self.call_with(target, "xds", n, headers).await
    }

    /// [`GrpcClient::call`] with `creds`: `xds`, or `insecure` (plaintext whatever xDS
    /// says).
    pub async fn call_with(
        &self,
        target: &str,
        creds: &str,
        n: u32,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Calls> {
        let mut path = format!("/call?target={target}&creds={creds}&n={n}&timeout=1");
        for (k, v) in headers {
            path.push_str(&format!("&header={k}:{v}"));
        }
        let v = http::get(self.control, &path).await?.json()?;
        let counts = |key: &str| -> BTreeMap<String, u64> {
            v[key]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Calls {
            backends: counts("backends"),
            errors: counts("errors"),
        })
    }

    /// The client's own xDS status (CSDS): every resource of every xDS client in it.
    pub async fn csds(&self) -> anyhow::Result<ClientStatusResponse> {
        use prost::Message as _;
        let body = http::get(self.control, "/csds").await?.body;
        Ok(ClientStatusResponse::decode(body.as_slice())?)
    }

    /// Checks CSDS: at least one resource, each acknowledged (`ACKED`), none with an
    /// error (a NACK). Returns how many resources the client holds.
    pub async fn all_acked(&self) -> anyhow::Result<usize> {
        let status = self.csds().await?;
        let mut n = 0;
        for client in &status.config {
            for r in &client.generic_xds_configs {
                anyhow::ensure!(
                    r.client_status == ClientResourceStatus::Acked as i32
                        && r.error_state.is_none(),
                    "{} {}: {:?} {:?}",
                    r.type_url,
                    r.name,
                    ClientResourceStatus::try_from(r.client_status),
                    r.error_state
                );
                n += 1;
            }
        }
        anyhow::ensure!(n > 0, "CSDS lists no resource");
        Ok(n)
    }

    /// The process.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }
}
