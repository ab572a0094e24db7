//! AuthorizationPolicy → Envoy RBAC filters, as istiod's authz builder
//! (pilot/pkg/security/authz/{builder,model}).
//!
//! The policies of the root namespace and of the workload's namespace whose selector
//! matches the workload's labels apply. They become up to three RBAC filters, in istiod's
//! order: AUDIT (`LOG`), DENY, ALLOW — HTTP chains get `envoy.filters.http.rbac` (403
//! "RBAC: access denied"), TCP chains `envoy.filters.network.rbac` (the connection is
//! closed). Policies annotated `istio.io/dry-run: "true"` go to the shadow rules.
//!
//! Each rule becomes one RBAC policy `ns[<ns>]-policy[<name>]-rule[<i>]`; a policy without
//! rules becomes one that never matches (so an ALLOW policy without rules denies all).
//! HTTP-only attributes (hosts, methods, paths, request headers) cannot be checked on a TCP
//! chain: as in istiod, an ALLOW rule using them is dropped there (narrower: allows less),
//! while in a DENY or AUDIT rule only those values are dropped (wider: denies more). The
//! same holds for any value that cannot be translated.
//!
//! JWT attributes (`requestPrincipals`, `notRequestPrincipals`, `request.auth.*`) match the
//! verified token's payload that the `jwt_authn` filter (RequestAuthentication, see
//! [`authn`](super::authn)) leaves in the dynamic metadata, as istiod's builder does; a
//! request without a (valid) token has no payload and matches none of their values. They
//! are HTTP only.
//!
//! Fields shoal accepts but does not enforce (`experimental.envoy.filters.*` conditions)
//! fail closed the same way as untranslatable values, on every chain: an ALLOW rule using
//! one is dropped (an ALLOW policy left without rules denies everything it selects), a DENY
//! rule loses only that field and so matches every request its other fields match, and an
//! AUDIT rule using one is dropped. The policy itself always applies
//! (docs/istio-compatibility.md, "Fail closed").
//!
//! CUSTOM policies name an external authorizer (`provider`), and shoal has none: as istiod
//! does for a provider missing from MeshConfig, each provider's policies become a DENY
//! filter ahead of the others whose rules, translated as DENY rules, are named
//! `istio-ext-authz-<provider>-ns[<ns>]-policy[<name>]-rule[<i>]-deny-due-to-bad-CUSTOM-action`:
//! what the authorizer would have been asked about is denied.
//!
//! `Rbac.policies` is a protobuf map, which prost encodes in hash order; the filter configs
//! are therefore encoded here entry by entry in name order (protobuf concatenates map
//! entries), so that replicas produce the same bytes.

mod translate;

pub use translate::TranslateError;

use crate::generate::authn::{self, JwtKey};
use crate::index::config::Config;
use crate::index::hosts::labels_match;
use crate::index::proxy::Proxy;
use crate::index::push_context::PushContext;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;
use shoal_common::model::{AuthorizationAction, AuthorizationPolicy};
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter};
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action as RbacAction, Permission, Policy, Principal, Rbac,
};
use shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpFilter,
};
use shoal_proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use shoal_proto::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use translate::{permission_any, principal_any, translate_rule};

/// The HTTP RBAC filter's name.
pub const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
/// The network RBAC filter's name.
pub const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
const HTTP_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";
/// istiod's stat prefix of the network RBAC filter.
const TCP_STAT_PREFIX: &str = "tcp.";
/// istiod's shadow (dry-run) stat prefixes.
const SHADOW_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
const SHADOW_DENY_PREFIX: &str = "istio_dry_run_deny_";
/// istiod's prefix of CUSTOM policies' RBAC policy names.
const EXT_AUTHZ_PREFIX: &str = "istio-ext-authz";
/// istiod's suffix of the DENY policies of a CUSTOM provider it cannot use.
const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
/// The annotation that puts a policy in the shadow rules.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Everything the access-control filters of one workload are built from: the policies that
/// apply (root namespace first, then the workload's namespace, each in name order), the
/// mesh trust domain principals are rewritten to, and the JWT rules of its
/// RequestAuthentications (the `jwt_authn` filter that HTTP chains get before RBAC).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AuthzKey {
    /// The applicable policies.
    pub policies: Vec<Arc<Config<AuthorizationPolicy>>>,
    /// The mesh trust domain (`cluster.local` in a principal means this one, as in istiod).
    pub trust_domain: String,
    /// The applicable RequestAuthentication rules.
    pub authn: JwtKey,
}

/// The policies that apply to a workload: those of the root namespace and of its own
/// namespace whose selector (if any) matches its labels.
pub fn applicable(ctx: &PushContext, proxy: &Proxy) -> AuthzKey {
    let root = ctx.mesh.root_namespace.as_str();
    let mut namespaces = vec![root];
    if proxy.namespace != root {
        namespaces.push(proxy.namespace.as_str());
    }
    let policies = namespaces
        .into_iter()
        .flat_map(|ns| ctx.authorization_policies.get(ns).into_iter().flatten())
        .filter(|p| {
            p.spec
                .selector
                .as_ref()
                .is_none_or(|s| labels_match(&s.match_labels, &proxy.labels))
        })
        .cloned()
        .collect();
    AuthzKey {
        policies,
        trust_domain: ctx.mesh.trust_domain.clone(),
        authn: authn::applicable(ctx, proxy),
    }
}

/// A workload's RBAC filters for both kinds of filter chain, built once per listener.
#[derive(Debug, Clone, Default)]
pub struct RbacFilters {
    /// For HTTP chains, before the router.
    pub http: Vec<HttpFilter>,
    /// For TCP chains, before `tcp_proxy`.
    pub tcp: Vec<Filter>,
}

impl RbacFilters {
    /// Both sets of filters of `key`.
    pub fn new(key: &AuthzKey) -> RbacFilters {
        RbacFilters {
            http: http_filters(key),
            tcp: network_filters(key),
        }
    }
}

/// The HTTP filters to put before the router of an HTTP chain: `jwt_authn` (when a
/// RequestAuthentication applies; before RBAC, which reads its metadata, as in istiod),
/// then RBAC's AUDIT, DENY, ALLOW (those that have policies).
pub fn http_filters(key: &AuthzKey) -> Vec<HttpFilter> {
    let rbac = filter_configs(key, false)
        .into_iter()
        .map(|config| HttpFilter {
            name: HTTP_RBAC_FILTER.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                type_url: HTTP_RBAC_TYPE.into(),
                value: config,
            })),
            ..Default::default()
        });
    authn::jwt_filter(&key.authn)
        .into_iter()
        .chain(rbac)
        .collect()
}

/// The network filters (AUDIT, DENY, ALLOW) to put before the `tcp_proxy` of a TCP chain.
pub fn network_filters(key: &AuthzKey) -> Vec<Filter> {
    filter_configs(key, true)
        .into_iter()
        .map(|config| Filter {
            name: NETWORK_RBAC_FILTER.into(),
            config_type: Some(filter::ConfigType::TypedConfig(Any {
                type_url: NETWORK_RBAC_TYPE.into(),
                value: config,
            })),
        })
        .collect()
}

/// The encoded filter configs, in istiod's order: the CUSTOM policies' DENY filters (one
/// per provider, in name order), then AUDIT, DENY, ALLOW.
fn filter_configs(key: &AuthzKey, tcp: bool) -> Vec<Vec<u8>> {
    let providers: BTreeSet<&str> = key
        .policies
        .iter()
        .filter(|p| p.spec.action == AuthorizationAction::Custom && !dry_run(p))
        .filter_map(|p| p.spec.provider.as_ref().map(|p| p.name.as_str()))
        .collect();
    let custom = providers.into_iter().filter_map(|provider| {
        let select = |p: &Config<AuthorizationPolicy>| {
            p.spec.action == AuthorizationAction::Custom
                && !dry_run(p)
                && p.spec.provider.as_ref().is_some_and(|p| p.name == provider)
        };
        let name = |ns: &str, name: &str, rule: usize| {
            format!(
                "{EXT_AUTHZ_PREFIX}-{provider}-{}{BAD_CUSTOM_SUFFIX}",
                policy_name(ns, name, rule)
            )
        };
        let built = build(key, select, name, RbacAction::Deny, tcp)?;
        Some(encode_filter(&built, tcp, true))
    });
    let others = [
        (AuthorizationAction::Audit, RbacAction::Log),
        (AuthorizationAction::Deny, RbacAction::Deny),
        (AuthorizationAction::Allow, RbacAction::Allow),
    ]
    .into_iter()
    .filter_map(|(action, rbac_action)| {
        let select = |p: &Config<AuthorizationPolicy>| p.spec.action == action;
        let built = build(key, select, policy_name, rbac_action, tcp)?;
        Some(encode_filter(&built, tcp, false))
    });
    custom.chain(others).collect()
}

/// The enforced and shadow (dry-run) rules of one action.
struct Built {
    action: RbacAction,
    rules: Option<BTreeMap<String, Policy>>,
    shadow: Option<BTreeMap<String, Policy>>,
}

/// The rules of the `selected` policies, translated for `rbac_action` and named by `name`;
/// `None` when no policy is selected.
fn build(
    key: &AuthzKey,
    selected: impl Fn(&Config<AuthorizationPolicy>) -> bool,
    name: impl Fn(&str, &str, usize) -> String,
    rbac_action: RbacAction,
    tcp: bool,
) -> Option<Built> {
    let mut out = Built {
        action: rbac_action,
        rules: None,
        shadow: None,
    };
    let mut any = false;
    for policy in key.policies.iter().filter(|p| selected(p)) {
        any = true;
        let target = if dry_run(policy) {
            &mut out.shadow
        } else {
            &mut out.rules
        };
        let target = target.get_or_insert_with(BTreeMap::new);
        let (ns, policy_name) = (&policy.meta.namespace, &policy.meta.name);
        if policy.spec.rules.is_empty() {
            target.insert(name(ns, policy_name, 0), match_never());
        }
        for (i, rule) in policy.spec.rules.iter().enumerate() {
            match translate_rule(rule, ns, &key.trust_domain, rbac_action, tcp) {
                Ok(p) => {
                    target.insert(name(ns, policy_name, i), p);
                }
                Err(error) => tracing::debug!(
                    policy = %format!("{ns}/{policy_name}"),
                    rule = i,
                    tcp,
                    %error,
                    "authorization rule skipped on this filter chain"
                ),
            }
        }
    }
    any.then_some(out)
}

fn dry_run(policy: &Config<AuthorizationPolicy>) -> bool {
    policy
        .meta
        .annotations
        .get(DRY_RUN_ANNOTATION)
        .is_some_and(|v| matches!(v.as_str(), "true" | "True" | "TRUE" | "t" | "T" | "1"))
}

fn policy_name(ns: &str, name: &str, rule: usize) -> String {
    format!("ns[{ns}]-policy[{name}]-rule[{rule}]")
}

fn match_never() -> Policy {
    Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::NotRule(Box::new(permission_any()))),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(principal_any()))),
        }],
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Encoding

/// One filter config; `bad_custom`: the DENY filter of a CUSTOM provider, which istiod
/// builds without a shadow prefix.
fn encode_filter(built: &Built, tcp: bool, bad_custom: bool) -> Vec<u8> {
    // istiod reads the shadow prefix off the shadow rules' action, which is ALLOW (0) when
    // there are none.
    let shadow_prefix = match built
        .shadow
        .as_ref()
        .map_or(RbacAction::Allow, |_| built.action)
    {
        _ if bad_custom => "",
        RbacAction::Allow => SHADOW_ALLOW_PREFIX,
        RbacAction::Deny => SHADOW_DENY_PREFIX,
        RbacAction::Log => "",
    };
    let mut buf = if tcp {
        NetworkRbac {
            stat_prefix: TCP_STAT_PREFIX.into(),
            shadow_rules_stat_prefix: shadow_prefix.into(),
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        HttpRbac {
            shadow_rules_stat_prefix: shadow_prefix.into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    // `rules` is field 1 and `shadow_rules` field 2 in both filter configs.
    if let Some(rules) = &built.rules {
        put_message(&mut buf, 1, &encode_rbac(built.action, rules));
    }
    if let Some(shadow) = &built.shadow {
        put_message(&mut buf, 2, &encode_rbac(built.action, shadow));
    }
    buf
}

/// An `RBAC` message with its policies in name order.
fn encode_rbac(action: RbacAction, policies: &BTreeMap<String, Policy>) -> Vec<u8> {
    let mut buf = Rbac {
        action: action as i32,
        ..Default::default()
    }
    .encode_to_vec();
    for (name, policy) in policies {
        let one = Rbac {
            policies: [(name.clone(), policy.clone())].into_iter().collect(),
            ..Default::default()
        };
        one.encode(&mut buf).expect("a Vec grows");
    }
    buf
}

fn put_message(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}
