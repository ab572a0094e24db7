//! `hbone-server`: an HBONE terminator standing in for ztunnel in the tests (no ztunnel runs
//! in CI). HBONE is HTTP/2 CONNECT over mutual TLS on port 15008: the caller's proxy
//! presents its workload certificate, asks to CONNECT to `<podIP>:<port>`, and the bytes
//! of the tunnel are the connection to that port.
//!
//! Like ztunnel's inbound side it requires a client certificate chaining to the mesh root,
//! serves the pod's own workload certificate, speaks only TLS 1.3 with ALPN `h2`, and
//! connects to the requested authority inside the pod. Unlike ztunnel it applies no
//! authorization policy: it prints `hbone <caller's SPIFFE id> -> <authority>` for every
//! tunnel it opens, so the test reads who called.

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// The files of the terminator's TLS identity.
pub struct Identity<'a> {
    /// The pod's certificate (then its chain), PEM.
    pub cert: &'a Path,
    /// Its private key, PEM.
    pub key: &'a Path,
    /// The mesh root that callers' certificates must chain to, PEM.
    pub root: &'a Path,
}

/// Serves HBONE on `addr` until killed; prints `listening on <addr>` once it accepts.
pub async fn serve(addr: SocketAddr, identity: Identity<'_>) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(&identity)?));
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    super::announce(listener.local_addr()?);
    serve_on(listener, acceptor).await
}

async fn serve_on(listener: TcpListener, acceptor: TlsAcceptor) -> anyhow::Result<()> {
    loop {
        let (stream, peer) = super::accept(&listener).await;
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(acceptor, stream).await {
                eprintln!("hbone connection from {peer}: {e:#}");
            }
        });
    }
}

/// Mutual TLS 1.3, ALPN `h2`, client certificates verified against the mesh root.
fn server_config(identity: &Identity<'_>) -> anyhow::Result<rustls::ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(identity.cert)
        .with_context(|| format!("reading {}", identity.cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", identity.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(identity.key)
        .with_context(|| format!("reading {}", identity.key.display()))?;
    let mut roots = RootCertStore::empty();
    for root in CertificateDer::pem_file_iter(identity.root)
        .with_context(|| format!("reading {}", identity.root.display()))?
    {
        roots
            .add(root.with_context(|| format!("parsing {}", identity.root.display()))?)
            .context("adding the mesh root")?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("the client certificate verifier")?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("the pod's certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// One HBONE connection: the handshake, the caller's identity, then HTTP/2 whose every
/// CONNECT stream is a tunnel.
async fn connection(acceptor: TlsAcceptor, stream: TcpStream) -> anyhow::Result<()> {
    let tls = acceptor.accept(stream).await.context("TLS handshake")?;
    let caller = {
        let (_, session) = tls.get_ref();
        let leaf = session
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or_else(|| anyhow!("no client certificate"))?;
        spiffe_id(leaf)?
    };
    let service = service_fn(move |req| tunnel(caller.clone(), req));
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await
        .context("HTTP/2")
}

/// The certificate's `spiffe://` URI SAN.
fn spiffe_id(cert: &CertificateDer<'_>) -> anyhow::Result<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| anyhow!("the client certificate does not parse: {e}"))?;
    let sans = cert
        .subject_alternative_name()
        .map_err(|e| anyhow!("the client certificate's SANs: {e}"))?;
    sans.into_iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) if uri.starts_with("spiffe://") => {
                Some(uri.to_string())
            }
            _ => None,
        })
        .ok_or_else(|| anyhow!("the client certificate has no SPIFFE identity"))
}

/// A CONNECT to `<ip>:<port>`: connects there, answers 200, then copies bytes both ways
/// between the stream and the connection. Anything else is refused.
async fn tunnel(
    caller: String,
    req: Request<Incoming>,
) -> Result<Response<Empty<Bytes>>, Infallible> {
    let status = |s: StatusCode| {
        let mut r = Response::new(Empty::new());
        *r.status_mut() = s;
        Ok(r)
    };
    if req.method() != Method::CONNECT {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let Some(target) = req
        .uri()
        .authority()
        .and_then(|a| a.as_str().parse::<SocketAddr>().ok())
    else {
        eprintln!(
            "hbone {caller}: CONNECT without an ip:port authority: {}",
            req.uri()
        );
        return status(StatusCode::BAD_REQUEST);
    };
    let upstream = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hbone {caller} -> {target}: {e}");
            return status(StatusCode::SERVICE_UNAVAILABLE);
        }
    };
    println!("hbone {caller} -> {target}");
    let _ = std::io::stdout().flush();
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut upgraded = TokioIo::new(upgraded);
                let mut upstream = upstream;
                if let Err(e) = tokio::io::copy_bidirectional(&mut upgraded, &mut upstream).await {
                    eprintln!("hbone {caller} -> {target}: {e}");
                }
            }
            Err(e) => eprintln!("hbone {caller} -> {target}: no tunnel: {e}"),
        }
    });
    status(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_tests::pki::{client_config, Pem, TestCa};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A terminator on 127.0.0.1 with a serving certificate for `localhost` from `root`
    /// (the test client checks the server's name; Envoy's `connect_originate` does not).
    async fn terminator(root: &TestCa, dir: &Path) -> SocketAddr {
        let (cert, key) = root.server("ambient").write(dir, "server");
        let root_path = dir.join("root.pem");
        std::fs::write(&root_path, &root.cert_pem).unwrap();
        let config = server_config(&Identity {
            cert: &cert,
            key: &key,
            root: &root_path,
        })
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_on(listener, TlsAcceptor::from(Arc::new(config))));
        addr
    }

    /// A TCP echo server: the tunnel's destination.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// CONNECTs to `target` through the terminator at `addr` as `client` (trusting
    /// `root`), sends `ping` and returns what came back.
    async fn through(
        addr: SocketAddr,
        root: &TestCa,
        client: Option<&Pem>,
        target: SocketAddr,
    ) -> anyhow::Result<String> {
        let tls =
            shoal_tests::pki::tls_connect(addr, "localhost", client_config(&root.cert_pem, client))
                .await?;
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri(target.to_string())
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(req).await?;
        anyhow::ensure!(response.status() == StatusCode::OK, "{}", response.status());
        let mut tunnel = TokioIo::new(hyper::upgrade::on(response).await?);
        tunnel.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tunnel.read_exact(&mut buf).await?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// A caller with a mesh certificate gets its tunnel; one without a certificate, or
    /// with one of another root, gets none.
    #[tokio::test]
    async fn tunnels_for_mesh_identities_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = TestCa::new("mesh root");
        let addr = terminator(&root, dir.path()).await;
        let target = echo().await;
        let caller = root.workload("shop", "productpage");
        let got = through(addr, &root, Some(&caller), target).await.unwrap();
        assert_eq!(got, "ping");

        let timeout = Duration::from_secs(5);
        let anonymous = tokio::time::timeout(timeout, through(addr, &root, None, target)).await;
        assert!(matches!(anonymous, Ok(Err(_))), "{anonymous:?}");
        let other = TestCa::new("another root").workload("shop", "productpage");
        let foreign =
            tokio::time::timeout(timeout, through(addr, &root, Some(&other), target)).await;
        assert!(matches!(foreign, Ok(Err(_))), "{foreign:?}");
    }

    #[test]
    fn reads_the_spiffe_id() {
        let pem = TestCa::new("mesh root").workload("shop", "productpage");
        let der = CertificateDer::from_pem_slice(pem.cert.as_bytes()).unwrap();
        assert_eq!(
            spiffe_id(&der).unwrap(),
            "spiffe://cluster.local/ns/shop/sa/productpage"
        );
        let plain = TestCa::new("mesh root").client("no SAN");
        let der = CertificateDer::from_pem_slice(plain.cert.as_bytes()).unwrap();
        assert!(spiffe_id(&der).is_err());
    }
}
