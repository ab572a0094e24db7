//! Command line and wiring of the server binary.

use crate::admin::{self, AdminState};
use crate::generate::cache::GeneratorCache;
use crate::index::mesh_config;
use crate::index::mesh_config::MeshSettings;
use crate::metrics::Metrics;
use crate::push::pipeline::{self, Debounce};
use crate::push::view::{Generation, Views};
use crate::security::auth::{self, Authenticator, Issuers};
use crate::security::ca::Ca;
use crate::security::metrics::SecurityMetrics;
use crate::security::reload::Reloading;
use crate::security::serving_cert::ServingCert;
use crate::security::tls::{TlsFiles, TlsServer};
use crate::xds::ads::AdsConfig;
use crate::xds::limits::{self, Breach, BufferBudget};
use crate::xds::listener::{self, ConnectionLimits, ConnectionPolicy};
use crate::xds::metrics::XdsMetrics;
use crate::xds::{AdsService, Registry};
use anyhow::Context;
use clap::Parser;
use shoal_common::bus::nats::NatsBus;
use shoal_common::bus::nats_args::NatsArgs;
use shoal_common::bus::StateBus;
use shoal_common::credential::CredentialKeys;
use shoal_common::model::Duration as ConfigDuration;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// shoal's xDS server: watches mesh state on NATS JetStream (or, standalone, reads a
/// directory of manifests) and serves Envoy proxies over gRPC ADS.
#[derive(Debug, Parser)]
#[command(name = "shoal-server", version, about, long_about = None)]
#[command(group(clap::ArgGroup::new("state").required(true).args(["nats_url", "standalone"])))]
pub struct ServerArgs {
    /// NATS server URL(s) to read mesh state from, comma-separated
    /// (e.g. nats://nats:4222). Mutually exclusive with --standalone.
    #[arg(long, env = "SHOAL_NATS_URL", value_name = "URL")]
    pub nats_url: Option<String>,

    /// Accepted for compatibility and unused: servers never create the KV buckets (the
    /// ingesters do, with their own --nats-replicas).
    #[arg(
        long,
        env = "SHOAL_NATS_REPLICAS",
        default_value_t = 1,
        value_name = "N"
    )]
    pub nats_replicas: usize,

    /// NATS TLS and authentication.
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Standalone mode: read Kubernetes/Istio manifests from DIR (watched for changes) into
    /// an in-process bus. No NATS needed. Mutually exclusive with --nats-url.
    #[arg(long, env = "SHOAL_STANDALONE", value_name = "DIR")]
    pub standalone: Option<PathBuf>,

    /// Cluster ID given to services and endpoints read in standalone mode.
    #[arg(
        long,
        env = "SHOAL_CLUSTER_ID",
        default_value = shoal_common::defaults::CLUSTER_ID,
        value_name = "ID"
    )]
    pub cluster_id: String,

    /// Istio MeshConfig file (the `mesh` key of the `istio` ConfigMap). shoal reads
    /// `outboundTrafficPolicy.mode` (ALLOW_ANY, the default, or REGISTRY_ONLY) and
    /// `rootNamespace` (default istio-system); changes apply without a restart.
    #[arg(long, env = "SHOAL_MESH_CONFIG", value_name = "FILE")]
    pub mesh_config: Option<PathBuf>,

    /// Ingester fleets that must have published their clusters (their sync marker
    /// `synced.<fleet>` in shoal-meta) before this server is ready and serves proxies,
    /// comma-separated. Empty: ready once the bus's current state is loaded.
    #[arg(
        long,
        env = "SHOAL_EXPECT_FLEETS",
        value_delimiter = ',',
        value_name = "FLEET,..."
    )]
    pub expect_fleets: Vec<String>,

    /// Longest wait for --expect-fleets: then the server becomes ready without the fleets
    /// still missing, with a warning and shoal_sync_timed_out 1 (like Istio's
    /// PILOT_REMOTE_CLUSTER_TIMEOUT). "0s" waits forever.
    #[arg(
        long,
        env = "SHOAL_SYNC_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION"
    )]
    pub sync_timeout: ConfigDuration,

    /// Address of the plaintext gRPC ADS endpoint (istiod's 15010, e.g. 0.0.0.0:15010).
    /// Off unless given: its streams are not authenticated (any client may ask for any
    /// proxy's config), so enable it only on a trusted network.
    #[arg(long, env = "SHOAL_XDS_ADDR", value_name = "HOST:PORT")]
    pub xds_addr: Option<SocketAddr>,

    /// Address of the TLS gRPC ADS endpoint (istiod's 15012), served when
    /// --xds-tls-cert and --xds-tls-key are given, or --ca-dir with --xds-dns-names. Its streams must authenticate with a
    /// client certificate (SPIFFE identity) or a Kubernetes service-account token, and get
    /// only the config of a proxy of their own namespace (and service account).
    #[arg(
        long,
        env = "SHOAL_XDS_TLS_ADDR",
        default_value = "0.0.0.0:15012",
        value_name = "HOST:PORT"
    )]
    pub xds_tls_addr: SocketAddr,

    /// Serving certificate chain (PEM) of the TLS xDS endpoint; reloaded when it changes.
    /// Wins over a certificate issued from --ca-dir (--xds-dns-names).
    #[arg(
        long,
        env = "SHOAL_XDS_TLS_CERT",
        value_name = "FILE",
        requires = "xds_tls_key"
    )]
    pub xds_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --xds-tls-cert; reloaded when it changes.
    #[arg(
        long,
        env = "SHOAL_XDS_TLS_KEY",
        value_name = "FILE",
        requires = "xds_tls_cert"
    )]
    pub xds_tls_key: Option<PathBuf>,

    /// Key file that opens the gateway credentials the ingester sealed on the bus (the same
    /// file as the ingester's `--credential-key-file`: one base64-encoded 32-byte key per
    /// line, every key opens). Without it, gateways get no credentials over SDS. Standalone
    /// mode needs none (its credentials never leave the process).
    #[arg(long, env = "SHOAL_CREDENTIAL_KEY_FILE", value_name = "FILE")]
    pub credential_key_file: Option<PathBuf>,

    /// CA certificates (PEM) that verify proxies' client certificates on the TLS endpoint
    /// (the mesh's root); reloaded when it changes. Without it, proxies authenticate with
    /// service-account tokens only.
    #[arg(long, env = "SHOAL_XDS_CLIENT_CA", value_name = "FILE")]
    pub xds_client_ca: Option<PathBuf>,

    /// The `iss` of the service-account tokens of the cluster --cluster-id (e.g.
    /// https://kubernetes.default.svc.cluster.local), whose keys --token-issuer-jwks holds.
    /// Standalone mode has no ingester to publish issuer keys: with these two flags it
    /// authenticates tokens (of sidecars, gateways, ztunnel) on the TLS endpoint.
    #[arg(
        long,
        env = "SHOAL_TOKEN_ISSUER",
        value_name = "ISSUER",
        requires = "token_issuer_jwks"
    )]
    pub token_issuer: Option<String>,

    /// A JSON Web Key Set file (the API server's /openid/v1/jwks) that verifies the tokens
    /// of --token-issuer. Read at startup.
    #[arg(
        long,
        env = "SHOAL_TOKEN_ISSUER_JWKS",
        value_name = "FILE",
        requires = "token_issuer"
    )]
    pub token_issuer_jwks: Option<PathBuf>,

    /// Sign workload certificates (istio-agent's `CreateCertificate`) on the TLS endpoint
    /// with the CA in DIR, Istio's `cacerts` layout: ca-cert.pem, ca-key.pem,
    /// root-cert.pem and optionally cert-chain.pem. Callers get certificates only for
    /// their own identity. Without --xds-tls-cert, the TLS endpoint also serves a
    /// certificate issued from this CA for --xds-dns-names, so proxies verify it with the
    /// mesh root (istio-ca-root-cert).
    #[arg(long, env = "SHOAL_CA_DIR", value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,

    /// DNS names proxies use to reach the TLS endpoint, comma-separated (e.g.
    /// shoal-server.istio-system.svc,istiod.istio-system.svc). Required with --ca-dir when
    /// no --xds-tls-cert is given: the endpoint then serves a certificate for these names
    /// issued from the CA, kept in memory, renewed at half its 24 h lifetime and whenever
    /// the CA changes. Ignored when --xds-tls-cert is given.
    #[arg(
        long,
        env = "SHOAL_XDS_DNS_NAMES",
        value_delimiter = ',',
        value_name = "NAME,...",
        requires = "ca_dir"
    )]
    pub xds_dns_names: Vec<String>,

    /// Audiences a service-account token must have (comma-separated). istio-agent asks
    /// for `istio-ca` (its TOKEN_AUDIENCE).
    #[arg(
        long,
        env = "SHOAL_TOKEN_AUDIENCES",
        default_value = crate::security::auth::DEFAULT_AUDIENCE,
        value_delimiter = ',',
        value_name = "AUDIENCE,..."
    )]
    pub token_audiences: Vec<String>,

    /// Address of the admin HTTP endpoint (/ready, /healthz, /metrics, /debug/*).
    #[arg(
        long,
        env = "SHOAL_ADMIN_ADDR",
        default_value = "0.0.0.0:15014",
        value_name = "HOST:PORT"
    )]
    pub admin_addr: SocketAddr,

    #[command(flatten)]
    pub debug: shoal_common::admin::DebugArgs,

    /// Quiet period after the last change before pushing (like PILOT_DEBOUNCE_AFTER).
    #[arg(
        long,
        env = "SHOAL_DEBOUNCE_AFTER",
        default_value = "100ms",
        value_name = "DURATION"
    )]
    pub debounce_after: ConfigDuration,

    /// Longest a stream of changes may delay a push (like PILOT_DEBOUNCE_MAX).
    #[arg(
        long,
        env = "SHOAL_DEBOUNCE_MAX",
        default_value = "10s",
        value_name = "DURATION"
    )]
    pub debounce_max: ConfigDuration,

    /// Quiet period before pushing when every pending change is an endpoint change. Shorter
    /// than --debounce-after: endpoint-only snapshots reuse the PushContext and proxies
    /// wait for endpoints when pods come and go. (Istio pushes endpoint changes through its
    /// one debounce unless PILOT_ENABLE_EDS_DEBOUNCE=false.)
    #[arg(
        long,
        env = "SHOAL_EDS_DEBOUNCE_AFTER",
        default_value = "10ms",
        value_name = "DURATION"
    )]
    pub eds_debounce_after: ConfigDuration,

    /// Longest a stream of endpoint changes may delay a push: during a churn storm,
    /// endpoint snapshots are published at most this often.
    #[arg(
        long,
        env = "SHOAL_EDS_DEBOUNCE_MAX",
        default_value = "100ms",
        value_name = "DURATION"
    )]
    pub eds_debounce_max: ConfigDuration,

    /// Maximum age of a proxy connection, jittered ±10% per connection; an aged connection
    /// ends gracefully so the proxy reconnects, spreading proxies over replicas after a
    /// scale-out. "0s" disables it.
    #[arg(
        long,
        env = "SHOAL_MAX_CONNECTION_AGE",
        default_value = "30m",
        value_name = "DURATION"
    )]
    pub max_connection_age: ConfigDuration,

    /// On SIGTERM, period over which proxy connections are closed (each at a random moment),
    /// so the other replicas take them over gradually. Keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(
        long,
        env = "SHOAL_DRAIN_DURATION",
        default_value = "20s",
        value_name = "DURATION"
    )]
    pub drain_duration: ConfigDuration,

    /// Most xDS connections open at once, both ports together; one more is closed as soon
    /// as it is accepted. Default: three quarters of the open-file limit (the soft limit is
    /// raised to the hard one at start), at most 20000.
    #[arg(long, env = "SHOAL_XDS_MAX_CONNECTIONS", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub xds_max_connections: Option<u32>,

    /// Bytes of an xDS connection's writes gathered into one system call per poll of the
    /// connection (0: each HTTP/2 frame is written as it is made). Gathering (65536, say)
    /// copies the responses once more for a fifth of the system calls (a 425 KB route
    /// table is 26 frames of Envoy's 16 KiB): worth it only where system calls are dear,
    /// such as sandboxed runtimes (docs/benchmarks.md).
    #[arg(
        long,
        env = "SHOAL_XDS_WRITE_GATHER",
        default_value_t = crate::xds::DEFAULT_WRITE_GATHER as u32,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(0..=16 << 20)
    )]
    pub xds_write_gather: u32,

    /// Cork an xDS connection's socket (TCP_CORK) while one poll of the connection writes
    /// more than one HTTP/2 frame, so that a large response leaves in full TCP segments,
    /// not one per 16 KiB frame; uncorked when the poll ends (docs/benchmarks.md).
    #[arg(
        long,
        env = "SHOAL_XDS_WRITE_CORK",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub xds_write_cork: bool,

    /// Most concurrent streams per xDS connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(
        long,
        env = "SHOAL_XDS_MAX_STREAMS_PER_CONNECTION",
        default_value_t = limits::DEFAULT_MAX_STREAMS_PER_CONNECTION,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub xds_max_streams_per_connection: u32,

    /// Most streams one authenticated identity (SPIFFE ID) may have open on this server;
    /// one more is refused with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "SHOAL_XDS_MAX_STREAMS_PER_IDENTITY",
        default_value_t = limits::DEFAULT_MAX_STREAMS_PER_IDENTITY as u32,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub xds_max_streams_per_identity: u32,

    /// Budget of xDS request bytes being received (messages not yet complete) for the
    /// whole server, in MiB; a stream that would pass it ends with RESOURCE_EXHAUSTED.
    /// Unauthenticated (plaintext-port) connections together get a quarter of it.
    #[arg(
        long,
        env = "SHOAL_XDS_REQUEST_BUFFER",
        default_value_t = (limits::DEFAULT_REQUEST_BUFFER_BYTES >> 20) as u32,
        value_name = "MIB",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub xds_request_buffer: u32,

    /// Budget of request bytes being received on one TLS xDS connection, in MiB.
    #[arg(
        long,
        env = "SHOAL_XDS_CONNECTION_BUFFER",
        default_value_t = (limits::DEFAULT_CONNECTION_BUFFER_BYTES >> 20) as u32,
        value_name = "MIB",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub xds_connection_buffer: u32,

    /// Budget of request bytes being received on one plaintext (unauthenticated) xDS
    /// connection, in MiB.
    #[arg(
        long,
        env = "SHOAL_XDS_UNAUTHENTICATED_BUFFER",
        default_value_t = (limits::DEFAULT_UNAUTHENTICATED_BUFFER_BYTES >> 20) as u32,
        value_name = "MIB",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub xds_unauthenticated_buffer: u32,

    /// Time a started xDS request message has to arrive completely; then the stream ends
    /// with DEADLINE_EXCEEDED. "0s" disables it.
    #[arg(
        long,
        env = "SHOAL_XDS_MESSAGE_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION"
    )]
    pub xds_message_timeout: ConfigDuration,

    /// Time an xDS connection may stay open without a stream (e.g. silent after its TLS
    /// handshake); then it is closed. "0s" disables it.
    #[arg(
        long,
        env = "SHOAL_XDS_IDLE_TIMEOUT",
        default_value = "60s",
        value_name = "DURATION"
    )]
    pub xds_idle_timeout: ConfigDuration,

    /// How many proxy streams may generate a push at the same time (like PILOT_PUSH_THROTTLE).
    #[arg(
        long,
        env = "SHOAL_PUSH_CONCURRENCY",
        default_value_t = 100,
        value_name = "N"
    )]
    pub push_concurrency: usize,

    /// Size bound of the generator cache, in MiB (encoded resources by generator input;
    /// proxies with the same view share entries).
    #[arg(
        long,
        env = "SHOAL_CACHE_SIZE",
        default_value_t = 256,
        value_name = "MIB"
    )]
    pub cache_size: u64,

    /// Rebuild every cache hit and abort if the bytes differ (for tests: proves no generator
    /// input is missing from its cache key).
    #[arg(
        long,
        env = "SHOAL_CACHE_ASSERT",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub cache_assert: bool,

    /// Log filter, in RUST_LOG syntax (e.g. "info" or "info,shoal_server=debug").
    #[arg(
        long,
        env = "SHOAL_LOG",
        default_value = "info,async_nats=warn",
        value_name = "FILTER"
    )]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "SHOAL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Runs the server until SIGTERM or Ctrl-C.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    shoal_common::logging::init(&args.log_level, args.log_format == "json");
    let metrics = Metrics::new();
    let dns_names: Vec<String> = args
        .xds_dns_names
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    let ca = match &args.ca_dir {
        Some(dir) => Some(load_ca(dir, &metrics.security)?),
        None => None,
    };
    let tls_files = args.xds_tls_cert.clone().map(|cert| TlsFiles {
        cert,
        key: args.xds_tls_key.clone().unwrap_or_default(),
        client_ca: args.xds_client_ca.clone(),
    });
    let tls = match (&tls_files, &ca) {
        (Some(files), _) => {
            if !dns_names.is_empty() {
                tracing::warn!(
                    "--xds-tls-cert is given: it is served, and --xds-dns-names is ignored"
                );
            }
            let tls = TlsServer::load(files).context("cannot serve xDS over TLS")?;
            tokio::spawn(tls.clone().reload(files.clone(), metrics.security.clone()));
            Some(tls)
        }
        (None, Some(ca)) => {
            if dns_names.is_empty() {
                anyhow::bail!(
                    "--ca-dir without --xds-tls-cert: the TLS xDS endpoint serves a certificate \
                     issued from the CA, and --xds-dns-names NAME,... must name what proxies \
                     dial (e.g. shoal-server.istio-system.svc,istiod.istio-system.svc)"
                );
            }
            let (serving, tls) = ServingCert::start(
                ca.clone(),
                dns_names,
                args.xds_client_ca.clone(),
                metrics.security.clone(),
            )
            .context("cannot serve xDS over TLS with a certificate from --ca-dir")?;
            tokio::spawn(serving.renew(tls.clone()));
            Some(tls)
        }
        (None, None) => {
            if args.xds_client_ca.is_some() {
                anyhow::bail!(
                    "--xds-client-ca needs the TLS xDS endpoint: give --xds-tls-cert and \
                     --xds-tls-key, or --ca-dir with --xds-dns-names"
                );
            }
            None
        }
    };
    if args.xds_addr.is_none() && tls.is_none() {
        anyhow::bail!(
            "no xDS endpoint to serve: give --xds-tls-cert and --xds-tls-key (or --ca-dir with \
             --xds-dns-names) to serve TLS on --xds-tls-addr ({}), and/or --xds-addr HOST:PORT \
             to serve plaintext (no authentication; trusted networks only)",
            args.xds_tls_addr
        );
    }
    let credential_keys = match (&args.credential_key_file, &args.standalone) {
        (Some(path), _) => Some(Arc::new(
            CredentialKeys::load(path).context("cannot use --credential-key-file")?,
        )),
        // Standalone: the file source seals and this process opens; nothing leaves it.
        (None, Some(_)) => Some(Arc::new(CredentialKeys::ephemeral())),
        (None, None) => None,
    };
    let bus: Arc<dyn StateBus> = match (&args.nats_url, &args.standalone) {
        (Some(url), _) => {
            let opts = args.nats.options(url, args.nats_replicas)?;
            tracing::info!(
                %url,
                auth = opts.auth.method(),
                tls = opts.tls.is_required(),
                "connecting to NATS"
            );
            // Servers only read the bus: they create no bucket (the ingesters do) and
            // need no write permission on NATS.
            Arc::new(
                NatsBus::connect_reader(&opts)
                    .await
                    .context("cannot use the NATS state bus")?,
            )
        }
        (None, Some(dir)) => standalone_bus(dir, &args.cluster_id, credential_keys.clone()).await?,
        (None, None) => anyhow::bail!("one of --nats-url or --standalone is required"),
    };

    let registry = Registry::default();
    let (tx, rx) = watch::channel(None);
    let debounce = Debounce {
        after: args.debounce_after.get(),
        max: args.debounce_max.get(),
        eds_after: args.eds_debounce_after.get(),
        eds_max: args.eds_debounce_max.get(),
    };
    let settings = match &args.mesh_config {
        Some(path) => mesh_config::load(path).context("cannot use --mesh-config")?,
        None => MeshSettings::default(),
    };
    tracing::info!(?settings, "mesh settings");
    let issuers = Issuers::default();
    let authenticator = Authenticator::new(
        issuers.clone(),
        args.token_audiences.clone(),
        &settings.trust_domain,
    );
    if let (Some(issuer), Some(path)) = (&args.token_issuer, &args.token_issuer_jwks) {
        let jwks = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --token-issuer-jwks {}", path.display()))?;
        issuers
            .set(&shoal_common::model::ClusterIssuer {
                cluster: args.cluster_id.clone(),
                issuer: issuer.clone(),
                jwks,
            })
            .with_context(|| format!("cannot use --token-issuer-jwks {}", path.display()))?;
        tracing::info!(cluster = %args.cluster_id, %issuer, "token issuer keys from a file");
        metrics.security.token_issuers.set(1);
    }
    let (mesh_tx, mesh_rx) = watch::channel(Arc::new(settings));
    if let Some(path) = args.mesh_config.clone() {
        tokio::spawn(mesh_config::watch(path, mesh_tx));
    }
    // Issuer keys from a file take the place of the published ones (the bus's would
    // replace them at its first sync).
    if tls.is_some() && args.token_issuer.is_none() {
        tokio::spawn(auth::follow_issuers(
            bus.clone(),
            issuers,
            metrics.security.clone(),
        ));
    }
    let sync_timeout = args.sync_timeout.get();
    let gate = pipeline::FleetGate {
        expect: args
            .expect_fleets
            .iter()
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty())
            .collect(),
        timeout: (!sync_timeout.is_zero()).then_some(sync_timeout),
    };
    let config = pipeline::PipelineConfig {
        debounce,
        mesh: mesh_rx,
        gate,
        credential_keys,
        jwks: Some({
            let (wanted, keys) =
                crate::security::jwks::spawn(metrics.security.jwks_fetches.clone());
            pipeline::JwksLink { wanted, keys }
        }),
    };
    tokio::spawn(pipeline::run(bus, config, metrics.push.clone(), tx));

    let (drain_tx, drain_rx) = watch::channel(false);
    let cache = GeneratorCache::new(
        args.cache_size << 20,
        args.cache_assert,
        metrics.cache.clone(),
    );
    let views = Views::new(Generation::per_core(cache.clone()));
    let admin_listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot listen on admin address {}", args.admin_addr))?;
    tokio::spawn(admin::serve(
        admin_listener,
        args.debug.policy(),
        AdminState {
            snapshots: rx.clone(),
            registry: registry.clone(),
            metrics: metrics.clone(),
            draining: drain_rx.clone(),
            cache,
            views: views.clone(),
        },
    ));

    let nonzero = |d: std::time::Duration| (!d.is_zero()).then_some(d);
    let config = AdsConfig {
        push_concurrency: args.push_concurrency,
        auth: authenticator,
        ca,
        message_timeout: nonzero(args.xds_message_timeout.get()),
        max_streams_per_identity: args.xds_max_streams_per_identity as usize,
    };
    let ads = AdsService::new(rx, registry, metrics.xds.clone(), views, config);
    let server = ads.into_server();
    let routes = tonic::service::Routes::new(server.clone())
        .add_service(crate::xds::ads::CertificateServer(server))
        .prepare();
    let max_age = args.max_connection_age.get();
    let policy = ConnectionPolicy {
        max_age: (!max_age.is_zero()).then_some(max_age),
        grace: std::time::Duration::from_secs(5),
        drain: args.drain_duration.get(),
    };
    let (tls_limits, plaintext_limits) = connection_limits(&args, &metrics.xds);
    let mut servers = Vec::new();
    if let Some(tls) = tls {
        let listener = listen_backlog(args.xds_tls_addr, XDS_BACKLOG)
            .with_context(|| format!("cannot listen on xDS TLS address {}", args.xds_tls_addr))?;
        tracing::info!(xds_tls = %args.xds_tls_addr, "serving xDS over TLS");
        servers.push(tokio::spawn(listener::serve(
            listener,
            routes.clone(),
            policy,
            tls_limits,
            drain_rx.clone(),
            Some(tls),
        )));
    }
    if let Some(addr) = args.xds_addr {
        let listener = listen_backlog(addr, XDS_BACKLOG)
            .with_context(|| format!("cannot listen on xDS address {addr}"))?;
        tracing::info!(xds = %addr, "serving plaintext xDS (no authentication)");
        servers.push(tokio::spawn(listener::serve(
            listener,
            routes,
            policy,
            plaintext_limits,
            drain_rx,
            None,
        )));
    }
    tracing::info!(admin = %args.admin_addr, "serving");
    let signal = shoal_common::process::shutdown_signal().await;
    tracing::info!(%signal, "shutdown signal received");
    // Not ready from now on, so load balancers stop sending new proxies here, then close
    // existing connections gradually.
    let _ = drain_tx.send(true);
    for server in servers {
        if let Err(error) = server.await {
            tracing::warn!(%error, "xDS server task failed during drain");
        }
    }
    tracing::info!("shut down");
    Ok(())
}

/// The bounds of the TLS port's connections and of the plaintext port's: one process-wide
/// budget of request bytes being received and one cap on connections for both; the
/// plaintext port's callers are not authenticated, so their connections get the smaller
/// budget, inside a pool of a quarter of the process's.
fn connection_limits(
    args: &ServerArgs,
    metrics: &XdsMetrics,
) -> (ConnectionLimits, ConnectionLimits) {
    let mib = |n: u32| (n as usize) << 20;
    let process = BufferBudget::process(
        mib(args.xds_request_buffer),
        Some(metrics.request_buffer_bytes.clone()),
    );
    let unauthenticated = BufferBudget::within(
        &process,
        mib(args.xds_request_buffer) / limits::UNAUTHENTICATED_SHARE,
        Breach::UnauthenticatedBuffer,
    );
    let open_files = limits::raise_open_file_limit();
    let max_connections = match args.xds_max_connections {
        Some(n) => n as usize,
        None => limits::default_max_connections(open_files),
    };
    tracing::info!(
        max_connections,
        open_files = ?open_files,
        "xDS connection limit (--xds-max-connections; raise the open-file limit for more)"
    );
    let idle = args.xds_idle_timeout.get();
    let tls = ConnectionLimits {
        max_streams: args.xds_max_streams_per_connection,
        connection_buffer: mib(args.xds_connection_buffer),
        shared_buffer: process,
        idle_timeout: (!idle.is_zero()).then_some(idle),
        slots: Arc::new(tokio::sync::Semaphore::new(max_connections)),
        metrics: metrics.clone(),
        writes: crate::xds::WriteShape {
            gather: args.xds_write_gather as usize,
            cork: args.xds_write_cork,
        },
    };
    let plaintext = ConnectionLimits {
        connection_buffer: mib(args.xds_unauthenticated_buffer),
        shared_buffer: unauthenticated,
        ..tls.clone()
    };
    (tls, plaintext)
}

/// Loads the workload CA in `dir` and follows its files; every CA in use shows its expiry
/// (the first and each reloaded one).
fn load_ca(dir: &std::path::Path, metrics: &SecurityMetrics) -> anyhow::Result<Reloading<Ca>> {
    let load = {
        let (dir, metrics) = (dir.to_path_buf(), metrics.clone());
        move || {
            Ca::load(&dir).inspect(|ca| {
                metrics.ca_root_expiry.set(ca.root_expiry());
                metrics.ca_chain_expiry.set(ca.chain_expiry());
            })
        }
    };
    let ca = load().with_context(|| format!("cannot use the CA in --ca-dir {}", dir.display()))?;
    tracing::info!(dir = %dir.display(), "signing workload certificates");
    let ca = Reloading::new(ca);
    tokio::spawn(ca.clone().follow(
        "workload CA",
        Ca::files(dir),
        load,
        metrics.ca_reloads.clone(),
    ));
    Ok(ca)
}

#[cfg(feature = "standalone")]
async fn standalone_bus(
    dir: &std::path::Path,
    cluster_id: &str,
    credential_keys: Option<Arc<CredentialKeys>>,
) -> anyhow::Result<Arc<dyn StateBus>> {
    use shoal_ingester::{FileSource, FileSourceConfig};
    let bus: Arc<dyn StateBus> = Arc::new(shoal_common::MemoryBus::new());
    let cfg = FileSourceConfig {
        cluster_id: cluster_id.to_string(),
        fleet: "standalone".to_string(),
        credential_keys,
        ..FileSourceConfig::new(dir)
    };
    let mut source = FileSource::new(cfg, bus.clone())
        .await
        .with_context(|| format!("cannot read manifests from {}", dir.display()))?;
    // Load the directory before serving, so the first snapshot is the whole mesh.
    source
        .sync_once()
        .await
        .context("initial read of the manifest directory failed")?;
    tokio::spawn(async move {
        if let Err(error) = source.run().await {
            tracing::error!(%error, "file source stopped");
        }
    });
    tracing::info!(dir = %dir.display(), "standalone mode: serving manifests from a directory");
    Ok(bus)
}

#[cfg(not(feature = "standalone"))]
async fn standalone_bus(
    _dir: &std::path::Path,
    _cluster_id: &str,
    _credential_keys: Option<Arc<CredentialKeys>>,
) -> anyhow::Result<Arc<dyn StateBus>> {
    anyhow::bail!("this build has no standalone mode (built without the `standalone` feature)")
}

/// Pending connections the xDS listener queues: a fleet reconnecting at once (a replica
/// gone, a rollout) must not overflow the kernel's accept queue, or proxies wait for SYN
/// retransmits (the kernel caps it at `net.core.somaxconn`).
const XDS_BACKLOG: u32 = 4096;

/// Binds `addr` with an accept queue of `backlog` (tokio's `bind` uses 1024).
fn listen_backlog(
    addr: std::net::SocketAddr,
    backlog: u32,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
