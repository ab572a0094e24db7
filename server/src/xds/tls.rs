//! TLS of the secure xDS port (istiod's 15012): the serving certificate chain and key, and
//! the CA that verifies client certificates, read from PEM files and reloaded when they
//! change, without a restart.
//!
//! The files are read again every [`RELOAD_INTERVAL`]; when their contents differ from the
//! last read, the configuration is rebuilt and used for every connection accepted from then
//! on (open connections keep theirs). A set that does not load (a certificate written
//! before its key, a bad file) is logged and counted in
//! `shoal_xds_tls_reloads_total{result="error"}`, and the previous configuration stays in
//! use until the files change again. Kubernetes Secret volumes update all files at once
//! (an atomic symlink swap), so a mounted Secret never shows a half-written pair.

use crate::metrics::Metrics;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

/// How often the certificate files are checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Where the secure port's TLS material is.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The serving certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// The serving certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that verify client certificates; without it, clients
    /// authenticate with tokens only.
    pub client_ca: Option<PathBuf>,
}

/// TLS material that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the expected kind.
    #[error("{what} {path}: {error}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
    /// rustls refused the combination (e.g. the key does not match the certificate).
    #[error("the serving certificate and key cannot be used: {0}")]
    Config(String),
}

/// The current TLS configuration of the secure port, shared with its reloader.
#[derive(Clone)]
pub struct TlsServer {
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

/// A fingerprint of the files' contents.
type Fingerprint = [u8; 32];

impl TlsServer {
    /// Loads the files; fails when they cannot be used.
    pub fn load(files: &TlsFiles) -> Result<TlsServer, TlsError> {
        let config = build(files)?;
        Ok(TlsServer {
            current: Arc::new(RwLock::new(Arc::new(config))),
        })
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        TlsAcceptor::from(config)
    }

    /// Reloads the configuration whenever the files' contents change, forever.
    pub async fn reload(self, files: TlsFiles, metrics: Metrics) {
        let mut seen = fingerprint(&files).ok();
        metrics.tls_reloads.with_label_values(&["ok"]).inc();
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            let now = fingerprint(&files).ok();
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            match build(&files) {
                Ok(config) => {
                    *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                    metrics.tls_reloads.with_label_values(&["ok"]).inc();
                    tracing::info!(cert = %files.cert.display(), "xDS TLS certificate reloaded");
                }
                Err(error) => {
                    metrics.tls_reloads.with_label_values(&["error"]).inc();
                    tracing::error!(%error, "xDS TLS files changed but cannot be used; still serving the previous certificate");
                }
            }
        }
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn fingerprint(files: &TlsFiles) -> Result<Fingerprint, TlsError> {
    let mut h = Sha256::new();
    h.update(read("certificate", &files.cert)?);
    h.update(read("key", &files.key)?);
    if let Some(ca) = &files.client_ca {
        h.update(read("client CA", ca)?);
    }
    Ok(h.finalize().into())
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |error: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        error,
    };
    let certs = CertificateDer::pem_slice_iter(&read(what, path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn build(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let chain = certificates("certificate", &files.cert)?;
    let key =
        PrivateKeyDer::from_pem_slice(&read("key", &files.key)?).map_err(|e| TlsError::Pem {
            what: "key",
            path: files.key.clone(),
            error: format!("no usable PEM private key: {e}"),
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match &files.client_ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates("client CA", path)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    what: "client CA",
                    path: path.clone(),
                    error: e.to_string(),
                })?;
            }
            // Client certificates are optional: a proxy may authenticate with a token.
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?
        }
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
