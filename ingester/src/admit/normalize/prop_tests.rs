//! Property tests of Kubernetes normalization: Services, EndpointSlices, Pods and Nodes
//! edited at any depth (as they could arrive from an API server or a manifest) normalize or
//! are refused with an error, never panic.

use super::*;
use crate::admit::istio::prop_tests::{apply, edit, Edit};
use proptest::prelude::*;
use serde_json::{json, Value};

fn edited(base: Value) -> impl Strategy<Value = Value> {
    prop::collection::vec(edit(), 0..4).prop_map(move |edits| {
        let mut v = base.clone();
        for e in &edits {
            let path = match e {
                Edit::Set(p, _, _) | Edit::Remove(p) => p.clone(),
            };
            apply(&mut v, &path, e);
        }
        v
    })
}

fn service_json() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "reviews", "namespace": "default", "labels": {"app": "reviews"},
            "annotations": {"networking.istio.io/exportTo": "."}},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"},
            "ports": [{"name": "http", "port": 9080, "targetPort": 9080, "protocol": "TCP", "appProtocol": "http"}]}})
}

fn slice_json() -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "reviews-1", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true},
            "nodeName": "node-1", "zone": "z1",
            "targetRef": {"kind": "Pod", "name": "reviews-1", "namespace": "default"}}]})
}

fn pod_json() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reviews-1", "namespace": "default", "labels": {"app": "reviews", "version": "v1"}},
        "spec": {"nodeName": "node-1", "serviceAccountName": "reviews", "containers": []},
        "status": {"podIP": "10.1.0.1"}})
}

fn node_json() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/region": "r1",
            "topology.kubernetes.io/zone": "z1"}}})
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: shoal_common::proptest_cases(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn prop_kubernetes_objects_normalize_or_fail_cleanly(
        svc in edited(service_json()),
        slice in edited(slice_json()),
        pod in edited(pod_json()),
        node in edited(node_json()),
    ) {
        // What does not even decode is refused by the decoder, before normalization.
        if let Ok(svc) = serde_json::from_value::<KubeService>(svc) {
            let _ = check_service(&svc);
            if let Err(e) = service(&svc, "c1") {
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let pods: Vec<Pod> = serde_json::from_value(pod).into_iter().collect();
        let nodes: Vec<Node> = serde_json::from_value(node).into_iter().collect();
        for n in &nodes {
            let _ = node_locality(n);
        }
        let workloads = Workloads::new(&pods, &nodes);
        if let Ok(slice) = serde_json::from_value::<EndpointSlice>(slice) {
            let _ = slice_service_name(&slice);
            if let Err(e) = endpoint_slice(&slice, "c1", &workloads) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// The unedited objects normalize: the edits start from valid ones.
#[test]
fn the_base_objects_normalize() {
    let svc: KubeService = serde_json::from_value(service_json()).expect("service");
    assert!(service(&svc, "c1").expect("valid").is_some());
    let pod: Pod = serde_json::from_value(pod_json()).expect("pod");
    let node: Node = serde_json::from_value(node_json()).expect("node");
    let workloads = Workloads::new([&pod], [&node]);
    let slice: EndpointSlice = serde_json::from_value(slice_json()).expect("slice");
    let set = endpoint_slice(&slice, "c1", &workloads)
        .expect("valid")
        .expect("a set");
    assert_eq!(set.endpoints.len(), 1);
}
