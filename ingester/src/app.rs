//! Command line and process wiring of the `shoal-ingester` binary.

use crate::error::IngestError;
use crate::file::{FileSource, FileSourceConfig};
use anyhow::Context;
use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::bus::StateBus;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use tracing::info;

/// Where the ingester reads Kubernetes and Istio objects from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A directory of manifests (`file:DIR`).
    File(PathBuf),
}

impl FromStr for SourceSpec {
    type Err = IngestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("file", dir)) if !dir.is_empty() => Ok(SourceSpec::File(PathBuf::from(dir))),
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

    /// NATS credentials file (`.creds`), if the server requires one.
    #[arg(long, env = "SHOAL_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,

    /// Where to read objects from: `file:DIR` polls a directory of YAML/JSON manifests.
    /// (The `kube` source is not implemented yet.)
    #[arg(long, env = "SHOAL_SOURCE", value_name = "SOURCE")]
    pub source: SourceSpec,

    /// Cluster ID that services and endpoints are published under (Istio's default is
    /// `Kubernetes`).
    #[arg(
        long,
        env = "SHOAL_CLUSTER_ID",
        value_name = "ID",
        default_value = "Kubernetes"
    )]
    pub cluster_id: String,

    /// Fleet this ingester belongs to; written into every published value.
    #[arg(
        long,
        env = "SHOAL_FLEET",
        value_name = "NAME",
        default_value = "default"
    )]
    pub fleet: String,

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

/// Runs the ingester until SIGTERM or ctrl-c: connects to NATS, publishes the source's
/// objects, then keeps them in sync.
pub async fn run(args: IngesterArgs) -> anyhow::Result<()> {
    shoal_common::logging::init(&args.log_level, args.log_format == LogFormat::Json);
    let SourceSpec::File(dir) = args.source;
    let opts = NatsOptions {
        url: args.nats_url.clone(),
        replicas: args.nats_replicas,
        credentials_file: args.nats_creds.clone(),
    };
    let bus = NatsBus::connect(&opts)
        .await
        .with_context(|| format!("connecting to the state bus at {}", args.nats_url))?;
    let bus: Arc<dyn StateBus> = Arc::new(bus);
    let cfg = FileSourceConfig {
        cluster_id: args.cluster_id,
        fleet: args.fleet,
        ..FileSourceConfig::new(dir)
    };
    info!(
        dir = %cfg.dir.display(),
        cluster = %cfg.cluster_id,
        fleet = %cfg.fleet,
        "starting file source",
    );
    let mut source = FileSource::new(cfg, bus).await?;
    let report = source.sync_once().await?;
    info!(
        writes = report.writes,
        deletes = report.deletes,
        unchanged = report.unchanged,
        errors = report.errors,
        "initial sync done"
    );
    tokio::select! {
        result = source.run() => result?,
        signal = shutdown_signal() => info!(%signal, "shutting down"),
    }
    Ok(())
}

/// Resolves on SIGTERM (how Kubernetes stops a pod) or ctrl-c, naming the signal.
async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            },
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only ctrl-c stops the ingester");
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "ctrl-c"
    }
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
        for bad in ["kube", "file:", "/etc/shoal", "http://x"] {
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
        let err = IngesterArgs::try_parse_from(["shoal-ingester", "--source", "kube"]).unwrap_err();
        assert!(err.to_string().contains("not implemented yet"), "{err}");
    }
}
