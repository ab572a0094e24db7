//! DestinationRules as istiod indexes, merges and selects them (`pilot/pkg/model`
//! `setDestinationRules`, `mergeDestinationRule`, `PushContext.destinationRule` and
//! `SidecarScope.DestinationRule`), and the effective traffic policy of one cluster
//! (`GetPortLevelTrafficPolicy`, `MergeSubsetTrafficPolicy`).
//!
//! - Rules are ordered as istiod orders them: rules with a `workloadSelector` first, then
//!   by creation time, name, namespace.
//! - Each namespace has three pools: rules visible in their own namespace, rules exported
//!   to others, and the root namespace's private rules. Rules for one host in one pool
//!   merge: subsets are unioned (the first of a name wins) and the first traffic policy
//!   wins; rules with different `exportTo` or different selectors stay separate.
//! - A proxy looks in its own namespace first, then the service's namespace (rules
//!   exported to it), then the root namespace; within the pool the most specific host
//!   wins (exact, else the longest wildcard).
//! - Of the rules found, the first whose `workloadSelector` matches the proxy (a rule in
//!   the proxy's namespace) applies, else the last one without a selector.

use crate::index::config::Config;
use crate::index::hosts::{labels_match, most_specific, resolve_host};
use crate::index::service::ServiceView;
use shoal_common::model::{
    ConsistentHashLb, DestinationRule, ObjectMeta, PortTrafficPolicy, Subset, TrafficPolicy,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One DestinationRule after istiod's merge of the rules for its host in one pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MergedRule {
    /// The namespace of the first rule (where a `workloadSelector` applies).
    pub namespace: String,
    /// The merged spec; `host` resolved to an FQDN.
    pub spec: DestinationRule,
    /// `exportTo` (a rule with a `workloadSelector` is private: `{"."}`).
    pub export_to: BTreeSet<String>,
    /// The rules merged into it, as `namespace/name`, first first.
    pub from: Vec<String>,
}

type HostRules = BTreeMap<String, Vec<Arc<MergedRule>>>;

/// DestinationRules indexed as istiod's `destinationRuleIndex`.
#[derive(Debug, Default)]
pub struct DestinationRuleIndex {
    /// Rules visible in their own namespace (`exportTo` empty, `*`, `.` or the namespace).
    namespace_local: BTreeMap<String, HostRules>,
    /// Rules exported beyond their namespace.
    exported: BTreeMap<String, HostRules>,
    /// Private rules of the root namespace.
    root_local: HostRules,
    /// The root namespace.
    root_namespace: String,
}

fn private_only(export_to: &BTreeSet<String>, ns: &str) -> bool {
    export_to.len() == 1 && (export_to.contains(".") || export_to.contains(ns))
}

/// istiod's `mergeDestinationRule` (with `ENABLE_ENHANCED_DESTINATIONRULE_MERGE`, the
/// default).
fn merge(pool: &mut BTreeMap<String, Vec<MergedRule>>, meta: &ObjectMeta, rule: &DestinationRule) {
    let export_to = export_set(rule);
    let list = pool.entry(rule.host.clone()).or_default();
    let mut append = true;
    for mdr in list.iter_mut() {
        if export_to == mdr.export_to {
            append = false;
        } else if !mdr.export_to.is_empty() && export_to.is_superset(&mdr.export_to) {
            append = true;
        } else {
            append = true;
            continue;
        }
        let (new_sel, old_sel) = (
            rule.workload_selector.as_ref(),
            mdr.spec.workload_selector.as_ref(),
        );
        match (new_sel, old_sel) {
            (Some(a), Some(b)) if a.match_labels != b.match_labels => {
                append = true;
                continue;
            }
            (Some(_), Some(_)) | (None, None) => append = false,
            _ => {}
        }
        mdr.from.push(format!("{}/{}", meta.namespace, meta.name));
        for subset in &rule.subsets {
            if !mdr.spec.subsets.iter().any(|s| s.name == subset.name) {
                mdr.spec.subsets.push(subset.clone());
            }
        }
        if mdr.spec.traffic_policy.is_none() {
            mdr.spec.traffic_policy = rule.traffic_policy.clone();
        }
    }
    if append {
        list.push(MergedRule {
            namespace: meta.namespace.clone(),
            spec: rule.clone(),
            export_to,
            from: vec![format!("{}/{}", meta.namespace, meta.name)],
        });
    }
}

fn export_set(rule: &DestinationRule) -> BTreeSet<String> {
    if rule.workload_selector.is_some() {
        // Rules with a workload selector are never exported.
        return BTreeSet::from([".".to_string()]);
    }
    rule.export_to.iter().cloned().collect()
}

fn freeze(pool: BTreeMap<String, Vec<MergedRule>>) -> HostRules {
    pool.into_iter()
        .map(|(h, v)| (h, v.into_iter().map(Arc::new).collect()))
        .collect()
}

impl DestinationRuleIndex {
    /// Indexes the rules (any order) as istiod's `setDestinationRules`.
    pub fn build(
        rules: &[Arc<Config<DestinationRule>>],
        root_namespace: &str,
    ) -> DestinationRuleIndex {
        let mut sorted: Vec<(ObjectMeta, DestinationRule)> = rules
            .iter()
            .map(|c| {
                let mut spec = c.spec.clone();
                spec.host = resolve_host(&spec.host, &c.meta.namespace);
                (c.meta.clone(), spec)
            })
            .collect();
        sorted.sort_by(|(am, a), (bm, b)| {
            (a.workload_selector.is_none(), precedence(am))
                .cmp(&(b.workload_selector.is_none(), precedence(bm)))
        });
        let mut local: BTreeMap<String, BTreeMap<String, Vec<MergedRule>>> = BTreeMap::new();
        let mut exported: BTreeMap<String, BTreeMap<String, Vec<MergedRule>>> = BTreeMap::new();
        let mut root_local = BTreeMap::new();
        for (meta, rule) in &sorted {
            let ns = meta.namespace.as_str();
            let export_to = export_set(rule);
            if export_to.is_empty()
                || export_to.contains("*")
                || export_to.contains(".")
                || export_to.contains(ns)
            {
                merge(local.entry(ns.to_string()).or_default(), meta, rule);
            }
            if !private_only(&export_to, ns) {
                merge(exported.entry(ns.to_string()).or_default(), meta, rule);
            } else if ns == root_namespace {
                merge(&mut root_local, meta, rule);
            }
        }
        DestinationRuleIndex {
            namespace_local: local.into_iter().map(|(k, v)| (k, freeze(v))).collect(),
            exported: exported.into_iter().map(|(k, v)| (k, freeze(v))).collect(),
            root_local: freeze(root_local),
            root_namespace: root_namespace.to_string(),
        }
    }

    /// istiod's `PushContext.destinationRule`: the merged rules for a service as seen
    /// from `proxy_ns`.
    fn candidates(&self, proxy_ns: &str, svc: &ServiceView) -> Vec<Arc<MergedRule>> {
        let host = svc.hostname.as_str();
        let own = if proxy_ns != self.root_namespace {
            self.namespace_local
                .get(proxy_ns)
                .and_then(|p| most_specific(p, host))
        } else {
            most_specific(&self.root_local, host)
        };
        if let Some(found) = own {
            return found.clone();
        }
        let exported_from = |ns: &str| -> Vec<Arc<MergedRule>> {
            self.exported
                .get(ns)
                .and_then(|p| most_specific(p, host))
                .into_iter()
                .flatten()
                .filter(|r| exported_to_ns(&r.export_to, proxy_ns))
                .cloned()
                .collect()
        };
        let from_service = exported_from(&svc.namespace);
        if !from_service.is_empty() {
            return from_service;
        }
        exported_from(&self.root_namespace)
    }

    /// The rule that applies to a proxy's outbound traffic to a service (istiod's
    /// `SidecarScope.DestinationRule`): the first rule of the proxy's namespace whose
    /// `workloadSelector` matches the proxy, else the last rule without a selector.
    pub fn for_proxy(
        &self,
        proxy_ns: &str,
        proxy_labels: &BTreeMap<String, String>,
        svc: &ServiceView,
    ) -> Option<Arc<MergedRule>> {
        let mut catch_all = None;
        for r in self.candidates(proxy_ns, svc) {
            match &r.spec.workload_selector {
                None => catch_all = Some(r),
                Some(sel) => {
                    if r.namespace == proxy_ns && labels_match(&sel.match_labels, proxy_labels) {
                        return Some(r);
                    }
                }
            }
        }
        catch_all
    }
}

/// istiod's config order after the selector: creation time, name, namespace.
fn precedence(meta: &ObjectMeta) -> (bool, i64, &str, &str) {
    meta.precedence()
}

fn exported_to_ns(export_to: &BTreeSet<String>, client_ns: &str) -> bool {
    export_to.is_empty() || export_to.contains("*") || export_to.contains(client_ns)
}

/// The policy for one port (istiod's `GetPortLevelTrafficPolicy`): a `portLevelSettings`
/// entry for the port replaces the load balancer, connection pool, outlier detection and
/// TLS settings (nothing is inherited from the rule's); `hasPortLevel` is the second value.
pub fn port_policy(policy: &TrafficPolicy, port: u16) -> (TrafficPolicy, bool) {
    match policy
        .port_level_settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|s| s.number == u32::from(port)))
    {
        Some(PortTrafficPolicy {
            load_balancer,
            connection_pool,
            outlier_detection,
            tls,
            ..
        }) => (
            TrafficPolicy {
                load_balancer: load_balancer.clone(),
                connection_pool: connection_pool.clone(),
                outlier_detection: outlier_detection.clone(),
                tls: tls.clone(),
                port_level_settings: Vec::new(),
            },
            true,
        ),
        None => (
            TrafficPolicy {
                port_level_settings: Vec::new(),
                ..policy.clone()
            },
            false,
        ),
    }
}

/// The cluster of `subset` (empty: the service's own) on `port` under `rule`: the subset's
/// definition and the effective policy; `None` when the subset is named but the rule does
/// not define it (istiod builds no cluster, and so no endpoints, for it).
pub fn subset_policy<'a>(
    rule: Option<&'a DestinationRule>,
    subset: &str,
    port: u16,
) -> Option<(Option<&'a Subset>, Option<TrafficPolicy>)> {
    let subset_spec = if subset.is_empty() {
        None
    } else {
        Some(rule?.subsets.iter().find(|s| s.name == subset)?)
    };
    let policy = effective_policy(
        rule.and_then(|r| r.traffic_policy.as_deref()),
        subset_spec.and_then(|s| s.traffic_policy.as_ref()),
        port,
    );
    Some((subset_spec, policy))
}

/// The effective policy of a cluster (istiod's `MergeSubsetTrafficPolicy`): the rule's
/// policy for the port, with the subset's (for the port) over it field by field — or
/// wholesale when the subset has a port-level entry for the port.
pub fn effective_policy(
    rule: Option<&TrafficPolicy>,
    subset: Option<&TrafficPolicy>,
    port: u16,
) -> Option<TrafficPolicy> {
    let original = rule.map(|p| port_policy(p, port).0);
    let Some(subset) = subset else {
        return original;
    };
    let (sub, has_port_level) = port_policy(subset, port);
    let Some(mut merged) = original else {
        return Some(sub);
    };
    if sub.connection_pool.is_some() || has_port_level {
        merged.connection_pool = sub.connection_pool;
    }
    if sub.outlier_detection.is_some() || has_port_level {
        merged.outlier_detection = sub.outlier_detection;
    }
    if sub.load_balancer.is_some() || has_port_level {
        merged.load_balancer = sub.load_balancer;
    }
    if sub.tls.is_some() || has_port_level {
        merged.tls = sub.tls;
    }
    Some(merged)
}

/// The consistent hash of a route destination (istiod's `HashForHTTPDestination`): the
/// subset's port-level hash, else the subset's, else the rule's port-level hash, else the
/// rule's. Port-level settings count only when the destination names its port.
pub fn destination_hash(
    rule: &DestinationRule,
    subset: &str,
    port: Option<u32>,
) -> Option<ConsistentHashLb> {
    let pls_hash = |p: Option<&TrafficPolicy>| -> Option<ConsistentHashLb> {
        let port = port?;
        p?.port_level_settings
            .iter()
            .find(|s| s.port.as_ref().is_some_and(|s| s.number == port))?
            .load_balancer
            .as_ref()?
            .consistent_hash
            .clone()
    };
    let hash = |p: Option<&TrafficPolicy>| p?.load_balancer.as_ref()?.consistent_hash.clone();
    let top = rule.traffic_policy.as_deref();
    let sub = rule
        .subsets
        .iter()
        .find(|s| s.name == subset)
        .and_then(|s| s.traffic_policy.as_ref());
    pls_hash(sub)
        .or_else(|| hash(sub))
        .or_else(|| pls_hash(top))
        .or_else(|| hash(top))
}
