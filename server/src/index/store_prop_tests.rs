//! Property tests of `MeshState::apply`: arbitrary bus entries for every bucket (random
//! keys, random bytes, valid envelopes with garbage bodies or bodies of another key, other
//! schemas) never panic; every one that does not apply is an error (which the pipeline
//! counts as `invalid` and skips), and the state of the good keys is unchanged.

use crate::index::store::MeshState;
use crate::testutil::*;
use bytes::Bytes;
use proptest::prelude::*;
use shoal_common::bus::{Bucket, Entry, Op};
use shoal_common::keys;
use shoal_common::model::{ConfigKind, ConfigObject, EndpointSet, Service};
use shoal_common::{Envelope, SCHEMA_VERSION};

fn good_vs() -> ConfigObject {
    virtual_service(
        "default",
        "reviews",
        "hosts: [reviews]\nhttp: [{route: [{destination: {host: reviews}}]}]",
    )
}

fn good_service() -> Service {
    service("default", "reviews", &[("http", 9080)])
}

fn good_slice() -> EndpointSet {
    slice(
        "default",
        "reviews",
        "reviews-1",
        &[("http", 9080)],
        vec![endpoint("10.0.0.1", &[])],
    )
}

fn good_keys() -> Vec<(Bucket, String)> {
    let vs = good_vs();
    let svc = good_service();
    let set = good_slice();
    vec![
        (
            Bucket::Config,
            keys::config_key(
                ConfigKind::VirtualService,
                &vs.meta.namespace,
                &vs.meta.name,
            ),
        ),
        (
            Bucket::Services,
            keys::service_key(&svc.cluster, &svc.meta.namespace, &svc.meta.name),
        ),
        (
            Bucket::Endpoints,
            keys::endpoints_key(&set.cluster, &set.namespace, &set.service, &set.slice),
        ),
    ]
}

fn good_state() -> MeshState {
    let mut state = MeshState::default();
    for entry in [
        config_put(&good_vs()),
        service_put(&good_service()),
        slice_put(&good_slice()),
    ] {
        let bucket = match &entry {
            e if e.key.starts_with("VirtualService.") => Bucket::Config,
            e if e.key.split('.').count() == 4 => Bucket::Endpoints,
            _ => Bucket::Services,
        };
        state.apply(bucket, &entry).expect("good entries apply");
    }
    state
}

/// What the good keys hold, comparable.
fn good_values(state: &MeshState) -> (String, String, String) {
    let vs = &state.config[&keys::ConfigId {
        kind: ConfigKind::VirtualService,
        cluster: None,
        namespace: "default".to_string(),
        name: "reviews".to_string(),
    }];
    let svc = &state.services[&keys::ServiceId {
        cluster: CLUSTER.to_string(),
        namespace: "default".to_string(),
        name: "reviews".to_string(),
    }];
    let host = shoal_common::model::service_fqdn("reviews", "default");
    let shards = state.endpoints.host(&host).expect("good endpoints");
    let set = &shards[&(CLUSTER.to_string(), "reviews-1".to_string())];
    (format!("{vs:?}"), format!("{svc:?}"), format!("{set:?}"))
}

#[derive(Debug, Clone)]
enum Value {
    Bytes(Vec<u8>),
    /// A current-schema envelope whose body is a string, not the bucket's type.
    StringBody(String),
    /// A current-schema envelope of another bucket's (valid) type.
    OtherType(u8),
    /// A valid object of the bucket's type, under a key it does not match (or the good
    /// key, with another object's identity).
    Mismatched(u8),
    /// Another schema.
    Schema(u32),
    /// A valid envelope with bytes flipped.
    Flipped(u8, Vec<(usize, u8)>),
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Value::Bytes),
        ".{0,20}".prop_map(Value::StringBody),
        (0u8..3).prop_map(Value::OtherType),
        (0u8..3).prop_map(Value::Mismatched),
        any::<u32>()
            .prop_filter("not current", |s| *s != SCHEMA_VERSION)
            .prop_map(Value::Schema),
        (
            0u8..3,
            prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)
        )
            .prop_map(|(w, f)| Value::Flipped(w, f)),
    ]
}

fn typed(which: u8) -> Vec<u8> {
    let env = |b: &dyn erased::Encode| b.encode();
    match which % 3 {
        0 => env(&good_vs()),
        1 => env(&good_service()),
        _ => env(&good_slice()),
    }
}

/// Encoding of a value of some model type.
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            shoal_common::Envelope::new("fuzz", 1, 1, self)
                .encode()
                .expect("encodes")
        }
    }
}

/// A valid object of `bucket`'s type whose identity is not the good key's.
fn mismatched(bucket: Bucket, which: u8) -> Vec<u8> {
    use erased::Encode;
    let name = format!("other-{which}");
    match bucket {
        Bucket::Config => {
            let mut vs = good_vs();
            vs.meta.name = name;
            vs.encode()
        }
        Bucket::Services => {
            let mut svc = good_service();
            svc.meta.name = name;
            svc.encode()
        }
        Bucket::Endpoints | Bucket::Meta => {
            let mut set = good_slice();
            set.slice = name;
            set.encode()
        }
    }
}

fn bytes_of(bucket: Bucket, v: &Value) -> Vec<u8> {
    match v {
        Value::Bytes(b) => b.clone(),
        Value::StringBody(s) => Envelope::new("fuzz", 1, 1, s.clone())
            .encode()
            .expect("encodes"),
        Value::OtherType(w) => {
            // Another bucket's type than this one's.
            let own = match bucket {
                Bucket::Config => 0,
                Bucket::Services => 1,
                _ => 2,
            };
            typed(own + 1 + w % 2)
        }
        Value::Mismatched(w) => mismatched(bucket, *w),
        Value::Schema(schema) => {
            let mut e = Envelope::new("fuzz", 1, 1, good_vs());
            e.schema = *schema;
            e.encode().expect("encodes")
        }
        Value::Flipped(w, flips) => {
            let mut b = typed(*w);
            for (at, x) in flips {
                let at = at % b.len();
                b[at] ^= x.max(&1);
            }
            b
        }
    }
}

#[derive(Debug, Clone)]
enum Key {
    /// One of the good keys (puts only: a valid delete of it legitimately removes it).
    Good(usize),
    Random(String),
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        2 => (0usize..3).prop_map(Key::Good),
        1 => "[-_=.a-zA-Z0-9]{0,30}".prop_map(Key::Random),
        1 => ".{0,20}".prop_map(Key::Random),
        1 => "(VirtualService|Gateway|Kubernetes|lease|owner|issuer)\\.[a-z=_]{0,6}\\.[a-z=_.]{0,8}"
            .prop_map(Key::Random),
    ]
}

fn entry() -> impl Strategy<Value = (Bucket, Key, Value, bool, bool)> {
    (
        prop::sample::select(Bucket::ALL.to_vec()),
        key(),
        value(),
        any::<bool>(),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(256), ..ProptestConfig::default() })]

    #[test]
    fn prop_garbage_bus_entries_never_take_good_state_down(
        entries in prop::collection::vec(entry(), 1..16),
    ) {
        let mut state = good_state();
        let mut before = good_values(&state);
        let good = good_keys();
        for (bucket, key, value, delete, live) in entries {
            let (bucket, key, delete) = match key {
                // Good keys get puts of bad values in their own bucket.
                Key::Good(i) => (good[i].0, good[i].1.clone(), false),
                Key::Random(k) => (bucket, k, delete),
            };
            // A flipped byte can leave a valid envelope (another fleet name, another
            // label value): that is a good value, which may apply.
            let may_be_valid = matches!(value, Value::Flipped(..));
            let entry = Entry {
                value: if delete { Bytes::new() } else { Bytes::from(bytes_of(bucket, &value)) },
                key: key.clone(),
                revision: 0,
                op: if delete { Op::Delete } else { Op::Put },
            };
            let snapshot = state.clone();
            let result = if live {
                state.apply_live(bucket, &entry)
            } else {
                state.apply(bucket, &entry)
            };
            match result {
                Err(error) => {
                    prop_assert!(!error.to_string().is_empty());
                    // Nothing changed.
                    prop_assert_eq!(state.keys(bucket), snapshot.keys(bucket));
                    prop_assert_eq!(good_values(&state), good_values(&snapshot));
                }
                Ok(_) if may_be_valid => before = good_values(&state),
                Ok(_) => {
                    prop_assert!(
                        !good.iter().any(|(b, k)| *b == bucket && *k == key),
                        "a bad value applied to a good key {}", key
                    );
                }
            }
            prop_assert_eq!(&good_values(&state), &before);
        }
    }
}
