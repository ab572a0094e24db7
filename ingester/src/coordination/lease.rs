//! Leader election between the replicas of one fleet, through a lease on the bus.
//!
//! The lease is one key in `shoal-meta`, `lease.<fleet>`, holding a
//! [`LeaseBody`] `{holder, epoch, renewed_at_ms, ttl_ms}`, and it is only ever written with
//! compare-and-set on its revision:
//!
//! - **Acquire**: when the key is absent (epoch 1, or one more than the last epoch this
//!   replica saw), released (`ttl_ms` 0), or expired. Every acquisition increments the
//!   epoch, which the leader stamps into everything it writes.
//! - **Expiry** is measured on the standby's own clock: the lease has expired when its
//!   revision has not changed for its `ttl` since this replica first saw that revision,
//!   so clock skew between hosts does not matter. A lease whose `renewed_at_ms` is more
//!   than two ttls old by the wall clock (one ttl of allowance for skew) is expired at
//!   once: a fleet that was stopped does not make a new replica wait.
//! - **Renew** every ttl/3. The holder may write until `ttl - ttl/4` after it *sent* its
//!   last successful renewal: since a standby starts counting no earlier than when the
//!   renewal was written, the holder stops writing at least ttl/4 before any standby can
//!   take over. A renewal that fails on a revision mismatch (someone took the lease), that
//!   cannot be done before that deadline, or that times out ends the term at once.
//! - **Release** on shutdown: the holder stops writing, then writes the lease with
//!   `ttl_ms` 0 so that a standby takes over without waiting for expiry.
//!
//! An instance restarted with the same `--instance-id` (a container restart in the same
//! pod) takes its own lease back at once; the new term still gets a new epoch.
//!
//! **Implausible epochs.** A takeover writes one more than the highest epoch its replica
//! saw, so a lease whose epoch jumps far above the last one seen
//! ([`lease::epoch_jump`]) was not written by a replica: it is forged or corrupt, and
//! obeyed it would leave every real write fenced (servers refuse it too). The holder that
//! finds such a lease over its own writes its own lease back over it (compare-and-set on
//! what it read) and keeps leading; a standby does not adopt the epoch. Both log it and
//! count it in `shoal_ingester_lease_epoch_refused_total`.
//!
//! The term is published on a watch channel that [`Leadership`] reads: leading or not,
//! the epoch, and the write deadline, which [`Leadership::current`] checks on every write.

use crate::coordination::metrics::CoordinationMetrics;
use shoal_common::bus::{Bucket, BusError, Entry, StateBus};
use shoal_common::envelope::now_ms;
use shoal_common::keys;
use shoal_common::lease::{self, LeaseBody};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::{timeout, Instant};
use tracing::{debug, info, warn};

/// A leadership term as the elector publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// Whether this ingester holds the lease.
    pub leading: bool,
    /// The lease epoch stamped into every write of this term (0 without a lease).
    pub epoch: u64,
    /// Until when writes are allowed: the holder's own deadline, a safety margin before
    /// any other replica may consider the lease expired. `None`: no deadline (no lease).
    pub until: Option<Instant>,
}

impl Term {
    /// Not leading.
    pub fn standby() -> Term {
        Term {
            leading: false,
            epoch: 0,
            until: None,
        }
    }
}

/// Whether this ingester may write, and with which epoch: the lease state of its fleet
/// (see the module docs). A publisher that does not lead writes nothing and publishes
/// everything that differs once it leads. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: tokio::sync::watch::Receiver<Term>,
    elected: bool,
}

impl Leadership {
    /// Always leading, with epoch 0 and no lease: the file source and standalone mode.
    pub fn always() -> Leadership {
        let term = Term {
            leading: true,
            epoch: 0,
            until: None,
        };
        Leadership {
            rx: tokio::sync::watch::channel(term).1,
            elected: false,
        }
    }

    /// Leadership as decided by an election that updates `rx`.
    pub fn from_watch(rx: tokio::sync::watch::Receiver<Term>) -> Leadership {
        Leadership { rx, elected: true }
    }

    /// The epoch to write with if this ingester leads now (within its term's deadline).
    pub fn current(&self) -> Option<u64> {
        let term = *self.rx.borrow();
        let in_time = term.until.is_none_or(|until| Instant::now() < until);
        (term.leading && in_time).then_some(term.epoch)
    }

    /// Whether this ingester leads now.
    pub fn leads(&self) -> bool {
        self.current().is_some()
    }

    /// Whether leadership comes from an election (a lease), as opposed to [`Leadership::always`].
    pub fn is_elected(&self) -> bool {
        self.elected
    }

    /// Waits until the term changes (this ingester starts or stops leading). Never
    /// resolves for [`Leadership::always`].
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The shortest lease ttl accepted.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// How long a release may take on shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Configuration of an [`Elector`].
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The fleet whose lease this is.
    pub fleet: String,
    /// This replica's identity, written as the holder.
    pub instance_id: String,
    /// How long the lease stays valid after a renewal.
    pub ttl: Duration,
}

impl LeaseConfig {
    /// Renewals are this far apart.
    pub fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }

    /// The holder stops writing this long before a standby may take over.
    pub fn safety_margin(&self) -> Duration {
        self.ttl / 4
    }

    /// A standby reads the lease this often.
    pub fn poll_interval(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// This replica's default instance ID: the host name (the pod name in Kubernetes) and
/// the process ID.
pub fn default_instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "shoal-ingester".to_string());
    format!("{host}-{}", std::process::id())
}

/// The lease this replica holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: u64,
    /// The lease's revision when this term took it ([`LeaseBody::since_revision`]).
    since_revision: u64,
    /// The revision of the lease key this replica last wrote.
    revision: u64,
    /// Writes are allowed until then.
    until: Instant,
}

/// Runs the election for one replica (see the module docs).
pub struct Elector {
    bus: Arc<dyn StateBus>,
    cfg: LeaseConfig,
    key: String,
    metrics: CoordinationMetrics,
    term: watch::Sender<Term>,
    held: Option<Held>,
    /// The lease revision a standby last saw and when it first saw it (its own clock).
    observed: Option<(u64, Instant)>,
    /// The highest epoch seen, so that a new lease never goes back.
    highest_epoch: u64,
    /// The revision this replica last wrote: its own lease, if nobody wrote since.
    last_written: Option<u64>,
    ever_held: bool,
    /// The holder last logged, so a standby logs a change of leader once.
    last_holder: Option<String>,
    /// When the last renewal attempt failed without ending the term, to retry sooner.
    renewal_failed: bool,
    /// The revision of the last lease refused for its epoch jump (reported once).
    refused_jump: Option<u64>,
}

impl Elector {
    /// An elector, not leading yet, and the [`Leadership`] that follows it.
    pub fn new(
        bus: Arc<dyn StateBus>,
        cfg: LeaseConfig,
        metrics: CoordinationMetrics,
    ) -> (Elector, Leadership) {
        let (term, rx) = watch::channel(Term::standby());
        metrics.leader.set(0);
        let elector = Elector {
            key: keys::lease_key(&cfg.fleet),
            bus,
            cfg,
            metrics,
            term,
            held: None,
            observed: None,
            highest_epoch: 0,
            last_written: None,
            ever_held: false,
            last_holder: None,
            renewal_failed: false,
            refused_jump: None,
        };
        (elector, Leadership::from_watch(rx))
    }

    /// Runs until `stop` fires (or its sender is dropped), then releases the lease if it
    /// holds it.
    pub async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        info!(
            fleet = %self.cfg.fleet,
            holder = %self.cfg.instance_id,
            ttl_ms = self.cfg.ttl.as_millis() as u64,
            "starting leader election"
        );
        loop {
            self.step().await;
            tokio::select! {
                () = tokio::time::sleep(self.next_wait()) => {}
                _ = &mut stop => {
                    self.release().await;
                    return;
                }
            }
        }
    }

    /// Whether this replica holds the lease (as far as it knows).
    pub fn is_leader(&self) -> bool {
        self.held.is_some()
    }

    /// How long to wait before the next step.
    pub fn next_wait(&self) -> Duration {
        match &self.held {
            Some(_) if self.renewal_failed => self.cfg.poll_interval(),
            Some(_) => self.cfg.renew_interval(),
            None => self.cfg.poll_interval(),
        }
    }

    /// One round: renew the lease when holding it, else see whether it can be taken.
    pub async fn step(&mut self) {
        match self.held {
            Some(held) => self.renew(held).await,
            None => self.try_acquire().await,
        }
    }

    fn body(&self, epoch: u64, since_revision: u64, ttl: Duration) -> LeaseBody {
        LeaseBody {
            holder: self.cfg.instance_id.clone(),
            epoch,
            renewed_at_ms: now_ms(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            since_revision,
        }
    }

    /// Writes the lease with compare-and-set on `expected`, within `limit`.
    async fn write(
        &self,
        body: &LeaseBody,
        expected: u64,
        limit: Duration,
    ) -> Result<u64, WriteError> {
        let value =
            lease::encode(&self.cfg.fleet, body).map_err(|e| WriteError::Other(e.to_string()))?;
        match timeout(
            limit,
            self.bus
                .update(Bucket::Meta, &self.key, value.into(), expected),
        )
        .await
        {
            Ok(Ok(revision)) => Ok(revision),
            Ok(Err(BusError::RevisionMismatch { .. })) => Err(WriteError::Taken),
            Ok(Err(error)) => Err(WriteError::Other(error.to_string())),
            Err(_) => Err(WriteError::Other(format!(
                "no answer within {} ms",
                limit.as_millis()
            ))),
        }
    }

    async fn renew(&mut self, held: Held) {
        let sent = Instant::now();
        if sent >= held.until {
            return self.step_down(held.epoch, "the lease could not be renewed in time");
        }
        let body = self.body(held.epoch, held.since_revision, self.cfg.ttl);
        match self.write(&body, held.revision, held.until - sent).await {
            Ok(revision) => {
                self.renewed(held, revision, sent);
                debug!(fleet = %self.cfg.fleet, epoch = held.epoch, revision, "renewed the lease");
            }
            Err(WriteError::Taken) => {
                if self.write_back_over_a_jump(held).await {
                    return;
                }
                let holder = self.current_holder().await;
                self.step_down(
                    held.epoch,
                    &format!("the lease was taken over (now held by {holder})"),
                );
            }
            Err(WriteError::Other(error)) => {
                if Instant::now() >= held.until {
                    return self
                        .step_down(held.epoch, &format!("renewing the lease failed: {error}"));
                }
                warn!(
                    fleet = %self.cfg.fleet,
                    epoch = held.epoch,
                    %error,
                    "renewing the lease failed; retrying while the term lasts"
                );
                self.renewal_failed = true;
            }
        }
    }

    /// This term's lease was written at `revision` (the write sent at `sent`): the term
    /// lasts one more ttl from then.
    fn renewed(&mut self, held: Held, revision: u64, sent: Instant) {
        let until = sent + self.cfg.ttl - self.cfg.safety_margin();
        self.held = Some(Held {
            revision,
            until,
            ..held
        });
        self.last_written = Some(revision);
        self.renewal_failed = false;
        // A new deadline is no news for those waiting on term changes.
        self.term.send_if_modified(|term| {
            term.until = Some(until);
            false
        });
    }

    /// The lease changed under this holder: when its epoch is an implausible jump from
    /// this term's (see the module docs), it is refused, and this term's lease is written
    /// back over it, compare-and-set on what was read. Returns whether the term goes on.
    async fn write_back_over_a_jump(&mut self, held: Held) -> bool {
        let limit = held.until.saturating_duration_since(Instant::now());
        let entry = match timeout(limit, self.bus.get(Bucket::Meta, &self.key)).await {
            Ok(Ok(Some(entry))) => entry,
            _ => return false,
        };
        let Ok(found) = lease::decode(&entry.value) else {
            return false;
        };
        if !lease::epoch_jump(Some(held.epoch), found.body.epoch) {
            return false;
        }
        self.report_jump(entry.revision, &found.body);
        let sent = Instant::now();
        if sent >= held.until {
            return false;
        }
        let body = self.body(held.epoch, held.since_revision, self.cfg.ttl);
        match self.write(&body, entry.revision, held.until - sent).await {
            Ok(revision) => {
                self.renewed(held, revision, sent);
                warn!(
                    fleet = %self.cfg.fleet,
                    epoch = held.epoch,
                    revision,
                    "wrote this term's lease back over the refused one; still leading"
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Logs and counts a lease refused for its epoch jump, once per revision.
    fn report_jump(&mut self, revision: u64, found: &LeaseBody) {
        if self.refused_jump == Some(revision) {
            return;
        }
        self.refused_jump = Some(revision);
        self.metrics.lease_epoch_refused.inc();
        warn!(
            fleet = %self.cfg.fleet,
            epoch = found.epoch,
            holder = %found.holder,
            known_epoch = self.highest_epoch,
            max_step = lease::MAX_EPOCH_STEP,
            "refusing a lease whose epoch jumps implausibly (forged or corrupt: a takeover \
             adds one); its epoch is not adopted"
        );
    }

    /// The epoch of this replica's next acquisition.
    fn next_epoch(&self) -> u64 {
        self.highest_epoch.saturating_add(1)
    }

    /// Who holds the lease now, for logs.
    async fn current_holder(&self) -> String {
        match self.bus.get(Bucket::Meta, &self.key).await {
            Ok(Some(entry)) => match lease::decode(&entry.value) {
                Ok(env) => format!("{} at epoch {}", env.body.holder, env.body.epoch),
                Err(_) => "an unreadable lease".to_string(),
            },
            Ok(None) => "nobody".to_string(),
            Err(_) => "unknown".to_string(),
        }
    }

    fn step_down(&mut self, epoch: u64, why: &str) {
        self.held = None;
        self.observed = None;
        self.renewal_failed = false;
        self.term.send_replace(Term::standby());
        self.metrics.leader.set(0);
        self.metrics.lease_transitions.inc();
        warn!(
            fleet = %self.cfg.fleet,
            epoch,
            holder = %self.cfg.instance_id,
            reason = why,
            "no longer leading: writes stopped; standing by"
        );
    }

    async fn try_acquire(&mut self) {
        let entry = match timeout(self.cfg.ttl, self.bus.get(Bucket::Meta, &self.key)).await {
            Ok(Ok(entry)) => entry,
            Ok(Err(error)) => {
                debug!(fleet = %self.cfg.fleet, %error, "cannot read the lease; retrying");
                return;
            }
            Err(_) => {
                debug!(fleet = %self.cfg.fleet, "reading the lease timed out; retrying");
                return;
            }
        };
        let Some(entry) = entry else {
            let epoch = self.next_epoch();
            return self.acquire(0, epoch, None).await;
        };
        match lease::decode(&entry.value) {
            Ok(env) => self.consider(&entry, env.body).await,
            // Possibly written by a newer build: taken over only once it stops changing.
            Err(error) => {
                if self.expired_by_observation(entry.revision, self.cfg.ttl) {
                    warn!(fleet = %self.cfg.fleet, %error, "the lease does not decode and has not changed for a ttl; taking it over");
                    let epoch = self.next_epoch();
                    self.acquire(entry.revision, epoch, None).await;
                } else {
                    debug!(fleet = %self.cfg.fleet, %error, "the lease does not decode; waiting for it to expire");
                }
            }
        }
    }

    /// A standby's view of a readable lease: take it if it is released, expired or this
    /// instance's own.
    async fn consider(&mut self, entry: &Entry, body: LeaseBody) {
        let known = (self.highest_epoch > 0).then_some(self.highest_epoch);
        if lease::epoch_jump(known, body.epoch) {
            // Not adopted: a takeover goes on from the last plausible epoch.
            self.report_jump(entry.revision, &body);
        } else {
            self.highest_epoch = self.highest_epoch.max(body.epoch);
            self.metrics
                .lease_epoch
                .set(i64::try_from(body.epoch).unwrap_or(i64::MAX));
        }
        if self.last_holder.as_deref() != Some(body.holder.as_str()) {
            info!(
                fleet = %self.cfg.fleet,
                epoch = body.epoch,
                holder = %body.holder,
                "standing by: the lease is held by another instance"
            );
            self.last_holder = Some(body.holder.clone());
        }
        let ttl = Duration::from_millis(body.ttl_ms);
        let own = body.holder == self.cfg.instance_id
            && (!self.ever_held || self.last_written == Some(entry.revision));
        // One ttl of allowance for the clocks of the two hosts.
        let stale = body.is_expired(now_ms().saturating_sub(body.ttl_ms));
        let reason = if body.is_released() {
            Some("released")
        } else if own {
            Some("this instance's own")
        } else if stale {
            Some("expired long ago")
        } else if self.expired_by_observation(entry.revision, ttl) {
            Some("expired")
        } else {
            None
        };
        if let Some(reason) = reason {
            debug!(fleet = %self.cfg.fleet, previous = %body.holder, reason, "taking the lease");
            let epoch = self.next_epoch();
            self.acquire(entry.revision, epoch, Some((body.holder, reason)))
                .await;
        }
    }

    /// Whether the lease at `revision` has not changed for `ttl` on this replica's clock
    /// (counting from when this replica first saw that revision).
    fn expired_by_observation(&mut self, revision: u64, ttl: Duration) -> bool {
        let now = Instant::now();
        match self.observed {
            Some((seen, since)) if seen == revision => now.duration_since(since) >= ttl,
            _ => {
                self.observed = Some((revision, now));
                false
            }
        }
    }

    async fn acquire(&mut self, expected: u64, epoch: u64, previous: Option<(String, &str)>) {
        let sent = Instant::now();
        let body = self.body(epoch, expected, self.cfg.ttl);
        let limit = self.cfg.ttl - self.cfg.safety_margin();
        match self.write(&body, expected, limit).await {
            Ok(revision) => {
                let until = sent + self.cfg.ttl - self.cfg.safety_margin();
                self.held = Some(Held {
                    epoch,
                    since_revision: expected,
                    revision,
                    until,
                });
                self.highest_epoch = epoch;
                self.last_written = Some(revision);
                self.ever_held = true;
                self.observed = None;
                self.last_holder = Some(self.cfg.instance_id.clone());
                self.renewal_failed = false;
                self.term.send_replace(Term {
                    leading: true,
                    epoch,
                    until: Some(until),
                });
                self.metrics.leader.set(1);
                self.metrics
                    .lease_epoch
                    .set(i64::try_from(epoch).unwrap_or(i64::MAX));
                self.metrics.lease_transitions.inc();
                let (previous, reason) = previous.unwrap_or_else(|| ("nobody".into(), "absent"));
                info!(
                    fleet = %self.cfg.fleet,
                    epoch,
                    holder = %self.cfg.instance_id,
                    %previous,
                    lease = reason,
                    "acquired the lease: leading"
                );
            }
            Err(WriteError::Taken) => {
                debug!(fleet = %self.cfg.fleet, epoch, "another instance took the lease first");
            }
            Err(WriteError::Other(error)) => {
                warn!(fleet = %self.cfg.fleet, epoch, %error, "cannot write the lease; retrying");
            }
        }
    }

    /// Gives the lease up: stops writing first, then marks the lease released so that a
    /// standby takes over at once.
    pub async fn release(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        self.term.send_replace(Term::standby());
        self.metrics.leader.set(0);
        let body = self.body(held.epoch, held.since_revision, Duration::ZERO);
        match self.write(&body, held.revision, RELEASE_TIMEOUT).await {
            Ok(_) => {
                info!(fleet = %self.cfg.fleet, epoch = held.epoch, holder = %self.cfg.instance_id, "released the lease")
            }
            Err(WriteError::Taken) => {
                info!(fleet = %self.cfg.fleet, epoch = held.epoch, "the lease was taken over already")
            }
            Err(WriteError::Other(error)) => warn!(
                fleet = %self.cfg.fleet,
                epoch = held.epoch,
                %error,
                "cannot release the lease; it expires after its ttl"
            ),
        }
    }
}

/// A failed lease write.
enum WriteError {
    /// The revision changed: another instance wrote the lease.
    Taken,
    /// Anything else (the bus, a timeout); the lease may or may not have been written.
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::CountingBus;

    const TTL: Duration = Duration::from_secs(10);

    fn elector(bus: &CountingBus, id: &str) -> (Elector, Leadership) {
        let cfg = LeaseConfig {
            fleet: "f".into(),
            instance_id: id.into(),
            ttl: TTL,
        };
        Elector::new(
            Arc::new(bus.clone()),
            cfg,
            CoordinationMetrics::register(&prometheus::Registry::new()),
        )
    }

    async fn lease_on_bus(bus: &CountingBus) -> LeaseBody {
        let entry = bus
            .inner
            .get(Bucket::Meta, &keys::lease_key("f"))
            .await
            .unwrap()
            .expect("a lease");
        lease::decode(&entry.value).unwrap().body
    }

    /// Steps an elector every `next_wait` for `duration` of (paused) time.
    async fn run_for(e: &mut Elector, duration: Duration) {
        let end = Instant::now() + duration;
        while Instant::now() < end {
            e.step().await;
            tokio::time::sleep(e.next_wait()).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_renew_and_one_leader_only() {
        let bus = CountingBus::default();
        let (mut a, la) = elector(&bus, "a");
        let (mut b, lb) = elector(&bus, "b");
        a.step().await;
        b.step().await;
        assert!(a.is_leader() && !b.is_leader());
        assert_eq!(la.current(), Some(1));
        assert_eq!(lb.current(), None);
        let lease = lease_on_bus(&bus).await;
        assert_eq!(
            (lease.holder.as_str(), lease.epoch, lease.ttl_ms),
            ("a", 1, 10_000)
        );
        assert_eq!(lease.since_revision, 0, "taken while absent");

        // A renews every ttl/3; b never takes over, however long.
        for _ in 0..30 {
            tokio::time::sleep(a.next_wait()).await;
            a.step().await;
            b.step().await;
            assert!(a.is_leader() && !b.is_leader());
            assert_eq!(la.current(), Some(1));
        }
        assert_eq!(lease_on_bus(&bus).await.epoch, 1);
        assert!(a.metrics.render().contains("shoal_ingester_leader 1"));
        assert!(b.metrics.render().contains("shoal_ingester_leader 0"));
        assert!(b.metrics.render().contains("shoal_ingester_lease_epoch 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_over_an_expired_lease_with_a_new_epoch() {
        let bus = CountingBus::default();
        let (mut a, la) = elector(&bus, "a");
        let (mut b, lb) = elector(&bus, "b");
        a.step().await;
        b.step().await;
        // `a` dies: it never renews again. Its own deadline passes before b may take over.
        let died = Instant::now();
        let mut a_stopped = None;
        while !b.is_leader() {
            tokio::time::sleep(b.next_wait()).await;
            b.step().await;
            if a_stopped.is_none() && la.current().is_none() {
                a_stopped = Some(died.elapsed());
            }
        }
        let took = died.elapsed();
        let stopped = a_stopped.expect("a stopped writing before b took over");
        // (sampled once per poll interval)
        let deadline = TTL - TTL / 4;
        assert!(
            stopped >= deadline && stopped <= deadline + Duration::from_secs(1),
            "{stopped:?}"
        );
        assert!(
            took >= TTL && took <= TTL + Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(lb.current(), Some(2));
        let lease = lease_on_bus(&bus).await;
        assert_eq!((lease.holder.as_str(), lease.epoch), ("b", 2));
        // Compare-and-set over a's last renewal: b's term starts after that revision, and
        // keeps saying so when renewed.
        assert!(lease.since_revision > 0);
        b.step().await;
        tokio::time::sleep(b.next_wait()).await;
        b.step().await;
        assert_eq!(
            lease_on_bus(&bus).await.since_revision,
            lease.since_revision
        );
        assert!(b
            .metrics
            .render()
            .contains("shoal_ingester_lease_transitions_total 1"));

        // `a` wakes up (a paused process): its renewal fails, it stands by, never writes.
        a.step().await;
        assert!(!a.is_leader());
        assert_eq!(la.current(), None);
        assert_eq!(lease_on_bus(&bus).await.holder, "b");
        assert!(a
            .metrics
            .render()
            .contains("shoal_ingester_lease_transitions_total 2"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_renewal_ends_the_term_before_anyone_can_take_over() {
        let bus = CountingBus::default();
        let (mut a, la) = elector(&bus, "a");
        a.step().await;
        assert_eq!(la.current(), Some(1));
        // The bus fails: renewals fail; writes stop at the deadline, not after it.
        bus.set_failing(true);
        let failing = Instant::now();
        run_for(&mut a, TTL).await;
        assert!(!a.is_leader());
        assert_eq!(la.current(), None);
        assert!(failing.elapsed() >= TTL - TTL / 4);

        // The bus is back and nobody took the lease: a takes its own lease back.
        bus.set_failing(false);
        a.step().await;
        assert!(a.is_leader());
        assert_eq!(la.current(), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stolen_lease_ends_the_term_at_once() {
        let bus = CountingBus::default();
        let (mut a, mut la) = elector(&bus, "a");
        a.step().await;
        la.changed().await;
        let stolen = LeaseBody {
            holder: "x".into(),
            epoch: 7,
            renewed_at_ms: now_ms(),
            ttl_ms: 10_000,
            since_revision: 0,
        };
        bus.inner
            .put(
                Bucket::Meta,
                &keys::lease_key("f"),
                lease::encode("f", &stolen).unwrap().into(),
            )
            .await
            .unwrap();
        tokio::time::sleep(a.next_wait()).await;
        a.step().await;
        assert!(!a.is_leader());
        tokio::time::timeout(Duration::from_millis(1), la.changed())
            .await
            .expect("the term change is announced");
        assert_eq!(la.current(), None);
        // And it does not steal it back while x renews... nor before x's ttl elapses.
        run_for(&mut a, TTL / 2).await;
        assert!(!a.is_leader());
        // Then x is gone for a ttl: a takes over with epoch 8.
        run_for(&mut a, TTL).await;
        assert!(a.is_leader());
        assert_eq!(la.current(), Some(8));
    }

    async fn forge(bus: &CountingBus, epoch: u64) {
        let forged = LeaseBody {
            holder: "x".into(),
            epoch,
            renewed_at_ms: now_ms(),
            ttl_ms: 10_000,
            since_revision: 0,
        };
        bus.inner
            .put(
                Bucket::Meta,
                &keys::lease_key("f"),
                lease::encode("f", &forged).unwrap().into(),
            )
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_holder_writes_its_lease_back_over_an_implausible_epoch() {
        let bus = CountingBus::default();
        let (mut a, la) = elector(&bus, "a");
        a.step().await;
        assert_eq!(la.current(), Some(1));
        forge(&bus, 1 << 62).await;
        tokio::time::sleep(a.next_wait()).await;
        a.step().await;
        assert!(a.is_leader());
        assert_eq!(la.current(), Some(1), "the term goes on");
        let lease = lease_on_bus(&bus).await;
        assert_eq!((lease.holder.as_str(), lease.epoch), ("a", 1));
        let text = a.metrics.render();
        assert!(
            text.contains("shoal_ingester_lease_epoch_refused_total 1"),
            "{text}"
        );
        assert!(text.contains("shoal_ingester_lease_epoch 1"), "{text}");
        // It renews normally afterwards.
        run_for(&mut a, TTL).await;
        assert_eq!(la.current(), Some(1));

        // A plausible epoch is a takeover: it stands down.
        forge(&bus, 1 + lease::MAX_EPOCH_STEP).await;
        tokio::time::sleep(a.next_wait()).await;
        a.step().await;
        assert_eq!(la.current(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_does_not_adopt_an_implausible_epoch() {
        let bus = CountingBus::default();
        let (mut a, _la) = elector(&bus, "a");
        let (mut b, lb) = elector(&bus, "b");
        a.step().await;
        b.step().await;
        // `a` dies and a forged lease appears; nobody renews it.
        forge(&bus, 1 << 62).await;
        run_for(&mut b, TTL + TTL / 2).await;
        assert_eq!(lb.current(), Some(2), "the takeover goes on from epoch 1");
        let text = b.metrics.render();
        assert!(
            text.contains("shoal_ingester_lease_epoch_refused_total 1"),
            "{text}"
        );
        assert_eq!(lease_on_bus(&bus).await.epoch, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn release_lets_a_standby_take_over_at_once_and_restarts_reclaim() {
        let bus = CountingBus::default();
        let (mut a, la) = elector(&bus, "a");
        let (mut b, lb) = elector(&bus, "b");
        a.step().await;
        b.step().await;
        a.release().await;
        assert_eq!(la.current(), None);
        assert!(lease_on_bus(&bus).await.is_released());
        b.step().await;
        assert_eq!(lb.current(), Some(2));

        // b is restarted (same instance ID, a new process): it takes its lease back at once.
        let (mut b2, lb2) = elector(&bus, "b");
        b2.step().await;
        assert_eq!(lb2.current(), Some(3));
        // The old b loses it at its next renewal.
        b.step().await;
        assert_eq!(lb.current(), None);
        // ...and, having held it, does not take it back from the new b.
        b.step().await;
        assert_eq!(lb.current(), None);
        assert_eq!(lease_on_bus(&bus).await.epoch, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_left_long_ago_is_taken_without_waiting() {
        let bus = CountingBus::default();
        let old = LeaseBody {
            holder: "gone".into(),
            epoch: 4,
            renewed_at_ms: now_ms() - 60_000,
            ttl_ms: 10_000,
            since_revision: 0,
        };
        bus.inner
            .put(
                Bucket::Meta,
                &keys::lease_key("f"),
                lease::encode("f", &old).unwrap().into(),
            )
            .await
            .unwrap();
        let (mut a, la) = elector(&bus, "a");
        a.step().await;
        assert_eq!(la.current(), Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_lease_is_taken_only_once_it_stops_changing() {
        let bus = CountingBus::default();
        let key = keys::lease_key("f");
        bus.inner
            .put(Bucket::Meta, &key, "junk".into())
            .await
            .unwrap();
        let (mut a, la) = elector(&bus, "a");
        run_for(&mut a, TTL / 2).await;
        assert_eq!(la.current(), None);
        bus.inner
            .put(Bucket::Meta, &key, "junk2".into())
            .await
            .unwrap();
        run_for(&mut a, TTL / 2 + Duration::from_secs(1)).await;
        assert_eq!(la.current(), None, "it changed: someone renews it");
        run_for(&mut a, TTL).await;
        assert_eq!(la.current(), Some(1));
    }
}
