//! TLS of the secure xDS port (istiod's 15012): the serving certificate chain and key, and
//! the CA that verifies client certificates, read from PEM files and reloaded when they
//! change, without a restart — or, without files, a serving certificate issued from the
//! workload CA ([`crate::security::serving_cert`]).
//!
//! Reloaded as [`crate::security::reload`] describes: a changed set serves every connection accepted
//! from then on (open connections keep theirs); `shoal_xds_tls_reloads_total` counts the
//! loads.

use crate::security::metrics::SecurityMetrics;
use crate::security::reload::Reloading;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

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
pub struct TlsServer(Reloading<ServerConfig>);

impl TlsServer {
    /// Loads the files; fails when they cannot be used.
    pub fn load(files: &TlsFiles) -> Result<TlsServer, TlsError> {
        Ok(TlsServer(Reloading::new(build(files)?)))
    }

    /// Serves `config` (built by [`config_from_pem`]).
    pub fn new(config: ServerConfig) -> TlsServer {
        TlsServer(Reloading::new(config))
    }

    /// Serves `config` to every connection accepted from now on.
    pub fn set(&self, config: ServerConfig) {
        self.0.set(config)
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.0.get())
    }

    /// Reloads the configuration whenever the files' contents change, forever.
    pub async fn reload(self, files: TlsFiles, metrics: SecurityMetrics) {
        let mut paths = vec![files.cert.clone(), files.key.clone()];
        paths.extend(files.client_ca.clone());
        let build = move || build(&files);
        self.0
            .follow("xDS TLS certificate", paths, build, metrics.tls_reloads)
            .await
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
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
    config(chain, key, files.client_ca.as_deref())
}

/// A configuration serving `chain` (PEM certificates, leaf first) with `key` (PEM), and
/// verifying client certificates with the CA file `client_ca` if given.
pub fn config_from_pem(
    chain: &[String],
    key: &str,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let chain = chain
        .iter()
        .map(|pem| CertificateDer::from_pem_slice(pem.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Config(format!("the issued certificate is not PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|e| TlsError::Config(format!("the issued key is not PEM: {e}")))?;
    config(chain, key, client_ca)
}

fn config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match client_ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates("client CA", path)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    what: "client CA",
                    path: path.to_path_buf(),
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
