//! Golden comparison with istiod: the Envoy config dumps in `../shared/istio-golden/` (real
//! istiod output, copied verbatim from Istio's repository; see its README) against what
//! shoal generates for the same mesh.
//!
//! The dumps carry no inputs, so each test rebuilds the mesh they were taken from (the
//! services, ports, endpoints and Istio config the dump's names and fields imply) and
//! reduces both sides to the same flat facts (`lds/<listener>/<field>` = value). Every
//! difference must be named by an entry of the test's allow-list, with the reason (Istio
//! version drift, ambient mode, a deliberate choice, a known gap); an entry that no longer
//! matches a difference fails the test too, so the list only shrinks.
//!
//! The files are read at run time from beside the clone (CI has `../shared` there); they are
//! never copied into this repository.
//!
//! No Istio repository holds a 1.2x sidecar CDS dump (see the README), so clusters are
//! compared by what the other dumps say about them: every cluster a dumped listener, route
//! or load assignment names exists in shoal's CDS, with the discovery type istiod gives it.

use crate::index::proxy::Proxy;
use crate::testutil::*;
use prost::Message;
use serde_json::Value;
use shoal_common::model::{Protocol, Service, ServicePort, TargetPort};
use shoal_proto::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, Cluster};
use shoal_proto::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, route_match::PathSpecifier, RouteConfiguration,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::ClusterSpecifier as TcpCluster, TcpProxy,
};
use shoal_proto::pb::google::protobuf::{value, Duration as PbDuration};
use shoal_proto::XdsType;
use std::collections::{BTreeMap, BTreeSet};

/// Flat facts: `<type>/<resource>/<field>` → value.
type Facts = BTreeMap<String, String>;

/// A difference the comparison accepts: a glob over fact keys (`*` matches anything) and
/// why the difference is there.
struct Allowed {
    keys: &'static str,
    why: &'static str,
}

const fn allow(keys: &'static str, why: &'static str) -> Allowed {
    Allowed { keys, why }
}

fn golden(file: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/istio-golden")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the istiod dumps live in ../shared beside the clone)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn glob(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first) || !s[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Fails unless every difference between the two sides is allowed, and every allowance
/// still matches a difference.
fn compare(what: &str, istiod: &Facts, shoal: &Facts, allowed: &[Allowed]) {
    let keys: BTreeSet<&String> = istiod.keys().chain(shoal.keys()).collect();
    let mut used = vec![false; allowed.len()];
    let mut unexplained = Vec::new();
    for key in keys {
        let (a, b) = (istiod.get(key), shoal.get(key));
        if a == b {
            continue;
        }
        match allowed.iter().position(|al| glob(al.keys, key)) {
            Some(i) => {
                used[i] = true;
                // Shown with `--nocapture`: what each allowance covers.
                eprintln!(
                    "allowed ({}): {key}\n    istiod: {}\n    shoal:  {}",
                    allowed[i].keys,
                    a.map_or("<absent>", String::as_str),
                    b.map_or("<absent>", String::as_str)
                );
            }
            None => unexplained.push(format!(
                "  {key}\n    istiod: {}\n    shoal:  {}",
                a.map_or("<absent>", String::as_str),
                b.map_or("<absent>", String::as_str)
            )),
        }
    }
    let stale: Vec<String> = allowed
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|(al, _)| format!("  {} ({})", al.keys, al.why))
        .collect();
    assert!(
        unexplained.is_empty() && stale.is_empty(),
        "{what}: {} differences from istiod not in the allow-list:\n{}\n\
         allow-list entries that match no difference (remove them):\n{}",
        unexplained.len(),
        unexplained.join("\n"),
        stale.join("\n")
    );
}

mod endpoints;
mod listeners;
mod routes;

// ---------------------------------------------------------------------------------------
// Shared readers

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn names(v: &Value, field: &str) -> String {
    v.as_array()
        .map(|a| a.iter().map(|x| s(&x[field])).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

fn strings(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

fn dur(d: &Option<PbDuration>) -> String {
    match d {
        None => String::new(),
        Some(d) if d.nanos == 0 => format!("{}s", d.seconds),
        Some(d) => format!("{}s", d.seconds as f64 + f64::from(d.nanos) / 1e9),
    }
}

fn typed<M: Message + Default>(f: &Filter) -> Option<M> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => M::decode(&*any.value).ok(),
        _ => None,
    }
}

fn svc(ns: &str, name: &str, vip: &str, ports: &[(&str, u16, Protocol)]) -> Service {
    let mut s = service(ns, name, &[]);
    s.cluster_ips = vec![vip.into()];
    s.ports = ports
        .iter()
        .map(|(n, p, proto)| ServicePort {
            name: n.to_string(),
            port: *p,
            protocol: *proto,
            target_port: None,
        })
        .collect();
    s
}
