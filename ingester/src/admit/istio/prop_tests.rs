//! Property tests of Istio config conversion and validation: JSON values shaped like each
//! kind's spec (plausible fields with plausible and garbage values) convert into a valid
//! object or fail with an error naming something, never panic; an accepted object passes
//! validation again after a round trip through the bus encoding.

use super::*;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Field names of the Istio specs shoal models (and a few it does not).
const FIELDS: &[&str] = &[
    "hosts",
    "gateways",
    "http",
    "tcp",
    "tls",
    "match",
    "route",
    "destination",
    "host",
    "subset",
    "port",
    "number",
    "name",
    "weight",
    "uri",
    "prefix",
    "exact",
    "regex",
    "headers",
    "timeout",
    "retries",
    "attempts",
    "perTryTimeout",
    "retryOn",
    "rewrite",
    "redirect",
    "authority",
    "mirror",
    "mirrorPercentage",
    "value",
    "corsPolicy",
    "fault",
    "delegate",
    "namespace",
    "sniHosts",
    "trafficPolicy",
    "loadBalancer",
    "simple",
    "consistentHash",
    "httpHeaderName",
    "connectionPool",
    "maxConnections",
    "outlierDetection",
    "consecutive5xxErrors",
    "interval",
    "baseEjectionTime",
    "subsets",
    "labels",
    "portLevelSettings",
    "servers",
    "protocol",
    "mode",
    "selector",
    "ingress",
    "egress",
    "captureMode",
    "defaultEndpoint",
    "bind",
    "ports",
    "targetPort",
    "location",
    "resolution",
    "endpoints",
    "address",
    "addresses",
    "exportTo",
    "workloadSelector",
    "outboundTrafficPolicy",
    "method",
    "queryParams",
    "ignoreUriCase",
    "sourceLabels",
    "withoutHeaders",
    "set",
    "add",
    "remove",
    "request",
    "response",
    "credentialName",
    "serviceAccount",
    "network",
    "locality",
    "unknownField",
    // Kubernetes fields (the normalize tests edit Services, EndpointSlices, Pods, Nodes).
    "metadata",
    "annotations",
    "conditions",
    "ready",
    "nodeName",
    "targetRef",
    "kind",
    "clusterIP",
    "type",
    "externalName",
    "appProtocol",
    "addressType",
    "podIP",
    "zone",
    "hostname",
    "status",
    "spec",
];

/// String values the validators look at, and some they should not like.
const STRINGS: &[&str] = &[
    "",
    "*",
    "reviews",
    "reviews.default.svc.cluster.local",
    "*.example.com",
    "default/*",
    "./*",
    "~/*",
    "istio-system/gw",
    "mesh",
    "v1",
    "HTTP",
    "HTTP2",
    "GRPC",
    "TCP",
    "TLS",
    "HTTPS",
    "MONGO",
    "UDP",
    "PASSTHROUGH",
    "SIMPLE",
    "ISTIO_MUTUAL",
    "ROUND_ROBIN",
    "LEAST_REQUEST",
    "RANDOM",
    "MESH_EXTERNAL",
    "MESH_INTERNAL",
    "DNS",
    "STATIC",
    "NONE",
    "DEFAULT",
    "IPTABLES",
    "REGISTRY_ONLY",
    "ALLOW_ANY",
    "1s",
    "10ms",
    "1.5s",
    "-1s",
    "1h",
    "99999999999s",
    "5xx,connect-failure",
    "10.0.0.1",
    "10.0.0.0/8",
    "::1",
    "not an ip",
    "unix:///tmp/sock",
    "/api",
    "^/api/.*$",
    "(unclosed",
    "x-user",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(STRINGS).prop_map(|s| json!(s)),
        1 => ".{0,12}".prop_map(Value::String),
        2 => prop_oneof![Just(0i64), Just(80), Just(9080), Just(65535), Just(65536), Just(-1),
            Just(i64::MAX), Just(i64::MIN), Just(u32::MAX as i64 + 1)].prop_map(|n| json!(n)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<f64>().prop_map(|f| json!(f)),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
    ]
}

/// A JSON value of plausible Istio fields, a few levels deep.
pub(crate) fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|fields| {
                Value::Object(
                    fields
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A valid spec of each kind, to mutate.
fn valid_specs() -> Vec<(ConfigKind, Value)> {
    vec![
        (
            ConfigKind::VirtualService,
            json!({"hosts": ["reviews"], "gateways": ["mesh"], "http": [{"match": [{"uri": {"prefix": "/api"}}], "route": [{"destination": {"host": "reviews", "subset": "v1", "port": {"number": 9080}}, "weight": 100}], "timeout": "1s", "retries": {"attempts": 3, "perTryTimeout": "1s"}}], "tcp": [{"route": [{"destination": {"host": "db"}}]}]}),
        ),
        (
            ConfigKind::DestinationRule,
            json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}], "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}, "connectionPool": {"tcp": {"maxConnections": 10}}, "outlierDetection": {"consecutive5xxErrors": 5, "interval": "10s"}}}),
        ),
        (
            ConfigKind::Gateway,
            json!({"selector": {"istio": "ingressgateway"}, "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}, {"port": {"number": 443, "name": "tls", "protocol": "TLS"}, "hosts": ["*"], "tls": {"mode": "PASSTHROUGH"}}]}),
        ),
        (
            ConfigKind::ServiceEntry,
            json!({"hosts": ["api.example.com"], "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}], "location": "MESH_EXTERNAL", "resolution": "DNS"}),
        ),
        (
            ConfigKind::Sidecar,
            json!({"workloadSelector": {"labels": {"app": "reviews"}}, "egress": [{"hosts": ["./*", "istio-system/*"]}], "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
        ),
        (
            ConfigKind::WorkloadEntry,
            json!({"address": "10.0.0.5", "labels": {"app": "vm"}, "ports": {"http": 8080}}),
        ),
    ]
}

/// One change at some depth of a valid spec.
#[derive(Debug, Clone)]
pub(crate) enum Edit {
    /// Follow these child indices, then set a field (object) or replace (array, scalar).
    Set(Vec<usize>, &'static str, Value),
    /// Follow these child indices, then remove a child.
    Remove(Vec<usize>),
}

pub(crate) fn edit() -> impl Strategy<Value = Edit> {
    let path = || prop::collection::vec(any::<usize>(), 0..5);
    prop_oneof![
        3 => (path(), prop::sample::select(FIELDS), value()).prop_map(|(p, k, v)| Edit::Set(p, k, v)),
        1 => path().prop_map(Edit::Remove),
    ]
}

pub(crate) fn apply(value: &mut Value, path: &[usize], edit: &Edit) {
    let child = match (value, path.split_first()) {
        (Value::Object(m), Some((i, rest))) if !m.is_empty() => {
            let key = m.keys().nth(i % m.len()).cloned().unwrap_or_default();
            m.get_mut(&key).map(|v| (v, rest))
        }
        (Value::Array(a), Some((i, rest))) if !a.is_empty() => {
            let n = a.len();
            a.get_mut(i % n).map(|v| (v, rest))
        }
        (value, _) => {
            match (value, edit) {
                (Value::Object(m), Edit::Set(_, k, v)) => {
                    m.insert(k.to_string(), v.clone());
                }
                (Value::Object(m), Edit::Remove(_)) => {
                    let key = m.keys().next().cloned();
                    if let Some(key) = key {
                        m.remove(&key);
                    }
                }
                (Value::Array(a), Edit::Remove(_)) => {
                    a.pop();
                }
                (other, Edit::Set(_, _, v)) => *other = v.clone(),
                (other, Edit::Remove(_)) => *other = Value::Null,
            }
            None
        }
    };
    if let Some((child, rest)) = child {
        apply(child, rest, edit);
    }
}

/// A kind and a spec: a valid spec with edits at any depth (mostly), or plausible fields
/// of any shape.
fn kind_and_spec() -> impl Strategy<Value = (ConfigKind, Value)> {
    let kind = || prop::sample::select(ConfigKind::ALL.to_vec());
    prop_oneof![
        3 => (prop::sample::select(valid_specs()), prop::collection::vec(edit(), 0..4)).prop_map(
            |((kind, mut spec), edits)| {
                for e in &edits {
                    let path = match e {
                        Edit::Set(p, _, _) | Edit::Remove(p) => p.clone(),
                    };
                    apply(&mut spec, &path, e);
                }
                (kind, spec)
            }
        ),
        1 => (kind(), value()),
        1 => (kind(), prop::collection::vec((prop::sample::select(FIELDS), value()), 0..6)).prop_map(
            |(kind, fields)| {
                (kind, Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
            }
        ),
    ]
}

/// The valid specs above are accepted: the edits start from objects that convert.
#[test]
fn the_valid_specs_convert() {
    for (kind, spec) in valid_specs() {
        let spec = config_spec(kind, spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
        validate(&spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(512), ..ProptestConfig::default() })]

    #[test]
    fn prop_istio_specs_convert_or_fail_cleanly(
        (kind, spec) in kind_and_spec(),
    ) {
        let meta = ObjectMeta { name: "fuzz".into(), namespace: "default".into(), ..Default::default() };
        match config_spec(kind, spec) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(spec) => match config_object(meta, spec) {
                Err(e) => prop_assert!(!e.to_string().is_empty()),
                Ok(obj) => {
                    // What was accepted survives the bus encoding and stays valid.
                    let bytes = shoal_common::Envelope::new("f", 1, 1, obj.clone()).encode().expect("encodes");
                    let back = shoal_common::Envelope::<ConfigObject>::decode(&bytes).expect("decodes").body;
                    prop_assert_eq!(&back, &obj);
                    prop_assert!(validate(&back.spec).is_ok());
                }
            },
        }
    }
}
