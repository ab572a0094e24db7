//! The file source: a directory tree of manifests, watched and polled for changes and
//! published.
//!
//! A watch ([`watch::DirWatch`], inotify on Linux) wakes a scan within milliseconds of a
//! write; a poll of (mtime, size) per file, every second while watched and every 250 ms
//! when the directory cannot be watched, catches what events miss (network mounts, an
//! overflowed event queue). Either way the scan decides what changed, so the source works
//! on every filesystem, Kubernetes ConfigMap volumes included.
//!
//! Files written in place are read half-written now and then: truncated to nothing, or
//! cut mid-document, which often still parses (as fewer objects). A change that would
//! drop objects a file has (fewer objects, or the file gone: an editor that renames the
//! old file away before writing the new one) therefore waits until the file has not
//! changed for [`DROP_SETTLE`]; a change that only adds or modifies objects applies at
//! once. Editors' companion files (`.swp` and other dot files, `~` backups, vim's `4913`
//! probe) are not manifests: only `.yaml`, `.yml` and `.json` files are read.

pub mod manifest;
#[cfg(test)]
mod samples;
pub mod store;
pub mod watch;

use crate::desired::scope::Dirty;
use crate::error::IngestError;
use crate::publish::metrics::PublishMetrics;
use crate::publish::{PublishReport, Publisher};
use crate::source::mesh_config::{self, SelectorsRx};
use manifest::ParsedFile;
use sha2::{Digest, Sha256};
use shoal_common::bus::StateBus;
use shoal_common::credential::CredentialKeys;
use shoal_common::envelope::now_ms;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use store::ManifestStore;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use watch::Schedule;

/// How often the directory is polled when it cannot be watched, unless configured
/// otherwise.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often a watched directory is polled unless configured otherwise: the safety net
/// for changes that raise no event, such as those made on another machine of a network
/// mount. It keeps the documented promise that edits reach the bus within a second.
pub const DEFAULT_WATCHED_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Every file is re-read this often, whatever its mtime says: a safety net for changes
/// that keep size and mtime (coarse timestamps, tools that restore mtimes).
const FULL_READ_INTERVAL: Duration = Duration::from_secs(10);

/// A file modified this recently is re-read on every poll: another write within the
/// filesystem's timestamp granularity could keep its (mtime, size) unchanged.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// How long a file must stay unchanged (or absent) before a change that drops some of its
/// objects applies.
pub const DROP_SETTLE: Duration = Duration::from_secs(2);

/// The largest manifest file read unless configured otherwise (`--max-manifest-bytes`):
/// 8 MiB. Parsing takes about 17 times a file's size in memory (a 60 MB manifest took the
/// ingester past its chart's 1 GiB limit), so 8 MiB stays near 150 MB, while a file of
/// thousands of objects fits: Kubernetes keeps one object under 1.5 MiB and a ConfigMap
/// (a common way to mount manifests) under 1 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 8 << 20;

/// Configuration of a [`FileSource`].
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    /// The manifest directory (read recursively).
    pub dir: PathBuf,
    /// The cluster ID services and endpoints are published under.
    pub cluster_id: String,
    /// The fleet written into every envelope.
    pub fleet: String,
    /// How often the directory is polled for changes when it is not watched.
    pub poll_interval: Duration,
    /// `Some(interval)`: watch the directory for change events, and poll it only this
    /// often as a safety net. `None`, or a watch that cannot start (logged), polls every
    /// `poll_interval`.
    pub watch: Option<Duration>,
    /// Seals the gateway credentials (Secrets Gateways name); `None` publishes none.
    pub credential_keys: Option<Arc<CredentialKeys>>,
    /// Larger files are not read (their objects stay as they were).
    pub max_file_bytes: u64,
}

impl FileSourceConfig {
    /// A configuration for `dir` with the defaults: cluster `Kubernetes` (Istio's default
    /// cluster ID), fleet `default`, watched with a 1 s poll (250 ms if the watch cannot
    /// start), files up to 8 MiB.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileSourceConfig {
            dir: dir.into(),
            cluster_id: shoal_common::defaults::CLUSTER_ID.to_string(),
            fleet: "default".to_string(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            watch: Some(DEFAULT_WATCHED_POLL_INTERVAL),
            credential_keys: None,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// What identifies a file version cheaply: modification time (ns) and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    mtime_ns: u128,
    len: u64,
}

/// What the source knows about a file it has seen.
#[derive(Debug, Clone)]
struct FileState {
    stamp: FileStamp,
    /// sha256 of the content last read; `None` when it could not be read.
    hash: Option<[u8; 32]>,
}

/// A difference found by a scan.
enum Change {
    /// New or changed content, parsed.
    Parsed {
        path: PathBuf,
        state: FileState,
        parsed: Result<ParsedFile, IngestError>,
    },
    /// Same content, new stamp.
    Touched { path: PathBuf, stamp: FileStamp },
    /// The file exists but could not be read; its objects stay.
    Unreadable {
        path: PathBuf,
        stamp: FileStamp,
        error: IngestError,
    },
    /// The file is gone.
    Removed(PathBuf),
}

/// Publishes the manifests of a directory to the bus and keeps them in sync.
pub struct FileSource {
    cfg: FileSourceConfig,
    publisher: Publisher,
    store: ManifestStore,
    /// Shared with the scan's blocking task, which must not copy 2 000 paths per poll.
    /// Hashed, not ordered: ordering paths compares them component by component, which
    /// was half of a scan's CPU (the store keeps its own stable order).
    files: Arc<HashMap<PathBuf, FileState>>,
    last_full_read: Option<Instant>,
    full_read_interval: Duration,
    /// What changed since the last publish: the namespaces to recompute, or all.
    dirty: Dirty,
    /// Changes that would drop objects, waiting for their file to settle: the content's
    /// hash (`None`: the file is gone) and when it was first seen.
    held: BTreeMap<PathBuf, (Option<[u8; 32]>, Instant)>,
    /// [`DROP_SETTLE`] (zero in tests of what a change does, not when).
    drop_settle: Duration,
    /// The namespaces to publish (discovery selectors).
    selectors: SelectorsRx,
    metrics: Option<PublishMetrics>,
}

impl FileSource {
    /// Checks the directory and reads what this source owns on the bus. Nothing is
    /// published until [`FileSource::sync_once`].
    pub async fn new(
        cfg: FileSourceConfig,
        bus: Arc<dyn StateBus>,
    ) -> Result<FileSource, IngestError> {
        let dir_err = |source| IngestError::SourceDir {
            path: cfg.dir.clone(),
            source,
        };
        let meta = tokio::fs::metadata(&cfg.dir).await.map_err(dir_err)?;
        if !meta.is_dir() {
            return Err(dir_err(std::io::Error::new(
                ErrorKind::NotADirectory,
                "not a directory",
            )));
        }
        // Listing now turns a permission problem into a startup error, not a log line.
        let _listing = tokio::fs::read_dir(&cfg.dir).await.map_err(dir_err)?;
        let publisher = Publisher::load(bus, cfg.fleet.clone(), cfg.cluster_id.clone()).await?;
        let mut store = ManifestStore::new();
        store.set_credential_keys(cfg.credential_keys.clone());
        Ok(FileSource {
            cfg,
            publisher,
            store,
            files: Arc::default(),
            last_full_read: None,
            full_read_interval: FULL_READ_INTERVAL,
            // The first round publishes even for an empty directory, so keys left on the
            // bus by an earlier run are swept.
            dirty: Dirty::everything(),
            held: BTreeMap::new(),
            drop_settle: DROP_SETTLE,
            selectors: mesh_config::select_all(),
            metrics: None,
        })
    }

    /// Publishes only objects in the namespaces these discovery selectors select (the
    /// default: every namespace), following their changes.
    pub fn set_discovery_selectors(&mut self, selectors: SelectorsRx) {
        self.selectors = selectors;
        self.dirty.add_all();
    }

    /// Counts publish results in these metrics.
    pub fn set_metrics(&mut self, metrics: PublishMetrics) {
        self.metrics = Some(metrics);
    }

    /// Scans the directory, parses new and changed files, and publishes the result.
    /// Returns an empty report when nothing changed. `Err` only when the directory
    /// cannot be scanned; the published state is then left as it was.
    pub async fn sync_once(&mut self) -> Result<PublishReport, IngestError> {
        let full = self
            .last_full_read
            .is_none_or(|t| t.elapsed() >= self.full_read_interval);
        let dir = self.cfg.dir.clone();
        let known = Arc::clone(&self.files);
        let max_bytes = self.cfg.max_file_bytes;
        // Walking, reading and parsing block; keep them off the async workers.
        let changes = tokio::task::spawn_blocking(move || scan(&dir, &known, full, max_bytes))
            .await
            .map_err(|source| IngestError::Task {
                action: "scanning manifests",
                source,
            })??;
        let observed_at_ms = now_ms();
        if full {
            self.last_full_read = Some(Instant::now());
        }
        let mut holding = BTreeSet::new();
        for change in changes {
            if let Some(path) = self.hold(&change) {
                holding.insert(path);
                continue;
            }
            self.apply(change);
        }
        self.held.retain(|path, _| holding.contains(path));
        if self.selectors.has_changed().unwrap_or(false) {
            self.dirty.add_all();
        }
        if self.publisher.needs_retry() {
            self.dirty.add_all();
        }
        if self.dirty.is_empty() {
            return Ok(PublishReport::default());
        }
        let selectors = self.selectors.borrow_and_update().clone();
        let dirty = std::mem::take(&mut self.dirty);
        let desired = self
            .store
            .desired_state_scoped(&self.cfg.cluster_id, &selectors, &dirty);
        let report = if dirty.is_all() {
            self.publisher.publish(&desired, observed_at_ms).await
        } else {
            self.publisher
                .publish_scoped(&desired, observed_at_ms, &|k| dirty.contains_key(k))
                .await
        };
        if let Some(metrics) = &self.metrics {
            metrics.published(&report);
        }
        Ok(report)
    }

    /// Whether a change must wait for its file to settle (see the module docs); returns
    /// its path if so.
    fn hold(&mut self, change: &Change) -> Option<PathBuf> {
        if self.drop_settle.is_zero() {
            return None;
        }
        let (path, version) = match change {
            Change::Parsed {
                path,
                state,
                parsed,
            } if self.store.would_drop(path, parsed) => (path, state.hash),
            Change::Removed(path) if self.store.objects(path).is_some_and(|o| !o.is_empty()) => {
                (path, None)
            }
            _ => return None,
        };
        let now = Instant::now();
        match self.held.get(path) {
            Some((held, since)) if *held == version => {
                if now.duration_since(*since) >= self.drop_settle {
                    self.held.remove(path);
                    return None;
                }
            }
            _ => {
                debug!(
                    file = %path.display(),
                    settle_ms = self.drop_settle.as_millis() as u64,
                    "a change drops objects; waiting for the file to settle",
                );
                self.held.insert(path.clone(), (version, now));
            }
        }
        Some(path.clone())
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Parsed {
                path,
                state,
                parsed,
            } => {
                debug!(file = %path.display(), "manifest file changed");
                self.store.touch(&path, &mut self.dirty);
                self.store.apply(&path, parsed);
                self.store.touch(&path, &mut self.dirty);
                Arc::make_mut(&mut self.files).insert(path, state);
            }
            Change::Touched { path, stamp } => {
                if let Some(f) = Arc::make_mut(&mut self.files).get_mut(&path) {
                    f.stamp = stamp;
                }
            }
            Change::Unreadable { path, stamp, error } => {
                warn!(
                    file = %path.display(),
                    %error,
                    "cannot read file; keeping its previously published objects",
                );
                // Remember the stamp so the file is retried on change or full re-read,
                // not logged on every poll.
                let hash = self.files.get(&path).and_then(|f| f.hash);
                Arc::make_mut(&mut self.files).insert(path, FileState { stamp, hash });
            }
            Change::Removed(path) => {
                info!(file = %path.display(), "manifest file removed; dropping its objects");
                Arc::make_mut(&mut self.files).remove(&path);
                self.store.touch(&path, &mut self.dirty);
                self.store.remove(&path);
            }
        }
    }

    /// Runs forever: [`FileSource::sync_once`] when the directory's watch reports an
    /// event, when a held change's file has had time to settle, and every poll interval.
    /// Scan errors are logged and retried; they never remove published state.
    pub async fn run(mut self) -> Result<(), IngestError> {
        let mut schedule = Schedule::new(&self.cfg.dir, self.cfg.watch, self.cfg.poll_interval);
        // Warn when scanning starts failing and when it recovers, not on every poll.
        let mut failing = false;
        loop {
            schedule.wait(self.settles_at()).await;
            let result = self.sync_once().await;
            schedule.scanned();
            match result {
                Ok(_) if failing => {
                    info!(dir = %self.cfg.dir.display(), "manifest scan works again");
                    failing = false;
                }
                Ok(_) => {}
                Err(error) if failing => debug!(%error, "manifest scan still failing"),
                Err(error) => {
                    warn!(
                        %error,
                        "manifest scan failed; published state unchanged until it works again",
                    );
                    failing = true;
                }
            }
        }
    }

    /// When the earliest held change's file will have settled, if any is held.
    fn settles_at(&self) -> Option<Instant> {
        let first = self.held.values().map(|(_, since)| *since).min()?;
        Some(first + self.drop_settle)
    }
}

fn stamp_of(meta: &std::fs::Metadata) -> (FileStamp, Option<SystemTime>) {
    let mtime = meta.modified().ok();
    let mtime_ns = mtime
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let stamp = FileStamp {
        mtime_ns,
        len: meta.len(),
    };
    (stamp, mtime)
}

/// Finds what changed in `dir` relative to `known`. With `full`, every file is read and
/// compared by content. Files over `max_bytes` are not read: they are unreadable.
fn scan(
    dir: &Path,
    known: &HashMap<PathBuf, FileState>,
    full: bool,
    max_bytes: u64,
) -> Result<Vec<Change>, IngestError> {
    let mut found = Vec::new();
    let mut uncertain = Vec::new();
    let mut visited = BTreeSet::new();
    walk(dir, true, &mut found, &mut uncertain, &mut visited)?;
    let now = SystemTime::now();
    let mut changes = Vec::new();
    // Files under a path that cannot be examined right now are kept, not removed.
    let listed: HashSet<&Path> = found.iter().map(|(path, _)| path.as_path()).collect();
    for path in known.keys() {
        let hidden = uncertain.iter().any(|d: &PathBuf| path.starts_with(d));
        if !listed.contains(path.as_path()) && !hidden {
            changes.push(Change::Removed(path.clone()));
        }
    }
    drop(listed);
    for (path, meta) in found {
        let (stamp, mtime) = stamp_of(&meta);
        let previous = known.get(&path);
        // A missing or future mtime counts as recent: read rather than trust it.
        let racy = mtime
            .and_then(|t| now.duration_since(t).ok())
            .is_none_or(|age| age < RACY_WINDOW);
        if !full && !racy && previous.is_some_and(|p| p.stamp == stamp) {
            continue;
        }
        if stamp.len > max_bytes {
            // Refused at this stamp already: nothing new to say.
            if previous.is_none_or(|p| p.stamp != stamp) {
                let error = IngestError::FileTooLarge {
                    path: path.clone(),
                    size: stamp.len,
                    limit: max_bytes,
                };
                changes.push(Change::Unreadable { path, stamp, error });
            }
            continue;
        }
        let bytes = match read_at_most(&path, max_bytes) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                // It grew since it was listed.
                let size = std::fs::metadata(&path).map_or(max_bytes + 1, |m| m.len());
                let error = IngestError::FileTooLarge {
                    path: path.clone(),
                    size,
                    limit: max_bytes,
                };
                changes.push(Change::Unreadable { path, stamp, error });
                continue;
            }
            // Vanished between listing and reading: it is removed.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if previous.is_some() {
                    changes.push(Change::Removed(path));
                }
                continue;
            }
            Err(source) => {
                let error = IngestError::ReadFile {
                    path: path.clone(),
                    source,
                };
                changes.push(Change::Unreadable { path, stamp, error });
                continue;
            }
        };
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        if let Some(p) = previous.filter(|p| p.hash == Some(hash)) {
            if p.stamp != stamp {
                changes.push(Change::Touched { path, stamp });
            }
            continue;
        }
        let parsed = match String::from_utf8(bytes) {
            Ok(text) => manifest::parse_file(&path, &text),
            Err(e) => Err(IngestError::ReadFile {
                path: path.clone(),
                source: std::io::Error::new(ErrorKind::InvalidData, e.utf8_error()),
            }),
        };
        let state = FileState {
            stamp,
            hash: Some(hash),
        };
        changes.push(Change::Parsed {
            path,
            state,
            parsed,
        });
    }
    Ok(changes)
}

/// Reads a file of at most `max_bytes`; `None` if it is larger (it may have grown since it
/// was listed: never more than that is read).
fn read_at_most(path: &Path, max_bytes: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max_bytes).then_some(bytes))
}

/// Collects the manifest files under `dir`, following symlinks. Paths that cannot be
/// examined (unlistable directories, unstattable entries) go to `uncertain`.
///
/// Entries whose name starts with `.` are skipped: editors' temporary files, and the
/// `..data`/`..<timestamp>` directories of Kubernetes ConfigMap volumes, whose files are
/// also reachable through the top-level symlinks and would otherwise be read twice.
fn walk(
    dir: &Path,
    root: bool,
    found: &mut Vec<(PathBuf, std::fs::Metadata)>,
    uncertain: &mut Vec<PathBuf>,
    visited: &mut BTreeSet<PathBuf>,
) -> Result<(), IngestError> {
    // A symlink cycle would otherwise recurse forever.
    if let Ok(canonical) = dir.canonicalize() {
        if !visited.insert(canonical) {
            return Ok(());
        }
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(source) if root => {
            return Err(IngestError::SourceDir {
                path: dir.to_path_buf(),
                source,
            })
        }
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            warn!(
                dir = %dir.display(),
                %error,
                "cannot list directory; keeping its files' objects",
            );
            uncertain.push(dir.to_path_buf());
            return Ok(());
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                warn!(
                    dir = %dir.display(),
                    %error,
                    "cannot list directory; keeping its files' objects",
                );
                uncertain.push(dir.to_path_buf());
                return Ok(());
            }
        };
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks; a dangling one is like a vanished file.
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(error) => {
                warn!(file = %path.display(), %error, "cannot stat; skipping");
                uncertain.push(path);
                continue;
            }
        };
        if meta.is_dir() {
            walk(&path, false, found, uncertain, visited)?;
        } else if meta.is_file() && manifest::is_manifest_path(&path) {
            found.push((path, meta));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::CountingBus;
    use shoal_common::bus::Bucket;
    use shoal_common::envelope::Envelope;
    use shoal_common::model::{ConfigObject, ConfigSpec, EndpointSet, Service};

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: reviews, namespace: bookinfo}\nspec: {ports: [{name: http, port: 9080}]}\n";
    const DR: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: bookinfo}\nspec: {host: reviews}\n";

    struct Fixture {
        dir: tempfile::TempDir,
        bus: CountingBus,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                dir: tempfile::tempdir().expect("tempdir"),
                bus: CountingBus::default(),
            }
        }

        fn write(&self, name: &str, text: &str) {
            let path = self.dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(path, text).unwrap();
        }

        /// A source that applies every change at once (no settling).
        async fn source(&self) -> FileSource {
            let mut source = self.settling_source().await;
            source.drop_settle = Duration::ZERO;
            source
        }

        async fn settling_source(&self) -> FileSource {
            let cfg = FileSourceConfig {
                cluster_id: "c1".into(),
                ..FileSourceConfig::new(self.dir.path())
            };
            FileSource::new(cfg, Arc::new(self.bus.clone()))
                .await
                .expect("source")
        }

        async fn keys(&self, bucket: Bucket) -> Vec<String> {
            self.bus.inner.keys(bucket).await.unwrap()
        }

        async fn service(&self) -> Option<Service> {
            let entry = self
                .bus
                .inner
                .get(Bucket::Services, "c1.bookinfo.reviews")
                .await
                .unwrap()?;
            Some(Envelope::<Service>::decode(&entry.value).unwrap().body)
        }

        async fn endpoints(&self, ns: &str) -> EndpointSet {
            let key = format!("c1.{ns}.web.web-1");
            let entry = self.bus.inner.get(Bucket::Endpoints, &key).await.unwrap();
            Envelope::<EndpointSet>::decode(&entry.unwrap().value)
                .unwrap()
                .body
        }

        async fn dr_host(&self) -> Option<String> {
            let key = "DestinationRule.bookinfo.reviews";
            let entry = self.bus.inner.get(Bucket::Config, key).await.unwrap()?;
            match Envelope::<ConfigObject>::decode(&entry.value)
                .unwrap()
                .body
                .spec
            {
                ConfigSpec::DestinationRule(dr) => Some(dr.host),
                _ => None,
            }
        }
    }

    #[tokio::test]
    async fn publishes_then_detects_edit_add_and_remove() {
        let f = Fixture::new();
        f.write("svc.yaml", SVC);
        f.write("nested/deeper/dr.yml", DR);
        f.write("notes.txt", "not a manifest: [");
        f.write(".hidden.yaml", "kind: [");
        let mut src = f.source().await;
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.errors), (2, 0));
        assert_eq!(
            f.keys(Bucket::Config).await,
            vec!["DestinationRule.bookinfo.reviews"]
        );

        // Nothing changed: nothing published.
        assert_eq!(src.sync_once().await.unwrap(), PublishReport::default());

        // Same-size edit right after the write: caught by content, not (mtime, size).
        f.write("svc.yaml", &SVC.replace("9080", "9081"));
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.unchanged), (1, 1));
        assert_eq!(f.service().await.unwrap().ports[0].port, 9081);

        f.write(
            "more.json",
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"ratings"}}"#,
        );
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
        assert_eq!(
            f.keys(Bucket::Services).await,
            vec!["c1.bookinfo.reviews", "c1.default.ratings"]
        );

        std::fs::remove_file(f.dir.path().join("nested/deeper/dr.yml")).unwrap();
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.deletes), (0, 1));
        assert!(f.keys(Bucket::Config).await.is_empty());
    }

    /// The layout of a Kubernetes ConfigMap volume: files are symlinks through `..data`,
    /// which kubelet swaps atomically to a new timestamped directory on update.
    #[cfg(unix)]
    #[tokio::test]
    async fn configmap_volume_swap_and_symlink_loops() {
        use std::os::unix::fs::symlink;
        let f = Fixture::new();
        let root = f.dir.path();
        f.write("..2024_01/svc.yaml", SVC);
        symlink("..2024_01", root.join("..data")).unwrap();
        symlink("..data/svc.yaml", root.join("svc.yaml")).unwrap();
        symlink(".", root.join("loop")).unwrap();
        let mut src = f.source().await;
        assert_eq!(
            src.sync_once().await.unwrap().writes,
            1,
            "read once, not per path"
        );

        f.write("..2024_02/svc.yaml", &SVC.replace("9080", "9090"));
        symlink("..2024_02", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        std::fs::remove_dir_all(root.join("..2024_01")).unwrap();
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
        assert_eq!(f.service().await.unwrap().ports[0].port, 9090);
    }

    #[tokio::test]
    async fn restart_with_unchanged_files_writes_nothing() {
        let f = Fixture::new();
        f.write("all.yaml", &format!("{SVC}---\n{DR}"));
        f.source().await.sync_once().await.unwrap();
        let before = f.bus.counts();
        let r = f.source().await.sync_once().await.unwrap();
        assert_eq!((r.writes, r.deletes, r.unchanged), (0, 0, 2));
        assert_eq!(f.bus.counts(), before);
    }

    #[tokio::test]
    async fn first_sync_of_an_emptied_directory_sweeps_old_keys() {
        let f = Fixture::new();
        f.write("svc.yaml", SVC);
        f.source().await.sync_once().await.unwrap();
        std::fs::remove_file(f.dir.path().join("svc.yaml")).unwrap();
        let r = f.source().await.sync_once().await.unwrap();
        assert_eq!(r.deletes, 1);
        assert!(f.keys(Bucket::Services).await.is_empty());
    }

    #[tokio::test]
    async fn bad_yaml_keeps_old_objects_until_fixed() {
        let f = Fixture::new();
        f.write("all.yaml", &format!("{SVC}---\n{DR}"));
        let mut src = f.source().await;
        src.sync_once().await.unwrap();
        f.write(
            "all.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n",
        );
        let r = src.sync_once().await.unwrap();
        assert!(!r.changed());
        assert!(f.service().await.is_some());
        assert_eq!(f.dr_host().await.as_deref(), Some("reviews"));

        // Fixed, with the DestinationRule gone: now it is deleted.
        f.write("all.yaml", SVC);
        let r = src.sync_once().await.unwrap();
        assert_eq!(r.deletes, 1);
        assert_eq!(f.dr_host().await, None);
    }

    /// A file nested 100 000 `[` deep (195 KiB; 25 s of parser time before the depth
    /// check) and a file over the size limit are refused, quickly and naming the file;
    /// their objects stay, and the rest of the directory applies.
    #[tokio::test]
    async fn deeply_nested_and_oversized_files_are_refused_keeping_their_objects() {
        const RATINGS: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: ratings, namespace: bookinfo}\nspec: {ports: [{name: http, port: 9080}]}\n";
        let f = Fixture::new();
        f.write("all.yaml", &format!("{SVC}---\n{DR}"));
        f.write("ratings.yaml", RATINGS);
        let mut src = f.source().await;
        src.cfg.max_file_bytes = 64 << 10;
        assert_eq!(src.sync_once().await.unwrap().writes, 3);
        let ratings_port = || async {
            let entry = f
                .bus
                .inner
                .get(Bucket::Services, "c1.bookinfo.ratings")
                .await
                .unwrap()
                .unwrap();
            Envelope::<Service>::decode(&entry.value)
                .unwrap()
                .body
                .ports[0]
                .port
        };

        // The DestinationRule replaced by 100 000 nested `[`; ratings changes meanwhile.
        let deep = format!("{SVC}---\nx:\n  {}\n", "[".repeat(100_000));
        f.write("all.yaml", &deep);
        f.write("ratings.yaml", &RATINGS.replace("9080", "9090"));
        let started = std::time::Instant::now();
        let r = src.sync_once().await.unwrap();
        println!("100 000 nested `[`: refused in {:?}", started.elapsed());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!((r.writes, r.deletes), (1, 0));
        assert_eq!(ratings_port().await, 9090);
        assert!(f.service().await.is_some());
        assert_eq!(f.dr_host().await.as_deref(), Some("reviews"));
        let path = f.dir.path().join("all.yaml");
        let err = manifest::parse_file(&path, &deep).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                IngestError::TooDeep {
                    document: 1,
                    line: 7,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains(&path.display().to_string()), "{text}");

        // Over the size limit (a valid file that would drop the DestinationRule): not read.
        let big = format!("{SVC}# {}\n", "x".repeat(70 << 10));
        f.write("all.yaml", &big);
        f.write("ratings.yaml", &RATINGS.replace("9080", "9191"));
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.deletes), (1, 0));
        assert_eq!(ratings_port().await, 9191);
        assert_eq!(f.dr_host().await.as_deref(), Some("reviews"));
        let changes = scan(f.dir.path(), &HashMap::new(), true, 64 << 10).unwrap();
        let refused: Vec<String> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Unreadable { error, .. } => Some(error.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].contains(&path.display().to_string()),
            "{refused:?}"
        );
        assert!(
            refused[0].contains("over the 65536-byte limit"),
            "{refused:?}"
        );

        // Back under the limit: read again, and the DestinationRule goes.
        f.write("all.yaml", SVC);
        assert_eq!(src.sync_once().await.unwrap().deletes, 1);
        assert_eq!(f.dr_host().await, None);
        assert_eq!(FileSourceConfig::new("d").max_file_bytes, 8 << 20);
    }

    #[tokio::test]
    async fn bad_document_keeps_previous_version_while_others_update() {
        let f = Fixture::new();
        f.write("all.yaml", &format!("{SVC}---\n{DR}"));
        let mut src = f.source().await;
        src.sync_once().await.unwrap();
        let bad_dr = DR.replace("spec: {host: reviews}", "spec: {host: ''}");
        f.write(
            "all.yaml",
            &format!("{}---\n{bad_dr}", SVC.replace("9080", "9090")),
        );
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.deletes), (1, 0));
        assert_eq!(f.service().await.unwrap().ports[0].port, 9090);
        assert_eq!(f.dr_host().await.as_deref(), Some("reviews"));
    }

    #[tokio::test]
    async fn pod_change_updates_endpoints_from_another_file() {
        let f = Fixture::new();
        let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: reviews-1, namespace: bookinfo, labels: {kubernetes.io/service-name: reviews}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.1]}]\n";
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: reviews-v1, namespace: bookinfo, labels: {version: v1}}\nspec: {containers: []}\nstatus: {podIP: 10.1.0.1}\n";
        f.write("slice.yaml", slice);
        f.write("pod.yaml", pod);
        let mut src = f.source().await;
        src.sync_once().await.unwrap();
        f.write("pod.yaml", &pod.replace("version: v1", "version: v2"));
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
        let entry = f
            .bus
            .inner
            .get(Bucket::Endpoints, "c1.bookinfo.reviews.reviews-1")
            .await
            .unwrap()
            .unwrap();
        let set = Envelope::<EndpointSet>::decode(&entry.value).unwrap().body;
        assert_eq!(set.endpoints[0].labels["version"], "v2");
    }

    #[tokio::test]
    async fn full_reread_catches_edits_that_keep_mtime_and_size() {
        let f = Fixture::new();
        f.write("svc.yaml", SVC);
        let path = f.dir.path().join("svc.yaml");
        let old = SystemTime::now() - Duration::from_secs(3600);
        let set_mtime = || {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(old).unwrap();
        };
        set_mtime();
        let mut src = f.source().await;
        src.sync_once().await.unwrap();
        f.write("svc.yaml", &SVC.replace("9080", "9081"));
        set_mtime();
        assert!(
            !src.sync_once().await.unwrap().changed(),
            "stamp unchanged, not re-read yet"
        );
        src.full_read_interval = Duration::ZERO;
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
        assert_eq!(f.service().await.unwrap().ports[0].port, 9081);
    }

    #[tokio::test]
    async fn bus_failure_is_retried_without_file_changes() {
        let f = Fixture::new();
        f.write("svc.yaml", SVC);
        let mut src = f.source().await;
        f.bus.set_failing(true);
        assert_eq!(src.sync_once().await.unwrap().errors, 1);
        f.bus.set_failing(false);
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
    }

    #[tokio::test]
    async fn missing_directory_is_a_clear_error() {
        let f = Fixture::new();
        let missing = f.dir.path().join("nope");
        let cfg = FileSourceConfig::new(&missing);
        let err = FileSource::new(cfg, Arc::new(f.bus.clone()))
            .await
            .err()
            .expect("error");
        let msg = err.to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        assert!(matches!(err, IngestError::SourceDir { .. }));

        f.write("file.yaml", SVC);
        let cfg = FileSourceConfig::new(f.dir.path().join("file.yaml"));
        let err = FileSource::new(cfg, Arc::new(f.bus.clone()))
            .await
            .err()
            .expect("error");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn changes_that_drop_objects_wait_for_the_file_to_settle() {
        let f = Fixture::new();
        let two = format!("{SVC}---\n{DR}");
        f.write("all.yaml", &two);
        let mut src = f.settling_source().await;
        src.sync_once().await.unwrap();
        assert!(f.service().await.is_some());
        // Truncated, then half-written: nothing is dropped while the file keeps changing.
        for content in ["", &two[..SVC.len() / 2], ""] {
            f.write("all.yaml", content);
            for _ in 0..3 {
                let r = src.sync_once().await.unwrap();
                assert_eq!(r.deletes, 0, "{content:?}");
                tokio::time::advance(Duration::from_millis(500)).await;
            }
        }
        // The complete new content (an edit that drops nothing) applies at once.
        f.write("all.yaml", &two.replace("9080", "9999"));
        src.sync_once().await.unwrap();
        assert_eq!(f.service().await.map(|s| s.ports[0].port), Some(9999));
        // A removal that lasts applies once the file stayed away for DROP_SETTLE.
        std::fs::remove_file(f.dir.path().join("all.yaml")).unwrap();
        let r = src.sync_once().await.unwrap();
        assert_eq!(r.deletes, 0);
        tokio::time::advance(DROP_SETTLE).await;
        let r = src.sync_once().await.unwrap();
        assert_eq!(r.deletes, 2);
        assert!(f.service().await.is_none());
    }

    /// Waits up to `within` for the published service port to be `want`.
    async fn wait_for_port(f: &Fixture, want: Option<u16>, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        loop {
            if f.service().await.map(|s| s.ports[0].port) == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not published within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn run_polls_an_unwatched_directory_within_a_second() {
        let f = Fixture::new();
        f.write("svc.yaml", SVC);
        let mut src = f.source().await;
        src.cfg.watch = None;
        src.sync_once().await.unwrap();
        let task = tokio::spawn(src.run());
        f.write("svc.yaml", &SVC.replace("9080", "9999"));
        wait_for_port(&f, Some(9999), Duration::from_secs(1), "edit").await;
        std::fs::remove_file(f.dir.path().join("svc.yaml")).unwrap();
        wait_for_port(&f, None, Duration::from_secs(1), "remove").await;
        task.abort();
    }

    /// With a watch, changes are published at once although the poll would wait an hour:
    /// edits, files in directories made after the watch started, a ConfigMap volume's
    /// `..data` swap, the whole directory swapped for another, and a removal held until
    /// its file settled.
    #[cfg(unix)]
    #[tokio::test]
    async fn run_publishes_a_watched_directory_s_changes_without_its_poll() {
        use std::os::unix::fs::symlink;
        let f = Fixture::new();
        let root = f.dir.path();
        f.write("svc.yaml", SVC);
        let mut src = f.settling_source().await;
        src.cfg.watch = Some(Duration::from_secs(3600));
        src.drop_settle = Duration::from_millis(300);
        src.sync_once().await.unwrap();
        let task = tokio::spawn(src.run());
        // The first scan, at once, finds nothing new; the watch is up once it is done.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Generous for a loaded CI machine; it takes milliseconds.
        let soon = Duration::from_millis(900);

        f.write("svc.yaml", &SVC.replace("9080", "9001"));
        wait_for_port(&f, Some(9001), soon, "edit").await;

        std::fs::remove_file(root.join("svc.yaml")).unwrap();
        f.write("new/deeper/svc.yaml", &SVC.replace("9080", "9002"));
        wait_for_port(&f, Some(9002), soon, "a file in a new directory").await;

        // A ConfigMap volume: the file is a symlink through `..data`, swapped on update.
        std::fs::remove_dir_all(root.join("new")).unwrap();
        let version = |n: u16| {
            let dir = root.join(format!("..v{n}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("svc.yaml"), SVC.replace("9080", &n.to_string())).unwrap();
        };
        version(9003);
        symlink("..v9003", root.join("..data")).unwrap();
        symlink("..data/svc.yaml", root.join("svc.yaml")).unwrap();
        wait_for_port(&f, Some(9003), soon, "a ConfigMap volume").await;
        version(9004);
        symlink("..v9004", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        wait_for_port(&f, Some(9004), soon, "a ConfigMap volume's swap").await;

        // The whole directory swapped for another: the watch follows the path, not the
        // moved directory (the short poll finds the new one until it is watched).
        let moved = root.with_extension("old");
        std::fs::rename(root, &moved).unwrap();
        std::fs::create_dir(root).unwrap();
        std::fs::write(root.join("svc.yaml"), SVC.replace("9080", "9005")).unwrap();
        wait_for_port(&f, Some(9005), soon, "a swapped directory").await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        f.write("svc.yaml", &SVC.replace("9080", "9006"));
        wait_for_port(&f, Some(9006), soon, "an edit in the swapped directory").await;
        std::fs::remove_dir_all(&moved).unwrap();

        // The removal is held for the settle time, then applied without a poll.
        std::fs::remove_file(root.join("svc.yaml")).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(f.service().await.map(|s| s.ports[0].port), Some(9006));
        wait_for_port(&f, None, soon, "a settled removal").await;
        task.abort();
    }

    #[tokio::test]
    async fn discovery_selectors_filter_namespaces_and_follow_changes() {
        let f = Fixture::new();
        let ns = |labels: &str| {
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: bookinfo, labels: {labels}}}\n"
            )
        };
        f.write("ns.yaml", &ns("{mesh: 'on'}"));
        f.write("all.yaml", &format!("{SVC}---\n{DR}"));
        f.write(
            "other.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: other}\n",
        );
        let selected = mesh_config::parse(
            Path::new("mesh"),
            "discoverySelectors: [{matchLabels: {mesh: 'on'}}]",
        )
        .unwrap();
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(selected));
        let mut src = f.source().await;
        src.set_discovery_selectors(rx);
        src.sync_once().await.unwrap();
        assert_eq!(f.keys(Bucket::Services).await, vec!["c1.bookinfo.reviews"]);
        assert_eq!(f.dr_host().await.as_deref(), Some("reviews"));

        // Relabelled out: its service, config and labels entry go; back in: they return.
        f.write("ns.yaml", &ns("{mesh: 'off'}"));
        assert_eq!(src.sync_once().await.unwrap().deletes, 3);
        assert!(f.keys(Bucket::Services).await.is_empty());
        assert_eq!(f.dr_host().await, None);
        f.write("ns.yaml", &ns("{mesh: 'on'}"));
        assert_eq!(src.sync_once().await.unwrap().writes, 3);

        // A selector change applies without any file change.
        tx.send_replace(Arc::new(crate::selector::DiscoverySelectors::all()));
        assert_eq!(src.sync_once().await.unwrap().writes, 1);
        assert_eq!(
            f.keys(Bucket::Services).await,
            vec!["c1.bookinfo.reviews", "c1.other.x"]
        );
    }

    /// A change is published at the cost of its namespace: the round recomputes and
    /// compares that namespace's keys only, and the bus ends as a full round would leave it.
    #[tokio::test]
    async fn changes_are_published_at_the_cost_of_their_namespace() {
        let f = Fixture::new();
        let ns = |name: &str, labels: &str| {
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {labels}}}\n"
            )
        };
        let mesh = |ns: &str, ip: &str, version: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
                 apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: {ns}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}], targetRef: {{kind: Pod, name: web-0}}}}]\n---\n\
                 apiVersion: v1\nkind: Pod\nmetadata: {{name: web-0, namespace: {ns}, labels: {{version: {version}}}}}\nspec: {{containers: []}}\nstatus: {{podIP: {ip}}}\n---\n\
                 apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: web, namespace: {ns}}}\nspec: {{host: web}}\n"
            )
        };
        f.write(
            "ns.yaml",
            &format!("{}---\n{}", ns("a", "{}"), ns("b", "{}")),
        );
        f.write("a.yaml", &mesh("a", "10.0.0.1", "v1"));
        f.write("b.yaml", &mesh("b", "10.0.1.1", "v1"));
        let mut src = f.source().await;
        assert_eq!(src.sync_once().await.unwrap().writes, 8);

        // A pod relabel in `a`: a's four keys compared, b's not looked at.
        f.write("a.yaml", &mesh("a", "10.0.0.1", "v2"));
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.unchanged, r.deletes), (1, 3, 0));
        assert_eq!(f.endpoints("a").await.endpoints[0].labels["version"], "v2");

        // `b`'s objects move to namespace `c`: both recomputed (b's Namespace entry compared), b's keys swept.
        f.write("b.yaml", &mesh("c", "10.0.1.1", "v1"));
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.unchanged, r.deletes), (3, 1, 3));

        // The system namespace's network label reaches every namespace's endpoints.
        f.write(
            "ns.yaml",
            &format!(
                "{}---\n{}---\n{}",
                ns("a", "{}"),
                ns("b", "{}"),
                ns("istio-system", "{topology.istio.io/network: net1}")
            ),
        );
        let r = src.sync_once().await.unwrap();
        assert_eq!((r.writes, r.deletes), (3, 0), "{r:?}");
        assert_eq!(f.endpoints("a").await.network, "net1");
        assert_eq!(f.endpoints("c").await.network, "net1");

        // The bus is what a full round from scratch publishes.
        let fresh = Fixture {
            dir: tempfile::tempdir().unwrap(),
            bus: CountingBus::default(),
        };
        for name in ["ns.yaml", "a.yaml", "b.yaml"] {
            let text = std::fs::read_to_string(f.dir.path().join(name)).unwrap();
            fresh.write(name, &text);
        }
        fresh.source().await.sync_once().await.unwrap();
        for bucket in [Bucket::Config, Bucket::Services, Bucket::Endpoints] {
            assert_eq!(f.keys(bucket).await, fresh.keys(bucket).await);
        }
        assert_eq!(f.endpoints("c").await.endpoints[0].labels["version"], "v1");
    }
}
