//! Host names and namespaced references as Istio writes them in config, matched in one
//! place: `exportTo`, short names, wildcard hosts, label selectors and the `ns/host`
//! entries of Sidecars and Gateways, and the `ns/name` references between objects.

use shoal_common::model::service_fqdn;
use std::collections::BTreeMap;

/// Istio `exportTo` semantics: empty or `*` = everywhere, `.` = own namespace, `~` = nowhere.
pub fn exported_to(export_to: &[String], own_ns: &str, viewer_ns: &str) -> bool {
    export_to.is_empty()
        || export_to
            .iter()
            .any(|e| e == "*" || (e == "." && own_ns == viewer_ns) || e == viewer_ns)
}

/// Resolves a host as written in config in `namespace` to a hostname: a short name
/// (no dots) becomes the FQDN of that service in the namespace.
pub fn resolve_host(host: &str, namespace: &str) -> String {
    if host.contains('.') || host.contains('*') {
        host.to_string()
    } else {
        service_fqdn(host, namespace)
    }
}

/// Whether a host pattern (`*`, `*.suffix`, or a hostname) covers `host`, as Istio's
/// `SubsetOf`: a wildcard also covers the narrower wildcards under it (`*.com` covers
/// `*.a.com`).
pub fn wildcard_covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.strip_prefix('*').unwrap_or(host).ends_with(suffix),
        None => pattern == host,
    }
}

/// The entry of `map` for `host`: the exact key, else the most specific wildcard key that
/// covers it (Istio's `MostSpecificHostMatch`).
pub fn most_specific<'a, V>(map: &'a BTreeMap<String, V>, host: &str) -> Option<&'a V> {
    map.get(host).or_else(|| {
        map.iter()
            .filter(|(k, _)| k.starts_with('*') && wildcard_covers(k, host))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| v)
    })
}

/// Whether every label of `selector` is in `labels` (an empty selector matches all).
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Splits an `ns/host` entry (Sidecar egress hosts, Gateway server hosts); an entry
/// without a namespace part stands for any namespace (`*`).
pub fn split_namespaced_host(entry: &str) -> (&str, &str) {
    entry.split_once('/').unwrap_or(("*", entry))
}

/// Whether the namespace part of an `ns/host` entry written in `own_ns` admits an object in
/// `candidate_ns`: `*` any, `.` the entry's own namespace, `~` none, else that namespace.
pub fn namespace_admits(ns: &str, own_ns: &str, candidate_ns: &str) -> bool {
    match ns {
        "*" => true,
        "~" => false,
        "." => candidate_ns == own_ns,
        other => candidate_ns == other,
    }
}

/// Splits an `ns/name` reference (a VirtualService's gateways, a service account) written
/// in `own_ns`; a bare name is in `own_ns`.
pub fn split_reference<'a>(reference: &'a str, own_ns: &'a str) -> (&'a str, &'a str) {
    reference.split_once('/').unwrap_or((own_ns, reference))
}
