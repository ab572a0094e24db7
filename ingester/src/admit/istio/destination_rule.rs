//! DestinationRule validation, as Istio's admission webhook would refuse the object, plus
//! what shoal does not implement yet: every error names the field.

use crate::error::InvalidObject;
use shoal_common::model::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, DestinationRule, Duration,
    LoadBalancerSettings, LocalityLbSetting, OutlierDetection, TrafficPolicy,
};
use std::collections::BTreeSet;

type Result = std::result::Result<(), InvalidObject>;

fn invalid(reason: String) -> Result {
    Err(InvalidObject::new(reason))
}

const LABEL_REGION: &str = "topology.kubernetes.io/region";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const LABEL_SUBZONE: &str = "topology.istio.io/subzone";

/// Envoy's largest ring (`maximum_ring_size` default).
const MAX_RING_SIZE: u64 = 1 << 23;

/// Checks a DestinationRule.
pub fn validate(dr: &DestinationRule) -> Result {
    if dr.host.is_empty() {
        return invalid("host is empty".into());
    }
    if let Some(sel) = &dr.workload_selector {
        if sel.match_labels.is_empty() {
            return invalid(
                "workloadSelector.matchLabels is empty: a selector must name at least one label"
                    .into(),
            );
        }
    }
    if let Some(p) = &dr.traffic_policy {
        traffic_policy(p, "trafficPolicy")?;
    }
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let at = format!("subsets[{i}]");
        if subset.name.is_empty() {
            return invalid(format!("{at}.name is empty"));
        }
        if !names.insert(subset.name.as_str()) {
            return invalid(format!(
                "{at}.name {:?} is used by an earlier subset",
                subset.name
            ));
        }
        if let Some(p) = &subset.traffic_policy {
            traffic_policy(p, &format!("{at}.trafficPolicy"))?;
        }
    }
    Ok(())
}

fn traffic_policy(p: &TrafficPolicy, at: &str) -> Result {
    settings(
        p.load_balancer.as_ref(),
        p.connection_pool.as_ref(),
        p.outlier_detection.as_ref(),
        p.tls.as_ref(),
        at,
    )?;
    for (i, pl) in p.port_level_settings.iter().enumerate() {
        let at = format!("{at}.portLevelSettings[{i}]");
        match &pl.port {
            None => return invalid(format!("{at}.port is required")),
            Some(port) if !(1..=65535).contains(&port.number) => {
                return invalid(format!(
                    "{at}.port.number {} is not in 1-65535",
                    port.number
                ))
            }
            Some(_) => {}
        }
        settings(
            pl.load_balancer.as_ref(),
            pl.connection_pool.as_ref(),
            pl.outlier_detection.as_ref(),
            pl.tls.as_ref(),
            &at,
        )?;
    }
    Ok(())
}

fn settings(
    lb: Option<&LoadBalancerSettings>,
    pool: Option<&ConnectionPoolSettings>,
    outlier: Option<&OutlierDetection>,
    tls: Option<&ClientTlsSettings>,
    at: &str,
) -> Result {
    if let Some(lb) = lb {
        load_balancer(lb, &format!("{at}.loadBalancer"))?;
    }
    if let Some(pool) = pool {
        connection_pool(pool, &format!("{at}.connectionPool"))?;
    }
    if let Some(od) = outlier {
        outlier_detection(od, &format!("{at}.outlierDetection"))?;
    }
    // istiod's validation: MUTUAL with certificate files needs both of them.
    if let Some(tls) = tls.filter(|t| t.mode == ClientTlsMode::Mutual) {
        if tls
            .client_certificate
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return invalid(format!(
                "{at}.tls.clientCertificate is required for mode MUTUAL"
            ));
        }
        if tls.private_key.as_deref().unwrap_or_default().is_empty() {
            return invalid(format!("{at}.tls.privateKey is required for mode MUTUAL"));
        }
    }
    Ok(())
}

fn load_balancer(lb: &LoadBalancerSettings, at: &str) -> Result {
    if let Some(l) = &lb.locality_lb_setting {
        locality_lb_setting(l, &format!("{at}.localityLbSetting"))?;
    }
    let Some(ch) = &lb.consistent_hash else {
        return Ok(());
    };
    if lb.simple.is_some() {
        return invalid(format!(
            "{at}: simple and consistentHash are mutually exclusive"
        ));
    }
    let at = format!("{at}.consistentHash");
    let keys = [
        ch.http_header_name.is_some(),
        ch.http_cookie.is_some(),
        ch.use_source_ip.is_some(),
        ch.http_query_parameter_name.is_some(),
    ];
    if keys.iter().filter(|k| **k).count() != 1 {
        return invalid(format!(
            "{at}: exactly one of httpHeaderName, httpCookie, useSourceIp and \
             httpQueryParameterName is required"
        ));
    }
    if ch.http_header_name.as_deref() == Some("") {
        return invalid(format!("{at}.httpHeaderName is empty"));
    }
    if ch.http_query_parameter_name.as_deref() == Some("") {
        return invalid(format!("{at}.httpQueryParameterName is empty"));
    }
    if ch.use_source_ip == Some(false) {
        return invalid(format!(
            "{at}.useSourceIp is false: set it to true, or hash on something else"
        ));
    }
    if let Some(c) = &ch.http_cookie {
        if c.name.is_empty() {
            return invalid(format!("{at}.httpCookie.name is empty"));
        }
    }
    let algorithms = [
        ch.ring_hash.is_some(),
        ch.maglev.is_some(),
        ch.minimum_ring_size.is_some(),
    ];
    if algorithms.iter().filter(|a| **a).count() > 1 {
        return invalid(format!(
            "{at}: ringHash, maglev and minimumRingSize are mutually exclusive"
        ));
    }
    let ring = ch
        .ring_hash
        .as_ref()
        .and_then(|r| r.minimum_ring_size)
        .or(ch.minimum_ring_size);
    if let Some(size) = ring.filter(|s| *s > MAX_RING_SIZE) {
        let field = if ch.ring_hash.is_some() {
            "ringHash.minimumRingSize"
        } else {
            "minimumRingSize"
        };
        return invalid(format!(
            "{at}.{field} {size} is larger than the maximum ring size {MAX_RING_SIZE}"
        ));
    }
    if let Some(size) = ch.maglev.as_ref().and_then(|m| m.table_size) {
        if !is_prime(size) {
            return invalid(format!(
                "{at}.maglev.tableSize {size} is not a prime number"
            ));
        }
    }
    Ok(())
}

/// Istio's `ValidateLocalityLbSetting`.
fn locality_lb_setting(l: &LocalityLbSetting, at: &str) -> Result {
    if !l.distribute.is_empty() && !l.failover.is_empty() {
        return invalid(format!(
            "{at}: distribute and failover are mutually exclusive"
        ));
    }
    if !l.failover.is_empty() {
        if let Some(label) = l
            .failover_priority
            .iter()
            .find(|p| [LABEL_REGION, LABEL_ZONE, LABEL_SUBZONE].contains(&p.as_str()))
        {
            return invalid(format!(
                "{at}.failoverPriority: topology label {label} cannot be combined with failover"
            ));
        }
    }
    for (i, d) in l.distribute.iter().enumerate() {
        let at = format!("{at}.distribute[{i}]");
        let mut total = 0u32;
        for (to, weight) in &d.to {
            if !(1..=100).contains(weight) {
                return invalid(format!("{at}.to[{to}] weight {weight} is not in 1-100"));
            }
            total += weight;
        }
        if total != 100 {
            return invalid(format!("{at}.to: the weights sum to {total}, not 100"));
        }
        localities(d.to.keys().map(String::as_str), &format!("{at}.to"))?;
    }
    localities(
        l.distribute.iter().map(|d| d.from.as_str()),
        &format!("{at}.distribute[].from"),
    )?;
    for (i, f) in l.failover.iter().enumerate() {
        let at = format!("{at}.failover[{i}]");
        if f.from == f.to {
            return invalid(format!(
                "{at}: from and to are both {:?}: failover must name another region",
                f.from
            ));
        }
        if f.from.contains('/') || f.to.contains('/') {
            return invalid(format!("{at}: from and to are regions, without '/'"));
        }
        if f.from.contains('*') || f.to.contains('*') {
            return invalid(format!("{at}: from and to cannot contain '*'"));
        }
    }
    Ok(())
}

/// Istio's `validateLocalities`: each `region[/zone[/subzone]]` has no empty part, at most
/// one `*` and only at the end, and none overlaps one before it.
fn localities<'a>(list: impl Iterator<Item = &'a str>, at: &str) -> Result {
    let mut seen: Vec<Vec<&str>> = Vec::new();
    for loc in list {
        let stars = loc.matches('*').count();
        if stars > 1 || (stars == 1 && !loc.ends_with('*')) {
            return invalid(format!(
                "{at}: locality {loc:?} may have one '*', at the end"
            ));
        }
        let parts: Vec<&str> = loc.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return invalid(format!(
                "{at}: locality {loc:?} has an empty region, zone or subzone"
            ));
        }
        // An earlier locality covers this one when it is a prefix of it, its `*` matching
        // anything (a wildcard after specific localities is a fallback, as in Istio).
        let covers = |a: &[&str], b: &[&str]| a.iter().zip(b).all(|(x, y)| x == y || *x == "*");
        if seen.iter().any(|s| covers(s, &parts)) {
            return invalid(format!(
                "{at}: locality {loc:?} overlaps one listed before it"
            ));
        }
        seen.push(parts);
    }
    Ok(())
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

fn duration(d: Option<Duration>, at: &str) -> Result {
    match d {
        Some(d) if d.get() < std::time::Duration::from_millis(1) => {
            invalid(format!("{at} {d} is shorter than 1ms"))
        }
        _ => Ok(()),
    }
}

fn non_negative(v: Option<i32>, at: &str) -> Result {
    match v {
        Some(v) if v < 0 => invalid(format!("{at} {v} is negative")),
        _ => Ok(()),
    }
}

fn connection_pool(pool: &ConnectionPoolSettings, at: &str) -> Result {
    if pool.tcp.is_none() && pool.http.is_none() {
        return invalid(format!("{at}: tcp or http is required"));
    }
    if let Some(tcp) = &pool.tcp {
        let at = format!("{at}.tcp");
        non_negative(tcp.max_connections, &format!("{at}.maxConnections"))?;
        duration(tcp.connect_timeout, &format!("{at}.connectTimeout"))?;
        duration(
            tcp.max_connection_duration,
            &format!("{at}.maxConnectionDuration"),
        )?;
        duration(tcp.idle_timeout, &format!("{at}.idleTimeout"))?;
        if let Some(ka) = &tcp.tcp_keepalive {
            for (d, name) in [(ka.time, "time"), (ka.interval, "interval")] {
                if let Some(d) = d {
                    if d.get() < std::time::Duration::from_secs(1) {
                        return invalid(format!(
                            "{at}.tcpKeepalive.{name} {d} is shorter than 1s (Envoy counts \
                             keepalive in whole seconds)"
                        ));
                    }
                }
            }
        }
    }
    if let Some(http) = &pool.http {
        let at = format!("{at}.http");
        non_negative(
            http.http1_max_pending_requests,
            &format!("{at}.http1MaxPendingRequests"),
        )?;
        non_negative(http.http2_max_requests, &format!("{at}.http2MaxRequests"))?;
        non_negative(
            http.max_requests_per_connection,
            &format!("{at}.maxRequestsPerConnection"),
        )?;
        non_negative(http.max_retries, &format!("{at}.maxRetries"))?;
        non_negative(
            http.max_concurrent_streams,
            &format!("{at}.maxConcurrentStreams"),
        )?;
        duration(http.idle_timeout, &format!("{at}.idleTimeout"))?;
    }
    Ok(())
}

fn outlier_detection(od: &OutlierDetection, at: &str) -> Result {
    duration(od.interval, &format!("{at}.interval"))?;
    duration(od.base_ejection_time, &format!("{at}.baseEjectionTime"))?;
    for (v, name) in [
        (od.max_ejection_percent, "maxEjectionPercent"),
        (od.min_health_percent, "minHealthPercent"),
    ] {
        if let Some(v) = v {
            if !(0..=100).contains(&v) {
                return invalid(format!("{at}.{name} {v} is not in 0-100"));
            }
        }
    }
    if od.consecutive_local_origin_failures.is_some()
        && od.split_external_local_origin_errors != Some(true)
    {
        return invalid(format!(
            "{at}.consecutiveLocalOriginFailures needs splitExternalLocalOriginErrors: true"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::admit::istio::{config_spec, validate};
    use shoal_common::model::{ConfigKind, ConfigSpec};

    fn spec(yaml: &str) -> Result<ConfigSpec, String> {
        let v: serde_json::Value = shoal_common::yaml::from_str(yaml).expect("test yaml");
        config_spec(ConfigKind::DestinationRule, v).map_err(|e| e.to_string())
    }

    fn reason(yaml: &str) -> String {
        let s = spec(yaml).expect("decodes");
        validate(&s).expect_err("invalid").reason
    }

    fn ok(yaml: &str) {
        let s = spec(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        if let Err(e) = validate(&s) {
            panic!("{}\n{yaml}", e.reason);
        }
    }

    #[test]
    fn accepts_the_implemented_traffic_policy() {
        ok(r#"
host: reviews
workloadSelector: {matchLabels: {app: productpage}}
trafficPolicy:
  connectionPool:
    tcp: {maxConnections: 100, connectTimeout: 30ms, maxConnectionDuration: 1h, idleTimeout: 5m,
          tcpKeepalive: {probes: 3, time: 7200s, interval: 75s}}
    http: {http1MaxPendingRequests: 10, http2MaxRequests: 100, maxRequestsPerConnection: 1,
           maxRetries: 3, idleTimeout: 1m, h2UpgradePolicy: UPGRADE, useClientProtocol: false,
           maxConcurrentStreams: 10}
  outlierDetection: {consecutive5xxErrors: 3, consecutiveGatewayErrors: 2, interval: 1s,
                     baseEjectionTime: 30s, maxEjectionPercent: 50, minHealthPercent: 10,
                     splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 4}
  loadBalancer:
    consistentHash: {httpCookie: {name: user, path: /, ttl: 0s}, ringHash: {minimumRingSize: 4096}}
    localityLbSetting:
      enabled: true
      failover: [{from: us-east, to: us-west}]
      failoverPriority: [topology.istio.io/network, version=v1]
  tls: {mode: SIMPLE, caCertificates: /etc/certs/ca.pem, sni: reviews.example, subjectAltNames: [reviews.example]}
  portLevelSettings:
  - port: {number: 9080}
    loadBalancer: {simple: PASSTHROUGH}
subsets:
- name: v1
  labels: {version: v1}
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-user, maglev: {tableSize: 65537}}}
- name: v2
  labels: {version: v2}
  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        distribute:
        - {from: us-east/a/*, to: {us-east/a/*: 70, us-east/b: 20, "us-west/*": 10}}
        - {from: "us-west/*", to: {"us-west/*": 100}}
"#);
    }

    #[test]
    fn mesh_tls_modes_are_accepted_and_mutual_needs_its_files() {
        assert!(spec("host: r\ntrafficPolicy: {tls: {mode: ISTIO_MUTUAL}}").is_ok());
        assert!(spec(
            "host: r\ntrafficPolicy: {tls: {mode: MUTUAL, clientCertificate: /c, privateKey: /k, caCertificates: /ca}}"
        )
        .is_ok());
        let r = reason("host: r\nsubsets: [{name: v1, trafficPolicy: {portLevelSettings: [{port: {number: 80}, tls: {mode: MUTUAL, privateKey: /k}}]}}]");
        assert!(
            r.starts_with(
                "subsets[0].trafficPolicy.portLevelSettings[0].tls.clientCertificate is required"
            ),
            "{r}"
        );
        let r = reason("host: r\ntrafficPolicy: {tls: {mode: MUTUAL, clientCertificate: /c}}");
        assert!(
            r.starts_with("trafficPolicy.tls.privateKey is required"),
            "{r}"
        );
    }

    #[test]
    fn unimplemented_fields_are_rejected_by_name() {
        for (yaml, field) in [
            ("host: r\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN, warmupDurationSecs: 10s}}", "spec.trafficPolicy.loadBalancer.warmupDurationSecs"),
            ("host: r\ntrafficPolicy: {outlierDetection: {consecutiveErrors: 5}}", "spec.trafficPolicy.outlierDetection.consecutiveErrors"),
            ("host: r\ntrafficPolicy: {tunnel: {targetHost: a, targetPort: 1}}", "spec.trafficPolicy.tunnel"),
            ("host: r\ntrafficPolicy: {proxyProtocol: {version: V1}}", "spec.trafficPolicy.proxyProtocol"),
            ("host: r\ntrafficPolicy: {connectionPool: {http: {http2KeepAlive: {time: 1s}}}}", "spec.trafficPolicy.connectionPool.http.http2KeepAlive"),
            ("host: r\ntrafficPolicy: {tls: {mode: SIMPLE, credentialName: c}}", "spec.trafficPolicy.tls.credentialName"),
        ] {
            let e = spec(yaml).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        assert!(spec("host: r\ntrafficPolicy: {loadBalancer: {simple: MAGIC}}").is_err());
        assert!(spec("host: r\ntrafficPolicy: {tls: {mode: SOMETIMES}}").is_err());
    }

    #[test]
    fn field_errors() {
        for (yaml, want) in [
            ("subsets: []", "host is empty"),
            ("host: r\nworkloadSelector: {matchLabels: {}}", "workloadSelector.matchLabels is empty"),
            ("host: r\ntrafficPolicy: {loadBalancer: {simple: RANDOM, consistentHash: {httpHeaderName: x}}}", "trafficPolicy.loadBalancer: simple and consistentHash are mutually exclusive"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x, useSourceIp: true}}}", "trafficPolicy.loadBalancer.consistentHash: exactly one of"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {ringHash: {}}}}", "trafficPolicy.loadBalancer.consistentHash: exactly one of"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {path: /}}}}", "trafficPolicy.loadBalancer.consistentHash.httpCookie.name is empty"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, ringHash: {}, maglev: {}}}}", "trafficPolicy.loadBalancer.consistentHash: ringHash, maglev and minimumRingSize are mutually exclusive"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, minimumRingSize: 99999999}}}", "trafficPolicy.loadBalancer.consistentHash.minimumRingSize 99999999 is larger"),
            ("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 1000}}}}", "trafficPolicy.loadBalancer.consistentHash.maglev.tableSize 1000 is not a prime"),
            ("host: r\ntrafficPolicy: {connectionPool: {}}", "trafficPolicy.connectionPool: tcp or http is required"),
            ("host: r\ntrafficPolicy: {connectionPool: {tcp: {connectTimeout: 0s}}}", "trafficPolicy.connectionPool.tcp.connectTimeout 0s is shorter than 1ms"),
            ("host: r\ntrafficPolicy: {connectionPool: {tcp: {maxConnections: -1}}}", "trafficPolicy.connectionPool.tcp.maxConnections -1 is negative"),
            ("host: r\ntrafficPolicy: {connectionPool: {tcp: {tcpKeepalive: {time: 500ms}}}}", "trafficPolicy.connectionPool.tcp.tcpKeepalive.time 500ms is shorter than 1s"),
            ("host: r\ntrafficPolicy: {connectionPool: {http: {maxRetries: -2}}}", "trafficPolicy.connectionPool.http.maxRetries -2 is negative"),
            ("host: r\ntrafficPolicy: {outlierDetection: {maxEjectionPercent: 101}}", "trafficPolicy.outlierDetection.maxEjectionPercent 101 is not in 0-100"),
            ("host: r\ntrafficPolicy: {outlierDetection: {minHealthPercent: -1}}", "trafficPolicy.outlierDetection.minHealthPercent -1 is not in 0-100"),
            ("host: r\ntrafficPolicy: {outlierDetection: {interval: 0s}}", "trafficPolicy.outlierDetection.interval 0s is shorter than 1ms"),
            ("host: r\ntrafficPolicy: {outlierDetection: {consecutiveLocalOriginFailures: 3}}", "trafficPolicy.outlierDetection.consecutiveLocalOriginFailures needs splitExternalLocalOriginErrors: true"),
            ("host: r\ntrafficPolicy: {portLevelSettings: [{loadBalancer: {simple: RANDOM}}]}", "trafficPolicy.portLevelSettings[0].port is required"),
            ("host: r\ntrafficPolicy: {portLevelSettings: [{port: {number: 70000}}]}", "trafficPolicy.portLevelSettings[0].port.number 70000 is not in 1-65535"),
            ("host: r\nsubsets: [{name: v1}, {name: v1}]", "subsets[1].name \"v1\" is used by an earlier subset"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {a/*: 100}}], failover: [{from: a, to: b}]}}}", "trafficPolicy.loadBalancer.localityLbSetting: distribute and failover are mutually exclusive"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {a/*: 80, b/*: 10}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to: the weights sum to 90, not 100"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {a/*: 0, b/*: 100}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to[a/*] weight 0 is not in 1-100"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {a/*: 50, a/z: 50}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to: locality \"a/z\" overlaps"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {a/*: 100}}, {from: a/z, to: {a/*: 100}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[].from: locality \"a/z\" overlaps"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: \"a/*/c\", to: {a: 100}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[].from: locality \"a/*/c\" may have one '*', at the end"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a//c, to: {a: 100}}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.distribute[].from: locality \"a//c\" has an empty"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: a}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.failover[0]: from and to are both \"a\""),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a/z, to: b}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.failover[0]: from and to are regions"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: \"*\"}]}}}", "trafficPolicy.loadBalancer.localityLbSetting.failover[0]: from and to cannot contain '*'"),
            ("host: r\ntrafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: b}], failoverPriority: [topology.kubernetes.io/zone]}}}", "trafficPolicy.loadBalancer.localityLbSetting.failoverPriority: topology label topology.kubernetes.io/zone"),
        ] {
            let r = reason(yaml);
            assert!(r.starts_with(want), "{yaml}\nwant: {want}\ngot:  {r}");
        }
    }
}
