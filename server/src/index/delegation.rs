//! VirtualService delegation (`http[].delegate`), merged as istiod merges it
//! (`mergeVirtualServices`, `MergeHTTPRoutes`): a root rule that delegates is replaced by
//! the delegate's (child's) rules, each child match ANDed with the root rule's matches, the
//! child's settings taking precedence over the root rule's.
//!
//! The merge happens once per PushContext, so the generators only ever see merged
//! VirtualServices: a route table's key holds the root with its children's rules inside,
//! and a change of a child changes the key of every table its root shapes.

use crate::index::config::Config;
use crate::index::hosts::{exported_to, resolve_host};
use shoal_common::model::{HeaderMatch, HttpMatchRequest, HttpRoute, StringMatch, VirtualService};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The VirtualServices with every root's delegating rules replaced by its children's rules;
/// order is kept. Delegates (VirtualServices without hosts) stay in the list: they bind no
/// gateway and cover no host, so nothing reads them but their roots.
pub fn merge_delegates(vss: &[Arc<Config<VirtualService>>]) -> Vec<Arc<Config<VirtualService>>> {
    let delegates: BTreeMap<(&str, &str), &Config<VirtualService>> = vss
        .iter()
        .filter(|vs| vs.spec.hosts.is_empty())
        .map(|vs| ((vs.meta.namespace.as_str(), vs.meta.name.as_str()), &**vs))
        .collect();
    vss.iter()
        .map(|vs| {
            let is_root =
                !vs.spec.hosts.is_empty() && vs.spec.http.iter().any(|r| r.delegate.is_some());
            if !is_root {
                return vs.clone();
            }
            let mut merged = (**vs).clone();
            merged.spec.http = merged_rules(vs, &delegates);
            Arc::new(merged)
        })
        .collect()
}

/// A root's rules with each delegating rule replaced by its child's merged rules. A rule
/// whose child is missing, is not a delegate, or is not exported to the root's namespace is
/// dropped (istiod ignores only that rule).
fn merged_rules(
    root: &Config<VirtualService>,
    delegates: &BTreeMap<(&str, &str), &Config<VirtualService>>,
) -> Vec<HttpRoute> {
    let root_ns = root.meta.namespace.as_str();
    let mut out = Vec::new();
    for rule in &root.spec.http {
        let Some(d) = &rule.delegate else {
            out.push(rule.clone());
            continue;
        };
        let child_ns = d
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or(root_ns);
        let Some(child) = delegates.get(&(child_ns, d.name.as_str())) else {
            tracing::debug!(root = %root.meta.name, namespace = root_ns, delegate = %d.name,
                "delegate VirtualService not found; the rule is ignored");
            continue;
        };
        if !exported_to(&child.spec.export_to, child_ns, root_ns) {
            tracing::debug!(root = %root.meta.name, namespace = root_ns, delegate = %d.name,
                "delegate VirtualService not exported to the root's namespace; the rule is ignored");
            continue;
        }
        let root_rule = resolve_rule(rule, root_ns);
        // Only one level: a child's own delegating rules (refused at ingest) have no action.
        out.extend(
            child
                .spec
                .http
                .iter()
                .filter(|r| r.delegate.is_none())
                .filter_map(|r| merge_rule(&root_rule, resolve_rule(r, child_ns))),
        );
    }
    out
}

/// A rule with its hosts and gateway names made absolute in `ns`, so that it means the same
/// inside a VirtualService of another namespace (istiod's `ResolveVirtualServiceShortnames`).
fn resolve_rule(rule: &HttpRoute, ns: &str) -> HttpRoute {
    let mut r = rule.clone();
    for d in &mut r.route {
        d.destination.host = resolve_host(&d.destination.host, ns);
    }
    if let Some(m) = &mut r.mirror {
        m.host = resolve_host(&m.host, ns);
    }
    for m in &mut r.mirrors {
        m.destination.host = resolve_host(&m.destination.host, ns);
    }
    for m in &mut r.matches {
        for g in &mut m.gateways {
            if g != "mesh" && !g.contains('/') {
                *g = format!("{ns}/{g}");
            }
        }
    }
    r
}

/// istiod's `mergeHTTPRoute`: the child rule with the root rule's matches ANDed in and the
/// root's settings where the child has none; `None` when the matches conflict.
fn merge_rule(root: &HttpRoute, mut child: HttpRoute) -> Option<HttpRoute> {
    child.matches = merge_matches(&root.matches, &child.matches)?;
    child.name = join_names(&root.name, &child.name);
    fn inherit<T: Clone>(child: &mut Option<T>, root: &Option<T>) {
        if child.is_none() {
            child.clone_from(root);
        }
    }
    inherit(&mut child.rewrite, &root.rewrite);
    inherit(&mut child.direct_response, &root.direct_response);
    inherit(&mut child.timeout, &root.timeout);
    inherit(&mut child.retries, &root.retries);
    inherit(&mut child.fault, &root.fault);
    inherit(&mut child.mirror, &root.mirror);
    inherit(&mut child.mirror_percent, &root.mirror_percent);
    inherit(&mut child.mirror_percentage, &root.mirror_percentage);
    inherit(&mut child.cors_policy, &root.cors_policy);
    inherit(&mut child.headers, &root.headers);
    if child.mirrors.is_empty() {
        child.mirrors.clone_from(&root.mirrors);
    }
    Some(child)
}

/// `root-child`, or whichever is set.
fn join_names(root: &Option<String>, child: &Option<String>) -> Option<String> {
    match (root, child) {
        (Some(r), Some(c)) => Some(format!("{r}-{c}")),
        (r, None) => r.clone(),
        (None, c) => c.clone(),
    }
}

/// istiod's `mergeHTTPMatchRequests`: every child match is ANDed with each root match it
/// does not conflict with. A child match that conflicts with every root match (a URI
/// outside the root's prefix, another header value, ...) makes the whole child rule
/// conflict: `None`, and the rule is dropped.
pub fn merge_matches(
    root: &[HttpMatchRequest],
    child: &[HttpMatchRequest],
) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(child.to_vec());
    }
    if child.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for c in child {
        let before = out.len();
        out.extend(
            root.iter()
                .filter(|r| !conflicts(r, c))
                .map(|r| merge_match(r, c)),
        );
        if out.len() == before {
            return None;
        }
    }
    Some(out)
}

/// istiod's `mergeHTTPMatchRequest`: the child's conditions, the root's where the child
/// has none; maps are unioned, the child's entry winning.
fn merge_match(root: &HttpMatchRequest, child: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = child.clone();
    out.name = join_names(&root.name, &child.name);
    for (field, from) in [
        (&mut out.uri, &root.uri),
        (&mut out.scheme, &root.scheme),
        (&mut out.method, &root.method),
        (&mut out.authority, &root.authority),
    ] {
        if field.is_none() {
            field.clone_from(from);
        }
    }
    for (field, from) in [
        (&mut out.headers, &root.headers),
        (&mut out.without_headers, &root.without_headers),
        (&mut out.query_params, &root.query_params),
    ] {
        for (k, v) in from {
            field.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    for (k, v) in &root.source_labels {
        out.source_labels
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    if out.port.is_none() {
        out.port = root.port;
    }
    if out.source_namespace.is_none() {
        out.source_namespace.clone_from(&root.source_namespace);
    }
    if out.gateways.is_empty() {
        out.gateways.clone_from(&root.gateways);
    }
    out
}

/// istiod's `hasConflict`: whether a child match can never lie within a root match.
fn conflicts(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let value = |m: &Option<StringMatch>| m.clone().map(HeaderMatch::Value);
    for (r, l) in [
        (&root.uri, &leaf.uri),
        (&root.scheme, &leaf.scheme),
        (&root.method, &leaf.method),
        (&root.authority, &leaf.authority),
    ] {
        if string_match_conflict(value(r).as_ref(), value(l).as_ref()) {
            return true;
        }
    }
    for (r, l) in [
        (&root.headers, &leaf.headers),
        (&root.without_headers, &leaf.without_headers),
        (&root.query_params, &leaf.query_params),
    ] {
        if l.iter()
            .any(|(k, lv)| string_match_conflict(r.get(k), Some(lv)))
        {
            return true;
        }
    }
    if root.ignore_uri_case != leaf.ignore_uri_case {
        return true;
    }
    if let (Some(r), Some(l)) = (root.port, leaf.port) {
        if r != l {
            return true;
        }
    }
    if root.source_namespace.is_some() && leaf.source_namespace != root.source_namespace {
        return true;
    }
    if leaf
        .source_labels
        .iter()
        .any(|(k, v)| root.source_labels.get(k).is_some_and(|rv| rv != v))
    {
        return true;
    }
    // The root's gateways must be a superset of the child's.
    if !root.gateways.is_empty() && !leaf.gateways.is_empty() {
        return leaf.gateways.iter().any(|g| !root.gateways.contains(g));
    }
    false
}

/// istiod's `stringMatchConflict`: no conflict when either side is unset; a regex on
/// either side conflicts with anything on the other; an exact root admits only the same
/// exact value; a prefix root admits a longer prefix or an exact value under it. A `{}`
/// (presence) match on both sides conflicts, as in istiod.
fn string_match_conflict(root: Option<&HeaderMatch>, leaf: Option<&HeaderMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else {
        return false;
    };
    let (root, leaf) = match (root, leaf) {
        (HeaderMatch::Value(r), HeaderMatch::Value(l)) => (r, l),
        _ => return true,
    };
    match (root, leaf) {
        (StringMatch::Regex(_), _) | (_, StringMatch::Regex(_)) => true,
        (StringMatch::Exact(r), StringMatch::Exact(l)) => r != l,
        (StringMatch::Exact(_), StringMatch::Prefix(_)) => true,
        (StringMatch::Prefix(r), StringMatch::Prefix(l) | StringMatch::Exact(l)) => {
            !l.starts_with(r.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(yaml: &str) -> HttpMatchRequest {
        shoal_common::yaml::from_str(yaml).expect("test yaml")
    }

    #[test]
    fn string_matches_follow_istiod() {
        let v = |s: StringMatch| HeaderMatch::Value(s);
        let prefix = |s: &str| v(StringMatch::Prefix(s.into()));
        let exact = |s: &str| v(StringMatch::Exact(s.into()));
        let regex = |s: &str| v(StringMatch::Regex(s.into()));
        let c = |r: &HeaderMatch, l: &HeaderMatch| string_match_conflict(Some(r), Some(l));
        assert!(!c(&prefix("/a"), &prefix("/a/b")));
        assert!(c(&prefix("/a/b"), &prefix("/a")));
        assert!(!c(&prefix("/a"), &exact("/a/x")));
        assert!(c(&prefix("/a"), &exact("/b")));
        assert!(!c(&exact("/a"), &exact("/a")));
        assert!(c(&exact("/a"), &exact("/b")));
        assert!(c(&exact("/a"), &prefix("/a")));
        assert!(c(&regex(".*"), &prefix("/a")));
        assert!(c(&prefix("/a"), &regex("/a.*")));
        assert!(c(&HeaderMatch::Present, &exact("x")));
        assert!(!string_match_conflict(None, Some(&exact("x"))));
        assert!(!string_match_conflict(Some(&exact("x")), None));
    }

    #[test]
    fn matches_merge_pairwise_and_conflicts_drop_the_rule() {
        let root = [m("{uri: {prefix: /v2}}"), m("{uri: {prefix: /beta}}")];
        let merged = merge_matches(&root, &[m("{headers: {x: {exact: y}}}")]).unwrap();
        assert_eq!(
            merged.len(),
            2,
            "one child match ANDed with each root match"
        );
        assert_eq!(merged[1].uri, Some(StringMatch::Prefix("/beta".into())));
        assert_eq!(merged[1].headers.len(), 1);
        // /v2/a lies within /v2 only: the /beta pair is dropped.
        let merged = merge_matches(&root, &[m("{uri: {prefix: /v2/a}}")]).unwrap();
        assert_eq!(merged.len(), 1);
        // A child match outside every root match: the whole rule conflicts.
        assert_eq!(
            merge_matches(
                &root,
                &[m("{uri: {prefix: /v2/a}}"), m("{uri: {prefix: /other}}")]
            ),
            None
        );
        assert!(merge_matches(&[m("{sourceNamespace: a}")], &[m("{port: 80}")]).is_none());
        assert!(merge_matches(&[m("{port: 80}")], &[m("{port: 81}")]).is_none());
        assert!(merge_matches(&[m("{gateways: [a/g]}")], &[m("{gateways: [a/h]}")]).is_none());
        assert!(merge_matches(&[m("{ignoreUriCase: true}")], &[m("{}")]).is_none());
    }
}
