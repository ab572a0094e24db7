//! [`StateBus`] on NATS JetStream KV, for nats-server 2.9 and later.
//!
//! Buckets keep one revision per key (`history = 1`): the bus holds compacted state, and
//! watches deliver the last value per key first (`DeliverPolicy::LastPerSubject`).

use super::{check_size, Bucket, BusError, Entry, Op, StateBus, WatchEvent, WatchStream};
use crate::secret::Secret;
use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// Options for connecting to NATS.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// Server URL(s), comma-separated (`nats://host:4222`, or `tls://host:4222` to require
    /// TLS).
    pub url: String,
    /// Replicas of each bucket (1 for a single server, 3 for a JetStream cluster).
    pub replicas: usize,
    /// How shoal authenticates to the server.
    pub auth: NatsAuth,
    /// TLS settings.
    pub tls: NatsTls,
}

impl NatsOptions {
    /// Options for one server with single-replica buckets, no authentication, no TLS
    /// (unless the URL is `tls://` or the server requires it).
    pub fn new(url: impl Into<String>) -> Self {
        NatsOptions {
            url: url.into(),
            replicas: 1,
            auth: NatsAuth::None,
            tls: NatsTls::default(),
        }
    }
}

/// How shoal authenticates to NATS: one method at most. `Debug` never shows a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// No authentication.
    #[default]
    None,
    /// A credentials file (`.creds`: user JWT and nkey seed, decentralized auth).
    CredentialsFile(PathBuf),
    /// An nkey seed (`SU...`), signing the server's nonce.
    NKey(Secret),
    /// User name and password.
    UserPassword {
        /// The user name.
        user: String,
        /// The password.
        password: Secret,
    },
    /// An authorization token.
    Token(Secret),
}

impl NatsAuth {
    /// The method's name, for logs.
    pub fn method(&self) -> &'static str {
        match self {
            NatsAuth::None => "none",
            NatsAuth::CredentialsFile(_) => "creds",
            NatsAuth::NKey(_) => "nkey",
            NatsAuth::UserPassword { .. } => "user/password",
            NatsAuth::Token(_) => "token",
        }
    }
}

/// TLS to NATS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// Require TLS even when the server does not ask for it (implied by `ca_file` and
    /// `client_cert`, and by `tls://` URLs).
    pub required: bool,
    /// PEM file of the CA certificate(s) that verify the server; when unset, the system's
    /// roots verify it.
    pub ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS.
    pub client_cert: Option<ClientCert>,
}

impl NatsTls {
    /// Whether shoal insists on TLS.
    pub fn is_required(&self) -> bool {
        self.required || self.ca_file.is_some() || self.client_cert.is_some()
    }
}

/// A client certificate and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Certificate chain, PEM.
    pub cert_file: PathBuf,
    /// Private key, PEM.
    pub key_file: PathBuf,
}

/// A JetStream KV backed bus.
#[derive(Clone)]
pub struct NatsBus {
    stores: HashMap<Bucket, kv::Store>,
    /// True while the client is connected (set by the client's connection events).
    connected: tokio::sync::watch::Receiver<bool>,
}

/// Delay before the `attempt`-th reconnection: 0, then doubling from 50 ms to at most
/// 500 ms. async-nats' default grows to 4 s, so after an outage of a minute a client
/// noticed the server's return up to 4 s late; a reconnection is one TCP connect, cheap
/// for a NATS server even from hundreds of clients.
pub fn reconnect_delay(attempt: usize) -> std::time::Duration {
    let ms = match attempt {
        0 | 1 => 0,
        n => 50u64.saturating_mul(1 << (n - 2).min(4)).min(500),
    };
    std::time::Duration::from_millis(ms)
}

fn boxed<E: std::error::Error + Send + Sync + 'static>(
    e: E,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

/// How long shoal waits for a first connection while the server is unreachable (it may
/// still be starting). Authentication and TLS failures end the wait at once.
const FIRST_CONNECT: Duration = Duration::from_secs(30);

impl NatsBus {
    /// Connects and opens (creating when missing) every bucket.
    ///
    /// An unreachable server is retried for 30 s; a rejected authentication or a failed
    /// TLS handshake is an error at once (retrying cannot fix it).
    pub async fn connect(opts: &NatsOptions) -> Result<NatsBus, BusError> {
        let connect_err = |source| BusError::Connect {
            url: opts.url.clone(),
            source,
        };
        let (connected_tx, connected) = tokio::sync::watch::channel(false);
        let connected_tx = std::sync::Arc::new(connected_tx);
        let servers = opts
            .url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| connect_err(boxed(e)))?;
        if servers.is_empty() {
            return Err(connect_err("no NATS server URL given".into()));
        }
        let deadline = tokio::time::Instant::now() + FIRST_CONNECT;
        let client = loop {
            let events_tx = connected_tx.clone();
            let co = connect_options(opts)
                .await
                .map_err(connect_err)?
                .reconnect_delay_callback(reconnect_delay)
                .event_callback(move |event| {
                    match event {
                        async_nats::Event::Connected => {
                            events_tx.send_replace(true);
                        }
                        async_nats::Event::Disconnected => {
                            events_tx.send_replace(false);
                        }
                        _ => {}
                    }
                    std::future::ready(())
                });
            match co.connect(servers.clone()).await {
                Ok(client) => break client,
                Err(e) => {
                    if let Some(reason) = fatal(&e) {
                        return Err(connect_err(format!("{reason}: {e}").into()));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(connect_err(
                            format!("no connection within {FIRST_CONNECT:?}; last error: {e}")
                                .into(),
                        ));
                    }
                    tracing::debug!(url = %opts.url, error = %e, "NATS not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        };
        // Connected now, whenever the client's event gets delivered.
        connected_tx.send_if_modified(|c| !std::mem::replace(c, true));
        let js = jetstream::new(client);
        let mut stores = HashMap::new();
        for bucket in Bucket::ALL {
            let store = match js.get_key_value(bucket.name()).await {
                Ok(store) => store,
                Err(_) => create_bucket(&js, bucket, opts.replicas).await?,
            };
            stores.insert(bucket, store);
        }
        Ok(NatsBus { stores, connected })
    }

    fn store(&self, bucket: Bucket) -> &kv::Store {
        // Every bucket is opened in `connect`.
        &self.stores[&bucket]
    }
}

/// The client options for one connection attempt (files are read again on each attempt,
/// so a credentials file that appears late is picked up).
async fn connect_options(
    opts: &NatsOptions,
) -> Result<async_nats::ConnectOptions, Box<dyn std::error::Error + Send + Sync>> {
    let mut co = async_nats::ConnectOptions::new()
        .name("shoal")
        .connection_timeout(Duration::from_secs(5));
    co = match &opts.auth {
        NatsAuth::None => co,
        NatsAuth::CredentialsFile(path) => co
            .credentials_file(path)
            .await
            .map_err(|e| format!("reading the NATS credentials file {}: {e}", path.display()))?,
        NatsAuth::NKey(seed) => co.nkey(seed.expose().to_string()),
        NatsAuth::UserPassword { user, password } => {
            co.user_and_password(user.clone(), password.expose().to_string())
        }
        NatsAuth::Token(token) => co.token(token.expose().to_string()),
    };
    if opts.tls.is_required() {
        co = co.require_tls(true);
    }
    if let Some(ca) = &opts.tls.ca_file {
        co = co.add_root_certificates(ca.clone());
    }
    if let Some(cert) = &opts.tls.client_cert {
        co = co.add_client_certificate(cert.cert_file.clone(), cert.key_file.clone());
    }
    Ok(co)
}

/// Why a failed connection attempt is not worth retrying, if it is not: the server
/// rejected the credentials, or TLS failed (bad certificate files, an untrusted or
/// mismatched server certificate, a rejected client certificate).
fn fatal(e: &async_nats::ConnectError) -> Option<&'static str> {
    use async_nats::ConnectErrorKind as Kind;
    match e.kind() {
        Kind::AuthorizationViolation => Some(
            "the NATS server rejected shoal's credentials (check the user and password, \
             token, nkey or creds file, and the user's permissions)",
        ),
        Kind::Authentication => {
            Some("authenticating to NATS failed (is the nkey seed or creds file valid?)")
        }
        Kind::Tls => Some("TLS to NATS failed"),
        // rustls reports handshake failures (untrusted certificate, alerts) as I/O errors
        // of kind InvalidData.
        Kind::Io if io_kind(e) == Some(std::io::ErrorKind::InvalidData) => Some(
            "the TLS handshake with NATS failed (is the server certificate signed by the \
             CA given and valid for the host in the URL, does the server have TLS enabled, \
             does it require a client certificate?)",
        ),
        _ => None,
    }
}

fn io_kind(e: &async_nats::ConnectError) -> Option<std::io::ErrorKind> {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = err.source();
    }
    None
}

/// Creates a bucket's backing stream with the configuration JetStream KV uses, then opens it.
///
/// `create_key_value` is not used: it first reads the account info, and async-nats requires
/// fields (`reserved_memory`, `reserved_storage`) that nats-server 2.9 does not send, so it
/// fails on the very server version shoal targets.
async fn create_bucket(
    js: &jetstream::Context,
    bucket: Bucket,
    replicas: usize,
) -> Result<kv::Store, BusError> {
    let bucket_err =
        |e: Box<dyn std::error::Error + Send + Sync>| BusError::Bucket { bucket, source: e };
    let config = jetstream::stream::Config {
        name: format!("KV_{}", bucket.name()),
        description: Some(format!("shoal state: {bucket}")),
        subjects: vec![format!("$KV.{}.>", bucket.name())],
        // Compacted state: one value per key.
        max_messages_per_subject: 1,
        max_message_size: super::MAX_VALUE_BYTES as i32,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: replicas.max(1),
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    };
    if let Err(e) = js.create_stream(config).await {
        // Another process may have created it first; opening it below decides.
        tracing::debug!(%bucket, error = %e, "creating bucket stream failed; trying to open it");
    }
    js.get_key_value(bucket.name())
        .await
        .map_err(|e| bucket_err(boxed(e)))
}

fn op_err<'a, E: std::error::Error + Send + Sync + 'static>(
    op: &'static str,
    bucket: Bucket,
    key: &'a str,
) -> impl FnOnce(E) -> BusError + 'a {
    move |e| BusError::Op {
        op,
        bucket,
        key: key.to_string(),
        source: boxed(e),
    }
}

fn to_entry(e: kv::Entry) -> Entry {
    let op = match e.operation {
        kv::Operation::Put => Op::Put,
        kv::Operation::Delete | kv::Operation::Purge => Op::Delete,
    };
    let value = if op == Op::Put { e.value } else { Bytes::new() };
    Entry {
        key: e.key,
        value,
        revision: e.revision,
        op,
    }
}

#[async_trait]
impl StateBus for NatsBus {
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
        let entry = self
            .store(bucket)
            .entry(key)
            .await
            .map_err(op_err("get", bucket, key))?;
        Ok(entry.map(to_entry).filter(|e| e.op == Op::Put))
    }

    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        check_size(bucket, key, &value)?;
        self.store(bucket)
            .put(key, value)
            .await
            .map_err(op_err("put", bucket, key))
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError> {
        check_size(bucket, key, &value)?;
        let mismatch = || BusError::RevisionMismatch {
            bucket,
            key: key.to_string(),
            expected,
        };
        let store = self.store(bucket);
        if expected == 0 {
            // `create` also succeeds over a delete marker, matching "absent or deleted".
            return store.create(key, value).await.map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => mismatch(),
                _ => op_err("create", bucket, key)(e),
            });
        }
        store
            .update(key, value, expected)
            .await
            .map_err(|e| match e.kind() {
                kv::UpdateErrorKind::WrongLastRevision => mismatch(),
                _ => op_err("update", bucket, key)(e),
            })
    }

    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        // Deleting an absent key would still write a marker (and wake every watcher).
        if self.get(bucket, key).await?.is_none() {
            return Ok(());
        }
        self.store(bucket)
            .delete(key)
            .await
            .map_err(op_err("delete", bucket, key))
    }

    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        let keys = self
            .store(bucket)
            .keys()
            .await
            .map_err(op_err("list keys", bucket, ""))?;
        let mut keys: Vec<String> =
            keys.try_collect()
                .await
                .map_err(op_err("list keys", bucket, ""))?;
        keys.sort();
        Ok(keys)
    }

    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError> {
        let store = self.store(bucket).clone();
        let watch = store
            .watch_with_history(">")
            .await
            .map_err(op_err("watch", bucket, ""))?;
        // The watch does not say when an empty bucket has no history to deliver; the
        // stream's message count does. Checked after the consumer exists, so a message
        // written in between is delivered (as initial or as a change) either way.
        let info = store
            .stream
            .get_info()
            .await
            .map_err(op_err("watch status", bucket, ""))?;
        let empty = info.state.messages == 0;
        let mut initial_done = empty;
        let head = futures::stream::iter(empty.then_some(Ok(WatchEvent::InitialDone)));
        let body = watch.flat_map(move |item| {
            let events: Vec<Result<WatchEvent, BusError>> = match item {
                Ok(e) => {
                    let last_initial = !initial_done && e.delta == 0;
                    initial_done |= last_initial;
                    let mut v = vec![Ok(WatchEvent::Entry(to_entry(e)))];
                    if last_initial {
                        v.push(Ok(WatchEvent::InitialDone));
                    }
                    v
                }
                Err(e) => vec![Err(op_err("watch", bucket, "")(e))],
            };
            futures::stream::iter(events)
        });
        // The ordered consumer behind the watch recreates itself after a reconnection, but
        // with a backoff that reaches 10 s during a long outage: a watch that lived through
        // a disconnection ends instead (an error: re-watch), and the caller's new watch
        // replays the bucket at once.
        let mut conn = self.connected.clone();
        conn.borrow_and_update();
        let reconnected = async move {
            let down_then_up = async {
                conn.wait_for(|c| !*c).await.ok()?;
                conn.wait_for(|c| *c).await.ok()
            };
            if down_then_up.await.is_none() {
                // The client is gone: nothing will change any more.
                std::future::pending::<()>().await;
            }
        };
        let broken = futures::stream::once(async move {
            Err(BusError::Op {
                op: "watch",
                bucket,
                key: String::new(),
                source: "the NATS connection was re-established; re-watch to resync".into(),
            })
        });
        Ok(head
            .chain(body)
            .take_until(reconnected)
            .chain(broken)
            .boxed())
    }

    fn connected(&self) -> tokio::sync::watch::Receiver<bool> {
        self.connected.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::reconnect_delay;
    use std::time::Duration;

    #[test]
    fn reconnects_quickly_and_never_waits_long() {
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        assert_eq!(reconnect_delay(2), Duration::from_millis(50));
        assert_eq!(reconnect_delay(3), Duration::from_millis(100));
        assert_eq!(reconnect_delay(6), Duration::from_millis(500));
        assert_eq!(reconnect_delay(usize::MAX), Duration::from_millis(500));
    }
}
