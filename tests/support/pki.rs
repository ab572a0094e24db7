//! Test credentials for the secure xDS port: a CA issuing serving and SPIFFE workload
//! certificates, a cluster's service-account token signer (its JWKS, as the API server
//! serves it, and tokens as the kubelet projects them for istio-agent), and a gRPC channel
//! over TLS presenting them.

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

impl Pem {
    /// Writes `<name>.crt` and `<name>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert).expect("writing a certificate");
        std::fs::write(&key, &self.key).expect("writing a key");
        (cert, key)
    }
}

/// A certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    key_pem: String,
}

impl TestCa {
    /// A new self-signed root.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes this CA as Istio's `cacerts` layout (a root signing directly) into `dir`.
    pub fn write_cacerts(&self, dir: &Path) {
        std::fs::create_dir_all(dir).expect("cacerts dir");
        std::fs::write(dir.join("ca-cert.pem"), &self.cert_pem).expect("ca-cert.pem");
        std::fs::write(dir.join("ca-key.pem"), &self.key_pem).expect("ca-key.pem");
        std::fs::write(dir.join("root-cert.pem"), &self.cert_pem).expect("root-cert.pem");
    }

    fn issue(&self, params: CertificateParams, purpose: ExtendedKeyUsagePurpose) -> Pem {
        self.issue_for(params, vec![purpose])
    }

    fn issue_for(
        &self,
        mut params: CertificateParams,
        purposes: Vec<ExtendedKeyUsagePurpose>,
    ) -> Pem {
        params.extended_key_usages = purposes;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A serving certificate for `localhost` and 127.0.0.1, with `cn` as its common name.
    pub fn server(&self, cn: &str) -> Pem {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params.distinguished_name.push(DnType::CommonName, cn);
        self.issue(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A serving certificate for the DNS name `host` (its SAN and common name).
    pub fn server_for(&self, host: &str) -> Pem {
        let mut params = CertificateParams::new(vec![host.to_string()]).expect("server params");
        params.distinguished_name.push(DnType::CommonName, host);
        self.issue(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `cn` (no SAN).
    pub fn client(&self, cn: &str) -> Pem {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, cn);
        self.issue(params, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A workload certificate for `spiffe://cluster.local/ns/<ns>/sa/<sa>`, as Istio's CA
    /// issues them (URI SAN only; client and server use, for mutual TLS both ways).
    pub fn workload(&self, ns: &str, sa: &str) -> Pem {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("workload params");
        let uri = format!("spiffe://cluster.local/ns/{ns}/sa/{sa}");
        params.subject_alt_names = vec![SanType::URI(uri.try_into().expect("SPIFFE URI"))];
        self.issue_for(
            params,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }
}

/// A cluster's service-account token signer (ES256).
pub struct TokenSigner {
    key: KeyPair,
    kid: String,
    /// The issuer name (`iss`).
    pub issuer: String,
}

impl TokenSigner {
    /// A signer with a new key.
    pub fn new(issuer: &str, kid: &str) -> TokenSigner {
        TokenSigner {
            key: KeyPair::generate().expect("signing key"),
            kid: kid.to_string(),
            issuer: issuer.to_string(),
        }
    }

    /// The JSON Web Key Set an API server serves at `/openid/v1/jwks`.
    pub fn jwks(&self) -> serde_json::Value {
        let raw = self.key.public_key_raw();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
        }]})
    }

    /// A token carrying `claims` (with this signer's `kid`), signed ES256.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let key = jsonwebtoken::EncodingKey::from_ec_der(&self.key.serialize_der());
        jsonwebtoken::encode(&header, claims, &key).expect("signing a token")
    }

    /// A projected service-account token of `ns/sa` for `audience`, valid for an hour.
    pub fn token(&self, ns: &str, sa: &str, audience: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let claims = serde_json::json!({
            "aud": [audience], "iss": self.issuer, "iat": now, "nbf": now, "exp": now + 3600,
            "sub": format!("system:serviceaccount:{ns}:{sa}"),
            "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": "1"},
                              "pod": {"name": format!("{sa}-1"), "uid": "2"}},
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let key = jsonwebtoken::EncodingKey::from_ec_der(&self.key.serialize_der());
        jsonwebtoken::encode(&header, &claims, &key).expect("signing a token")
    }
}

/// A TLS client configuration trusting `ca_pem`, presenting `client` if given.
pub fn client_config(ca_pem: &str, client: Option<&Pem>) -> rustls::ClientConfig {
    try_client_config(ca_pem, client).expect("TLS client configuration")
}

/// [`client_config`], with an error naming what is unusable instead of a panic (for
/// programs reading the PEM from files: `shoal-test-agent`).
pub fn try_client_config(
    ca_pem: &str,
    client: Option<&Pem>,
) -> anyhow::Result<rustls::ClientConfig> {
    use anyhow::Context;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.context("the CA PEM")?)
            .context("the CA certificate")?;
    }
    if roots.is_empty() {
        anyhow::bail!("the CA PEM holds no certificate");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    let mut config = match client {
        Some(pem) => {
            let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .context("the client certificate PEM")?;
            let key =
                PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).context("the client key PEM")?;
            builder
                .with_client_auth_cert(chain, key)
                .context("the client certificate and key")?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Connects over TLS to `addr` (as `localhost`) and returns the server's leaf certificate.
pub async fn server_certificate(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> anyhow::Result<CertificateDer<'static>> {
    let stream = tls_connect(addr, "localhost", config).await?;
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .ok_or_else(|| anyhow::anyhow!("no server certificate"))?;
    Ok(certs[0].clone().into_owned())
}

/// A TLS connection to `addr`, verifying the server as `server_name`.
pub async fn tls_connect(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_string())?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?)
}

/// A gRPC channel to `addr` over TLS with `config`, verifying the server as `localhost`.
pub async fn tls_channel(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> anyhow::Result<tonic::transport::Channel> {
    tls_channel_to(addr, "localhost", config).await
}

/// A gRPC channel to `addr` over TLS with `config`, verifying the server's certificate for
/// `server_name`.
pub async fn tls_channel_to(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
) -> anyhow::Result<tonic::transport::Channel> {
    // Fails early on a name rustls cannot verify, rather than at the first connection.
    ServerName::try_from(server_name.to_string())?;
    Ok(tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(TlsConnector {
            addr,
            server_name: server_name.to_string(),
            config: Arc::new(config),
        })
        .await?)
}

/// Opens TLS connections for a tonic channel.
#[derive(Clone)]
struct TlsConnector {
    addr: SocketAddr,
    server_name: String,
    config: Arc<rustls::ClientConfig>,
}

type Connecting = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = anyhow::Result<
                    hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
                >,
            > + Send,
    >,
>;

impl tower_service::Service<tonic::codegen::http::Uri> for TlsConnector {
    type Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = anyhow::Error;
    type Future = Connecting;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let (addr, config) = (self.addr, (*self.config).clone());
        let server_name = self.server_name.clone();
        Box::pin(async move {
            Ok(hyper_util::rt::TokioIo::new(
                tls_connect(addr, &server_name, config).await?,
            ))
        })
    }
}

/// The key material of a shoal server with its TLS port (istiod's 15012) and its workload
/// CA, from one root, written to a temporary directory: Istio's `cacerts` layout for
/// `--ca-dir` (the server issues its TLS port's certificate from it for `localhost`, as the
/// chart has it do for the Service's names), and the root again as the client CA (so
/// certificates the CA issues authenticate on the TLS port). Clients trust the root alone,
/// as istio-agent with `istio-ca-root-cert`.
pub struct ServerPki {
    /// The root.
    pub ca: TestCa,
    dir: tempfile::TempDir,
}

impl ServerPki {
    /// A new root and its files.
    pub fn new() -> ServerPki {
        let ca = TestCa::new("mesh root");
        let dir = tempfile::tempdir().expect("PKI dir");
        ca.write_cacerts(&dir.path().join("cacerts"));
        std::fs::write(dir.path().join("client-ca.crt"), &ca.cert_pem).expect("client CA");
        ServerPki { ca, dir }
    }

    /// The `shoal-server` arguments for a TLS port on `tls` with the CA.
    pub fn server_args(&self, tls: SocketAddr) -> Vec<String> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        vec![
            "--xds-tls-addr".into(),
            tls.to_string(),
            "--xds-dns-names".into(),
            "localhost".into(),
            "--xds-client-ca".into(),
            path("client-ca.crt"),
            "--ca-dir".into(),
            path("cacerts"),
        ]
    }
}

impl Default for ServerPki {
    fn default() -> Self {
        ServerPki::new()
    }
}

/// Asks shoal's CA for a workload certificate as istio-agent does (`CreateCertificate` on
/// `channel`, the TLS port, with a new key's CSR): the identity is the caller's. Returns
/// the chain (leaf first, root last) and the key, PEM.
pub async fn create_certificate(
    channel: tonic::transport::Channel,
) -> Result<(Vec<String>, String), tonic::Status> {
    create_certificate_as(channel, None, &[]).await
}

/// [`create_certificate`] asking for `impersonate` (the `ImpersonatedIdentity` metadata a
/// node agent such as ztunnel sends), with extra request `headers` (a bearer token, a
/// `clusterid`).
pub async fn create_certificate_as(
    channel: tonic::transport::Channel,
    impersonate: Option<&str>,
    headers: &[(&'static str, String)],
) -> Result<(Vec<String>, String), tonic::Status> {
    use shoal_proto::istio_ca::{
        IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE_PATH,
    };
    use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
    let key = KeyPair::generate().expect("key");
    let csr = CertificateParams::new(Vec::<String>::new())
        .expect("CSR params")
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("CSR PEM");
    let metadata = impersonate.map(|id| Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            Value {
                kind: Some(Kind::StringValue(id.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    });
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata,
    });
    for (name, value) in headers {
        let value = value.parse().expect("a header value");
        request.metadata_mut().insert(*name, value);
    }
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec =
        tonic_prost::ProstCodec::<IstioCertificateRequest, IstioCertificateResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE_PATH);
    let response = grpc.unary(request, path, codec).await?.into_inner();
    Ok((response.cert_chain, key.serialize_pem()))
}
