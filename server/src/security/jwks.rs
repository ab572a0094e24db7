//! Fetches the keys (JWKS) of RequestAuthentications' `jwksUri`s, so that proxies get
//! them inline (`local_jwks`), as istiod's JWKS resolver does: a proxy never fetches keys
//! itself, and an issuer outside the mesh needs no ServiceEntry.
//!
//! A background task fetches each URI the current config names (the pipeline says which,
//! after each PushContext), bounded in time ([`FETCH_TIMEOUT`]) and size
//! ([`MAX_JWKS_BYTES`]), refreshes it every [`REFRESH`], retries a failure after
//! [`RETRY_AFTER_FAILURE`], and keeps the last good key set when a refresh fails. New keys
//! reach the pipeline through a watch channel and are pushed like a config change; a push
//! never waits for a fetch (until the first fetch succeeds, the provider gets a key set no
//! token verifies against: `generate::authn::FAIL_ALL_JWKS`).

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};

/// How long one fetch may take, connection included (istiod's default timeout).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWKS document accepted.
pub const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// How often a fetched key set is refreshed (istiod's `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`).
pub const REFRESH: Duration = Duration::from_secs(20 * 60);
/// How soon a failed fetch is tried again.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(60);

/// System CA bundles tried, in order, for `https` URIs.
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Fetched key sets by URI, each a JWKS document.
pub type JwksByUri = Arc<BTreeMap<String, Arc<str>>>;

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Not an `http(s)://host[:port]/path` URI.
    #[error("not an http or https URI: {0}")]
    BadUri(String),
    /// The connection (TCP or TLS) failed.
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    /// The request could not be built.
    #[error("building the request: {0}")]
    Request(#[source] hyper::http::Error),
    /// A status other than 200.
    #[error("status {0}")]
    Status(u16),
    /// The body is larger than [`MAX_JWKS_BYTES`] or could not be read.
    #[error("body: {0}")]
    Body(String),
    /// [`FETCH_TIMEOUT`] passed.
    #[error("timed out after {FETCH_TIMEOUT:?}")]
    Timeout,
    /// The body is not a JWKS document (a JSON object with a `keys` array).
    #[error("not a JWKS document")]
    NotJwks,
}

/// Every value of the fetch metric's `result` label.
pub const RESULTS: [&str; 8] = [
    "ok",
    "timeout",
    "connect",
    "http",
    "status",
    "too_large",
    "not_jwks",
    "bad_uri",
];

impl JwksError {
    /// The metric label of the failure (one of [`RESULTS`]).
    pub fn reason(&self) -> &'static str {
        match self {
            JwksError::BadUri(_) | JwksError::Request(_) => "bad_uri",
            JwksError::Connect(_) => "connect",
            JwksError::Http(_) => "http",
            JwksError::Status(_) => "status",
            JwksError::Body(_) => "too_large",
            JwksError::Timeout => "timeout",
            JwksError::NotJwks => "not_jwks",
        }
    }
}

/// Starts the fetcher. Send the wanted URIs on the returned sender; fetched key sets come
/// on the receiver. `results` counts fetches by result (`ok`, or a [`JwksError::reason`]).
pub fn spawn(
    results: prometheus::IntCounterVec,
) -> (watch::Sender<BTreeSet<String>>, watch::Receiver<JwksByUri>) {
    let (wanted_tx, wanted_rx) = watch::channel(BTreeSet::new());
    let (keys_tx, keys_rx) = watch::channel(JwksByUri::default());
    tokio::spawn(run(wanted_rx, keys_tx, results));
    (wanted_tx, keys_rx)
}

async fn run(
    mut wanted: watch::Receiver<BTreeSet<String>>,
    keys: watch::Sender<JwksByUri>,
    results: prometheus::IntCounterVec,
) {
    let tls = Arc::new(client_config());
    let mut due: BTreeMap<String, Instant> = BTreeMap::new();
    let mut fetched: BTreeMap<String, Arc<str>> = BTreeMap::new();
    loop {
        let uris = wanted.borrow_and_update().clone();
        // URIs no longer named are forgotten (a later config naming them fetches anew).
        due.retain(|uri, _| uris.contains(uri));
        fetched.retain(|uri, _| uris.contains(uri));
        let now = Instant::now();
        for uri in &uris {
            if due.get(uri).is_some_and(|at| *at > now) {
                continue;
            }
            match fetch(uri, &tls).await {
                Ok(doc) => {
                    results.with_label_values(&["ok"]).inc();
                    fetched.insert(uri.clone(), doc.into());
                    due.insert(uri.clone(), Instant::now() + REFRESH);
                }
                Err(error) => {
                    results.with_label_values(&[error.reason()]).inc();
                    tracing::warn!(
                        %uri,
                        %error,
                        kept_last_good = fetched.contains_key(uri),
                        retry_s = RETRY_AFTER_FAILURE.as_secs(),
                        "JWKS fetch failed"
                    );
                    due.insert(uri.clone(), Instant::now() + RETRY_AFTER_FAILURE);
                }
            }
        }
        keys.send_if_modified(|current| {
            if **current == fetched {
                return false;
            }
            *current = Arc::new(fetched.clone());
            true
        });
        let next = due
            .values()
            .min()
            .copied()
            .unwrap_or_else(|| Instant::now() + REFRESH);
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { return },
            _ = sleep_until(next) => {}
        }
    }
}

/// The TLS client configuration for `https` URIs: the system's CA bundle.
fn client_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for path in CA_BUNDLES {
        let Ok(iter) = CertificateDer::pem_file_iter(path) else {
            continue;
        };
        for cert in iter.flatten() {
            // A certificate the store cannot parse is skipped, as any TLS client does.
            let _ = roots.add(cert);
        }
        break;
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// One fetch of `uri`, bounded by [`FETCH_TIMEOUT`] and [`MAX_JWKS_BYTES`]; the body when it
/// is a JWKS document.
pub async fn fetch(uri: &str, tls: &Arc<rustls::ClientConfig>) -> Result<String, JwksError> {
    timeout(FETCH_TIMEOUT, fetch_unbounded(uri, tls))
        .await
        .map_err(|_| JwksError::Timeout)?
}

async fn fetch_unbounded(uri: &str, tls: &Arc<rustls::ClientConfig>) -> Result<String, JwksError> {
    let parsed: hyper::Uri = uri.parse().map_err(|_| JwksError::BadUri(uri.into()))?;
    let https = match parsed.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(JwksError::BadUri(uri.into())),
    };
    let host = parsed
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| JwksError::BadUri(uri.into()))?;
    let port = parsed.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(JwksError::Connect)?;
    let path = parsed.path_and_query().map_or("/", |p| p.as_str());
    let request = hyper::Request::get(path)
        .header(
            hyper::header::HOST,
            parsed.authority().map_or(host, |a| a.as_str()),
        )
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(JwksError::Request)?;
    let response = if https {
        let name = ServerName::try_from(bare_host.to_string())
            .map_err(|_| JwksError::BadUri(uri.into()))?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(JwksError::Connect)?;
        send(hyper_util::rt::TokioIo::new(stream), request).await?
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), request).await?
    };
    if response.status() != hyper::StatusCode::OK {
        return Err(JwksError::Status(response.status().as_u16()));
    }
    let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
        .collect()
        .await
        .map_err(|e| JwksError::Body(e.to_string()))?
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).map_err(|_| JwksError::NotJwks)?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|_| JwksError::NotJwks)?;
    if !doc.get("keys").is_some_and(|k| k.is_array()) {
        return Err(JwksError::NotJwks);
    }
    Ok(text)
}

async fn send<T>(
    io: T,
    request: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, JwksError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(JwksError::Http)?;
    // The connection task ends with the exchange (or with the fetch's timeout).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(request).await.map_err(JwksError::Http)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A one-shot HTTP server answering `body` with `status`, or never answering.
    async fn serve(status: &'static str, body: String, answer: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    if !answer {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return;
                    }
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                });
            }
        });
        format!("http://{addr}/jwks.json")
    }

    #[tokio::test]
    async fn fetches_a_jwks_and_refuses_what_is_not_one() {
        let tls = Arc::new(client_config());
        let good = r#"{"keys":[{"kty":"EC"}]}"#;
        let uri = serve("200 OK", good.into(), true).await;
        assert_eq!(fetch(&uri, &tls).await.expect("fetched"), good);

        let uri = serve("200 OK", "{}".into(), true).await;
        assert!(matches!(fetch(&uri, &tls).await, Err(JwksError::NotJwks)));
        let uri = serve("404 Not Found", "".into(), true).await;
        assert!(matches!(
            fetch(&uri, &tls).await,
            Err(JwksError::Status(404))
        ));
        let big = format!(r#"{{"keys":[],"pad":"{}"}}"#, "x".repeat(MAX_JWKS_BYTES));
        let uri = serve("200 OK", big, true).await;
        assert!(matches!(fetch(&uri, &tls).await, Err(JwksError::Body(_))));
        assert!(matches!(
            fetch("ftp://x/y", &tls).await,
            Err(JwksError::BadUri(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_issuer_times_out() {
        let tls = Arc::new(client_config());
        let uri = serve("200 OK", "".into(), false).await;
        assert!(matches!(fetch(&uri, &tls).await, Err(JwksError::Timeout)));
    }

    #[tokio::test]
    async fn the_task_fetches_wanted_uris_and_forgets_the_others() {
        let results = prometheus::IntCounterVec::new(prometheus::opts!("t", "t"), &["result"])
            .expect("metric");
        let good = r#"{"keys":[]}"#;
        let uri = serve("200 OK", good.into(), true).await;
        let (wanted, mut keys) = spawn(results.clone());
        wanted.send_replace([uri.clone()].into());
        tokio::time::timeout(Duration::from_secs(10), keys.changed())
            .await
            .expect("fetched in time")
            .expect("task alive");
        assert_eq!(
            keys.borrow().get(&uri).map(|k| k.to_string()),
            Some(good.into())
        );
        assert_eq!(results.with_label_values(&["ok"]).get(), 1);
        // No longer named: forgotten.
        wanted.send_replace(BTreeSet::new());
        tokio::time::timeout(Duration::from_secs(10), keys.changed())
            .await
            .expect("in time")
            .expect("task alive");
        assert!(keys.borrow().is_empty());
    }
}
