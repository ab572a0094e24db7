//! Envoy's Secret Discovery Service on a Unix socket, as istio-agent serves it: `default`
//! (the workload certificate chain and key) and `ROOTCA` (the mesh root), over SotW
//! (`StreamSecrets`) and delta (`DeltaSecrets`). Every stream gets the current secrets when
//! it asks and again whenever they are renewed.
//!
//! `shoal-test-agent` (tests/agent/) serves what shoal's CA issued. For every other test
//! Envoy, [`workload_socket`] stands in for the agent injection gives each Istio proxy: the
//! test process serves a certificate of the node's identity from one test mesh root
//! ([`mesh_root`]), so the default, mTLS-on configuration works in every test.

use anyhow::{anyhow, bail, Context};
use shoal_proto::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use shoal_proto::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

/// The type URL of SDS resources.
const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// The workload certificate's secret name (Istio's `default`).
const WORKLOAD: &str = "default";
/// The root certificate's secret name (Istio's `ROOTCA`).
const ROOT: &str = "ROOTCA";

/// One issued certificate, as served.
pub struct Secrets {
    /// The SDS version: the issuance count.
    pub version: String,
    /// The certificate then its intermediates, PEM.
    cert_chain: String,
    /// The private key, PEM.
    key: String,
    /// The root (the last certificate of the CA's response), PEM.
    root: String,
    /// The certificate's URI SANs.
    pub sans: Vec<String>,
    /// The certificate's serial number (hex).
    pub serial: String,
    /// When it was received.
    issued_at: SystemTime,
    /// When it expires.
    pub not_after: SystemTime,
}

impl Secrets {
    /// The secrets of a `CreateCertificate` response (the certificate first, the root
    /// last) and the key the CSR was made with; `issuance` counts the certificates.
    pub fn from_chain(chain: Vec<String>, key: String, issuance: u64) -> anyhow::Result<Secrets> {
        let [leaf_and_chain @ .., root] = chain.as_slice() else {
            bail!("the CA returned no certificate");
        };
        if leaf_and_chain.is_empty() {
            bail!("the CA returned one certificate; expected the certificate, then its chain up to the root");
        }
        let (_, pem) = x509_parser::pem::parse_x509_pem(leaf_and_chain[0].as_bytes())
            .map_err(|e| anyhow!("the issued certificate is not PEM: {e}"))?;
        let leaf = pem
            .parse_x509()
            .map_err(|e| anyhow!("the issued certificate does not parse: {e}"))?;
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = leaf.subject_alternative_name() {
            for name in &ext.value.general_names {
                if let x509_parser::extensions::GeneralName::URI(uri) = name {
                    sans.push(uri.to_string());
                }
            }
        }
        let not_after = leaf.validity().not_after.timestamp();
        let not_after = SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(not_after).context("expiry before 1970")?);
        Ok(Secrets {
            version: issuance.to_string(),
            cert_chain: leaf_and_chain.concat(),
            key,
            root: root.clone(),
            sans,
            serial: leaf
                .raw_serial()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            issued_at: SystemTime::now(),
            not_after,
        })
    }

    /// Time left until half of the certificate's life (from receipt to expiry) is over.
    pub fn renew_in(&self) -> Duration {
        let life = self
            .not_after
            .duration_since(self.issued_at)
            .unwrap_or_default();
        (self.issued_at + life / 2)
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    }

    /// The secret `name`, if it is one of the agent's.
    fn secret(&self, name: &str) -> Option<Secret> {
        let inline = |pem: &str| DataSource {
            specifier: Some(Specifier::InlineBytes(pem.as_bytes().to_vec())),
            ..DataSource::default()
        };
        let kind = match name {
            WORKLOAD => secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: Some(inline(&self.cert_chain)),
                private_key: Some(inline(&self.key)),
                ..TlsCertificate::default()
            }),
            ROOT => secret::Type::ValidationContext(CertificateValidationContext {
                trusted_ca: Some(inline(&self.root)),
                ..CertificateValidationContext::default()
            }),
            _ => return None,
        };
        Some(Secret {
            name: name.to_string(),
            r#type: Some(kind),
        })
    }

    /// The secrets among `names` that exist (unknown names are logged and left out).
    fn resources<'a>(
        &self,
        names: impl IntoIterator<Item = &'a String>,
    ) -> Vec<(String, shoal_proto::Any)> {
        let mut out = Vec::new();
        for name in names {
            match self.secret(name) {
                Some(s) => out.push((name.clone(), shoal_proto::pack(SECRET_TYPE, &s))),
                None => {
                    warn!(%name, "Envoy asked for an unknown secret (only {WORKLOAD} and {ROOT} exist)")
                }
            }
        }
        out
    }
}

/// Binds `path` (replacing a stale socket) and returns the server to run.
pub async fn serve(
    path: &Path,
    secrets: watch::Receiver<Arc<Secrets>>,
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>>> {
    let listener = tokio::net::UnixListener::from_std(bind(path)?)
        .with_context(|| format!("serving the SDS socket {}", path.display()))?;
    Ok(serve_on(listener, secrets))
}

/// Binds the Unix socket `path`, replacing a stale one.
fn bind(path: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("binding the SDS socket {}", path.display()))?;
    listener
        .set_nonblocking(true)
        .context("a non-blocking SDS socket")?;
    Ok(listener)
}

fn serve_on(
    listener: tokio::net::UnixListener,
    secrets: watch::Receiver<Arc<Secrets>>,
) -> impl Future<Output = Result<(), tonic::transport::Error>> {
    let service = SecretDiscoveryServiceServer::new(Sds { secrets });
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(UnixListenerStream::new(listener))
}

/// The test mesh's root: the CA of the certificates [`workload_socket`] serves.
pub fn mesh_root() -> &'static crate::pki::TestCa {
    static ROOT: OnceLock<crate::pki::TestCa> = OnceLock::new();
    ROOT.get_or_init(|| crate::pki::TestCa::new("shoal test mesh root"))
}

/// The Unix socket on which this test process serves the workload secrets of
/// `spiffe://cluster.local/ns/<namespace>/sa/<service_account>` (a certificate from
/// [`mesh_root`], and that root), starting the server on first use. The servers run on a
/// runtime of their own, so they outlive the test that started them; the socket is usable
/// by Envoy as uid 1337 inside a pod's network namespace.
pub fn workload_socket(namespace: &str, service_account: &str) -> PathBuf {
    static SERVED: Mutex<BTreeMap<(String, String), PathBuf>> = Mutex::new(BTreeMap::new());
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let mut served = SERVED.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (namespace.to_string(), service_account.to_string());
    if let Some(path) = served.get(&key) {
        return path.clone();
    }
    let dir = std::env::temp_dir().join(format!("shoal-test-sds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the test SDS directory");
    crate::netns::share_dir(&dir).expect("opening the test SDS directory to uid 1337");
    let path = dir.join(format!("{namespace}.{service_account}.sock"));
    let pem = mesh_root().workload(namespace, service_account);
    let chain = vec![pem.cert, mesh_root().cert_pem.clone()];
    let secrets = Secrets::from_chain(chain, pem.key, 1).expect("test workload secrets");
    let (_keep, rx) = watch::channel(Arc::new(secrets));
    let listener = bind(&path).expect("the test SDS socket");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("opening the test SDS socket to uid 1337");
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-sds")
            .enable_all()
            .build()
            .expect("the test SDS runtime")
    });
    runtime.spawn(async move {
        // The sender lives as long as the server: the secrets never change.
        let _keep = _keep;
        let listener =
            tokio::net::UnixListener::from_std(listener).expect("serving the test SDS socket");
        if let Err(error) = serve_on(listener, rx).await {
            warn!(%error, "the test SDS server stopped");
        }
    });
    served.insert(key, path.clone());
    path
}

struct Sds {
    secrets: watch::Receiver<Arc<Secrets>>,
}

type Outbox<T> = mpsc::Sender<Result<T, Status>>;

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type StreamSecretsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaSecretsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(sotw(request.into_inner(), self.secrets.clone(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(delta(request.into_inner(), self.secrets.clone(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn fetch_secrets(
        &self,
        _: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "FetchSecrets (REST) is not served; use StreamSecrets or DeltaSecrets",
        ))
    }
}

/// A SotW stream: answers each new subscription (not ACKs) and every renewal.
async fn sotw(
    mut requests: Streaming<DiscoveryRequest>,
    mut secrets: watch::Receiver<Arc<Secrets>>,
    tx: Outbox<DiscoveryResponse>,
) {
    let mut names: Option<Vec<String>> = None;
    let mut nonce = 0u64;
    loop {
        tokio::select! {
            request = requests.message() => {
                let request = match request {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(status) => {
                        info!(%status, "SDS stream (SotW) ended");
                        return;
                    }
                };
                if let Some(node) = &request.node {
                    info!(node = %node.id, names = ?request.resource_names, "SDS stream (SotW) opened");
                }
                if let Some(error) = &request.error_detail {
                    warn!(names = ?request.resource_names, error = %error.message, "Envoy rejected the secrets (NACK)");
                    continue;
                }
                let is_ack = !request.response_nonce.is_empty()
                    && names.as_ref() == Some(&request.resource_names);
                if is_ack {
                    continue;
                }
                names = Some(request.resource_names);
            }
            changed = secrets.changed() => {
                if changed.is_err() {
                    return;
                }
                if names.is_none() {
                    continue;
                }
            }
        }
        let Some(names) = &names else { continue };
        let current = secrets.borrow_and_update().clone();
        nonce += 1;
        let resources: Vec<_> = current
            .resources(names)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        info!(names = ?names, version = %current.version, "pushing secrets (SotW)");
        let response = DiscoveryResponse {
            version_info: current.version.clone(),
            resources,
            type_url: SECRET_TYPE.to_string(),
            nonce: nonce.to_string(),
            ..DiscoveryResponse::default()
        };
        if tx.send(Ok(response)).await.is_err() {
            return;
        }
    }
}

/// A delta stream: sends newly subscribed secrets, and every subscribed one on renewal.
async fn delta(
    mut requests: Streaming<DeltaDiscoveryRequest>,
    mut secrets: watch::Receiver<Arc<Secrets>>,
    tx: Outbox<DeltaDiscoveryResponse>,
) {
    let mut subscribed = BTreeSet::new();
    let mut nonce = 0u64;
    loop {
        let send: Vec<String> = tokio::select! {
            request = requests.message() => {
                let request = match request {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(status) => {
                        info!(%status, "SDS stream (delta) ended");
                        return;
                    }
                };
                if let Some(node) = &request.node {
                    info!(node = %node.id, names = ?request.resource_names_subscribe, "SDS stream (delta) opened");
                }
                if let Some(error) = &request.error_detail {
                    warn!(error = %error.message, "Envoy rejected the secrets (NACK)");
                }
                for name in &request.resource_names_unsubscribe {
                    subscribed.remove(name);
                }
                let new: Vec<String> = request
                    .resource_names_subscribe
                    .into_iter()
                    .filter(|n| subscribed.insert(n.clone()))
                    .collect();
                new
            }
            changed = secrets.changed() => {
                if changed.is_err() {
                    return;
                }
                subscribed.iter().cloned().collect()
            }
        };
        if send.is_empty() {
            continue;
        }
        let current = secrets.borrow_and_update().clone();
        nonce += 1;
        let resources = current
            .resources(&send)
            .into_iter()
            .map(|(name, resource)| Resource {
                name,
                version: current.version.clone(),
                resource: Some(resource),
                ..Resource::default()
            })
            .collect();
        info!(names = ?send, version = %current.version, "pushing secrets (delta)");
        let response = DeltaDiscoveryResponse {
            system_version_info: current.version.clone(),
            resources,
            type_url: SECRET_TYPE.to_string(),
            nonce: nonce.to_string(),
            ..DeltaDiscoveryResponse::default()
        };
        if tx.send(Ok(response)).await.is_err() {
            return;
        }
    }
}
