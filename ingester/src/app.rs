//! Command line and process wiring of the `shoal-ingester` binary.

use crate::admin::{self, AdminState};
use crate::coordination::bus_guard;
use crate::coordination::lease::{self, Elector, LeaseConfig};
use crate::coordination::metrics::CoordinationMetrics;
use crate::coordination::ownership::Owners;
use crate::coordination::readiness::{announce_synced, Readiness};
use crate::error::IngestError;
use crate::publish::metrics::PublishMetrics;
use crate::source::file::{FileSource, FileSourceConfig};
use crate::source::kubernetes::metrics::KubeMetrics;
use crate::source::kubernetes::{self, KubeSource, KubeSourceConfig};
use crate::source::mesh_config::{self, MeshConfigWatch};
use anyhow::Context;
use shoal_common::bus::nats::NatsBus;
use shoal_common::bus::nats_args::NatsArgs;
use shoal_common::bus::StateBus;
use shoal_common::credential::CredentialKeys;
use shoal_common::model::Duration;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use tracing::{info, warn};

/// Where the ingester reads Kubernetes and Istio objects from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A directory of manifests (`file:DIR`).
    File(PathBuf),
    /// Kubernetes clusters (`kube`): the config cluster and its multicluster secrets.
    Kube,
}

impl FromStr for SourceSpec {
    type Err = IngestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("file", dir)) if !dir.is_empty() => Ok(SourceSpec::File(PathBuf::from(dir))),
            None if s == "kube" => Ok(SourceSpec::Kube),
            _ => Err(IngestError::UnsupportedSource {
                spec: s.to_string(),
            }),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// shoal-ingester: reads Kubernetes and Istio objects and publishes them, normalized, to
/// the NATS JetStream state bus that shoal servers watch.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "shoal-ingester", version)]
pub struct IngesterArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(
        long,
        env = "SHOAL_NATS_URL",
        value_name = "URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,

    /// Replicas of each KV bucket when the ingester creates it (3 for a JetStream cluster).
    #[arg(
        long,
        env = "SHOAL_NATS_REPLICAS",
        value_name = "N",
        default_value_t = 1
    )]
    pub nats_replicas: usize,

    /// NATS TLS and authentication.
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Where to read objects from: `kube` watches Kubernetes (in-cluster config, else
    /// KUBECONFIG) and the remote clusters of its multicluster secrets; `file:DIR` polls
    /// a directory of YAML/JSON manifests.
    #[arg(long, env = "SHOAL_SOURCE", value_name = "SOURCE")]
    pub source: SourceSpec,

    /// Largest manifest file the `file:DIR` source reads, in bytes (8 MiB by default). A
    /// larger file is not read: logged, and the objects it had stay published.
    #[arg(
        long,
        env = "SHOAL_MAX_MANIFEST_BYTES",
        value_name = "BYTES",
        default_value_t = crate::source::file::DEFAULT_MAX_FILE_BYTES
    )]
    pub max_manifest_bytes: u64,

    /// Cluster ID that the local (config) cluster's services and endpoints are published
    /// under (Istio's default is `Kubernetes`).
    #[arg(
        long,
        env = "SHOAL_CLUSTER_ID",
        value_name = "ID",
        default_value = shoal_common::defaults::CLUSTER_ID
    )]
    pub cluster_id: String,

    /// Fleet this ingester belongs to; written into every published value. It reads the
    /// multicluster Secrets labelled `shoal.io/fleet=NAME` (a label value: letters, digits,
    /// `-`, `_`, `.`, at most 63).
    #[arg(
        long,
        env = "SHOAL_FLEET",
        value_name = "NAME",
        default_value = "default",
        value_parser = parse_fleet
    )]
    pub fleet: String,

    /// Whether this fleet publishes the cluster it runs in (the config cluster, under
    /// `--cluster-id`). Give the local cluster to exactly one fleet. `kube` only; `false`
    /// needs `--watch-config=false`.
    #[arg(
        long,
        env = "SHOAL_LOCAL_CLUSTER",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub local_cluster: bool,

    /// Whether this fleet also takes the multicluster Secrets without a `shoal.io/fleet`
    /// label. Give them to at most one fleet. Default: true for the fleet named `default`,
    /// false for any other. `kube` only.
    #[arg(
        long,
        env = "SHOAL_UNLABELLED_SECRETS",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub unlabelled_secrets: Option<bool>,

    /// How long a cluster that left this fleet (its Secret relabelled to another fleet, or
    /// removed) keeps its keys on the bus for another fleet to take it over, while another
    /// fleet is live; then they are deleted. Without another live fleet they are deleted at
    /// once. `kube` only.
    #[arg(
        long,
        env = "SHOAL_HANDOVER_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s"
    )]
    pub handover_timeout: Duration,

    /// Namespace of the multicluster Secrets (label `istio/multiCluster=true`; each data
    /// key a cluster ID, each value a kubeconfig). `kube` source only.
    #[arg(
        long,
        env = "SHOAL_SYSTEM_NAMESPACE",
        value_name = "NAMESPACE",
        default_value = shoal_common::defaults::ROOT_NAMESPACE
    )]
    pub system_namespace: String,

    /// Key file that seals gateway credentials (the Secrets Gateway servers name in
    /// `tls.credentialName`) before they go on the bus: one base64-encoded 32-byte key per
    /// line, the first seals (servers need every key in use). Without it, credentials are
    /// not published (a referenced Secret is logged).
    #[arg(long, env = "SHOAL_CREDENTIAL_KEY_FILE", value_name = "FILE")]
    pub credential_key_file: Option<PathBuf>,

    /// MeshConfig YAML file whose `discoverySelectors` choose the namespaces to publish
    /// (all when absent). Re-read when it changes.
    #[arg(long, env = "SHOAL_MESH_CONFIG", value_name = "FILE")]
    pub mesh_config: Option<PathBuf>,

    /// The mesh's root certificate (PEM; the public part of the workload CA, never its key).
    /// The leader writes it into the ConfigMap `istio-ca-root-cert` (key `root-cert.pem`)
    /// of every namespace the discovery selectors pass, in every cluster it publishes, puts
    /// it back when edited or deleted, and re-reads the file when it changes. `kube` only.
    #[arg(long, env = "SHOAL_CA_ROOT_CERT", value_name = "FILE")]
    pub ca_root_cert: Option<PathBuf>,

    /// How long a slow or unreachable remote cluster may hold back readiness, e.g. `30s`.
    #[arg(
        long,
        env = "SHOAL_REMOTE_CLUSTER_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s"
    )]
    pub remote_cluster_timeout: Duration,

    /// Whether this ingester publishes Istio config (networking.istio.io kinds) from the
    /// config cluster. `kube` source only.
    #[arg(
        long,
        env = "SHOAL_WATCH_CONFIG",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub watch_config: bool,

    /// Deploy a proxy for each Gateway API Gateway of an Istio class, as istiod does: the
    /// leader creates a ServiceAccount, a Deployment and a LoadBalancer Service named
    /// `<gateway>-<class>`, owned by the Gateway, and keeps them in step with its listeners.
    /// Needs `--watch-config` and RBAC on deployments, services and serviceaccounts.
    #[arg(
        long,
        env = "SHOAL_GATEWAY_DEPLOYMENT",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub gateway_deployment: bool,

    /// The proxy image of the gateways `--gateway-deployment` deploys.
    #[arg(
        long,
        env = "SHOAL_GATEWAY_PROXY_IMAGE",
        value_name = "IMAGE",
        default_value = crate::source::kubernetes::gateway_deploy::DEFAULT_PROXY_IMAGE
    )]
    pub gateway_proxy_image: String,

    /// How long the fleet's lease stays valid after its holder last renewed it (`kube`
    /// only): a standby takes over within about this long after the leader dies. The
    /// holder renews every third of it and stops writing a quarter of it before it ends.
    #[arg(
        long,
        env = "SHOAL_LEASE_TTL",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_lease_ttl
    )]
    pub lease_ttl: Duration,

    /// This replica's identity in its fleet's lease (`kube` only); unique per replica.
    /// Default: the host name (the pod name in Kubernetes) and the process ID.
    #[arg(long, env = "SHOAL_INSTANCE_ID", value_name = "ID", value_parser = parse_instance_id)]
    pub instance_id: Option<String>,

    /// Address of the admin HTTP server: `/ready`, `/healthz`, `/metrics`.
    #[arg(
        long,
        env = "SHOAL_ADMIN_ADDR",
        value_name = "HOST:PORT",
        default_value = "0.0.0.0:15014"
    )]
    pub admin_addr: SocketAddr,

    #[command(flatten)]
    pub debug: shoal_common::admin::DebugArgs,

    /// Log filter in RUST_LOG syntax, e.g. `info` or `info,shoal_ingester=debug`.
    #[arg(
        long,
        env = "SHOAL_LOG",
        value_name = "FILTER",
        default_value = "info,async_nats=warn"
    )]
    pub log_level: String,

    /// Log output format.
    #[arg(
        long,
        env = "SHOAL_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let ttl: Duration = s.parse().map_err(|e| format!("{e}"))?;
    if ttl.get() < lease::MIN_TTL {
        return Err(format!(
            "a lease ttl must be at least {} ms",
            lease::MIN_TTL.as_millis()
        ));
    }
    Ok(ttl)
}

/// A fleet name is a Kubernetes label value (it selects the fleet's Secrets), not empty.
fn parse_fleet(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    match valid {
        true => Ok(s.to_string()),
        false => Err(format!(
            "{s:?} is not a valid fleet name: a Kubernetes label value (1-63 letters, digits, \
             '-', '_' or '.', starting and ending with a letter or digit)"
        )),
    }
}

impl IngesterArgs {
    /// Whether this fleet takes the multicluster Secrets without a fleet label: as set,
    /// else when it is the fleet named `default`.
    pub fn takes_unlabelled_secrets(&self) -> bool {
        self.unlabelled_secrets
            .unwrap_or(self.fleet == DEFAULT_FLEET)
    }
}

/// The fleet that takes unlabelled multicluster Secrets unless configured otherwise.
pub const DEFAULT_FLEET: &str = "default";

fn parse_instance_id(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Err("an instance ID must not be empty".to_string()),
        id => Ok(id.to_string()),
    }
}

/// The readiness component of the file source.
const FILE_READINESS: &str = "manifest directory";

/// Runs the ingester until SIGTERM or ctrl-c: connects to NATS, publishes the source's
/// objects, then keeps them in sync.
pub async fn run(args: IngesterArgs) -> anyhow::Result<()> {
    shoal_common::logging::init(&args.log_level, args.log_format == LogFormat::Json);
    // Every subsystem's metrics are registered whatever the source, so /metrics always
    // lists the same series.
    let registry = prometheus::Registry::new();
    let coordination_metrics = CoordinationMetrics::register(&registry);
    let publish_metrics = PublishMetrics::register(&registry);
    let kube_metrics = KubeMetrics::register(&registry);
    let readiness = Readiness::new(coordination_metrics.clone());
    let selectors = match &args.mesh_config {
        Some(path) => {
            let (watch, rx) = MeshConfigWatch::load(path)?;
            tokio::spawn(watch.run());
            rx
        }
        None => mesh_config::select_all(),
    };
    let opts = args.nats.options(&args.nats_url, args.nats_replicas)?;
    info!(
        url = %args.nats_url,
        auth = opts.auth.method(),
        tls = opts.tls.is_required(),
        "connecting to NATS"
    );
    let bus = NatsBus::connect(&opts)
        .await
        .with_context(|| format!("connecting to the state bus at {}", args.nats_url))?;
    // Only writers heal a bus that lost its data: they know what belongs there.
    tokio::spawn(bus_guard::run(bus.clone(), coordination_metrics.clone()));
    let bus: Arc<dyn StateBus> = Arc::new(bus);
    let listener = admin::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding the admin address {}", args.admin_addr))?;
    let admin_state = AdminState {
        readiness: readiness.clone(),
        registry,
        clusters: kube_metrics.clone(),
    };
    let debug = args.debug.policy();

    let credential_keys = match &args.credential_key_file {
        Some(path) => Some(Arc::new(
            CredentialKeys::load(path).context("cannot use --credential-key-file")?,
        )),
        None => None,
    };
    if let Some(keys) = &credential_keys {
        info!(
            key_id = keys.sealing_key_id(),
            "sealing gateway credentials"
        );
    }
    match args.source.clone() {
        SourceSpec::File(dir) => {
            let cfg = FileSourceConfig {
                cluster_id: args.cluster_id,
                fleet: args.fleet,
                credential_keys: credential_keys.clone(),
                max_file_bytes: args.max_manifest_bytes,
                ..FileSourceConfig::new(dir)
            };
            info!(
                dir = %cfg.dir.display(),
                cluster = %cfg.cluster_id,
                fleet = %cfg.fleet,
                "starting file source",
            );
            readiness.require(FILE_READINESS);
            // No lease: the file source always writes, with epoch 0.
            coordination_metrics.leader.set(1);
            tokio::spawn(admin::serve(listener, debug, admin_state));
            tokio::spawn(announce_synced(
                bus.clone(),
                cfg.fleet.clone(),
                readiness.clone(),
                lease::Leadership::always(),
            ));
            let mut source = FileSource::new(cfg, bus).await?;
            source.set_discovery_selectors(selectors);
            source.set_metrics(publish_metrics);
            let report = source.sync_once().await?;
            info!(
                writes = report.writes,
                deletes = report.deletes,
                unchanged = report.unchanged,
                errors = report.errors,
                "initial sync done"
            );
            readiness.synced(FILE_READINESS);
            tokio::select! {
                result = source.run() => result?,
                signal = shoal_common::process::shutdown_signal() => info!(%signal, "shutting down"),
            }
        }
        SourceSpec::Kube => {
            if args.watch_config && !args.local_cluster {
                anyhow::bail!(
                    "--local-cluster=false needs --watch-config=false: the Istio config is read \
                     from the local cluster, which this fleet does not watch"
                );
            }
            if args.gateway_deployment && !args.watch_config {
                anyhow::bail!(
                    "--gateway-deployment needs --watch-config: the Gateways are read with the \
                     Istio config"
                );
            }
            let unlabelled_secrets = args.takes_unlabelled_secrets();
            let ca_root = match args.ca_root_cert.clone() {
                Some(path) => Some(kubernetes::ca_root::follow(path, kube_metrics.clone())?),
                None => None,
            };
            let instance_id = args
                .instance_id
                .clone()
                .unwrap_or_else(lease::default_instance_id);
            let user_agent = kubernetes::user_agent(&args.fleet, &instance_id);
            let client = kubernetes::infer_client(&user_agent).await?;
            let lease_cfg = LeaseConfig {
                fleet: args.fleet.clone(),
                instance_id,
                ttl: args.lease_ttl.get(),
            };
            let (elector, leadership) =
                Elector::new(bus.clone(), lease_cfg, coordination_metrics.clone());
            let owners = Owners::start(
                bus.clone(),
                &args.fleet,
                leadership.clone(),
                args.lease_ttl.get(),
            );
            let (stop_election, stopped) = tokio::sync::oneshot::channel();
            let election = tokio::spawn(elector.run(stopped));
            let cfg = KubeSourceConfig {
                cluster_id: args.cluster_id,
                local_cluster: args.local_cluster,
                unlabelled_secrets,
                handover_timeout: args.handover_timeout.get(),
                user_agent,
                fleet: args.fleet,
                system_namespace: args.system_namespace,
                watch_config: args.watch_config,
                remote_cluster_timeout: args.remote_cluster_timeout.get(),
                ca_root,
                credential_keys: credential_keys.clone(),
                selectors,
                gateway_proxy_image: args
                    .gateway_deployment
                    .then(|| args.gateway_proxy_image.clone()),
            };
            tokio::spawn(announce_synced(
                bus.clone(),
                cfg.fleet.clone(),
                readiness.clone(),
                leadership.clone(),
            ));
            let source = KubeSource::new(
                cfg,
                bus,
                kube_metrics,
                publish_metrics,
                readiness,
                leadership,
                owners,
            );
            tokio::spawn(admin::serve(listener, debug, admin_state));
            let result = tokio::select! {
                result = source.run(client) => result.map_err(anyhow::Error::from),
                signal = shoal_common::process::shutdown_signal() => {
                    info!(%signal, "shutting down");
                    Ok(())
                }
            };
            // Stop writing and release the lease, so a standby takes over at once.
            let _ = stop_election.send(());
            if tokio::time::timeout(std::time::Duration::from_secs(5), election)
                .await
                .is_err()
            {
                warn!("releasing the lease did not finish in time; it expires after its ttl");
            }
            result?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn source_spec_parsing() {
        assert_eq!(
            "file:/etc/shoal".parse::<SourceSpec>().unwrap(),
            SourceSpec::File("/etc/shoal".into())
        );
        assert_eq!("kube".parse::<SourceSpec>().unwrap(), SourceSpec::Kube);
        for bad in ["kube:x", "file:", "/etc/shoal", "http://x", "k8s"] {
            let msg = bad.parse::<SourceSpec>().unwrap_err().to_string();
            assert!(msg.contains("file:DIR") && msg.contains("kube"), "{msg}");
        }
    }

    #[test]
    fn args_defaults_and_errors() {
        let args = IngesterArgs::try_parse_from(["shoal-ingester", "--source", "file:/m"]).unwrap();
        assert_eq!(args.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(args.nats_replicas, 1);
        assert_eq!(args.cluster_id, "Kubernetes");
        assert_eq!(args.fleet, "default");
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.system_namespace, "istio-system");
        assert_eq!(args.mesh_config, None);
        assert_eq!(
            args.remote_cluster_timeout.get(),
            std::time::Duration::from_secs(30)
        );
        assert!(args.watch_config);
        assert!(args.local_cluster);
        assert!(args.takes_unlabelled_secrets());
        // Gateway deployment is off unless asked for.
        assert!(!args.gateway_deployment);
        assert_eq!(args.gateway_proxy_image, "docker.io/istio/proxyv2:1.24.2");
        let on = IngesterArgs::try_parse_from([
            "shoal-ingester",
            "--source",
            "kube",
            "--gateway-deployment",
            "--gateway-proxy-image",
            "example.com/proxy:1",
        ])
        .unwrap();
        assert!(on.gateway_deployment);
        assert_eq!(on.gateway_proxy_image, "example.com/proxy:1");
        assert_eq!(
            args.handover_timeout.get(),
            std::time::Duration::from_secs(30)
        );
        assert_eq!(args.lease_ttl.get(), std::time::Duration::from_secs(10));
        assert_eq!(args.instance_id, None);
        assert_eq!(args.admin_addr, "0.0.0.0:15014".parse().unwrap());
        let err =
            IngesterArgs::try_parse_from(["shoal-ingester", "--source", "kubernetes"]).unwrap_err();
        assert!(err.to_string().contains("supported sources"), "{err}");
    }

    #[test]
    fn kube_flags() {
        let args = IngesterArgs::try_parse_from([
            "shoal-ingester",
            "--source",
            "kube",
            "--system-namespace",
            "mesh",
            "--mesh-config",
            "/etc/istio/config/mesh",
            "--remote-cluster-timeout",
            "1.5s",
            "--watch-config=false",
            "--admin-addr",
            "127.0.0.1:9000",
        ])
        .unwrap();
        assert_eq!(args.source, SourceSpec::Kube);
        assert_eq!(args.system_namespace, "mesh");
        assert_eq!(args.mesh_config, Some("/etc/istio/config/mesh".into()));
        assert_eq!(
            args.remote_cluster_timeout.get(),
            std::time::Duration::from_millis(1500)
        );
        assert!(!args.watch_config);
        let args =
            IngesterArgs::try_parse_from(["shoal-ingester", "--source", "kube", "--watch-config"])
                .unwrap();
        assert!(args.watch_config);
        let err = IngesterArgs::try_parse_from([
            "shoal-ingester",
            "--source",
            "kube",
            "--remote-cluster-timeout",
            "soon",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }

    #[test]
    fn lease_flags() {
        let args = IngesterArgs::try_parse_from([
            "shoal-ingester",
            "--source",
            "kube",
            "--lease-ttl",
            "4s",
            "--instance-id",
            "shoal-ingester-7d9f-abcde",
        ])
        .unwrap();
        assert_eq!(args.lease_ttl.get(), std::time::Duration::from_secs(4));
        assert_eq!(
            args.instance_id.as_deref(),
            Some("shoal-ingester-7d9f-abcde")
        );
        let err = IngesterArgs::try_parse_from([
            "shoal-ingester",
            "--source",
            "kube",
            "--instance-id",
            " ",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--instance-id"), "{err}");
        for bad in ["50ms", "0s", "soon"] {
            let err = IngesterArgs::try_parse_from([
                "shoal-ingester",
                "--source",
                "kube",
                "--lease-ttl",
                bad,
            ])
            .unwrap_err();
            assert!(err.to_string().contains("--lease-ttl"), "{err}");
        }
        let id = lease::default_instance_id();
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
    }

    #[test]
    fn fleet_flags() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["shoal-ingester", "--source", "kube"];
            args.extend_from_slice(extra);
            IngesterArgs::try_parse_from(args)
        };
        let edge = parse(&["--fleet", "edge", "--local-cluster=false"]).unwrap();
        assert!(!edge.local_cluster);
        assert!(!edge.takes_unlabelled_secrets(), "only the default fleet");
        let edge = parse(&["--fleet", "edge", "--unlabelled-secrets"]).unwrap();
        assert!(edge.takes_unlabelled_secrets());
        let default = parse(&["--unlabelled-secrets=false", "--handover-timeout", "2s"]).unwrap();
        assert!(!default.takes_unlabelled_secrets());
        assert_eq!(
            default.handover_timeout.get(),
            std::time::Duration::from_secs(2)
        );
        for bad in ["", "-edge", "edge_", "a/b", "with space", &"x".repeat(64)] {
            let flag = format!("--fleet={bad}");
            let err = parse(&[&flag]).unwrap_err();
            assert!(
                err.to_string().contains("not a valid fleet name"),
                "{bad}: {err}"
            );
        }
        assert!(parse(&["--fleet", "edge.eu-1_a"]).is_ok());
    }
}
