//! Change events for the manifest directory: what wakes the file source before its poll.
//!
//! The poll alone puts its interval (250 ms) between a write and its observation, and
//! walks the whole directory four times a second while nothing changes. With a watch
//! (inotify on Linux, through `notify`), a write is seen within milliseconds and the poll
//! is only a safety net for what events miss: network filesystems, where changes made on
//! another machine raise none, and an overflowed event queue. An event only wakes a scan;
//! the scan, not the event, says what changed, so a missed or spurious event costs a
//! delay or a scan, never a wrong state.

use notify::event::ModifyKind;
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long the events of one write (truncate, write, close; a rename's pair) are
/// gathered before the scan they wake.
const GATHER: Duration = Duration::from_millis(5);

/// The least time between the end of one scan and the start of the next that an event
/// wakes: a file rewritten without pause costs at most a scan per this interval.
const MIN_GAP: Duration = Duration::from_millis(50);

/// How long after a failed attempt to watch the directory the next one is made (polling
/// meanwhile). A directory that was moved away is watched again at once.
const RETRY: Duration = Duration::from_secs(10);

/// When the file source scans its directory: soon after a watch event, when a held
/// change is due, and every poll interval (the watched one, or the short one while the
/// directory cannot be watched). It keeps the directory watched: a watch that cannot
/// start is tried again every [`RETRY`], one whose directory was moved away at once.
pub struct Schedule {
    dir: PathBuf,
    /// The poll while watched (`None`: never watched).
    watched_poll: Option<Duration>,
    /// The poll while not watched.
    unwatched_poll: Duration,
    watch: Option<DirWatch>,
    /// When to try to watch again (a watch costs a thread and a walk of the tree).
    watch_at: Instant,
    /// Warned that the directory cannot be watched, once until it can.
    unwatched_warned: bool,
    next_poll: Instant,
    last_scan: Instant,
}

impl Schedule {
    /// A schedule for `dir`: watched with a poll every `watched_poll` if given (and the
    /// watch starts), polled every `unwatched_poll` otherwise. The first scan is due now.
    pub fn new(dir: &Path, watched_poll: Option<Duration>, unwatched_poll: Duration) -> Self {
        let now = Instant::now();
        Schedule {
            dir: dir.to_path_buf(),
            watched_poll,
            unwatched_poll,
            watch: None,
            watch_at: now,
            unwatched_warned: false,
            next_poll: now,
            last_scan: now,
        }
    }

    /// Returns when the next scan is due: an event (after [`GATHER`], and at least
    /// [`MIN_GAP`] after the last scan), the poll, or `held`, when a held change settles.
    pub async fn wait(&mut self, held: Option<Instant>) {
        self.keep_watched();
        let due = held.map_or(self.next_poll, |at| at.min(self.next_poll));
        match &self.watch {
            Some(watch) => tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = watch.changed() => {
                    let gathered = Instant::now() + GATHER;
                    tokio::time::sleep_until(gathered.max(self.last_scan + MIN_GAP)).await;
                }
            },
            None => tokio::time::sleep_until(due).await,
        }
    }

    /// Records that a scan just ended: the next poll is one period from now.
    pub fn scanned(&mut self) {
        self.last_scan = Instant::now();
        if self.watch.as_ref().is_some_and(DirWatch::lost) {
            info!(dir = %self.dir.display(), "the manifest directory was moved or removed; watching its path again");
            self.watch = None;
            self.watch_at = self.last_scan;
        }
        // A zero period would scan without pause.
        let period = match (&self.watch, self.watched_poll) {
            (Some(_), Some(poll)) => poll,
            _ => self.unwatched_poll,
        };
        self.next_poll = self.last_scan + period.max(Duration::from_millis(1));
    }

    /// Starts the watch if one is wanted, none runs and a try is due.
    fn keep_watched(&mut self) {
        let Some(poll) = self.watched_poll else {
            return;
        };
        let now = Instant::now();
        if self.watch.is_some() || now < self.watch_at {
            return;
        }
        self.watch_at = now + RETRY;
        match DirWatch::start(&self.dir) {
            Ok(started) => {
                info!(
                    dir = %self.dir.display(),
                    poll_ms = poll.as_millis() as u64,
                    "watching the manifest directory for changes",
                );
                self.watch = Some(started);
                self.unwatched_warned = false;
            }
            Err(error) if !self.unwatched_warned => {
                warn!(
                    dir = %self.dir.display(),
                    %error,
                    poll_ms = self.unwatched_poll.as_millis() as u64,
                    "cannot watch the manifest directory; polling it instead",
                );
                self.unwatched_warned = true;
            }
            Err(error) => debug!(%error, "manifest directory still not watchable"),
        }
    }
}

/// A recursive watch of a directory; [`DirWatch::changed`] returns after an event that
/// may concern a manifest.
pub struct DirWatch {
    // Dropping the watcher ends the watch.
    _watcher: RecommendedWatcher,
    wake: Arc<Notify>,
    /// The directory itself was moved or removed: the watch follows what was there, not
    /// what is at its path now (a deployment that swaps the whole directory).
    lost: Arc<AtomicBool>,
}

impl DirWatch {
    /// Watches `dir` and everything under it, following symlinks (ConfigMap volumes).
    pub fn start(dir: &Path) -> notify::Result<DirWatch> {
        let root = std::path::absolute(dir).map_err(notify::Error::io)?;
        let wake = Arc::new(Notify::new());
        let lost = Arc::new(AtomicBool::new(false));
        let (waker, root_lost) = (wake.clone(), lost.clone());
        let watched = root.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
            match event {
                Ok(event) if is_gone(&event, &watched) => {
                    root_lost.store(true, Ordering::Relaxed);
                    waker.notify_one();
                }
                Ok(event) if !concerns_manifests(&event) => {}
                Ok(_) => waker.notify_one(),
                // An overflowed queue or a failed sub-watch: a scan finds what was missed.
                Err(error) => {
                    debug!(%error, "manifest directory watch error; scanning");
                    waker.notify_one();
                }
            }
        })?;
        watcher.watch(&root, RecursiveMode::Recursive)?;
        Ok(DirWatch {
            _watcher: watcher,
            wake,
            lost,
        })
    }

    /// Whether the watched directory was moved or removed since the watch started: a new
    /// watch of the path is needed.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Returns once an event came since the last call (at once if one already has).
    pub async fn changed(&self) {
        self.wake.notified().await;
    }
}

/// Whether an event says that the watched directory itself was moved or removed.
fn is_gone(event: &Event, root: &Path) -> bool {
    matches!(
        event.kind,
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
    ) && event.paths.iter().any(|p| p == root)
}

/// Whether an event can change what a scan finds. Reads (the scan's own opens among them)
/// cannot; nor can writes to files the scan skips: dot files other than a ConfigMap
/// volume's `..data` swaps, and files with another extension (`.swp`, `~` backups, logs).
/// Extensionless names may be directories, so they count.
fn concerns_manifests(event: &Event) -> bool {
    if matches!(event.kind, EventKind::Access(_)) {
        return false;
    }
    // An event without paths (a rescan request) concerns everything.
    event.paths.is_empty() || event.paths.iter().any(|p| may_hold_manifests(p))
}

fn may_hold_manifests(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return true;
    };
    if name.starts_with("..") {
        return true;
    }
    if name.starts_with('.') || name.ends_with('~') {
        return false;
    }
    path.extension().is_none() || super::manifest::is_manifest_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, ModifyKind};
    use std::path::PathBuf;

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn only_events_that_can_change_a_scan_wake_it() {
        let write = EventKind::Modify(ModifyKind::Any);
        for path in [
            "/m/svc.yaml",
            "/m/a/b.yml",
            "/m/x.json",
            "/m/..data",
            "/m/..2026_11_28",
            "/m/newdir",
        ] {
            assert!(concerns_manifests(&event(write, path)), "{path}");
        }
        for path in [
            "/m/.svc.yaml.swp",
            "/m/svc.yaml~",
            "/m/notes.txt",
            "/m/app.log",
        ] {
            assert!(!concerns_manifests(&event(write, path)), "{path}");
        }
        let open = EventKind::Access(AccessKind::Open(notify::event::AccessMode::Any));
        assert!(!concerns_manifests(&event(open, "/m/svc.yaml")));
        assert!(concerns_manifests(&Event::new(EventKind::Create(
            CreateKind::Any
        ))));
    }
}
