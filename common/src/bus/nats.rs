//! [`StateBus`] on NATS JetStream KV, for nats-server 2.9 and later.
//!
//! Buckets keep one revision per key (`history = 1`): the bus holds compacted state, and
//! watches deliver the last value per key first (`DeliverPolicy::LastPerSubject`).
//!
//! **Data loss.** A nats-server that comes back without its store (a lost volume, a
//! single-node server replaced) has no buckets, and async-nats's ordered consumers resume
//! silently from their last stream sequence on whatever stream has that name later, so a
//! watcher would miss everything written to a re-created bucket below that sequence.
//! Two checks catch it: every watch reads its stream's info each [`LOSS_CHECK_INTERVAL`]
//! and ends with [`BusError::Lost`] when the stream is gone or was re-created (its
//! creation time changed), so the watcher replays from scratch; and a writer calls
//! [`NatsBus::check_buckets`] periodically, which also finds a stream whose last sequence
//! went below a revision this handle wrote (a store restored from an older copy) or whose
//! message count went down or to zero after this handle wrote (a purge: in a bucket whose
//! deletes are markers, the count never drops otherwise) and re-creates missing buckets,
//! counting each loss in [`StateBus::data_losses`].
//!
//! **Writers and readers.** [`NatsBus::connect`] is the ingesters' handle: it creates
//! missing buckets. [`NatsBus::connect_reader`] is the servers': it never creates, writes
//! or purges anything, so a server's NATS identity needs no write permission (see
//! docs/operations.md, "Securing NATS"); a watch of a bucket that does not exist yet waits
//! until an ingester creates it, logging while it waits.

use super::{check_size, Bucket, BusError, Entry, Op, StateBus, WatchEvent, WatchStream};
use crate::secret::Secret;
use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often a watch checks that its bucket's stream is still the one it watches.
pub const LOSS_CHECK_INTERVAL: Duration = Duration::from_secs(1);

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

/// A JetStream KV backed bus. Clones share one connection and what it knows of the
/// buckets.
#[derive(Clone)]
pub struct NatsBus {
    inner: Arc<Inner>,
}

struct Inner {
    js: jetstream::Context,
    replicas: usize,
    role: Role,
    /// Each bucket's store, once opened (a reader's missing bucket is opened when it
    /// appears).
    stores: HashMap<Bucket, tokio::sync::OnceCell<kv::Store>>,
    /// True while the client is connected (set by the client's connection events).
    connected: tokio::sync::watch::Receiver<bool>,
    /// Per bucket: the stream seen and the highest revision this handle wrote.
    known: Mutex<HashMap<Bucket, Known>>,
    /// Losses found by [`NatsBus::check_buckets`].
    losses: tokio::sync::watch::Sender<u64>,
}

/// Whether a handle creates missing buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Creates missing buckets (ingesters).
    Writer,
    /// Only opens and watches (servers).
    Reader,
}

#[derive(Debug, Default, Clone, Copy)]
struct Known {
    /// The stream's creation time as [`NatsBus::check_buckets`] last saw it.
    created: Option<async_nats::datetime::DateTime>,
    /// The stream's creation time as the last watch started on it saw it.
    watched: Option<async_nats::datetime::DateTime>,
    written: u64,
    /// The highest message count seen on the stream (at connect and by
    /// [`NatsBus::check_buckets`]).
    messages: u64,
}

/// How a bucket was found to have lost its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Its stream did not exist (it was re-created).
    Missing,
    /// Its stream was re-created by someone else (its creation time changed).
    Replaced,
    /// Its last sequence is below a revision this handle wrote.
    Regressed,
    /// Its message count went down, or to zero after this handle wrote to it: it was
    /// purged (all of it, or some subjects).
    Purged,
}

impl Loss {
    /// The label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Missing => "missing",
            Loss::Replaced => "replaced",
            Loss::Regressed => "regressed",
            Loss::Purged => "purged",
        }
    }
}

fn stream_name(bucket: Bucket) -> String {
    format!("KV_{}", bucket.name())
}

/// How far apart two reports of a stream's creation time may be and still be the same
/// stream: in a JetStream cluster the time reported before the stream has a leader (the
/// meta leader's assignment) and after (the leader's own) differ by a few milliseconds.
/// A stream re-created after a data loss is younger by far more.
const CREATED_TOLERANCE_NANOS: i128 = 2_000_000_000;

type Created = async_nats::datetime::DateTime;

/// A stream's creation time as the server reported it, if it reported one: a stream
/// being created (by another process at the same moment) can be reported with the zero
/// time (`0001-01-01`), which says nothing about which stream it is.
fn created_of(info: &jetstream::stream::Info) -> Option<Created> {
    Some(info.created).filter(|c| c.year() >= 1970)
}

/// Whether a stream reported as created at `now` is another stream than one reported as
/// created at `before`; unknown times never count as a re-creation.
fn recreated(before: Option<Created>, now: Option<Created>) -> bool {
    match (before, now) {
        (Some(before), Some(now)) => {
            (now.unix_timestamp_nanos() - before.unix_timestamp_nanos()).abs()
                > CREATED_TOLERANCE_NANOS
        }
        _ => false,
    }
}

/// Whether a stream lookup failed because the stream does not exist.
fn not_found(error: &jetstream::context::GetStreamError) -> bool {
    matches!(
        error.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
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

/// How often a reader looks for a bucket that does not exist yet.
const BUCKET_POLL: Duration = Duration::from_millis(250);

/// How often a reader still waiting for a bucket says so again.
const BUCKET_WAIT_LOG: Duration = Duration::from_secs(30);

/// Opens a bucket as `role` does: a writer creates it when missing; a reader gets `None`
/// then (it opens the bucket when it appears, see `store_when_created`).
async fn open_as(
    js: &jetstream::Context,
    bucket: Bucket,
    role: Role,
    replicas: usize,
) -> Result<Option<kv::Store>, BusError> {
    match (open_bucket(js, bucket).await, role) {
        (Ok(Some(store)), _) => Ok(Some(store)),
        (_, Role::Writer) => create_bucket(js, bucket, replicas).await.map(Some),
        (Ok(None), Role::Reader) => Ok(None),
        (Err(error), Role::Reader) => Err(error),
    }
}

/// Whether a JetStream request failed in a way that passes: no answer in time, or no
/// JetStream responder yet. Both happen while a cluster elects its meta or stream leaders
/// (a stream another process is creating has no leader to answer for a moment).
fn transient(error: &(dyn std::error::Error + 'static)) -> bool {
    use jetstream::context::{RequestError, RequestErrorKind};
    cause::<RequestError>(error).is_some_and(|e| {
        matches!(
            e.kind(),
            RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
        )
    })
}

/// The first error of type `E` in `error`'s chain of sources, `error` included.
fn cause<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut source = Some(error);
    while let Some(err) = source {
        if let Some(e) = err.downcast_ref::<E>() {
            return Some(e);
        }
        source = err.source();
    }
    None
}

/// Opens a bucket; `None` when its stream does not exist.
async fn open_bucket(
    js: &jetstream::Context,
    bucket: Bucket,
) -> Result<Option<kv::Store>, BusError> {
    let bucket_err =
        |e: Box<dyn std::error::Error + Send + Sync>| BusError::Bucket { bucket, source: e };
    match js.get_stream(stream_name(bucket)).await {
        Ok(_) => {}
        Err(error) if not_found(&error) => return Ok(None),
        Err(error) => return Err(bucket_err(boxed(error))),
    }
    js.get_key_value(bucket.name())
        .await
        .map(Some)
        .map_err(|e| bucket_err(boxed(e)))
}

impl NatsBus {
    /// Connects and opens (creating when missing) every bucket: the handle of a writer.
    ///
    /// An unreachable server is retried for 30 s, and so is a JetStream that does not
    /// answer yet (a cluster electing its leaders); a rejected authentication or a failed
    /// TLS handshake is an error at once (retrying cannot fix it).
    pub async fn connect(opts: &NatsOptions) -> Result<NatsBus, BusError> {
        NatsBus::connect_as(opts, Role::Writer).await
    }

    /// Connects and opens the buckets that exist, creating nothing: the handle of a
    /// reader (a server), whose NATS identity may only read. A watch of a bucket that does
    /// not exist yet waits until an ingester creates it; other operations on it fail.
    /// Connection errors as for [`NatsBus::connect`].
    pub async fn connect_reader(opts: &NatsOptions) -> Result<NatsBus, BusError> {
        NatsBus::connect_as(opts, Role::Reader).await
    }

    async fn connect_as(opts: &NatsOptions, role: Role) -> Result<NatsBus, BusError> {
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
        let mut known = HashMap::new();
        // A JetStream cluster that is still electing its leaders leaves requests
        // unanswered for a while; the buckets get the same grace as the connection.
        let deadline = tokio::time::Instant::now() + FIRST_CONNECT;
        for bucket in Bucket::ALL {
            let store = loop {
                match open_as(&js, bucket, role, opts.replicas).await {
                    Err(error) if transient(&error) && tokio::time::Instant::now() < deadline => {
                        tracing::info!(%bucket, %error, "JetStream not answering yet; retrying");
                        tokio::time::sleep(BUCKET_POLL).await;
                    }
                    result => break result?,
                }
            };
            let info = store.as_ref().map(|s| s.stream.cached_info());
            let created = info.and_then(created_of);
            known.insert(
                bucket,
                Known {
                    created,
                    watched: created,
                    written: 0,
                    messages: info.map_or(0, |i| i.state.messages),
                },
            );
            stores.insert(bucket, tokio::sync::OnceCell::new_with(store));
        }
        let inner = Inner {
            js,
            replicas: opts.replicas,
            role,
            stores,
            connected,
            known: Mutex::new(known),
            losses: tokio::sync::watch::channel(0).0,
        };
        Ok(NatsBus {
            inner: Arc::new(inner),
        })
    }

    /// The bucket's store. A writer opened every bucket in `connect`; a reader opens a
    /// bucket that did not exist then on first use, and fails while it still does not. A
    /// store addresses its stream by name, so it keeps working on a re-created stream.
    async fn store(&self, bucket: Bucket) -> Result<&kv::Store, BusError> {
        let cell = self.cell(bucket);
        if let Some(store) = cell.get() {
            return Ok(store);
        }
        cell.get_or_try_init(|| async {
            open_bucket(&self.inner.js, bucket)
                .await?
                .ok_or_else(|| BusError::Bucket {
                    bucket,
                    source: "the bucket does not exist yet (an ingester creates it)".into(),
                })
        })
        .await
    }

    fn cell(&self, bucket: Bucket) -> &tokio::sync::OnceCell<kv::Store> {
        // Every bucket has a cell from `connect_as`.
        &self.inner.stores[&bucket]
    }

    /// The bucket's store, waiting (and saying so in the log) until the bucket exists: a
    /// reader never creates one, an ingester does.
    async fn store_when_created(&self, bucket: Bucket) -> Result<&kv::Store, BusError> {
        let started = tokio::time::Instant::now();
        let mut next_log = started;
        loop {
            if let Some(store) = self.cell(bucket).get() {
                return Ok(store);
            }
            match open_bucket(&self.inner.js, bucket).await? {
                Some(store) => {
                    if next_log > started {
                        tracing::info!(
                            %bucket,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "the bucket exists now"
                        );
                    }
                    // Another task may have opened it meanwhile: either store is the same.
                    let _ = self.cell(bucket).set(store);
                }
                None => {
                    let now = tokio::time::Instant::now();
                    if now >= next_log {
                        tracing::info!(
                            %bucket,
                            waited_s = started.elapsed().as_secs(),
                            "waiting for an ingester to create the bucket (this process only \
                             reads the bus and never creates buckets)"
                        );
                        next_log = now + BUCKET_WAIT_LOG;
                    }
                    tokio::time::sleep(BUCKET_POLL).await;
                }
            }
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<Bucket, Known>> {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn wrote(&self, bucket: Bucket, revision: u64) {
        let mut known = self.known();
        let entry = known.entry(bucket).or_default();
        entry.written = entry.written.max(revision);
    }

    /// Before a watch: [`BusError::Lost`] when the bucket's stream is gone, or is not the
    /// one this handle saw before (once per re-creation: the new stream is remembered).
    async fn check_same_stream(&self, bucket: Bucket) -> Result<(), BusError> {
        let stream = match self.inner.js.get_stream(stream_name(bucket)).await {
            Ok(stream) => stream,
            Err(error) if not_found(&error) => {
                return Err(BusError::Lost {
                    bucket,
                    reason: "its stream is gone".into(),
                })
            }
            // Unreachable or busy (a stream leader being elected): the watch below decides;
            // its own loss check runs from then on.
            Err(error) => {
                tracing::debug!(%bucket, %error, "cannot read the bucket's stream before watching");
                return Ok(());
            }
        };
        let Some(created) = created_of(stream.cached_info()) else {
            return Ok(());
        };
        let mut known = self.known();
        let entry = known.entry(bucket).or_default();
        let before = entry.watched.replace(created);
        if let Some(before) = before.filter(|before| recreated(Some(*before), Some(created))) {
            return Err(BusError::Lost {
                bucket,
                reason: format!("its stream was re-created (created {before}, now {created})"),
            });
        }
        Ok(())
    }

    /// Checks every bucket for lost data (see the module docs): re-creates a missing
    /// bucket, and reports each bucket found missing, re-created by someone else, or with
    /// a sequence below what this handle wrote. Any loss increments
    /// [`StateBus::data_losses`]. An unreachable server is an error, not a loss.
    ///
    /// For writers: a reader's handle reports a missing bucket without creating it.
    pub async fn check_buckets(&self) -> Result<Vec<(Bucket, Loss)>, BusError> {
        let mut losses = Vec::new();
        for bucket in Bucket::ALL {
            // What this handle wrote before asking: a write answered after the stream's
            // info was read is not in it.
            let written = self.known().get(&bucket).map_or(0, |k| k.written);
            let loss = match self.inner.js.get_stream(stream_name(bucket)).await {
                Ok(stream) => {
                    let info = stream.cached_info();
                    let mut known = self.known();
                    let entry = known.entry(bucket).or_default();
                    let created = created_of(info);
                    let replaced = recreated(entry.created, created);
                    let regressed = info.state.last_sequence < written;
                    // Deletes leave markers, so the count never drops, and a bucket this
                    // handle wrote to is never empty, unless purged (the second test
                    // catches a purge before any check saw the count rise).
                    let purged = info.state.messages < entry.messages
                        || (info.state.messages == 0 && written > 0);
                    entry.created = created.or(entry.created);
                    if replaced || regressed || purged {
                        entry.written = 0;
                    }
                    // The count starts over from what the stream holds after any loss.
                    entry.messages = if replaced || regressed || purged {
                        info.state.messages
                    } else {
                        entry.messages.max(info.state.messages)
                    };
                    match (replaced, regressed, purged) {
                        (true, _, _) => Some(Loss::Replaced),
                        (false, true, _) => Some(Loss::Regressed),
                        (false, false, true) => Some(Loss::Purged),
                        _ => None,
                    }
                }
                Err(error) if not_found(&error) && self.inner.role == Role::Reader => {
                    Some(Loss::Missing)
                }
                Err(error) if not_found(&error) => {
                    let store = create_bucket(&self.inner.js, bucket, self.inner.replicas).await?;
                    let mut known = self.known();
                    let entry = known.entry(bucket).or_default();
                    // This handle made it: its own watches need no telling (its loss count
                    // tells its writers).
                    entry.created = created_of(store.stream.cached_info());
                    entry.watched = entry.created;
                    entry.written = 0;
                    entry.messages = 0;
                    Some(Loss::Missing)
                }
                Err(error) => {
                    return Err(BusError::Op {
                        op: "check",
                        bucket,
                        key: String::new(),
                        source: boxed(error),
                    })
                }
            };
            if let Some(loss) = loss {
                losses.push((bucket, loss));
            }
        }
        if !losses.is_empty() {
            self.inner.losses.send_modify(|n| *n += 1);
        }
        Ok(losses)
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
    // rustls reports handshake failures (untrusted certificate, alerts) as I/O errors of
    // kind InvalidData.
    let invalid_data =
        cause::<std::io::Error>(e).is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData);
    match e.kind() {
        Kind::AuthorizationViolation => Some(
            "the NATS server rejected shoal's credentials (check the user and password, \
             token, nkey or creds file, and the user's permissions)",
        ),
        Kind::Authentication => {
            Some("authenticating to NATS failed (is the nkey seed or creds file valid?)")
        }
        Kind::Tls => Some("TLS to NATS failed"),
        Kind::Io if invalid_data => Some(
            "the TLS handshake with NATS failed (is the server certificate signed by the \
             CA given and valid for the host in the URL, does the server have TLS enabled, \
             does it require a client certificate?)",
        ),
        _ => None,
    }
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
        name: stream_name(bucket),
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
            .await?
            .entry(key)
            .await
            .map_err(op_err("get", bucket, key))?;
        Ok(entry.map(to_entry).filter(|e| e.op == Op::Put))
    }

    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        check_size(bucket, key, &value)?;
        let revision = self
            .store(bucket)
            .await?
            .put(key, value)
            .await
            .map_err(op_err("put", bucket, key))?;
        self.wrote(bucket, revision);
        Ok(revision)
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
        let store = self.store(bucket).await?;
        let revision = if expected == 0 {
            // `create` also succeeds over a delete marker, matching "absent or deleted".
            store.create(key, value).await.map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => mismatch(),
                _ => op_err("create", bucket, key)(e),
            })?
        } else {
            store
                .update(key, value, expected)
                .await
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => mismatch(),
                    _ => op_err("update", bucket, key)(e),
                })?
        };
        self.wrote(bucket, revision);
        Ok(revision)
    }

    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        // Deleting an absent key would still write a marker (and wake every watcher).
        if self.get(bucket, key).await?.is_none() {
            return Ok(());
        }
        self.store(bucket)
            .await?
            .delete(key)
            .await
            .map_err(op_err("delete", bucket, key))
    }

    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        let keys =
            self.store(bucket)
                .await?
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
        let store = self.store_when_created(bucket).await?.clone();
        self.check_same_stream(bucket).await?;
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
        let created = created_of(&info);
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
        // Whichever ends first ends the watch: the watch itself, or the loss check (with
        // its error).
        let end = || futures::stream::once(futures::future::ready(None));
        let lost = futures::stream::once(watch_for_loss(self.inner.js.clone(), bucket, created))
            .map(|e| Some(Err(e)))
            .chain(end());
        let body = futures::stream::select(body.map(Some).chain(end()), lost)
            .take_while(|item| futures::future::ready(item.is_some()))
            .filter_map(futures::future::ready);
        // The ordered consumer behind the watch recreates itself after a reconnection, but
        // with a backoff that reaches 10 s during a long outage: a watch that lived through
        // a disconnection ends instead (an error: re-watch), and the caller's new watch
        // replays the bucket at once.
        let mut conn = self.inner.connected.clone();
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

    fn data_losses(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.losses.subscribe())
    }

    fn connected(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.connected.clone()
    }
}

/// Resolves once the stream of `bucket` is gone or is not the one created at `created`
/// (checked every [`LOSS_CHECK_INTERVAL`]; an unreachable server is not a loss).
async fn watch_for_loss(
    js: jetstream::Context,
    bucket: Bucket,
    mut created: Option<Created>,
) -> BusError {
    loop {
        tokio::time::sleep(LOSS_CHECK_INTERVAL).await;
        let reason = match js.get_stream(stream_name(bucket)).await {
            Ok(stream) => {
                let now = created_of(stream.cached_info());
                if !recreated(created, now) {
                    created = created.or(now);
                    continue;
                }
                "its stream was re-created".to_string()
            }
            Err(error) if not_found(&error) => "its stream is gone".to_string(),
            Err(_) => continue,
        };
        tracing::warn!(%bucket, %reason, "bus bucket lost its data; ending the watch");
        return BusError::Lost { bucket, reason };
    }
}

#[cfg(test)]
mod tests {
    use super::{reconnect_delay, recreated, transient, BusError, Created};
    use crate::bus::Bucket;
    use async_nats::jetstream::context::{RequestError, RequestErrorKind};
    use std::time::Duration;

    #[test]
    fn unanswered_jetstream_requests_are_retried_and_others_are_not() {
        let bucket_err = |kind| BusError::Bucket {
            bucket: Bucket::Config,
            source: Box::new(RequestError::new(kind)),
        };
        assert!(transient(&bucket_err(RequestErrorKind::TimedOut)));
        assert!(transient(&bucket_err(RequestErrorKind::NoResponders)));
        assert!(!transient(&bucket_err(RequestErrorKind::Other)));
        let denied = BusError::Bucket {
            bucket: Bucket::Config,
            source: "permissions violation".into(),
        };
        assert!(!transient(&denied));
    }

    #[test]
    fn only_two_known_creation_times_far_apart_are_a_re_creation() {
        let at = |secs: i64| Some(Created::from_unix_timestamp(secs).unwrap());
        let t = 1_790_000_000;
        assert!(!recreated(at(t), at(t)));
        // A clustered stream's time before and after its leader is elected.
        assert!(!recreated(at(t), at(t + 1)));
        assert!(recreated(at(t), at(t + 60)));
        // Unknown (a stream reported mid-creation with the zero time) is never a loss.
        assert!(!recreated(None, at(t)));
        assert!(!recreated(at(t), None));
    }

    #[test]
    fn reconnects_quickly_and_never_waits_long() {
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        assert_eq!(reconnect_delay(2), Duration::from_millis(50));
        assert_eq!(reconnect_delay(3), Duration::from_millis(100));
        assert_eq!(reconnect_delay(6), Duration::from_millis(500));
        assert_eq!(reconnect_delay(usize::MAX), Duration::from_millis(500));
    }
}
