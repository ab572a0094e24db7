//! One ADS stream, SotW or delta alike: the loop that interleaves a proxy's requests with
//! snapshot pushes ([`drive`]) and the protocol half it drives ([`StreamHandler`],
//! implemented by [`super::sotw::SotwStream`] and [`super::delta::DeltaStream`]). What the
//! two protocols share of a stream's state is the [`Session`]; what each keeps per type is
//! in its own module. go-control-plane's `pkg/server/stream/v3` is the model.

use super::limits::{self, SharedWarnLimiter};
use super::session::Session;
use crate::push::pipeline::Published;
use crate::xds::metrics::CloseReason;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::{watch, Semaphore};
use tokio_stream::wrappers::WatchStream;
use tonic::Status;

/// What a stream needs from outside itself.
pub(crate) struct DriveContext {
    /// The snapshots the stream pushes.
    pub snapshots: watch::Receiver<Option<Published>>,
    /// Turns true when the connection is aged out or drained.
    pub close: Option<watch::Receiver<bool>>,
    /// How many streams generate a push at the same time.
    pub push_limit: Arc<Semaphore>,
    /// Rate limit of the warning logged when a stream is refused.
    pub refusals: SharedWarnLimiter,
}

#[cfg(test)]
impl DriveContext {
    /// A context for driving a stream in-process (tests): no connection to close.
    pub(crate) fn for_tests(
        snapshots: watch::Receiver<Option<Published>>,
        push_limit: usize,
        refusals: SharedWarnLimiter,
    ) -> Self {
        DriveContext {
            snapshots,
            close: None,
            push_limit: Arc::new(Semaphore::new(push_limit)),
            refusals,
        }
    }
}

/// Drives a stream: waits for the first snapshot (serving nothing before the initial state
/// is loaded, since an empty config would tear down a proxy's working one), then
/// interleaves requests and snapshot pushes until either side ends or the connection is
/// closed. Pushes regenerate only the types a change affects, at most `push_limit` streams
/// at a time; a stream never queues more than one pending push (the watch channel keeps
/// only the newest snapshot).
pub(crate) async fn drive<Req, H, S>(mut handler: H, mut requests: S, ctx: DriveContext)
where
    H: StreamHandler<Req>,
    S: futures::Stream<Item = Result<Req, Status>> + Unpin,
{
    let DriveContext {
        mut snapshots,
        close,
        push_limit,
        refusals,
    } = ctx;
    let Ok(first) = snapshots.wait_for(|s| s.is_some()).await.map(|s| s.clone()) else {
        return;
    };
    let mut last = first.as_ref().map(|p| p.snapshot.number).unwrap_or(0);
    let mut current = first.map(|p| p.snapshot);
    // The waits on new snapshots and on the connection's close live as long as the loop:
    // re-creating them at every request and push registered and unregistered a waiter on
    // the snapshot channel, which all streams share (5 % of a push's CPU).
    let mut published_stream = WatchStream::from_changes(snapshots.clone());
    let closed = connection_closed(close);
    tokio::pin!(closed);
    let (reason, error) = loop {
        tokio::select! {
            req = requests.next() => match req {
                None => break (CloseReason::ProxyClosed, None),
                // The request body failed (a reset, a broken connection): nobody to
                // answer.
                Some(Err(status)) if status.code() == tonic::Code::Cancelled => {
                    tracing::debug!(conn = %handler.session().id, %status, "stream error");
                    break (CloseReason::StreamError, None);
                }
                // A request refused as it was read (too big, undecodable, a budget or
                // deadline passed): the proxy is told why, in the stream's status.
                Some(Err(status)) => break (CloseReason::Refused, Some(status)),
                Some(Ok(req)) => {
                    let Some(snap) = current.clone() else { continue };
                    if let Err(status) = handler.on_request(req, &snap).await {
                        break (failure_reason(&status), Some(status));
                    }
                }
            },
            published = published_stream.next() => {
                let Some(published) = published else {
                    break (CloseReason::ServerClosed, None);
                };
                // A snapshot this stream already took as the newer one while it waited
                // for its turn (below).
                let Some(mut p) = published.filter(|p| p.snapshot.number > last) else {
                    continue;
                };
                current = Some(p.snapshot.clone());
                let mut types = if handler.session().identified() {
                    handler.session().affected(&p, last)
                } else {
                    BTreeSet::new()
                };
                last = p.snapshot.number;
                if types.is_empty() {
                    continue;
                }
                let Ok(_permit) = push_limit.acquire().await else {
                    break (CloseReason::ServerClosed, None);
                };
                // Snapshots published while this stream waited for its turn: push the
                // newest (its changes join these). The views have moved on to it, and
                // generating a superseded snapshot for this stream alone would cost a
                // whole output, however little changed.
                let newer = snapshots
                    .borrow()
                    .as_ref()
                    .filter(|n| n.snapshot.number > last)
                    .cloned();
                if let Some(newer) = newer {
                    if handler.session().identified() {
                        types.extend(handler.session().affected(&newer, last));
                    }
                    last = newer.snapshot.number;
                    current = Some(newer.snapshot.clone());
                    p = newer;
                }
                let mut failed = None;
                for ty in handler.watched_types().into_iter().filter(|t| types.contains(t)) {
                    if let Err(status) = handler.push(ty, &p.snapshot, p.observed_at_ms).await {
                        failed = Some(status);
                        break;
                    }
                }
                if let Some(status) = failed {
                    break (failure_reason(&status), Some(status));
                }
            }
            () = &mut closed => {
                tracing::debug!(conn = %handler.session().id, "connection closing; ending stream");
                break (CloseReason::ServerClosed, None);
            }
        }
    };
    // The session unregisters the stream and counts the reason when dropped, also when
    // this task panics (reason `aborted`).
    handler.session_mut().close_reason = reason;
    if let Some(status) = error {
        if status.code() != tonic::Code::Cancelled {
            if let Some(suppressed) = limits::check_shared(&refusals) {
                tracing::warn!(conn = %handler.session().id, %status, suppressed, "closing xDS stream");
            }
        }
        handler.fail(status).await;
    }
}

/// The close reason of a stream that ended with `status`: a response that could not be
/// written (the proxy is gone), or a refused request.
fn failure_reason(status: &Status) -> CloseReason {
    if status.code() == tonic::Code::Cancelled {
        CloseReason::SendFailed
    } else {
        CloseReason::Refused
    }
}

async fn connection_closed(close: Option<watch::Receiver<bool>>) {
    match close {
        Some(mut rx) => {
            if rx.wait_for(|c| *c).await.is_err() {
                // The connection task is gone: nothing will signal; never fire.
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The protocol-specific half of a stream.
#[tonic::async_trait]
pub(crate) trait StreamHandler<Req>: Send {
    /// The shared session.
    fn session(&self) -> &Session;
    /// The shared session, mutably.
    fn session_mut(&mut self) -> &mut Session;
    /// Handles one request.
    async fn on_request(
        &mut self,
        req: Req,
        snap: &Arc<crate::generate::Snapshot>,
    ) -> Result<(), Status>;
    /// The types this stream has subscribed to, in push order.
    fn watched_types(&self) -> Vec<shoal_proto::XdsType>;
    /// Pushes one type of a new snapshot, if its content changed for this proxy.
    async fn push(
        &mut self,
        ty: shoal_proto::XdsType,
        snap: &Arc<crate::generate::Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status>;
    /// Ends the stream with an error status.
    async fn fail(&mut self, status: Status);
}

#[cfg(test)]
mod merge_tests {
    //! A stream busy with a push never queues more: snapshots published meanwhile merge into
    //! one push of the newest.
    use super::*;
    use crate::generate::cache::GeneratorCache;
    use crate::generate::metrics::CacheMetrics;
    use crate::generate::Snapshot;
    use crate::push::pipeline::ChangeSet;
    use crate::push::view::{Generation, Views};
    use crate::xds::metrics::XdsMetrics;
    use crate::xds::registry::Registry;
    use crate::xds::session::Mode;
    use shoal_proto::XdsType;
    use std::sync::Mutex;
    use tokio::sync::Notify;

    struct Recorder {
        session: Session,
        pushed: Arc<Mutex<Vec<(u64, XdsType)>>>,
        gate: Arc<Notify>,
    }

    #[tonic::async_trait]
    impl StreamHandler<()> for Recorder {
        fn session(&self) -> &Session {
            &self.session
        }
        fn session_mut(&mut self) -> &mut Session {
            &mut self.session
        }
        async fn on_request(&mut self, _req: (), _snap: &Arc<Snapshot>) -> Result<(), Status> {
            Ok(())
        }
        fn watched_types(&self) -> Vec<XdsType> {
            vec![XdsType::Cluster]
        }
        async fn push(
            &mut self,
            ty: XdsType,
            snap: &Arc<Snapshot>,
            _obs: Option<u64>,
        ) -> Result<(), Status> {
            self.pushed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((snap.number, ty));
            // Stay busy until the test lets this push finish.
            self.gate.notified().await;
            Ok(())
        }
        async fn fail(&mut self, _status: Status) {}
    }

    fn published(number: u64) -> Option<Published> {
        Some(Published {
            snapshot: Arc::new(Snapshot {
                ctx: Default::default(),
                endpoints: Default::default(),
                number,
            }),
            observed_at_ms: None,
            changes: Arc::new(ChangeSet {
                full: true,
                ..Default::default()
            }),
            published_at_ms: 0,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn snapshots_published_during_a_push_merge_into_one() {
        let metrics = XdsMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(
            1 << 20,
            false,
            CacheMetrics::register(&prometheus::Registry::new()),
        );
        let views = Views::new(Generation::new(cache, 1));
        let mut session = Session::new(
            "t".into(),
            Mode::Sotw,
            Registry::default(),
            metrics,
            views,
            None,
        );
        let node = crate::index::proxy::tests::node(
            "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local",
            "ns",
            &[],
        );
        session.identify(Some(&node)).expect("valid node");
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let handler = Recorder {
            session,
            pushed: pushed.clone(),
            gate: gate.clone(),
        };
        let (tx, rx) = watch::channel(published(1));
        let ctx = DriveContext {
            snapshots: rx,
            close: None,
            push_limit: Arc::new(Semaphore::new(10)),
            refusals: SharedWarnLimiter::default(),
        };
        let task = tokio::spawn(drive(
            handler,
            futures::stream::pending::<Result<(), Status>>(),
            ctx,
        ));
        let pushes = || pushed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Let the stream start on snapshot 1.
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;

        tx.send(published(2)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushes(),
            vec![(2, XdsType::Cluster)],
            "snapshot 2 is being pushed"
        );
        // Busy: three more snapshots arrive.
        for n in 3..=5 {
            tx.send(published(n)).expect("stream alive");
        }
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushes(),
            vec![(2, XdsType::Cluster), (5, XdsType::Cluster)],
            "3 and 4 merged into the push of 5"
        );
        task.abort();
    }

    /// A stream that waits for a push permit while newer snapshots arrive pushes the newest
    /// (with the changes of the ones it skipped), never a superseded one.
    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_for_its_turn_pushes_the_newest_snapshot() {
        let metrics = XdsMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(
            1 << 20,
            false,
            CacheMetrics::register(&prometheus::Registry::new()),
        );
        let views = Views::new(Generation::new(cache, 1));
        let mut session = Session::new(
            "t".into(),
            Mode::Sotw,
            Registry::default(),
            metrics,
            views,
            None,
        );
        let node = crate::index::proxy::tests::node(
            "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local",
            "ns",
            &[],
        );
        session.identify(Some(&node)).expect("valid node");
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let handler = Recorder {
            session,
            pushed: pushed.clone(),
            gate: gate.clone(),
        };
        let (tx, rx) = watch::channel(published(1));
        let push_limit = Arc::new(Semaphore::new(1));
        // Another stream holds the only permit.
        let busy = push_limit.clone().acquire_owned().await.expect("permit");
        let ctx = DriveContext {
            snapshots: rx,
            close: None,
            push_limit,
            refusals: SharedWarnLimiter::default(),
        };
        let task = tokio::spawn(drive(
            handler,
            futures::stream::pending::<Result<(), Status>>(),
            ctx,
        ));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        tx.send(published(2)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        tx.send(published(3)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        drop(busy);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushed.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            vec![(3, XdsType::Cluster)],
            "snapshot 2 was superseded while the stream waited"
        );
        task.abort();
    }
}
