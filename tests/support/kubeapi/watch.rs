//! Watch streams: newline-delimited `{"type": ..., "object": ...}` events, replayed from the
//! event history after the requested resourceVersion and then followed live, with periodic
//! bookmarks, `timeoutSeconds`, and selector transitions the way the watch cache converts
//! events (an object that stops matching is DELETED for that watch, one that starts matching
//! is ADDED).

use super::status::ApiError;
use super::store::{parse_rv, present, Event, Filter, ResourceDef, Store};
use super::{Shared, WatchClient};
use bytes::Bytes;
use futures::Stream;
use serde_json::{json, Value};
use shoal_common::time::sleep_until;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What a watch request asked for.
pub(crate) struct WatchRequest {
    pub(crate) res: ResourceDef,
    pub(crate) version: String,
    pub(crate) filter: Filter,
    /// The raw `resourceVersion` parameter.
    pub(crate) resource_version: Option<String>,
    pub(crate) send_initial_events: Option<bool>,
    pub(crate) bookmarks: bool,
    pub(crate) timeout: Option<Duration>,
    /// Objects as `PartialObjectMetadata`.
    pub(crate) partial: bool,
}

/// Counts the watch as open, and lists its client, while it lives.
struct OpenGuard(Arc<Shared>, u64);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0
            .counters
            .watches_open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0
            .counters
            .watch_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

struct Watcher {
    shared: Arc<Shared>,
    req: WatchRequest,
    /// Every event up to this revision has been sent (or filtered out).
    cursor: u64,
    pending: VecDeque<Bytes>,
    finished: bool,
    revisions: watch::Receiver<u64>,
    drops: watch::Receiver<u64>,
    intervals: watch::Receiver<Duration>,
    deadline: Option<Instant>,
    next_bookmark: Instant,
    _open: OpenGuard,
}

/// Starts a watch: validates the request and returns the stream of event lines.
pub(crate) fn open(
    shared: Arc<Shared>,
    req: WatchRequest,
    client: WatchClient,
) -> Result<impl Stream<Item = Bytes> + Send, ApiError> {
    let start = match req.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(parse_rv(rv)?),
    };
    let mut revisions = shared.revision.subscribe();
    revisions.borrow_and_update();
    let mut drops = shared.drops.subscribe();
    drops.borrow_and_update();
    let mut intervals = shared.bookmark_interval.subscribe();
    let interval = *intervals.borrow_and_update();
    shared.count_watch(&req.res);
    let id = shared.add_watch_client(client);
    let now = Instant::now();
    let mut watcher = Watcher {
        shared: shared.clone(),
        cursor: 0,
        pending: VecDeque::new(),
        finished: false,
        revisions,
        drops,
        intervals,
        deadline: req.timeout.map(|t| now + t),
        next_bookmark: now + interval,
        _open: OpenGuard(shared.clone(), id),
        req,
    };
    shared.read(|store| match (watcher.req.send_initial_events, start) {
        // "Get state and start at most recent": synthetic ADDED events for the current state,
        // then (for streaming lists) a bookmark marking their end.
        (Some(true), _) | (None, None) => {
            watcher.cursor = store.revision();
            watcher.initial_state(store);
            if watcher.req.send_initial_events == Some(true) {
                watcher.bookmark(true);
            }
        }
        (Some(false), None) => watcher.cursor = store.revision(),
        (_, Some(rv)) => {
            watcher.cursor = rv;
            watcher.collect(store);
        }
    });
    Ok(futures::stream::unfold(watcher, |mut w| async move {
        let line = w.next().await?;
        Some((line, w))
    }))
}

impl Watcher {
    fn present(&self, object: &Value) -> Value {
        if self.req.partial {
            json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
            })
        } else {
            present(object, &self.req.res, &self.req.version)
        }
    }

    fn push(&mut self, kind: &str, object: Value) {
        let mut line = json!({"type": kind, "object": object}).to_string();
        line.push('\n');
        self.pending.push_back(Bytes::from(line));
    }

    fn initial_state(&mut self, store: &Store) {
        let Ok(page) = store.list(&self.req.res, &self.req.filter, None, None, None) else {
            return;
        };
        for object in page.items {
            let object = self.present(&object);
            self.push("ADDED", object);
        }
    }

    /// How the watch cache shows `event` to this watch, if at all.
    fn convert(&self, event: &Event) -> Option<(&'static str, Value)> {
        if event.gr != self.req.res.gr() {
            return None;
        }
        let passes = |o: &&Value| self.req.filter.matches(&event.key, o);
        match (
            event.object.as_ref().filter(passes),
            event.prev.as_ref().filter(passes),
        ) {
            (Some(now), None) => Some(("ADDED", self.present(now))),
            (Some(now), Some(_)) => Some(("MODIFIED", self.present(now))),
            // The previous state, at the revision of the change.
            (None, Some(before)) => {
                let mut before = self.present(before);
                before["metadata"]["resourceVersion"] = json!(event.rv.to_string());
                Some(("DELETED", before))
            }
            (None, None) => None,
        }
    }

    /// Queues the events after the cursor; ends the watch with 410 Expired when some of
    /// them were compacted away, and (after its last events) when the resource is no longer
    /// served, as when its CRD was deleted.
    fn collect(&mut self, store: &Store) {
        if self.finished {
            return;
        }
        if self.cursor < store.oldest() {
            let expired = ApiError::expired(format!(
                "too old resource version: {} ({})",
                self.cursor,
                store.oldest()
            ));
            self.push("ERROR", expired.status());
            self.finished = true;
            return;
        }
        let events: Vec<(&'static str, Value)> = store
            .events_after(self.cursor)
            .filter_map(|e| self.convert(e))
            .collect();
        for (kind, object) in events {
            self.push(kind, object);
        }
        self.cursor = self.cursor.max(store.revision());
        let res = &self.req.res;
        if store
            .resource(&res.group, &res.plural)
            .is_none_or(|r| !r.serves(&self.req.version))
        {
            self.finished = true;
        }
    }

    fn bookmark(&mut self, initial_events_end: bool) {
        let mut metadata = json!({"resourceVersion": self.cursor.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (api_version, kind) = if self.req.partial {
            (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadata".to_string(),
            )
        } else {
            (
                self.req.res.api_version(&self.req.version),
                self.req.res.kind.clone(),
            )
        };
        self.push(
            "BOOKMARK",
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata}),
        );
    }

    fn refresh(&mut self) {
        let shared = self.shared.clone();
        shared.read(|store| self.collect(store));
    }

    /// The next line to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if self.finished {
                return None;
            }
            // Biased: a drop or the deadline wins over events that are ready at the same time.
            tokio::select! {
                biased;
                _ = self.drops.changed() => self.finished = true,
                _ = sleep_until(self.deadline) => self.finished = true,
                changed = self.revisions.changed() => match changed {
                    Ok(()) => self.refresh(),
                    Err(_) => self.finished = true,
                },
                changed = self.intervals.changed() => match changed {
                    Ok(()) => self.next_bookmark = Instant::now() + *self.intervals.borrow_and_update(),
                    Err(_) => self.finished = true,
                },
                _ = tokio::time::sleep_until(self.next_bookmark), if self.req.bookmarks => {
                    self.refresh();
                    if !self.finished {
                        self.bookmark(false);
                    }
                    self.next_bookmark = Instant::now() + *self.intervals.borrow();
                }
            }
        }
    }
}
