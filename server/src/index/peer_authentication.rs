//! Which mutual TLS mode applies, as istiod composes PeerAuthentications
//! (`pilot/pkg/security/authn/policy_applier.go` `ComposePeerAuthentication`,
//! `pilot/pkg/model/authentication.go`).
//!
//! For a workload's inbound ports: the mesh policy (root namespace, no selector), overridden
//! by its namespace's policy (no selector), overridden by a workload policy (a selector that
//! matches, in the workload's namespace); `UNSET` inherits from the level above, and with no
//! policy at all the mode is PERMISSIVE. Of several policies at one level the oldest wins
//! (creation time, then name). A workload policy's `portLevelMtls` overrides per workload
//! port (`UNSET` there inherits the workload's mode). Selector policies in the root
//! namespace apply to nothing, as in istiod.
//!
//! For auto mTLS (a client deciding whether to originate mTLS) istiod looks only at the
//! destination's namespace and mesh policies ([`namespace_mode`]).

use crate::index::config::Config;
use crate::index::hosts::labels_match;
use crate::index::push_context::PushContext;
use shoal_common::model::{MtlsMode as PolicyMode, PeerAuthentication};
use std::collections::BTreeMap;

/// An effective mutual TLS mode of an inbound port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum MtlsMode {
    /// Plaintext only.
    Disable,
    /// Mutual TLS and plaintext.
    #[default]
    Permissive,
    /// Mutual TLS only.
    Strict,
}

impl MtlsMode {
    /// The mode a policy sets, or `None` for `UNSET` (inherit).
    fn from_policy(mode: PolicyMode) -> Option<MtlsMode> {
        match mode {
            PolicyMode::Unset => None,
            PolicyMode::Disable => Some(MtlsMode::Disable),
            PolicyMode::Permissive => Some(MtlsMode::Permissive),
            PolicyMode::Strict => Some(MtlsMode::Strict),
        }
    }

    /// istiod's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            MtlsMode::Disable => "DISABLE",
            MtlsMode::Permissive => "PERMISSIVE",
            MtlsMode::Strict => "STRICT",
        }
    }
}

/// The composed PeerAuthentication of one workload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WorkloadMtls {
    /// The mode of every port without a port-level setting.
    pub mode: MtlsMode,
    /// Port-level modes, by workload port (already resolved: `UNSET` inherits `mode`).
    pub ports: BTreeMap<u32, MtlsMode>,
}

impl WorkloadMtls {
    /// The mode of one workload port.
    pub fn for_port(&self, port: u32) -> MtlsMode {
        self.ports.get(&port).copied().unwrap_or(self.mode)
    }
}

/// A policy without a selector (or with an empty one) applies to its whole namespace.
fn namespace_wide(pa: &PeerAuthentication) -> bool {
    pa.selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty())
}

fn mode_of(pa: &PeerAuthentication) -> Option<MtlsMode> {
    pa.mtls.as_ref().and_then(|m| MtlsMode::from_policy(m.mode))
}

/// The oldest policy of a namespace matching `pick` (the lists are oldest first).
fn oldest<'a>(
    ctx: &'a PushContext,
    namespace: &str,
    pick: impl Fn(&PeerAuthentication) -> bool,
) -> Option<&'a Config<PeerAuthentication>> {
    ctx.peer_authentications
        .get(namespace)?
        .iter()
        .find(|c| pick(&c.spec))
        .map(|c| &**c)
}

/// The PeerAuthentication that applies to a workload of `namespace` with `labels`.
pub fn for_workload(
    ctx: &PushContext,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> WorkloadMtls {
    let root = ctx.mesh.root_namespace.as_str();
    let workload = (namespace != root)
        .then(|| {
            oldest(ctx, namespace, |pa| {
                !namespace_wide(pa)
                    && pa
                        .selector
                        .as_ref()
                        .is_some_and(|s| labels_match(&s.match_labels, labels))
            })
        })
        .flatten();
    compose(ctx, namespace, workload)
}

/// The mesh, namespace and (when given) workload policies of `namespace`, composed.
fn compose(
    ctx: &PushContext,
    namespace: &str,
    workload: Option<&Config<PeerAuthentication>>,
) -> WorkloadMtls {
    let root = ctx.mesh.root_namespace.as_str();
    let mut mode = MtlsMode::default();
    let mesh = oldest(ctx, root, namespace_wide);
    let ns = (namespace != root)
        .then(|| oldest(ctx, namespace, namespace_wide))
        .flatten();
    for level in [mesh, ns, workload].into_iter().flatten() {
        if let Some(m) = mode_of(&level.spec) {
            mode = m;
        }
    }
    let ports = workload
        .map(|w| {
            w.spec
                .port_level_mtls
                .iter()
                .map(|(port, m)| (*port, MtlsMode::from_policy(m.mode).unwrap_or(mode)))
                .collect()
        })
        .unwrap_or_default();
    WorkloadMtls { mode, ports }
}

/// Every workload's composed PeerAuthentication in one namespace, resolved once so that a
/// load assignment can ask per endpoint (istiod's `mtlsChecker`, which checks the mode of
/// each endpoint's workload at its port before sending it to another network's gateway).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NamespaceMtls {
    /// The workload policies with a selector, oldest first, each composed with the mesh
    /// and namespace policies: the first whose selector matches a workload applies.
    pub selected: Vec<(BTreeMap<String, String>, WorkloadMtls)>,
    /// What applies to a workload no selector matches (mesh and namespace policies).
    pub default: WorkloadMtls,
}

impl NamespaceMtls {
    /// The mode of the workload with `labels` at its `port`.
    pub fn mode(&self, labels: &BTreeMap<String, String>, port: u32) -> MtlsMode {
        self.selected
            .iter()
            .find(|(selector, _)| labels_match(selector, labels))
            .map_or(&self.default, |(_, m)| m)
            .for_port(port)
    }
}

/// The composed policies of every workload of `namespace` (see [`NamespaceMtls`]).
pub fn namespace_workloads(ctx: &PushContext, namespace: &str) -> NamespaceMtls {
    let root = ctx.mesh.root_namespace.as_str();
    let selected = if namespace == root {
        Vec::new()
    } else {
        ctx.peer_authentications
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|c| !namespace_wide(&c.spec))
            .filter_map(|c| {
                let selector = c.spec.selector.as_ref()?.match_labels.clone();
                Some((selector, compose(ctx, namespace, Some(c))))
            })
            .collect()
    };
    NamespaceMtls {
        selected,
        default: compose(ctx, namespace, None),
    }
}

/// The mode istiod infers for a destination namespace when deciding auto mTLS (its
/// `GetNamespaceMutualTLSMode`): the namespace's policy, `UNSET` inheriting the mesh's;
/// else the mesh policy; else PERMISSIVE. Workload and port-level policies are not
/// consulted (a client cannot know which workload it reaches).
pub fn namespace_mode(ctx: &PushContext, namespace: &str) -> MtlsMode {
    let root = ctx.mesh.root_namespace.as_str();
    // A mesh policy with UNSET means PERMISSIVE.
    let mesh = oldest(ctx, root, namespace_wide)
        .map(|c| mode_of(&c.spec).unwrap_or(MtlsMode::Permissive))
        .unwrap_or_default();
    if namespace == root {
        return mesh;
    }
    match oldest(ctx, namespace, namespace_wide) {
        Some(c) => mode_of(&c.spec).unwrap_or(mesh),
        None => mesh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::{LabelSelector, ObjectMeta, PeerMtls};
    use std::sync::Arc;

    fn pa(
        ns: &str,
        name: &str,
        created: i64,
        selector: Option<&[(&str, &str)]>,
        mode: PolicyMode,
        ports: &[(u32, PolicyMode)],
    ) -> Arc<Config<PeerAuthentication>> {
        Arc::new(Config {
            meta: ObjectMeta {
                name: name.into(),
                namespace: ns.into(),
                created: Some(created),
                ..Default::default()
            },
            spec: PeerAuthentication {
                selector: selector.map(|s| LabelSelector {
                    match_labels: s
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
                mtls: Some(PeerMtls { mode }),
                port_level_mtls: ports
                    .iter()
                    .map(|(p, m)| (*p, PeerMtls { mode: *m }))
                    .collect(),
            },
        })
    }

    fn ctx(policies: Vec<Arc<Config<PeerAuthentication>>>) -> PushContext {
        let mut ctx = PushContext::default();
        for p in policies {
            ctx.peer_authentications
                .entry(p.meta.namespace.clone())
                .or_default()
                .push(p);
        }
        for v in ctx.peer_authentications.values_mut() {
            v.sort_by(|a, b| a.meta.precedence().cmp(&b.meta.precedence()));
        }
        ctx
    }

    fn app(v: &str) -> BTreeMap<String, String> {
        [("app".to_string(), v.to_string())].into()
    }

    use PolicyMode::{Disable, Permissive, Strict, Unset};

    #[test]
    fn no_policy_is_permissive() {
        let c = ctx(vec![]);
        assert_eq!(for_workload(&c, "shop", &app("a")), WorkloadMtls::default());
        assert_eq!(namespace_mode(&c, "shop"), MtlsMode::Permissive);
    }

    #[test]
    fn workload_over_namespace_over_mesh() {
        let mesh = pa("istio-system", "mesh", 1, None, Strict, &[]);
        let ns = pa("shop", "ns", 1, None, Disable, &[]);
        let wl = pa("shop", "wl", 1, Some(&[("app", "a")]), Permissive, &[]);
        let c = ctx(vec![mesh.clone()]);
        assert_eq!(for_workload(&c, "shop", &app("a")).mode, MtlsMode::Strict);
        let c = ctx(vec![mesh.clone(), ns.clone()]);
        assert_eq!(for_workload(&c, "shop", &app("a")).mode, MtlsMode::Disable);
        let c = ctx(vec![mesh, ns, wl]);
        assert_eq!(
            for_workload(&c, "shop", &app("a")).mode,
            MtlsMode::Permissive
        );
        // The workload policy selects only its workloads.
        assert_eq!(for_workload(&c, "shop", &app("b")).mode, MtlsMode::Disable);
        // Other namespaces get the mesh policy.
        assert_eq!(for_workload(&c, "other", &app("a")).mode, MtlsMode::Strict);
    }

    #[test]
    fn unset_inherits() {
        let c = ctx(vec![
            pa("istio-system", "mesh", 1, None, Strict, &[]),
            pa("shop", "ns", 1, None, Unset, &[]),
            pa(
                "shop",
                "wl",
                1,
                Some(&[("app", "a")]),
                Unset,
                &[(8080, Unset), (9090, Disable)],
            ),
        ]);
        let m = for_workload(&c, "shop", &app("a"));
        assert_eq!(m.mode, MtlsMode::Strict);
        assert_eq!(m.for_port(8080), MtlsMode::Strict);
        assert_eq!(m.for_port(9090), MtlsMode::Disable);
        assert_eq!(m.for_port(1), MtlsMode::Strict);
        assert_eq!(namespace_mode(&c, "shop"), MtlsMode::Strict);
        // A mesh policy with UNSET is PERMISSIVE.
        let c = ctx(vec![pa("istio-system", "mesh", 1, None, Unset, &[])]);
        assert_eq!(namespace_mode(&c, "shop"), MtlsMode::Permissive);
    }

    #[test]
    fn oldest_wins_ties_then_name() {
        let c = ctx(vec![
            pa("shop", "b-older", 1, None, Strict, &[]),
            pa("shop", "a-newer", 2, None, Disable, &[]),
        ]);
        assert_eq!(for_workload(&c, "shop", &app("a")).mode, MtlsMode::Strict);
        assert_eq!(namespace_mode(&c, "shop"), MtlsMode::Strict);
        let c = ctx(vec![
            pa("shop", "b", 1, Some(&[("app", "a")]), Strict, &[]),
            pa("shop", "a", 1, Some(&[("app", "a")]), Disable, &[]),
        ]);
        assert_eq!(for_workload(&c, "shop", &app("a")).mode, MtlsMode::Disable);
    }

    #[test]
    fn root_namespace_selector_policies_apply_to_nothing() {
        let c = ctx(vec![pa(
            "istio-system",
            "sel",
            1,
            Some(&[("app", "a")]),
            Strict,
            &[],
        )]);
        assert_eq!(
            for_workload(&c, "shop", &app("a")).mode,
            MtlsMode::Permissive
        );
        assert_eq!(
            for_workload(&c, "istio-system", &app("a")).mode,
            MtlsMode::Permissive
        );
    }

    #[test]
    fn auto_mtls_reads_namespace_and_mesh_only() {
        let c = ctx(vec![
            pa("shop", "ns", 1, None, Disable, &[]),
            pa("web", "wl", 1, Some(&[("app", "a")]), Disable, &[]),
        ]);
        assert_eq!(namespace_mode(&c, "shop"), MtlsMode::Disable);
        assert_eq!(namespace_mode(&c, "web"), MtlsMode::Permissive);
    }
}
