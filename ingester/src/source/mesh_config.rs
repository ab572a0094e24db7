//! The MeshConfig file (`--mesh-config`): read for its `discoverySelectors`, and polled
//! for changes like the manifest directory is.
//!
//! The file is what Istio mounts at `/etc/istio/config/mesh` (MeshConfig as YAML); only
//! `discoverySelectors` is read, every other field is ignored. A file that becomes
//! unreadable or invalid while running keeps the last good selectors (logged), so a bad
//! edit never makes namespaces vanish from the mesh.

use crate::selector::{DiscoverySelectors, SelectorError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

/// How often the mesh config file is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A mesh config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    /// The file cannot be read.
    #[error("mesh config {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not MeshConfig YAML.
    #[error("mesh config {}: not valid MeshConfig YAML: {source}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The cause (boxed, as it is large).
        #[source]
        source: Box<shoal_common::yaml::Error>,
    },
    /// The file nests deeper than MeshConfig does (checked before parsing: see
    /// `shoal_common::yaml_depth`).
    #[error("mesh config {}: {source}; not parsed", path.display())]
    TooDeep {
        /// The file.
        path: PathBuf,
        /// Where.
        #[source]
        source: shoal_common::yaml_depth::TooDeep,
    },
    /// A discovery selector is invalid.
    #[error("mesh config {}: {source}", path.display())]
    Selector {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: SelectorError,
    },
}

/// The fields of MeshConfig shoal reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeshConfig {
    #[serde(default)]
    discovery_selectors: Option<Vec<LabelSelector>>,
}

/// Parses MeshConfig YAML into its discovery selectors; an empty document has none.
pub fn parse(path: &Path, text: &str) -> Result<DiscoverySelectors, MeshConfigError> {
    use shoal_common::yaml_depth;
    yaml_depth::check(text, yaml_depth::MAX_DEPTH).map_err(|source| MeshConfigError::TooDeep {
        path: path.to_path_buf(),
        source,
    })?;
    let config: Option<MeshConfig> =
        shoal_common::yaml::from_str(text).map_err(|source| MeshConfigError::Yaml {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
    let selectors = config
        .unwrap_or_default()
        .discovery_selectors
        .unwrap_or_default();
    DiscoverySelectors::new(&selectors).map_err(|source| MeshConfigError::Selector {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and parses the file, returning the selectors and the content hash.
fn read(path: &Path) -> Result<(DiscoverySelectors, [u8; 32]), MeshConfigError> {
    let bytes = std::fs::read(path).map_err(|source| MeshConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let hash: [u8; 32] = Sha256::digest(&bytes).into();
    let text = String::from_utf8_lossy(&bytes);
    Ok((parse(path, &text)?, hash))
}

/// The current discovery selectors, as a watch channel every source subscribes to.
pub type SelectorsRx = watch::Receiver<Arc<DiscoverySelectors>>;

/// Selectors that never change: every namespace (no `--mesh-config`).
pub fn select_all() -> SelectorsRx {
    // The receiver keeps working after the sender is dropped; it just never changes.
    watch::channel(Arc::new(DiscoverySelectors::all())).1
}

/// A mesh config file being watched.
pub struct MeshConfigWatch {
    path: PathBuf,
    hash: [u8; 32],
    tx: watch::Sender<Arc<DiscoverySelectors>>,
    poll: Duration,
}

impl MeshConfigWatch {
    /// Reads the file; at startup an unreadable or invalid file is an error.
    pub fn load(
        path: impl Into<PathBuf>,
    ) -> Result<(MeshConfigWatch, SelectorsRx), MeshConfigError> {
        let path = path.into();
        let (selectors, hash) = read(&path)?;
        info!(
            file = %path.display(),
            all_namespaces = selectors.selects_all(),
            "read mesh config"
        );
        let (tx, rx) = watch::channel(Arc::new(selectors));
        let watch = MeshConfigWatch {
            path,
            hash,
            tx,
            poll: POLL_INTERVAL,
        };
        Ok((watch, rx))
    }

    /// Re-reads the file once; true when the selectors changed.
    pub fn check(&mut self) -> bool {
        match read(&self.path) {
            Ok((_, hash)) if hash == self.hash => false,
            Ok((selectors, hash)) => {
                self.hash = hash;
                let changed = **self.tx.borrow() != selectors;
                if changed {
                    info!(
                        file = %self.path.display(),
                        all_namespaces = selectors.selects_all(),
                        "discovery selectors changed"
                    );
                    self.tx.send_replace(Arc::new(selectors));
                }
                changed
            }
            Err(error) => {
                // Log each distinct error once: the error text's hash stands in for the
                // content hash, so the next good read is taken whatever its content.
                let hash: [u8; 32] = Sha256::digest(error.to_string().as_bytes()).into();
                if hash != self.hash {
                    self.hash = hash;
                    warn!(%error, "keeping the previous discovery selectors");
                }
                false
            }
        }
    }

    /// Polls the file forever.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Labels;

    fn labels(k: &str, v: &str) -> Labels {
        [(k.to_string(), v.to_string())].into()
    }

    #[test]
    fn a_deeply_nested_file_is_refused_before_parsing() {
        let text = format!("discoverySelectors: {}\n", "[".repeat(100_000));
        let err = parse(Path::new("/mesh"), &text).unwrap_err();
        assert!(matches!(err, MeshConfigError::TooDeep { .. }), "{err}");
        assert!(err.to_string().contains("/mesh"), "{err}");
    }

    #[test]
    fn parses_discovery_selectors_and_ignores_other_fields() {
        let p = Path::new("/mesh");
        let s = parse(
            p,
            "defaultConfig: {discoveryAddress: x:15012}\ndiscoverySelectors:\n- matchLabels: {mesh: on}\n",
        )
        .unwrap();
        assert!(s.matches(&labels("mesh", "on")));
        assert!(!s.matches(&labels("mesh", "off")));
        assert!(parse(p, "").unwrap().selects_all());
        assert!(parse(p, "accessLogFile: /dev/stdout\n")
            .unwrap()
            .selects_all());
        let err = parse(
            p,
            "discoverySelectors: [{matchExpressions: [{key: a, operator: Bad}]}]",
        )
        .unwrap_err();
        assert!(matches!(err, MeshConfigError::Selector { .. }), "{err}");
        assert!(parse(p, "discoverySelectors: 3").is_err());
    }

    #[test]
    fn watch_follows_edits_and_keeps_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh");
        std::fs::write(&path, "discoverySelectors: [{matchLabels: {mesh: on}}]\n").unwrap();
        let (mut watch, rx) = MeshConfigWatch::load(&path).unwrap();
        assert!(!rx.borrow().selects_all());
        assert!(!watch.check(), "unchanged");

        std::fs::write(&path, "discoverySelectors: [{matchLabels: {mesh: [broken\n").unwrap();
        assert!(!watch.check());
        assert!(rx.borrow().matches(&labels("mesh", "on")), "last good kept");

        std::fs::write(&path, "discoverySelectors: []\n").unwrap();
        assert!(watch.check());
        assert!(rx.borrow().selects_all());

        std::fs::remove_file(&path).unwrap();
        assert!(!watch.check());
        assert!(rx.borrow().selects_all());
    }

    #[test]
    fn missing_file_is_an_error_at_startup() {
        let err = MeshConfigWatch::load("/nonexistent/mesh").err().unwrap();
        assert!(err.to_string().contains("/nonexistent/mesh"), "{err}");
    }
}
