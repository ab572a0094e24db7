//! Status reporting on Istio config objects: a rejected object's problem is written where
//! its author looks, the object's `status`, in the shape istiod's status reporting and
//! analysis use (`status.conditions[type=Reconciled]`, `status.validationMessages`,
//! `status.observedGeneration`).
//!
//! - A rejected version gets `Reconciled: "False"`, reason `Rejected`, the reason naming
//!   the field as message, and an `IST0106` (SchemaValidationError) validation message.
//! - A version accepted with fields shoal does not enforce (an AuthorizationPolicy using
//!   Envoy metadata conditions or CUSTOM: shoal fails closed on them) gets `Reconciled: "True"`, reason
//!   `PartiallyEnforced`, the fields and their effect as message.
//! - A later accepted version of an object shoal rejected before gets `Reconciled: "True"`,
//!   reason `Accepted`, and loses the `IST0106` message. Objects never rejected are left
//!   alone: a mesh of valid config costs no status write at all.
//! - What each object's status should be is computed from every watch event
//!   ([`StatusBook::observe`]) and compared with the status the event carries, so an
//!   object whose status already says it is skipped: a relist, a restart or a takeover
//!   writes nothing (and the MODIFIED event of shoal's own write settles the object).
//! - Only the leader writes, only in namespaces the discovery selectors select, with a
//!   merge patch to the `/status` subresource, from its own task: a failed write is logged
//!   and retried later, and never holds up ingestion.

use super::metrics::{KubeMetrics, StatusWrite};
use super::reduce::ObjKey;
use crate::coordination::lease::Leadership;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use shoal_common::model::ConfigKind;
use shoal_common::time::sleep_until;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The condition shoal maintains (the type istiod's status reporting uses).
pub const CONDITION: &str = "Reconciled";
/// The condition reason of a rejected version.
pub const REJECTED: &str = "Rejected";
/// The condition reason of an accepted version (after a rejected one).
pub const ACCEPTED: &str = "Accepted";
/// The condition reason of a version accepted with fields shoal does not enforce.
pub const PARTIALLY_ENFORCED: &str = "PartiallyEnforced";
/// The analysis message code of a rejected version: Istio's SchemaValidationError.
pub const CODE: &str = "IST0106";
const CODE_NAME: &str = "SchemaValidationError";
const DOCUMENTATION: &str = "https://istio.io/latest/docs/reference/config/analysis/ist0106/";
const ACCEPTED_MESSAGE: &str = "accepted by shoal";

/// A failed write is tried again after this long.
const RETRY: Duration = Duration::from_secs(5);
/// A write that takes longer than this counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What shoal made of one version of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Applied as written.
    Accepted,
    /// Applied, except fields shoal does not enforce (named, each with its effect).
    PartiallyEnforced(&'a str),
    /// Refused, for this reason (naming the field).
    Rejected(&'a str),
}

/// The namespaces whose objects may get a status: `None` until the Namespaces are known.
pub type Selection = Option<Arc<BTreeSet<String>>>;

/// One object in the book.
type BookKey = (ConfigKind, ObjKey);

/// A status write to make.
#[derive(Debug, Clone)]
struct Pending {
    resource: Arc<ApiResource>,
    patch: Value,
    /// Distinguishes this patch from a later one for the same object.
    seq: u64,
    /// Not before this instant (after a failure).
    not_before: Option<Instant>,
}

#[derive(Debug, Default)]
struct Book {
    pending: BTreeMap<BookKey, Pending>,
    seq: u64,
}

/// The status writes the config objects need, updated from watch events (synchronously,
/// in the watch tasks) and drained by the [`StatusReporter`]. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StatusBook {
    book: Arc<Mutex<Book>>,
    notify: Arc<Notify>,
}

impl StatusBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records what the object `key` of `kind` (served as `resource`) needs, given its
    /// generation, its current status and its verdict: a write when its status does not
    /// say the verdict yet, nothing otherwise.
    pub fn observe(
        &self,
        kind: ConfigKind,
        resource: &Arc<ApiResource>,
        key: ObjKey,
        generation: Option<i64>,
        status: Option<&Value>,
        verdict: Verdict<'_>,
    ) {
        let patch = status_patch(status, generation, verdict, &now_rfc3339());
        self.set(kind, resource, key, patch);
    }

    /// Sets (or, with `None`, withdraws) the merge patch of the object's status computed
    /// elsewhere (the Gateway API's, [`super::gateway_status`]). A cluster-scoped object
    /// has the namespace `""`.
    pub fn set(
        &self,
        kind: ConfigKind,
        resource: &Arc<ApiResource>,
        key: ObjKey,
        patch: Option<Value>,
    ) {
        let key = (kind, key);
        let mut book = self.lock();
        match patch {
            Some(patch) => {
                book.seq += 1;
                let seq = book.seq;
                book.pending.insert(
                    key,
                    Pending {
                        resource: resource.clone(),
                        patch,
                        seq,
                        not_before: None,
                    },
                );
                drop(book);
                self.notify.notify_one();
            }
            None => {
                book.pending.remove(&key);
            }
        }
    }

    /// Forgets a deleted object.
    pub fn forget(&self, kind: ConfigKind, key: &ObjKey) {
        self.lock().pending.remove(&(kind, key.clone()));
    }

    /// Forgets every object of a kind (its CRD is gone).
    pub fn forget_kind(&self, kind: ConfigKind) {
        self.lock().pending.retain(|(k, _), _| *k != kind);
    }

    /// The writes due now in the selected namespaces, and when the next deferred one is.
    fn due(&self, selected: &BTreeSet<String>) -> (Vec<(BookKey, Pending)>, Option<Instant>) {
        let now = Instant::now();
        let book = self.lock();
        let mut next = None::<Instant>;
        let due = book
            .pending
            .iter()
            // Cluster-scoped objects (namespace "") are in every selection.
            .filter(|((_, (ns, _)), _)| ns.is_empty() || selected.contains(ns))
            .filter(|(_, p)| match p.not_before {
                Some(at) if at > now => {
                    next = Some(next.map_or(at, |n| n.min(at)));
                    false
                }
                _ => true,
            })
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        (due, next)
    }

    /// A write is done (written, or moot): forgets it unless a newer one replaced it.
    fn done(&self, key: &BookKey, seq: u64) {
        let mut book = self.lock();
        if book.pending.get(key).is_some_and(|p| p.seq == seq) {
            book.pending.remove(key);
        }
    }

    /// A write failed: tried again after [`RETRY`] unless a newer one replaced it.
    fn defer(&self, key: &BookKey, seq: u64) {
        let mut book = self.lock();
        if let Some(p) = book.pending.get_mut(key).filter(|p| p.seq == seq) {
            p.not_before = Some(Instant::now() + RETRY);
        }
    }

    /// The number of writes waiting (for tests and logs).
    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether no write is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes the [`StatusBook`]'s statuses while this replica leads.
pub struct StatusReporter {
    client: Client,
    book: StatusBook,
    leadership: Leadership,
    selection: watch::Receiver<Selection>,
    metrics: KubeMetrics,
    cluster: String,
}

impl StatusReporter {
    /// A reporter writing through `client` the statuses `book` collects, in the namespaces
    /// `selection` names.
    pub fn new(
        client: Client,
        book: StatusBook,
        leadership: Leadership,
        selection: watch::Receiver<Selection>,
        metrics: KubeMetrics,
        cluster: &str,
    ) -> StatusReporter {
        StatusReporter {
            client,
            book,
            leadership,
            selection,
            metrics,
            cluster: cluster.to_string(),
        }
    }

    /// Writes what is due whenever the book, the leadership or the selection changes,
    /// until the task is dropped.
    pub async fn run(mut self) {
        let mut next: Option<Instant> = None;
        let mut selection_open = true;
        loop {
            tokio::select! {
                () = self.book.notify.notified() => {}
                () = self.leadership.changed() => {}
                changed = self.selection.changed(), if selection_open => {
                    selection_open = changed.is_ok();
                }
                () = sleep_until(next), if next.is_some() => {}
            }
            next = None;
            if !self.leadership.leads() {
                continue;
            }
            let Some(selected) = self.selection.borrow().clone() else {
                continue;
            };
            let (due, deferred) = self.book.due(&selected);
            next = deferred;
            for (key, pending) in due {
                if !self.leadership.leads() {
                    break;
                }
                if !self.write(&key, &pending).await {
                    let at = Instant::now() + RETRY;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
    }

    /// Writes one status; false when it failed and is to be retried.
    async fn write(&self, key: &BookKey, pending: &Pending) -> bool {
        let (kind, (namespace, name)) = key;
        let api: Api<DynamicObject> = match namespace.as_str() {
            "" => Api::all_with(self.client.clone(), pending.resource.as_ref()),
            ns => Api::namespaced_with(self.client.clone(), ns, pending.resource.as_ref()),
        };
        let patch = Patch::Merge(&pending.patch);
        let result = tokio::time::timeout(
            WRITE_TIMEOUT,
            api.patch_status(name, &PatchParams::default(), &patch),
        )
        .await;
        let rejected = pending
            .patch
            .pointer("/status/conditions")
            .is_some_and(|c| {
                find_condition(c).and_then(|c| c.get("status")) == Some(&json!("False"))
            });
        let count = |result| self.metrics.object_status_written(result);
        match result {
            Ok(Ok(_)) => {
                info!(cluster = %self.cluster, %kind, %namespace, %name, rejected, "object status written");
                count(StatusWrite::Written);
                self.book.done(key, pending.seq);
                true
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                debug!(cluster = %self.cluster, %kind, %namespace, %name, "object gone; its status is moot");
                count(StatusWrite::Gone);
                self.book.done(key, pending.seq);
                true
            }
            Ok(Err(error)) => {
                warn!(cluster = %self.cluster, %kind, %namespace, %name, %error, "cannot write object status; retrying later");
                count(StatusWrite::Error);
                self.book.defer(key, pending.seq);
                false
            }
            Err(_) => {
                warn!(cluster = %self.cluster, %kind, %namespace, %name, "object status write timed out; retrying later");
                count(StatusWrite::Error);
                self.book.defer(key, pending.seq);
                false
            }
        }
    }
}

/// Now, as a Kubernetes timestamp.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The `Reconciled` condition in a list of conditions.
fn find_condition(conditions: &Value) -> Option<&Value> {
    conditions
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(CONDITION))
}

/// A generation as Istio writes it (protobuf JSON: an int64 is a string), or as a number.
fn generation_of(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn is_ours(message: &Value) -> bool {
    message.pointer("/type/code").and_then(Value::as_str) == Some(CODE)
}

/// The merge patch that makes an object's status say its verdict, or `None` when the
/// status already says it — or, for an accepted object, when shoal never reported on it.
/// Conditions and validation messages of others are kept.
pub fn status_patch(
    status: Option<&Value>,
    generation: Option<i64>,
    verdict: Verdict<'_>,
    now: &str,
) -> Option<Value> {
    let rejection = match verdict {
        Verdict::Rejected(reason) => Some(reason),
        _ => None,
    };
    let empty = Value::Null;
    let status = status.unwrap_or(&empty);
    let conditions = status.get("conditions").unwrap_or(&empty);
    let current = find_condition(conditions);
    let messages: Vec<&Value> = status
        .get("validationMessages")
        .and_then(Value::as_array)
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    let ours = messages.iter().filter(|m| is_ours(m)).count();
    let field = |name: &str| current.and_then(|c| c.get(name)).and_then(Value::as_str);
    let partial;
    let (want_status, reason, message) = match verdict {
        Verdict::Rejected(reason) => ("False", REJECTED, reason),
        Verdict::PartiallyEnforced(fields) => {
            partial = format!("accepted; not enforced, shoal fails closed: {fields}");
            ("True", PARTIALLY_ENFORCED, partial.as_str())
        }
        Verdict::Accepted => ("True", ACCEPTED, ACCEPTED_MESSAGE),
    };
    let reported = matches!(
        field("reason"),
        Some(REJECTED | ACCEPTED | PARTIALLY_ENFORCED)
    );
    if verdict == Verdict::Accepted && !reported && ours == 0 {
        return None; // never rejected by shoal: nothing to say
    }
    let up_to_date = field("status") == Some(want_status)
        && field("reason") == Some(reason)
        && field("message") == Some(message)
        && generation_of(current.and_then(|c| c.get("observedGeneration"))) == generation
        && generation_of(status.get("observedGeneration")) == generation
        && ours == usize::from(rejection.is_some());
    if up_to_date {
        return None;
    }
    // A transition time changes only with the condition's status.
    let transition = match field("status") {
        Some(s) if s == want_status => field("lastTransitionTime").unwrap_or(now),
        _ => now,
    };
    let mut condition = json!({
        "type": CONDITION,
        "status": want_status,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message,
    });
    let generation = generation.map(|g| json!(g.to_string()));
    if let Some(g) = &generation {
        condition["observedGeneration"] = g.clone();
    }
    let mut new_conditions: Vec<Value> = conditions
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c.get("type").and_then(Value::as_str) != Some(CONDITION))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    new_conditions.push(condition);
    let mut new_messages: Vec<Value> = messages
        .into_iter()
        .filter(|m| !is_ours(m))
        .cloned()
        .collect();
    if rejection.is_some() {
        new_messages.push(json!({
            "type": {"code": CODE, "name": CODE_NAME},
            "level": "ERROR",
            "documentationUrl": DOCUMENTATION,
        }));
    }
    let mut patch = json!({"status": {
        "conditions": new_conditions,
        // A merge patch removes a key set to null.
        "validationMessages": if new_messages.is_empty() { Value::Null } else { Value::Array(new_messages) },
    }});
    if let Some(g) = generation {
        patch["status"]["observedGeneration"] = g;
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidObject;

    const NOW: &str = "2024-01-01T00:00:00Z";
    const LATER: &str = "2024-01-02T00:00:00Z";

    /// The status after applying a patch (as a merge patch) to `status`.
    fn applied(status: Option<&Value>, patch: &Value) -> Value {
        let mut object = json!({"status": status.cloned().unwrap_or(Value::Null)});
        merge(&mut object, patch);
        object["status"].clone()
    }

    fn merge(target: &mut Value, patch: &Value) {
        match patch {
            Value::Object(p) => {
                if !target.is_object() {
                    *target = json!({});
                }
                let t = target.as_object_mut().unwrap();
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
            other => *target = other.clone(),
        }
    }

    #[test]
    fn valid_objects_never_rejected_get_no_status() {
        assert_eq!(status_patch(None, Some(1), Verdict::Accepted, NOW), None);
        let istiod = json!({"conditions": [{"type": "Reconciled", "status": "True",
                                             "message": "2/2 proxies up to date."}]});
        assert_eq!(
            status_patch(Some(&istiod), Some(4), Verdict::Accepted, NOW),
            None
        );
    }

    #[test]
    fn rejection_is_written_once_and_cleared_once() {
        let reason = "http[0].match[0].uri: invalid regex \"(\"";
        let patch = status_patch(None, Some(2), Verdict::Rejected(reason), NOW).expect("a write");
        let status = applied(None, &patch);
        assert_eq!(
            status,
            json!({
                "conditions": [{"type": "Reconciled", "status": "False", "reason": "Rejected",
                                "message": reason, "observedGeneration": "2",
                                "lastTransitionTime": NOW}],
                "validationMessages": [{"type": {"code": "IST0106", "name": "SchemaValidationError"},
                                        "level": "ERROR", "documentationUrl": DOCUMENTATION}],
                "observedGeneration": "2",
            })
        );
        // The status says it: nothing to write (a relist, a restart).
        assert_eq!(
            status_patch(Some(&status), Some(2), Verdict::Rejected(reason), LATER),
            None
        );
        // Another generation rejected for the same reason: the generation moves, the
        // transition time stays.
        let again = status_patch(Some(&status), Some(3), Verdict::Rejected(reason), LATER).unwrap();
        let status = applied(Some(&status), &again);
        assert_eq!(status["observedGeneration"], "3");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], NOW);

        // Fixed: accepted, the validation message goes.
        let fix = status_patch(Some(&status), Some(4), Verdict::Accepted, LATER).unwrap();
        let status = applied(Some(&status), &fix);
        assert_eq!(
            status,
            json!({
                "conditions": [{"type": "Reconciled", "status": "True", "reason": "Accepted",
                                "message": "accepted by shoal", "observedGeneration": "4",
                                "lastTransitionTime": LATER}],
                "observedGeneration": "4",
            })
        );
        assert_eq!(
            status_patch(Some(&status), Some(4), Verdict::Accepted, LATER),
            None
        );
        // Once reported on, the object's condition follows its generation.
        assert!(status_patch(Some(&status), Some(5), Verdict::Accepted, LATER).is_some());
    }

    /// A policy accepted with fields shoal does not enforce says so (which fields, what
    /// happens instead) where its author looks, once; removing them makes it `Accepted`.
    #[test]
    fn partially_enforced_is_said_once_and_cleared() {
        let fields = "rules[0].when[0] \"experimental.envoy.filters.a[b]\" (its rule is \
                      dropped, so the policy allows less)";
        let verdict = Verdict::PartiallyEnforced(fields);
        let status = applied(
            None,
            &status_patch(None, Some(1), verdict, NOW).expect("a write"),
        );
        let condition = &status["conditions"][0];
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "PartiallyEnforced");
        let message = condition["message"].as_str().unwrap();
        assert!(
            message.contains("shoal fails closed") && message.contains(fields),
            "{message}"
        );
        assert!(status.get("validationMessages").is_none(), "{status}");
        assert_eq!(status_patch(Some(&status), Some(1), verdict, LATER), None);
        let fix = status_patch(Some(&status), Some(2), Verdict::Accepted, LATER).unwrap();
        let status = applied(Some(&status), &fix);
        assert_eq!(status["conditions"][0]["reason"], "Accepted");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], NOW);
    }

    #[test]
    fn conditions_and_messages_of_others_are_kept() {
        let status = json!({
            "conditions": [{"type": "Other", "status": "True"}],
            "validationMessages": [{"type": {"code": "IST0101"}, "level": "ERROR"}],
            "observedGeneration": 7,
        });
        let patch = status_patch(
            Some(&status),
            Some(7),
            Verdict::Rejected("hosts is empty"),
            NOW,
        )
        .unwrap();
        let new = applied(Some(&status), &patch);
        let types: Vec<&str> = new["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Other", "Reconciled"]);
        assert_eq!(new["validationMessages"].as_array().unwrap().len(), 2);
        let fixed = applied(
            Some(&new),
            &status_patch(Some(&new), Some(8), Verdict::Accepted, NOW).unwrap(),
        );
        assert_eq!(
            fixed["validationMessages"],
            json!([{"type": {"code": "IST0101"}, "level": "ERROR"}])
        );
        // A number generation (not Istio's string) compares equal.
        let mut numeric = fixed.clone();
        numeric["observedGeneration"] = json!(8);
        numeric["conditions"][1]["observedGeneration"] = json!(8);
        assert_eq!(
            status_patch(Some(&numeric), Some(8), Verdict::Accepted, NOW),
            None
        );
    }

    fn observe(
        book: &StatusBook,
        resource: &Arc<ApiResource>,
        status: Option<Value>,
        generation: i64,
        verdict: Result<(), &InvalidObject>,
    ) {
        let verdict = match verdict {
            Ok(()) => Verdict::Accepted,
            Err(e) => Verdict::Rejected(&e.reason),
        };
        let key = ("shop".to_string(), "web".to_string());
        let kind = ConfigKind::VirtualService;
        book.observe(
            kind,
            resource,
            key,
            Some(generation),
            status.as_ref(),
            verdict,
        );
    }

    #[test]
    fn the_book_keeps_the_latest_write_per_object() {
        let book = StatusBook::default();
        let gvk = kube::api::GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService");
        let resource = Arc::new(ApiResource::from_gvk(&gvk));
        let bad = InvalidObject::new("hosts is empty");
        let vs = ConfigKind::VirtualService;
        observe(&book, &resource, None, 1, Err(&bad));
        observe(&book, &resource, None, 2, Err(&bad));
        assert_eq!(book.len(), 1);
        let selected: BTreeSet<String> = ["shop".to_string()].into();
        let (due, _) = book.due(&selected);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1.patch["status"]["observedGeneration"], "2");
        assert!(book.due(&BTreeSet::new()).0.is_empty(), "not selected");
        // A newer observation is not forgotten by an older write's completion.
        let (key, old) = due.into_iter().next().unwrap();
        observe(&book, &resource, None, 3, Err(&bad));
        book.done(&key, old.seq);
        assert_eq!(book.len(), 1);
        // A failed write waits before it is due again.
        let seq = book.due(&selected).0[0].1.seq;
        book.defer(&key, seq);
        let (due, next) = book.due(&selected);
        assert!(due.is_empty() && next.is_some());
        // The written status comes back in the watch: settled.
        let written = applied(
            None,
            &status_patch(None, Some(3), Verdict::Rejected("hosts is empty"), NOW).unwrap(),
        );
        observe(&book, &resource, Some(written), 3, Err(&bad));
        assert!(book.is_empty());
        // An object never rejected costs nothing.
        observe(&book, &resource, None, 1, Ok(()));
        assert!(book.is_empty());
        observe(&book, &resource, None, 1, Err(&bad));
        book.forget(vs, &("shop".into(), "web".into()));
        assert!(book.is_empty());
    }
}
