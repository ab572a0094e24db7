//! The mesh-wide settings a server reads from Istio's MeshConfig file (`--mesh-config`: the
//! `mesh` key of the `istio` ConfigMap, the same file the ingester reads for discovery
//! selectors). The file is polled; a change applies as a full push, and a file that stops
//! parsing keeps the last good settings.

use serde::Deserialize;
use shoal_common::model::OutboundTrafficMode;
use shoal_common::model::OutboundTrafficPolicy;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The mesh-wide settings the generators read (Istio's MeshConfig subset).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshSettings {
    /// Where sidecars send traffic for destinations outside the registry, unless their
    /// Sidecar says otherwise (`outboundTrafficPolicy.mode`).
    pub outbound_traffic_policy: OutboundTrafficMode,
    /// The namespace whose selector-less Sidecar applies mesh-wide (`rootNamespace`).
    pub root_namespace: String,
    /// The mesh's trust domain (`trustDomain`): the trust domain of the identities read
    /// from service-account tokens on the secure xDS port (read at startup), and of the
    /// SPIFFE identities mutual TLS verifies.
    pub trust_domain: String,
    /// Sidecars originate Istio mutual TLS to in-mesh destinations that a DestinationRule
    /// leaves without TLS settings (`enableAutoMtls`, default true).
    pub enable_auto_mtls: bool,
    /// The networks of a multi-network mesh and their gateways (Istio's `meshNetworks`,
    /// here a top-level field of the file; see [`crate::index::network`]).
    pub mesh_networks: crate::index::network::MeshNetworks,
}

impl Default for MeshSettings {
    fn default() -> Self {
        MeshSettings {
            outbound_traffic_policy: OutboundTrafficMode::AllowAny,
            root_namespace: shoal_common::defaults::ROOT_NAMESPACE.into(),
            trust_domain: shoal_common::defaults::TRUST_DOMAIN.into(),
            enable_auto_mtls: true,
            mesh_networks: Default::default(),
        }
    }
}

/// How often the file is checked for changes.
const POLL: Duration = Duration::from_secs(2);

/// A mesh config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    /// The file cannot be read.
    #[error("cannot read mesh config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a MeshConfig shoal understands.
    #[error("mesh config {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the field).
        message: String,
    },
}

/// The MeshConfig fields the server reads; every other field is ignored (the file is
/// shared with istio-agent and the ingester).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MeshConfigFile {
    outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    root_namespace: Option<String>,
    trust_domain: Option<String>,
    enable_auto_mtls: Option<bool>,
    mesh_networks: Option<crate::index::network::MeshNetworks>,
}

/// Parses MeshConfig YAML (or JSON) into the settings, with Istio's defaults for what it
/// leaves out.
pub fn parse(text: &str) -> Result<MeshSettings, String> {
    let file: MeshConfigFile = if text.trim().is_empty() {
        MeshConfigFile::default()
    } else {
        serde_saphyr::from_str(text).map_err(|e| e.to_string())?
    };
    let defaults = MeshSettings::default();
    Ok(MeshSettings {
        outbound_traffic_policy: file
            .outbound_traffic_policy
            .and_then(|p| p.mode)
            .unwrap_or(defaults.outbound_traffic_policy),
        root_namespace: file
            .root_namespace
            .filter(|ns| !ns.is_empty())
            .unwrap_or(defaults.root_namespace),
        trust_domain: file
            .trust_domain
            .filter(|td| !td.is_empty())
            .unwrap_or(defaults.trust_domain),
        enable_auto_mtls: file.enable_auto_mtls.unwrap_or(defaults.enable_auto_mtls),
        mesh_networks: file.mesh_networks.unwrap_or_default(),
    })
}

/// Reads and parses the file.
pub fn load(path: &Path) -> Result<MeshSettings, MeshConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| MeshConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|message| MeshConfigError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

/// Polls the file and publishes changed settings; errors are logged and the last good
/// settings stay.
pub async fn watch(path: PathBuf, tx: watch::Sender<Arc<MeshSettings>>) {
    let mut last_error: Option<String> = None;
    loop {
        tokio::time::sleep(POLL).await;
        match load(&path) {
            Ok(settings) => {
                last_error = None;
                tx.send_if_modified(|cur| {
                    if **cur == settings {
                        return false;
                    }
                    tracing::info!(path = %path.display(), ?settings, "mesh config changed");
                    *cur = Arc::new(settings);
                    true
                });
            }
            Err(error) => {
                let text = error.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(%error, "keeping the previous mesh config");
                    last_error = Some(text);
                }
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::OutboundTrafficMode;

    #[test]
    fn reads_istio_mesh_config() {
        let s = parse(
            "defaultConfig:\n  discoveryAddress: istiod:15012\noutboundTrafficPolicy:\n  mode: REGISTRY_ONLY\nrootNamespace: mesh-root\n",
        )
        .unwrap();
        assert_eq!(s.outbound_traffic_policy, OutboundTrafficMode::RegistryOnly);
        assert_eq!(s.root_namespace, "mesh-root");
        assert!(s.enable_auto_mtls);
        assert!(!parse("enableAutoMtls: false").unwrap().enable_auto_mtls);
        assert_eq!(parse("").unwrap(), MeshSettings::default());
        assert_eq!(parse("{}").unwrap(), MeshSettings::default());
        let nets = parse("meshNetworks:\n  networks:\n    n1: {endpoints: [{fromRegistry: c1}]}\n")
            .unwrap()
            .mesh_networks;
        assert_eq!(nets.of_cluster("c1"), Some("n1"));
    }

    #[test]
    fn a_bad_mode_names_the_field() {
        let err = parse("outboundTrafficPolicy: {mode: SOMETIMES}").unwrap_err();
        assert!(err.contains("SOMETIMES") || err.contains("mode"), "{err}");
    }
}
