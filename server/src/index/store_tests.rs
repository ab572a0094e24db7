//! `MeshState::apply`: puts and deletes per bucket, what each reports, and entries that must
//! be rejected without touching the previous value.

use crate::index::store::{ApplyError, Change, MeshState};
use crate::testutil::*;
use bytes::Bytes;
use shoal_common::bus::{Bucket, Entry, Op};
use shoal_common::keys;
use shoal_common::lease::LeaseError;
use shoal_common::model::{ConfigKind, ConfigObject, ConfigSpec, Endpoint, EndpointSet, Service};
use shoal_common::{Envelope, SCHEMA_VERSION};

fn vs_obj(ns: &str, name: &str, host: &str) -> ConfigObject {
    virtual_service(
        ns,
        name,
        &format!("hosts: [{host}]\nhttp: [{{route: [{{destination: {{host: {host}}}}}]}}]"),
    )
}

fn config_of<'a>(state: &'a MeshState, kind: ConfigKind, ns: &str, name: &str) -> &'a ConfigObject {
    &state.config[&shoal_common::keys::ConfigId {
        kind,
        cluster: None,
        namespace: ns.to_string(),
        name: name.to_string(),
    }]
}

fn svc_of<'a>(state: &'a MeshState, ns: &str, name: &str) -> &'a Service {
    &state.services[&keys::ServiceId {
        cluster: CLUSTER.to_string(),
        namespace: ns.to_string(),
        name: name.to_string(),
    }]
}

fn slice_of(state: &MeshState, host: &str, slice: &str) -> EndpointSet {
    let shards = state.endpoints.host(host).expect("host has shards");
    (*shards[&(CLUSTER.to_string(), slice.to_string())]).clone()
}

#[test]
fn virtual_services_with_tcp_or_tls_rules_change_listeners() {
    let mut state = MeshState::default();
    let tcp = virtual_service(
        "default",
        "db",
        "hosts: [db]\ntcp: [{route: [{destination: {host: db}}]}]",
    );
    let (change, _) = state.apply(Bucket::Config, &config_put(&tcp)).unwrap();
    assert_eq!(change, Change::ListenerRules);
    // Its tcp rules removed: the listeners they shaped change too.
    let http = virtual_service(
        "default",
        "db",
        "hosts: [db]\nhttp: [{route: [{destination: {host: db}}]}]",
    );
    let (change, _) = state.apply(Bucket::Config, &config_put(&http)).unwrap();
    assert_eq!(change, Change::ListenerRules);
    // From then on, HTTP-only changes touch routes alone.
    let http2 = virtual_service(
        "default",
        "db",
        "hosts: [db]\nhttp: [{route: [{destination: {host: db2}}]}]",
    );
    let (change, _) = state.apply(Bucket::Config, &config_put(&http2)).unwrap();
    assert_eq!(change, Change::Config(ConfigKind::VirtualService));
}

#[test]
fn config_put_update_and_delete() {
    let mut state = MeshState::default();
    let v1 = vs_obj("default", "reviews", "reviews");
    let (change, observed) = state.apply(Bucket::Config, &config_put(&v1)).unwrap();
    assert_eq!(change, Change::Config(ConfigKind::VirtualService));
    assert_eq!(observed, Some(1_000));
    assert_eq!(
        config_of(&state, ConfigKind::VirtualService, "default", "reviews"),
        &v1
    );

    // The same value again: nothing changed.
    let (change, observed) = state.apply(Bucket::Config, &config_put(&v1)).unwrap();
    assert_eq!((change, observed), (Change::None, None));

    let v2 = vs_obj("default", "reviews", "ratings");
    let (change, _) = state.apply(Bucket::Config, &config_put(&v2)).unwrap();
    assert_eq!(change, Change::Config(ConfigKind::VirtualService));
    assert_eq!(
        config_of(&state, ConfigKind::VirtualService, "default", "reviews"),
        &v2
    );

    let key = keys::config_key(ConfigKind::VirtualService, "default", "reviews");
    let (change, observed) = state.apply(Bucket::Config, &delete(key.clone())).unwrap();
    assert_eq!(
        (change, observed),
        (Change::Config(ConfigKind::VirtualService), None)
    );
    assert!(state.config.is_empty());
    // Deleting what is not there changes nothing.
    let (change, _) = state.apply(Bucket::Config, &delete(key)).unwrap();
    assert_eq!(change, Change::None);
}

#[test]
fn config_kinds_are_kept_apart() {
    let mut state = MeshState::default();
    let vs = vs_obj("default", "reviews", "reviews");
    let dr = destination_rule("default", "reviews", "host: reviews");
    state.apply(Bucket::Config, &config_put(&vs)).unwrap();
    let (change, _) = state.apply(Bucket::Config, &config_put(&dr)).unwrap();
    assert_eq!(change, Change::Config(ConfigKind::DestinationRule));
    assert_eq!(state.config.len(), 2);
    state
        .apply(
            Bucket::Config,
            &delete(keys::config_key(
                ConfigKind::DestinationRule,
                "default",
                "reviews",
            )),
        )
        .unwrap();
    assert_eq!(
        config_of(&state, ConfigKind::VirtualService, "default", "reviews"),
        &vs
    );
}

#[test]
fn service_put_update_and_delete() {
    let mut state = MeshState::default();
    let svc = service("default", "reviews", &[("http", 9080)]);
    assert_eq!(
        state.apply(Bucket::Services, &service_put(&svc)).unwrap().0,
        Change::Service
    );
    assert_eq!(
        state.apply(Bucket::Services, &service_put(&svc)).unwrap().0,
        Change::None
    );
    let mut changed = svc.clone();
    changed.cluster_ips = vec!["10.96.0.1".into()];
    assert_eq!(
        state
            .apply(Bucket::Services, &service_put(&changed))
            .unwrap()
            .0,
        Change::Service
    );
    assert_eq!(svc_of(&state, "default", "reviews"), &changed);
    let key = keys::service_key(CLUSTER, "default", "reviews");
    assert_eq!(
        state
            .apply(Bucket::Services, &delete(key.clone()))
            .unwrap()
            .0,
        Change::Service
    );
    assert!(state.services.is_empty());
    assert_eq!(
        state.apply(Bucket::Services, &delete(key)).unwrap().0,
        Change::None
    );
}

#[test]
fn endpoint_identity_changes_are_told_apart() {
    let mut state = MeshState::default();
    let host = "reviews.default.svc.cluster.local";
    let mut ep = endpoint("10.0.0.1", &[("security.istio.io/tlsMode", "istio")]);
    ep.service_account = "reviews".into();
    let set = slice(
        "default",
        "reviews",
        "s1",
        &[("http", 8080)],
        vec![ep.clone()],
    );
    assert_eq!(
        state.apply(Bucket::Endpoints, &slice_put(&set)).unwrap().0,
        Change::EndpointIdentities(host.into())
    );
    // Another pod with the same identity and a sidecar: endpoints only.
    let mut more = set.clone();
    more.endpoints.push(Endpoint {
        address: "10.0.0.2".into(),
        ..ep.clone()
    });
    assert_eq!(
        state.apply(Bucket::Endpoints, &slice_put(&more)).unwrap().0,
        Change::Endpoints(host.into())
    );
    // A new service account changes the clusters' SANs.
    let mut other = more.clone();
    other.endpoints[1].service_account = "reviews-v2".into();
    assert_eq!(
        state
            .apply(Bucket::Endpoints, &slice_put(&other))
            .unwrap()
            .0,
        Change::EndpointIdentities(host.into())
    );
    // A pod without a sidecar changes auto mTLS to a headless service.
    let mut plain = other.clone();
    plain.endpoints[1].labels.clear();
    assert_eq!(
        state
            .apply(Bucket::Endpoints, &slice_put(&plain))
            .unwrap()
            .0,
        Change::EndpointIdentities(host.into())
    );
    let ids = state.endpoints.identities(host).unwrap();
    assert!(!ids.all_sidecars);
    assert_eq!(ids.accounts.len(), 2);
}

#[test]
fn endpoint_put_update_and_delete() {
    let mut state = MeshState::default();
    let host = "reviews.default.svc.cluster.local";
    let set = slice(
        "default",
        "reviews",
        "reviews-abc",
        &[("http", 8080)],
        vec![endpoint("10.0.0.1", &[])],
    );
    // A new host: who runs behind it changed too (clusters' mTLS reads it).
    assert_eq!(
        state.apply(Bucket::Endpoints, &slice_put(&set)).unwrap().0,
        Change::EndpointIdentities(host.into())
    );
    assert_eq!(
        state.apply(Bucket::Endpoints, &slice_put(&set)).unwrap().0,
        Change::None
    );
    let mut more = set.clone();
    more.endpoints.push(endpoint("10.0.0.2", &[]));
    assert_eq!(
        state.apply(Bucket::Endpoints, &slice_put(&more)).unwrap().0,
        Change::Endpoints(host.into())
    );
    assert_eq!(slice_of(&state, host, "reviews-abc"), more);
    let other = slice(
        "default",
        "reviews",
        "reviews-def",
        &[("http", 8080)],
        vec![],
    );
    state.apply(Bucket::Endpoints, &slice_put(&other)).unwrap();
    assert_eq!(state.endpoints.host(host).unwrap().len(), 2);

    let key = keys::endpoints_key(CLUSTER, "default", "reviews", "reviews-abc");
    assert_eq!(
        state
            .apply(Bucket::Endpoints, &delete(key.clone()))
            .unwrap()
            .0,
        Change::Endpoints(host.into())
    );
    assert_eq!(
        state.apply(Bucket::Endpoints, &delete(key)).unwrap().0,
        Change::None
    );
    // The last slice gone: the host is gone.
    let key = keys::endpoints_key(CLUSTER, "default", "reviews", "reviews-def");
    state.apply(Bucket::Endpoints, &delete(key)).unwrap();
    assert!(state.endpoints.host(host).is_none());
}

#[test]
fn meta_entries_change_nothing() {
    let mut state = MeshState::default();
    let entry = Entry {
        key: "cluster.east".into(),
        value: Bytes::from_static(b"anything"),
        revision: 1,
        op: Op::Put,
    };
    assert_eq!(
        state.apply(Bucket::Meta, &entry).unwrap(),
        (Change::None, None)
    );
}

#[test]
fn issuer_keys_are_the_clusters_whose_tokens_are_accepted() {
    let mut state = MeshState::default();
    let entry = |key: &str, op| Entry {
        key: key.into(),
        value: Bytes::from_static(b"record"),
        revision: 1,
        op,
    };
    let put = entry(&keys::issuer_key("east"), Op::Put);
    assert_eq!(
        state.apply(Bucket::Meta, &put).unwrap(),
        (Change::TokenIssuers, None)
    );
    assert_eq!(
        state.apply(Bucket::Meta, &put).unwrap(),
        (Change::None, None)
    );
    assert_eq!(state.token_issuers.iter().collect::<Vec<_>>(), ["east"]);
    assert!(state.keys(Bucket::Meta).contains(&keys::issuer_key("east")));
    let delete = entry(&keys::issuer_key("east"), Op::Delete);
    assert_eq!(
        state.apply(Bucket::Meta, &delete).unwrap(),
        (Change::TokenIssuers, None)
    );
    assert!(state.token_issuers.is_empty());
}

#[test]
fn credentials_are_keyed_by_cluster() {
    use shoal_common::credential::{CredentialKeys, TlsCredential};
    let keys_ = CredentialKeys::ephemeral();
    let sealed = |cluster: &str| {
        ConfigSpec::Credential(keys_.seal(
            cluster,
            "istio-system",
            "web-cert",
            &TlsCredential::default(),
        ))
    };
    let mut state = MeshState::default();
    let west = config("istio-system", "web-cert", sealed("west"));
    let east = config("istio-system", "web-cert", sealed("east"));
    let put = config_put(&west);
    assert_eq!(put.key, "Credential.west.istio-system.web-cert");
    state.apply(Bucket::Config, &put).unwrap();
    state.apply(Bucket::Config, &config_put(&east)).unwrap();
    assert_eq!(state.config.len(), 2, "one Secret name, two clusters");
    // A cluster's sealed value under another cluster's key is refused.
    let moved = Entry {
        key: keys::credential_key("west", "istio-system", "web-cert"),
        ..config_put(&east)
    };
    let err = state.apply(Bucket::Config, &moved).unwrap_err();
    assert!(matches!(err, ApplyError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("of cluster east"), "{err}");
    // The layout before clusters is refused by its key.
    let legacy = Entry {
        key: keys::config_key(ConfigKind::Credential, "istio-system", "web-cert"),
        ..config_put(&east)
    };
    let err = state.apply(Bucket::Config, &legacy).unwrap_err();
    assert!(matches!(err, ApplyError::Key { .. }), "{err}");
}

/// A state holding one of each, and the entries that put them.
fn populated() -> (MeshState, ConfigObject, Service, EndpointSet) {
    let mut state = MeshState::default();
    let vs = vs_obj("default", "reviews", "reviews");
    let svc = service("default", "reviews", &[("http", 9080)]);
    let set = slice(
        "default",
        "reviews",
        "reviews-abc",
        &[("http", 8080)],
        vec![endpoint("10.0.0.1", &[])],
    );
    state.apply(Bucket::Config, &config_put(&vs)).unwrap();
    state.apply(Bucket::Services, &service_put(&svc)).unwrap();
    state.apply(Bucket::Endpoints, &slice_put(&set)).unwrap();
    (state, vs, svc, set)
}

fn assert_unchanged(state: &MeshState, vs: &ConfigObject, svc: &Service, set: &EndpointSet) {
    assert_eq!(
        config_of(state, ConfigKind::VirtualService, "default", "reviews"),
        vs
    );
    assert_eq!(svc_of(state, "default", "reviews"), svc);
    assert_eq!(
        &slice_of(state, "reviews.default.svc.cluster.local", "reviews-abc"),
        set
    );
    assert_eq!(state.config.len(), 1);
    assert_eq!(state.services.len(), 1);
}

fn with_value(mut entry: Entry, value: Vec<u8>) -> Entry {
    entry.value = Bytes::from(value);
    entry
}

/// `entry` with its body re-encoded under a schema this build does not read.
fn newer<T: serde::Serialize>(entry: Entry, body: &T) -> Entry {
    let mut env = Envelope::new("test", 1, 1, body);
    env.schema = SCHEMA_VERSION + 1;
    with_value(entry, env.encode().expect("encodes"))
}

#[test]
fn a_newer_schema_is_rejected_and_the_previous_value_stays() {
    let (mut state, vs, svc, set) = populated();
    let changed_vs = vs_obj("default", "reviews", "other");
    let mut changed_svc = svc.clone();
    changed_svc.cluster_ips = vec!["10.0.0.9".into()];
    let mut changed_set = set.clone();
    changed_set.endpoints.clear();
    for (bucket, entry) in [
        (Bucket::Config, newer(config_put(&changed_vs), &changed_vs)),
        (
            Bucket::Services,
            newer(service_put(&changed_svc), &changed_svc),
        ),
        (
            Bucket::Endpoints,
            newer(slice_put(&changed_set), &changed_set),
        ),
    ] {
        let err = state.apply(bucket, &entry).unwrap_err();
        assert!(matches!(err, ApplyError::Payload { .. }), "{bucket}: {err}");
        assert!(err.to_string().contains("schema"), "{err}");
    }
    assert_unchanged(&state, &vs, &svc, &set);
}

#[test]
fn undecodable_payloads_are_rejected_and_the_previous_value_stays() {
    let (mut state, vs, svc, set) = populated();
    // A service body where a config object belongs, and plain garbage.
    let wrong_type = with_value(config_put(&vs), service_put(&svc).value.to_vec());
    let garbage = with_value(service_put(&svc), b"\xc1\x00garbage".to_vec());
    let truncated = {
        let full = slice_put(&set).value;
        with_value(slice_put(&set), full[..full.len() / 2].to_vec())
    };
    for (bucket, entry) in [
        (Bucket::Config, wrong_type),
        (Bucket::Services, garbage),
        (Bucket::Endpoints, truncated),
    ] {
        let err = state.apply(bucket, &entry).unwrap_err();
        assert!(matches!(err, ApplyError::Payload { .. }), "{bucket}: {err}");
    }
    assert_unchanged(&state, &vs, &svc, &set);
}

#[test]
fn payloads_for_another_key_are_rejected_and_the_previous_value_stays() {
    let (mut state, vs, svc, set) = populated();
    let key_of = |e: Entry| e.key;
    // Same key, but the payload names another object.
    let other_ns = vs_obj("elsewhere", "reviews", "x");
    let other_kind = destination_rule("default", "reviews", "host: reviews");
    let mut other_cluster = svc.clone();
    other_cluster.cluster = "east".into();
    let mut other_slice = set.clone();
    other_slice.slice = "reviews-xyz".into();
    let mut other_service = set.clone();
    other_service.service = "ratings".into();
    let cases = [
        (Bucket::Config, put(key_of(config_put(&vs)), &other_ns)),
        (Bucket::Config, put(key_of(config_put(&vs)), &other_kind)),
        (
            Bucket::Services,
            put(key_of(service_put(&svc)), &other_cluster),
        ),
        (
            Bucket::Endpoints,
            put(key_of(slice_put(&set)), &other_slice),
        ),
        (
            Bucket::Endpoints,
            put(key_of(slice_put(&set)), &other_service),
        ),
    ];
    for (bucket, entry) in cases {
        let err = state.apply(bucket, &entry).unwrap_err();
        assert!(
            matches!(err, ApplyError::Mismatch { .. }),
            "{bucket}: {err}"
        );
    }
    assert_unchanged(&state, &vs, &svc, &set);
}

#[test]
fn malformed_keys_are_rejected() {
    let (mut state, vs, svc, set) = populated();
    let cases = [
        (Bucket::Config, put("Bogus.default.reviews".into(), &vs)),
        (Bucket::Config, delete("VirtualService.default".into())),
        (Bucket::Services, put("only.two".into(), &svc)),
        (Bucket::Endpoints, delete("a.b.c".into())),
        (Bucket::Endpoints, put("a.b.c.d=ZZ".into(), &set)),
    ];
    for (bucket, entry) in cases {
        let err = state.apply(bucket, &entry).unwrap_err();
        assert!(matches!(err, ApplyError::Key { .. }), "{bucket}: {err}");
    }
    assert_unchanged(&state, &vs, &svc, &set);
}

#[test]
fn keys_are_listed_in_bus_format() {
    let (state, vs, svc, set) = populated();
    assert_eq!(state.keys(Bucket::Config), [config_put(&vs).key]);
    assert_eq!(state.keys(Bucket::Services), [service_put(&svc).key]);
    assert_eq!(state.keys(Bucket::Endpoints), [slice_put(&set).key]);
    assert!(state.keys(Bucket::Meta).is_empty());
}

#[test]
fn names_with_dots_round_trip_through_keys() {
    let mut state = MeshState::default();
    let vs = vs_obj("default", "reviews.v1", "reviews");
    let set = slice(
        "default",
        "reviews",
        "reviews.abc",
        &[("http", 8080)],
        vec![],
    );
    state.apply(Bucket::Config, &config_put(&vs)).unwrap();
    state.apply(Bucket::Endpoints, &slice_put(&set)).unwrap();
    assert_eq!(
        config_of(&state, ConfigKind::VirtualService, "default", "reviews.v1"),
        &vs
    );
    assert_eq!(state.keys(Bucket::Endpoints), [slice_put(&set).key]);
}

/// The lease of fleet `test` (the fixtures' fleet) at `epoch`.
fn lease_put(epoch: u64) -> Entry {
    let body = shoal_common::lease::LeaseBody {
        holder: "ingester-1".into(),
        epoch,
        renewed_at_ms: 1_000,
        ttl_ms: 10_000,
        since_revision: 0,
    };
    Entry {
        key: keys::lease_key("test"),
        value: Bytes::from(shoal_common::lease::encode("test", &body).unwrap()),
        revision: 0,
        op: Op::Put,
    }
}

/// A service put stamped with `epoch` (the fixtures use epoch 1).
fn service_put_at(svc: &Service, epoch: u64) -> Entry {
    let key = keys::service_key(&svc.cluster, &svc.meta.namespace, &svc.meta.name);
    let env = Envelope::new("test", epoch, 2_000, svc);
    Entry {
        key,
        value: Bytes::from(env.encode().unwrap()),
        revision: 0,
        op: Op::Put,
    }
}

#[test]
fn live_writes_of_a_deposed_leader_are_fenced() {
    let mut state = MeshState::default();
    let svc = service("default", "reviews", &[("http", 9080)]);
    // Replayed values are the latest per key: an older epoch is simply an unchanged key.
    state.apply(Bucket::Meta, &lease_put(2)).unwrap();
    state.apply(Bucket::Services, &service_put(&svc)).unwrap();
    assert_eq!(state.fleets.epoch("test"), Some(2));

    // Live: epoch 1 (and the lease-less epoch 0) are refused, the previous value stays.
    let mut changed = svc.clone();
    changed.ports[0].port = 1;
    for epoch in [0, 1] {
        let err = state
            .apply_live(Bucket::Services, &service_put_at(&changed, epoch))
            .unwrap_err();
        assert!(
            matches!(err, ApplyError::Fenced { epoch: e, fleet_epoch: 2, .. } if e == epoch),
            "{err}"
        );
        assert!(err.to_string().contains("deposed"), "{err}");
    }
    assert_eq!(svc_of(&state, "default", "reviews").ports[0].port, 9080);

    // The current epoch and a newer one (whose lease has not been read yet) apply.
    let (change, _) = state
        .apply_live(Bucket::Services, &service_put_at(&changed, 2))
        .unwrap();
    assert_eq!(change, Change::Service);
    changed.ports[0].port = 2;
    state
        .apply_live(Bucket::Services, &service_put_at(&changed, 3))
        .unwrap();
    assert_eq!(svc_of(&state, "default", "reviews").ports[0].port, 2);

    // Deleting the lease (the fleet has none any more) lifts fencing.
    let lease_gone = delete(keys::lease_key("test"));
    assert_eq!(
        state.apply(Bucket::Meta, &lease_gone).unwrap(),
        (Change::None, None)
    );
    assert!(state.keys(Bucket::Meta).is_empty());
    state
        .apply_live(Bucket::Services, &service_put_at(&svc, 0))
        .unwrap();
}

#[test]
fn fencing_covers_config_and_endpoints_and_bad_leases_are_errors() {
    let mut state = MeshState::default();
    state.apply(Bucket::Meta, &lease_put(5)).unwrap();
    assert_eq!(state.keys(Bucket::Meta), vec![keys::lease_key("test")]);
    let vs = vs_obj("default", "reviews", "reviews");
    let err = state
        .apply_live(Bucket::Config, &config_put(&vs))
        .unwrap_err();
    assert!(matches!(err, ApplyError::Fenced { .. }), "{err}");
    assert!(state.config.is_empty());
    let set = slice(
        "default",
        "reviews",
        "reviews-1",
        &[("http", 8080)],
        vec![endpoint("10.0.0.1", &[])],
    );
    let err = state
        .apply_live(Bucket::Endpoints, &slice_put(&set))
        .unwrap_err();
    assert!(matches!(err, ApplyError::Fenced { .. }), "{err}");

    let mut bad = lease_put(9);
    bad.value = Bytes::from_static(b"junk");
    let err = state.apply(Bucket::Meta, &bad).unwrap_err();
    assert!(matches!(err, ApplyError::Lease { .. }), "{err}");
    assert_eq!(state.fleets.epoch("test"), Some(5), "the known epoch stays");
}

/// A cluster that moves to another fleet: the new owner rewrites its keys stamped with its
/// own fleet and epoch. Each value is fenced by the epoch of the fleet it names, so the new
/// fleet's rewrite is accepted (and, with the same content, changes nothing), even though the
/// previous fleet's epoch is higher.
#[test]
fn a_key_rewritten_by_another_fleet_is_fenced_by_that_fleets_epoch() {
    let mut state = MeshState::default();
    let svc = service("default", "reviews", &[("http", 9080)]);
    state.apply(Bucket::Meta, &lease_put(7)).unwrap();
    state
        .apply_live(Bucket::Services, &service_put_at(&svc, 7))
        .unwrap();
    let edge_lease = shoal_common::lease::LeaseBody {
        holder: "edge-1".into(),
        epoch: 2,
        renewed_at_ms: 1_000,
        since_revision: 0,
        ttl_ms: 10_000,
    };
    let edge_lease = Entry {
        key: keys::lease_key("edge"),
        value: Bytes::from(shoal_common::lease::encode("edge", &edge_lease).unwrap()),
        revision: 0,
        op: Op::Put,
    };
    state.apply(Bucket::Meta, &edge_lease).unwrap();
    let by_edge = |svc: &Service, epoch: u64| Entry {
        value: Bytes::from(Envelope::new("edge", epoch, 3_000, svc).encode().unwrap()),
        ..service_put_at(svc, epoch)
    };
    let (change, _) = state
        .apply_live(Bucket::Services, &by_edge(&svc, 2))
        .unwrap();
    assert_eq!(change, Change::None, "same content: nothing to push");
    let mut changed = svc.clone();
    changed.ports[0].port = 81;
    state
        .apply_live(Bucket::Services, &by_edge(&changed, 2))
        .unwrap();
    assert_eq!(svc_of(&state, "default", "reviews").ports[0].port, 81);
    // A deposed leader of the new fleet is fenced as ever.
    let err = state
        .apply_live(Bucket::Services, &by_edge(&svc, 1))
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::Fenced { fleet_epoch: 2, .. }),
        "{err}"
    );
}

#[test]
fn implausible_epochs_are_refused_in_leases_and_live_writes() {
    let mut state = MeshState::default();
    let svc = service("default", "reviews", &[("http", 9080)]);
    state.apply(Bucket::Meta, &lease_put(2)).unwrap();
    state.apply(Bucket::Services, &service_put(&svc)).unwrap();

    // A forged lease 2^62 ahead is refused (replayed or live); epoch 2 stays.
    let err = state.apply(Bucket::Meta, &lease_put(1 << 62)).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::Lease {
                source: LeaseError::EpochJump { known: 2, .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(state.fleets.epoch("test"), Some(2));

    // So the real leader's writes at epoch 2 still apply, and a forged write far ahead
    // does not.
    let mut changed = svc.clone();
    changed.ports[0].port = 1;
    let err = state
        .apply_live(Bucket::Services, &service_put_at(&changed, 1 << 62))
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::EpochJump { fleet_epoch: 2, .. }),
        "{err}"
    );
    assert_eq!(svc_of(&state, "default", "reviews").ports[0].port, 9080);
    state
        .apply_live(Bucket::Services, &service_put_at(&changed, 2))
        .unwrap();
    assert_eq!(svc_of(&state, "default", "reviews").ports[0].port, 1);
}
