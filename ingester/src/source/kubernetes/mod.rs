//! The Kubernetes source (`--source kube`): the ingester as a Kubernetes controller.
//!
//! - The config cluster (in-cluster config or `KUBECONFIG`) is watched like every cluster
//!   (Namespaces, Services, EndpointSlices, Pods, Nodes) unless `--local-cluster=false`,
//!   and also for Istio config ([`config`]); in its system namespace, for the multicluster
//!   Secrets of this fleet ([`secrets`]).
//! - Each cluster ID is published by one fleet, its owner on the bus
//!   ([`crate::coordination::ownership`]); a cluster another live fleet owns is refused,
//!   and a cluster that leaves this fleet is handed over or deleted ([`orphans`]).
//! - Each cluster runs in its own task ([`cluster`]) owning the keys of its cluster ID, and
//!   keeps its sync status and token issuer in `shoal-meta` ([`cluster_status`], read
//!   with [`issuer`]).
//! - With `--ca-root-cert`, the leader writes the mesh's root certificate into every
//!   selected namespace of every cluster it publishes ([`ca_root`]), as istiod does.
//! - A rejected Istio config object gets the reason in its `status`, written by the leader
//!   ([`object_status`]); Gateway API objects get the status istiod writes
//!   ([`gateway_status`]).
//! - Watches reduce objects to what shoal reads ([`reduce`]) and follow kube-rs relist
//!   semantics ([`store`]): a relist is a reset, never a series of guessed deletes.
//! - What is published goes through the same normalization as the file source
//!   ([`crate::admit`], [`crate::desired`]) and the same [`crate::publish::Publisher`],
//!   which writes only changed values, so a restart with an unchanged cluster writes
//!   nothing.
//! - [`metrics`]: what the source counts (watch events, cluster states, status writes).

pub mod ca_root;
pub mod cluster;
pub mod cluster_status;
pub mod config;
pub mod context;
pub mod gateway_deploy;
pub mod gateway_status;
pub mod issuer;
pub mod metrics;
pub mod object_status;
pub mod orphans;
pub mod reduce;
pub mod secrets;
pub mod store;
pub mod watch;

use crate::coordination::lease::Leadership;
use crate::coordination::ownership::Owners;
use crate::coordination::readiness::Readiness;
use crate::publish::metrics::PublishMetrics;
use crate::source::mesh_config::SelectorsRx;
use cluster::readiness_name;
use context::ClusterContext;
use kube::Client;
use metrics::KubeMetrics;
use shoal_common::bus::StateBus;
use shoal_common::credential::CredentialKeys;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// Errors of the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// Neither in-cluster config nor a kubeconfig was found or usable.
    #[error("no Kubernetes configuration (in-cluster or KUBECONFIG): {0}")]
    Infer(String),
    /// A client could not be built from the configuration.
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// A multicluster secret's kubeconfig is unusable.
    #[error("kubeconfig of remote cluster {cluster:?}: {reason}")]
    RemoteKubeconfig {
        /// The cluster ID (the secret's data key).
        cluster: String,
        /// What is wrong.
        reason: String,
    },
    /// A task of the source ended, which it never should.
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
}

/// Configuration of the Kubernetes source.
#[derive(Debug, Clone)]
pub struct KubeSourceConfig {
    /// The config cluster's ID (services and endpoints keys start with it).
    pub cluster_id: String,
    /// Whether this fleet publishes the config (local) cluster's services and endpoints.
    pub local_cluster: bool,
    /// Whether this fleet takes the multicluster Secrets without a fleet label.
    pub unlabelled_secrets: bool,
    /// How long a cluster that left this fleet keeps its keys for another fleet to take
    /// it over, while another fleet is live.
    pub handover_timeout: Duration,
    /// The `User-Agent` of every Kubernetes client (it names the fleet and the replica).
    pub user_agent: String,
    /// The fleet written into every envelope.
    pub fleet: String,
    /// Where the multicluster Secrets are.
    pub system_namespace: String,
    /// Whether to publish Istio config from the config cluster.
    pub watch_config: bool,
    /// How long a remote cluster may hold back readiness.
    pub remote_cluster_timeout: Duration,
    /// The root certificate the leader writes into every selected namespace of every
    /// cluster (`--ca-root-cert`), if any.
    pub ca_root: Option<ca_root::RootRx>,
    /// Seals gateway credentials; with it (and `watch_config`), the config cluster's
    /// Secrets are watched in every namespace and the ones Gateways name are published.
    pub credential_keys: Option<Arc<CredentialKeys>>,
    /// The discovery selectors, followed.
    pub selectors: SelectorsRx,
    /// The proxy image of the gateways deployed for Gateway API Gateways
    /// (`--gateway-deployment`); `None`: nothing is deployed.
    pub gateway_proxy_image: Option<String>,
}

/// The `User-Agent` of the ingester's Kubernetes clients: the binary, its version, the
/// fleet and the replica, so that API server audit logs (and tests) tell who watches.
pub fn user_agent(fleet: &str, instance_id: &str) -> String {
    let agent = format!(
        "shoal-ingester/{} (fleet {fleet}; instance {instance_id})",
        env!("CARGO_PKG_VERSION")
    );
    // A header value is visible ASCII; anything else would make every request fail.
    agent
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Sets the `User-Agent` of a client configuration.
pub fn with_user_agent(mut config: kube::Config, user_agent: &str) -> kube::Config {
    if let Ok(value) = hyper::header::HeaderValue::from_str(user_agent) {
        config.headers.push((hyper::header::USER_AGENT, value));
    }
    config
}

/// The first line of a kubeconfig error with every quoted value replaced: YAML parse errors
/// quote the offending value and print the input around it, which in a kubeconfig may be a
/// token or a key, and these errors reach logs and `/debug/clusters`.
pub fn redact_config_error(reason: &str) -> String {
    static QUOTED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#""[^"]*"|`[^`]*`|'[^']*'"#).expect("valid regex")
    });
    let first = reason.lines().next().unwrap_or_default();
    QUOTED.replace_all(first, "<redacted>").into_owned()
}

/// The client of the config cluster: in-cluster config, else `KUBECONFIG` / `~/.kube/config`.
pub async fn infer_client(user_agent: &str) -> Result<Client, KubeSourceError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| KubeSourceError::Infer(redact_config_error(&e.to_string())))?;
    info!(server = %config.cluster_url, "connecting to the config cluster");
    Client::try_from(with_user_agent(config, user_agent)).map_err(KubeSourceError::Client)
}

/// The Kubernetes source, ready to run.
pub struct KubeSource {
    cfg: KubeSourceConfig,
    ctx: ClusterContext,
}

impl KubeSource {
    /// A source publishing to `bus` while `leadership` says this replica leads (a standby
    /// watches and keeps its caches, and counts as synced once they are), the clusters
    /// `owners` says this fleet owns. Registers what readiness waits for: the config
    /// cluster (when published), the Istio config kinds (when watched) and the multicluster
    /// secrets.
    pub fn new(
        cfg: KubeSourceConfig,
        bus: Arc<dyn StateBus>,
        metrics: KubeMetrics,
        publish_metrics: PublishMetrics,
        readiness: Readiness,
        leadership: Leadership,
        owners: Owners,
    ) -> KubeSource {
        if cfg.local_cluster {
            readiness.require(&readiness_name(&cfg.cluster_id));
        }
        readiness.require(secrets::READINESS);
        if cfg.watch_config {
            readiness.require(config::READINESS);
        }
        let ctx = ClusterContext {
            bus,
            fleet: cfg.fleet.clone(),
            metrics,
            publish_metrics,
            readiness,
            selectors: cfg.selectors.clone(),
            leadership,
            owners,
            ca_root: cfg.ca_root.clone(),
            credential_keys: cfg.credential_keys.clone(),
            system_namespace: cfg.system_namespace.clone(),
            gateway_proxy_image: cfg.gateway_proxy_image.clone(),
            services: context::ServiceDirectory::default(),
        };
        KubeSource { cfg, ctx }
    }

    /// Runs the config cluster and the multicluster secret controller until the process
    /// exits; returns only if one of them stops, which is a bug.
    pub async fn run(self, client: Client) -> Result<(), KubeSourceError> {
        let cfg = &self.cfg;
        info!(
            cluster = %cfg.cluster_id,
            local_cluster = cfg.local_cluster,
            fleet = %self.ctx.fleet,
            unlabelled_secrets = cfg.unlabelled_secrets,
            system_namespace = %cfg.system_namespace,
            watch_config = cfg.watch_config,
            "starting Kubernetes source"
        );
        // Nothing is claimed, refused or swept before the owner records are read.
        self.ctx.owners.loaded().await;
        let mut local = cfg.local_cluster.then(|| {
            cluster::spawn(
                self.ctx.clone(),
                cfg.cluster_id.clone(),
                client.clone(),
                cfg.watch_config,
            )
        });
        let controller = secrets::SecretController::start(
            self.ctx.clone(),
            client,
            secrets::SecretsConfig {
                namespace: cfg.system_namespace.clone(),
                local: cfg.local_cluster.then(|| cfg.cluster_id.clone()),
                unlabelled: cfg.unlabelled_secrets,
                timeout: cfg.remote_cluster_timeout,
                handover_timeout: cfg.handover_timeout,
                user_agent: cfg.user_agent.clone(),
            },
        );
        let local_stopped = async {
            match local.as_mut() {
                Some(local) => local.join().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = local_stopped => Err(KubeSourceError::Stopped("the config cluster's task")),
            () = controller.run() => Err(KubeSourceError::Stopped("the multicluster secret controller")),
        }
    }
}
