//! Locality load balancing (`localityLbSetting`): EDS priorities and weights relative to the
//! proxy's locality, as istiod's `ApplyLocalityLoadBalancer`, and EDS keys that differ by
//! proxy locality only when a setting is in effect.

use crate::generate::{self, eds::EndpointsKey, Key};
use crate::index::proxy::Proxy;
use crate::index::scope::ProxyScope;
use crate::testutil::*;
use shoal_common::model::{Endpoint, Locality};
use shoal_proto::pb::envoy::config::cluster::v3::cluster::common_lb_config::LocalityConfigSpecifier;
use shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use shoal_proto::XdsType;

const CLUSTER_NAME: &str = "outbound|9080||reviews.default.svc.cluster.local";

fn loc(s: &str) -> Locality {
    crate::index::proxy::parse_locality(s)
}

fn ep(address: &str, locality: &str, labels_: &[(&str, &str)]) -> Endpoint {
    Endpoint {
        locality: loc(locality),
        ..endpoint(address, labels_)
    }
}

fn proxy_at(locality: &str, labels_: &[(&str, &str)]) -> Proxy {
    Proxy {
        locality: loc(locality),
        ..sidecar_proxy("default", labels_)
    }
}

/// `reviews` with endpoints in five localities and a rule with `traffic_policy` (YAML).
fn mesh(traffic_policy: &str) -> Mesh {
    let mut m = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "s1",
            &[("http", 8080)],
            vec![
                ep("10.0.0.1", "us-east/a/s1", &[("version", "v1")]),
                ep("10.0.0.2", "us-east/a/s2", &[("version", "v2")]),
                ep("10.0.0.3", "us-east/b", &[("version", "v1")]),
                ep("10.0.0.4", "us-west/a", &[("version", "v1")]),
                ep("10.0.0.5", "eu/x", &[("version", "v2")]),
                ep("10.0.0.6", "us-west/b", &[("version", "v1")]),
                ep("10.0.0.7", "us-west/b", &[("version", "v2")]),
            ],
        ));
    if !traffic_policy.is_empty() {
        m.add_config(destination_rule(
            "default",
            "reviews",
            &format!("host: reviews\ntrafficPolicy: {traffic_policy}\n"),
        ));
    }
    m
}

fn cla(mesh: &Mesh, proxy: &Proxy) -> ClusterLoadAssignment {
    load_assignments(&gen(
        XdsType::Endpoint,
        proxy,
        &mesh.snapshot(),
        &[CLUSTER_NAME],
    ))
    .remove(CLUSTER_NAME)
    .expect("assignment")
}

/// `(locality, priority, weight, endpoint count)` per group, in order.
fn groups(cla: &ClusterLoadAssignment) -> Vec<(String, u32, Option<u32>, usize)> {
    cla.endpoints
        .iter()
        .map(|g| {
            let l = g.locality.clone().unwrap_or_default();
            let name = [l.region, l.zone, l.sub_zone]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("/");
            (
                name,
                g.priority,
                g.load_balancing_weight.map(|w| w.value),
                g.lb_endpoints.len(),
            )
        })
        .collect()
}

/// `(locality, priority)` per group.
fn priorities(cla: &ClusterLoadAssignment) -> Vec<(String, u32)> {
    groups(cla).into_iter().map(|(l, p, _, _)| (l, p)).collect()
}

fn pairs(v: &[(&str, u32)]) -> Vec<(String, u32)> {
    v.iter().map(|(l, p)| (l.to_string(), *p)).collect()
}

const OUTLIER: &str = "outlierDetection: {consecutive5xxErrors: 3}";

#[test]
fn outlier_detection_alone_fails_over_by_locality_as_the_mesh_default() {
    // istiod's mesh default is `localityLbSetting: {enabled: true}`: with outlier detection,
    // priority 0 same subzone, 1 same zone, 2 same region, 3 another region.
    let m = mesh(&format!("{{{OUTLIER}}}"));
    let got = cla(&m, &proxy_at("us-east/a/s1", &[]));
    assert_eq!(
        priorities(&got),
        pairs(&[
            ("eu/x", 3),
            ("us-east/a/s1", 0),
            ("us-east/a/s2", 1),
            ("us-east/b", 2),
            ("us-west/a", 3),
            ("us-west/b", 3),
        ])
    );
    // Each locality weighs its endpoints, as istiod sends it.
    let weights: Vec<Option<u32>> = groups(&got).into_iter().map(|g| g.2).collect();
    assert_eq!(
        weights,
        [Some(1), Some(1), Some(1), Some(1), Some(1), Some(2)]
    );
    // Priorities are renumbered without gaps: a proxy in us-west/b has no same-zone-other-
    // subzone endpoints.
    let got = cla(&m, &proxy_at("us-west/b", &[]));
    assert_eq!(
        priorities(&got),
        pairs(&[
            ("eu/x", 2),
            ("us-east/a/s1", 2),
            ("us-east/a/s2", 2),
            ("us-east/b", 2),
            ("us-west/a", 1),
            ("us-west/b", 0),
        ])
    );
}

#[test]
fn failover_names_the_next_region() {
    let m = mesh(&format!(
        "{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{failover: [{{from: us-east, to: eu}}]}}}}}}"
    ));
    let got = cla(&m, &proxy_at("us-east/a/s1", &[]));
    assert_eq!(
        priorities(&got),
        pairs(&[
            ("eu/x", 3),
            ("us-east/a/s1", 0),
            ("us-east/a/s2", 1),
            ("us-east/b", 2),
            ("us-west/a", 4),
            ("us-west/b", 4),
        ])
    );
    // The cluster balances by locality weights (istiod's ApplyToCluster).
    let c = clusters(&gen(
        XdsType::Cluster,
        &proxy_at("us-east/a/s1", &[]),
        &m.snapshot(),
        &[],
    ))
    .remove(CLUSTER_NAME)
    .expect("cluster");
    assert!(matches!(
        c.common_lb_config.and_then(|l| l.locality_config_specifier),
        Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(_))
    ));
    // A proxy of another region ignores the entry.
    let got = cla(&m, &proxy_at("us-west/a", &[]));
    assert_eq!(
        priorities(&got),
        pairs(&[
            ("eu/x", 2),
            ("us-east/a/s1", 2),
            ("us-east/a/s2", 2),
            ("us-east/b", 2),
            ("us-west/a", 0),
            ("us-west/b", 1),
        ])
    );
}

#[test]
fn no_failover_without_outlier_detection_or_when_disabled() {
    let plain = cla(&mesh(""), &proxy_at("us-east/a/s1", &[]));
    for policy in [
        "{loadBalancer: {localityLbSetting: {failover: [{from: us-east, to: eu}]}}}".to_string(),
        format!("{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{enabled: false}}}}}}"),
    ] {
        let m = mesh(&policy);
        let got = cla(&m, &proxy_at("us-east/a/s1", &[]));
        assert_eq!(got, plain, "{policy}");
        assert!(groups(&got).iter().all(|g| g.1 == 0 && g.2.is_none()));
        let c = clusters(&gen(
            XdsType::Cluster,
            &proxy_at("us-east/a/s1", &[]),
            &m.snapshot(),
            &[],
        ))
        .remove(CLUSTER_NAME)
        .expect("cluster");
        assert!(c
            .common_lb_config
            .and_then(|l| l.locality_config_specifier)
            .is_none());
    }
}

#[test]
fn distribute_sets_locality_weights_for_the_proxys_locality() {
    let m = mesh(
        r#"{loadBalancer: {localityLbSetting: {distribute: [
             {from: "us-east/a/*", to: {"us-east/*": 70, "us-west/*": 30}},
             {from: "us-west/*", to: {"us-west/a": 100}}]}}}"#,
    );
    // us-east/* holds three localities of one endpoint each: ceil(1*70/3) = 24 apiece;
    // us-west/a has one endpoint of three: ceil(1*30/3) = 10, us-west/b two: ceil(2*30/3)
    // = 20; eu is not named: no endpoints (istiod keeps the group, emptied).
    let got = cla(&m, &proxy_at("us-east/a/s2", &[]));
    assert_eq!(
        groups(&got),
        [
            ("eu/x".to_string(), 0, Some(1), 0),
            ("us-east/a/s1".to_string(), 0, Some(24), 1),
            ("us-east/a/s2".to_string(), 0, Some(24), 1),
            ("us-east/b".to_string(), 0, Some(24), 1),
            ("us-west/a".to_string(), 0, Some(10), 1),
            ("us-west/b".to_string(), 0, Some(20), 2),
        ]
    );
    let got = cla(&m, &proxy_at("us-west/b", &[]));
    assert_eq!(
        groups(&got),
        [
            ("eu/x".to_string(), 0, Some(1), 0),
            ("us-east/a/s1".to_string(), 0, Some(1), 0),
            ("us-east/a/s2".to_string(), 0, Some(1), 0),
            ("us-east/b".to_string(), 0, Some(1), 0),
            ("us-west/a".to_string(), 0, Some(100), 1),
            ("us-west/b".to_string(), 0, Some(2), 0),
        ]
    );
    // No `from` matches: the weights are the endpoint counts, nothing is removed.
    let got = cla(&m, &proxy_at("eu/x", &[]));
    assert_eq!(
        groups(&got).iter().map(|g| (g.2, g.3)).collect::<Vec<_>>(),
        [
            (Some(1), 1),
            (Some(1), 1),
            (Some(1), 1),
            (Some(1), 1),
            (Some(1), 1),
            (Some(2), 2)
        ]
    );
    let c = clusters(&gen(
        XdsType::Cluster,
        &proxy_at("eu/x", &[]),
        &m.snapshot(),
        &[],
    ))
    .remove(CLUSTER_NAME)
    .expect("cluster");
    assert!(c
        .common_lb_config
        .and_then(|l| l.locality_config_specifier)
        .is_some());
}

#[test]
fn failover_priority_ranks_endpoints_by_matching_labels() {
    // Region first, then version: same region and version 0, same region 1, else 2.
    let m = mesh(&format!(
        "{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{failoverPriority: [topology.kubernetes.io/region, version]}}}}}}"
    ));
    let got = cla(&m, &proxy_at("us-east/b", &[("version", "v1")]));
    assert_eq!(
        groups(&got),
        [
            ("eu/x".to_string(), 2, Some(1), 1),
            ("us-east/a/s1".to_string(), 0, Some(1), 1),
            ("us-east/a/s2".to_string(), 1, Some(1), 1),
            ("us-east/b".to_string(), 0, Some(1), 1),
            ("us-west/a".to_string(), 2, Some(1), 1),
            // One locality split by rank, each part weighing its endpoints.
            ("us-west/b".to_string(), 2, Some(2), 2),
        ]
    );
    // `version=v2` overrides the proxy's value; a proxy in us-west splits us-west/b.
    let m = mesh(&format!(
        "{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{failoverPriority: [topology.kubernetes.io/region, version=v2]}}}}}}"
    ));
    let got = cla(&m, &proxy_at("us-west/a", &[("version", "v1")]));
    assert_eq!(
        groups(&got),
        [
            ("eu/x".to_string(), 2, Some(1), 1),
            ("us-east/a/s1".to_string(), 2, Some(1), 1),
            ("us-east/a/s2".to_string(), 2, Some(1), 1),
            ("us-east/b".to_string(), 2, Some(1), 1),
            ("us-west/a".to_string(), 1, Some(1), 1),
            ("us-west/b".to_string(), 0, Some(1), 1),
            ("us-west/b".to_string(), 1, Some(1), 1),
        ]
    );
}

#[test]
fn failover_priority_with_failover_orders_by_locality_within_each_rank() {
    let m = mesh(&format!(
        "{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{failoverPriority: [version], failover: [{{from: us-east, to: us-west}}]}}}}}}"
    ));
    // Rank (version) first, then locality, as rank * 5 + locality rank: v1 us-east/a/s1 0,
    // v1 us-east/b 2, v1 us-west 3 (the failover region), v2 us-east/a/s2 6, v2 us-west 8,
    // v2 eu 9 (not the failover region): renumbered 0-5 in that order.
    let got = cla(&m, &proxy_at("us-east/a/s1", &[("version", "v1")]));
    assert_eq!(
        priorities(&got),
        pairs(&[
            ("eu/x", 5),
            ("us-east/a/s1", 0),
            ("us-east/a/s2", 3),
            ("us-east/b", 1),
            ("us-west/a", 2),
            ("us-west/b", 2),
            ("us-west/b", 4),
        ])
    );
}

fn eds_keys(mesh: &Mesh, proxy: &Proxy) -> Vec<EndpointsKey> {
    let snap = mesh.snapshot();
    let scope = ProxyScope::compute(proxy, &snap.ctx);
    generate::keys(
        XdsType::Endpoint,
        proxy,
        &scope,
        &snap,
        &[CLUSTER_NAME.to_string()],
    )
    .into_iter()
    .map(|k| match k {
        Key::Endpoints(k) => k,
        other => panic!("{other:?}"),
    })
    .collect()
}

#[test]
fn the_key_holds_the_proxy_locality_only_when_a_setting_applies() {
    let east = proxy_at("us-east/a/s1", &[("version", "v1")]);
    let east_v2 = proxy_at("us-east/a/s1", &[("version", "v2")]);
    let west = proxy_at("us-west/a", &[("version", "v1")]);
    let west_b = proxy_at("us-west/b", &[("version", "v1")]);
    // No setting in effect: every proxy shares the assignment.
    for policy in [
        "",
        "{loadBalancer: {simple: RANDOM}}",
        "{loadBalancer: {localityLbSetting: {failover: [{from: us-east, to: eu}]}}}",
    ] {
        let m = mesh(policy);
        assert_eq!(eds_keys(&m, &east), eds_keys(&m, &west), "{policy:?}");
    }
    // Failover: locality matters, unrelated labels do not.
    let m = mesh(&format!("{{{OUTLIER}}}"));
    assert_ne!(eds_keys(&m, &east), eds_keys(&m, &west));
    assert_eq!(eds_keys(&m, &east), eds_keys(&m, &east_v2));
    // failoverPriority alone: only the labels matter.
    let m = mesh(&format!(
        "{{{OUTLIER}, loadBalancer: {{localityLbSetting: {{failoverPriority: [version]}}}}}}"
    ));
    assert_eq!(eds_keys(&m, &east), eds_keys(&m, &west));
    assert_ne!(eds_keys(&m, &east), eds_keys(&m, &east_v2));
    // distribute: proxies whose locality picks the same entry share it.
    let m = mesh(
        r#"{loadBalancer: {localityLbSetting: {distribute: [{from: "us-west/*", to: {"us-west/*": 100}}]}}}"#,
    );
    assert_eq!(eds_keys(&m, &west), eds_keys(&m, &west_b));
    assert_ne!(eds_keys(&m, &east), eds_keys(&m, &west));
}
