//! The behaviour every [`StateBus`] implementation must have. Each case gets a fresh, empty
//! bus from the factory; `run_all` runs every case.

use super::{Bucket, BusError, Entry, Op, StateBus, WatchEvent, WatchStream, MAX_VALUE_BYTES};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

async fn next(w: &mut WatchStream) -> WatchEvent {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(ev))) => ev,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within 10 s"),
    }
}

async fn no_event(w: &mut WatchStream) {
    if let Ok(ev) = tokio::time::timeout(Duration::from_millis(300), w.next()).await {
        panic!("unexpected watch event {ev:?}");
    }
}

fn entry(ev: WatchEvent) -> Entry {
    match ev {
        WatchEvent::Entry(e) => e,
        WatchEvent::InitialDone => panic!("expected an entry, got InitialDone"),
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Applies the initial state of a watch to a map; returns it once `InitialDone` arrives.
async fn initial_state(w: &mut WatchStream) -> BTreeMap<String, Bytes> {
    let mut state = BTreeMap::new();
    let mut last_rev = 0;
    loop {
        match next(w).await {
            WatchEvent::InitialDone => return state,
            WatchEvent::Entry(e) => {
                assert!(
                    e.revision > last_rev,
                    "initial entries come in revision order"
                );
                last_rev = e.revision;
                match e.op {
                    Op::Put => state.insert(e.key, e.value),
                    Op::Delete => state.remove(&e.key),
                };
            }
        }
    }
}

/// An empty bucket's watch says `InitialDone` at once, then delivers changes.
pub async fn empty_bucket_is_ready_at_once(bus: Arc<dyn StateBus>) {
    let mut w = bus.watch(Bucket::Config).await.unwrap();
    assert_eq!(next(&mut w).await, WatchEvent::InitialDone);
    let rev = bus.put(Bucket::Config, "k", b("v")).await.unwrap();
    let e = entry(next(&mut w).await);
    assert_eq!(
        (e.key.as_str(), e.value, e.revision, e.op),
        ("k", b("v"), rev, Op::Put)
    );
}

/// A watch delivers the last value of each key first (not the history), then `InitialDone`.
pub async fn initial_values_first(bus: Arc<dyn StateBus>) {
    bus.put(Bucket::Services, "a", b("1")).await.unwrap();
    bus.put(Bucket::Services, "b", b("1")).await.unwrap();
    bus.put(Bucket::Services, "a", b("2")).await.unwrap();
    bus.put(Bucket::Services, "c", b("1")).await.unwrap();
    bus.delete(Bucket::Services, "b").await.unwrap();
    // Another bucket's keys never show up.
    bus.put(Bucket::Endpoints, "a", b("x")).await.unwrap();
    let mut w = bus.watch(Bucket::Services).await.unwrap();
    let state = initial_state(&mut w).await;
    let expected: BTreeMap<String, Bytes> =
        [("a".to_string(), b("2")), ("c".to_string(), b("1"))].into();
    assert_eq!(state, expected);
    no_event(&mut w).await;
}

/// After `InitialDone`, changes arrive in order with increasing revisions, deletes included.
pub async fn ordered_updates(bus: Arc<dyn StateBus>) {
    bus.put(Bucket::Endpoints, "x", b("0")).await.unwrap();
    let mut w = bus.watch(Bucket::Endpoints).await.unwrap();
    initial_state(&mut w).await;
    let r1 = bus.put(Bucket::Endpoints, "y", b("1")).await.unwrap();
    bus.delete(Bucket::Endpoints, "x").await.unwrap();
    let r3 = bus.put(Bucket::Endpoints, "y", b("2")).await.unwrap();
    let e1 = entry(next(&mut w).await);
    let e2 = entry(next(&mut w).await);
    let e3 = entry(next(&mut w).await);
    assert_eq!((e1.key.as_str(), e1.op, e1.revision), ("y", Op::Put, r1));
    assert_eq!((e2.key.as_str(), e2.op), ("x", Op::Delete));
    assert!(e2.value.is_empty());
    assert_eq!(
        (e3.key.as_str(), e3.value.clone(), e3.revision),
        ("y", b("2"), r3)
    );
    assert!(e1.revision < e2.revision && e2.revision < e3.revision);
    // Deleting an absent key changes nothing and wakes no watcher.
    bus.delete(Bucket::Endpoints, "never-there").await.unwrap();
    no_event(&mut w).await;
}

/// `get` and `keys` see live values only.
pub async fn get_and_keys(bus: Arc<dyn StateBus>) {
    assert_eq!(bus.get(Bucket::Meta, "k").await.unwrap(), None);
    let rev = bus.put(Bucket::Meta, "k", b("v")).await.unwrap();
    bus.put(Bucket::Meta, "j", b("w")).await.unwrap();
    bus.put(Bucket::Meta, "gone", b("w")).await.unwrap();
    bus.delete(Bucket::Meta, "gone").await.unwrap();
    let got = bus.get(Bucket::Meta, "k").await.unwrap().unwrap();
    assert_eq!((got.value, got.revision, got.op), (b("v"), rev, Op::Put));
    assert_eq!(bus.get(Bucket::Meta, "gone").await.unwrap(), None);
    assert_eq!(
        bus.keys(Bucket::Meta).await.unwrap(),
        vec!["j".to_string(), "k".to_string()]
    );
    assert!(bus.keys(Bucket::Config).await.unwrap().is_empty());
}

/// Compare-and-set: 0 means "absent", a stale revision is refused.
pub async fn compare_and_set(bus: Arc<dyn StateBus>) {
    let r1 = bus.update(Bucket::Meta, "lease", b("a"), 0).await.unwrap();
    let err = bus
        .update(Bucket::Meta, "lease", b("b"), 0)
        .await
        .unwrap_err();
    assert!(
        matches!(err, BusError::RevisionMismatch { expected: 0, .. }),
        "{err}"
    );
    let r2 = bus.update(Bucket::Meta, "lease", b("c"), r1).await.unwrap();
    assert!(r2 > r1);
    let err = bus
        .update(Bucket::Meta, "lease", b("d"), r1)
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::RevisionMismatch { .. }), "{err}");
    assert_eq!(
        bus.get(Bucket::Meta, "lease").await.unwrap().unwrap().value,
        b("c")
    );
    bus.delete(Bucket::Meta, "lease").await.unwrap();
    bus.update(Bucket::Meta, "lease", b("e"), 0).await.unwrap();
}

/// Oversized values are refused with a clear error and change nothing.
pub async fn oversized_values_are_refused(bus: Arc<dyn StateBus>) {
    let big = Bytes::from(vec![0u8; MAX_VALUE_BYTES + 1]);
    let err = bus.put(Bucket::Config, "big", big).await.unwrap_err();
    assert!(matches!(err, BusError::TooLarge { .. }), "{err}");
    assert_eq!(bus.get(Bucket::Config, "big").await.unwrap(), None);
}

/// Runs every case, each on a fresh bus from `make`.
pub async fn run_all<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn StateBus>>,
{
    empty_bucket_is_ready_at_once(make().await).await;
    initial_values_first(make().await).await;
    ordered_updates(make().await).await;
    get_and_keys(make().await).await;
    compare_and_set(make().await).await;
    oversized_values_are_refused(make().await).await;
}

#[cfg(test)]
mod tests {
    use crate::MemoryBus;
    use std::sync::Arc;

    #[tokio::test]
    async fn memory_bus_conforms() {
        super::run_all(|| async { Arc::new(MemoryBus::new()) as Arc<dyn super::StateBus> }).await;
    }
}
