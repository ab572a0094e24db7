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
//! `Rbac.policies` is a protobuf map, which prost encodes in hash order; the filter configs
//! are therefore encoded here entry by entry in name order (protobuf concatenates map
//! entries), so that replicas produce the same bytes.

use super::outbound::cidr;
use crate::proxy::Proxy;
use crate::push_context::{labels_match, Config, PushContext};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;
use shoal_common::model::{AuthorizationAction, AuthorizationPolicy, AuthorizationRule};
use shoal_proto::pb::envoy::config::core::v3::TypedExtensionConfig;
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter};
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action as RbacAction, Permission, Policy, Principal, Rbac,
};
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, HeaderMatcher,
};
use shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpFilter,
};
use shoal_proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use shoal_proto::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use shoal_proto::pb::envoy::r#type::matcher::v3::{
    path_matcher, string_matcher::MatchPattern, PathMatcher, RegexMatcher, StringMatcher,
};
use shoal_proto::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The HTTP RBAC filter's name.
pub const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
/// The network RBAC filter's name.
pub const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
const HTTP_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";
const URI_TEMPLATE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig";
/// istiod's stat prefix of the network RBAC filter.
const TCP_STAT_PREFIX: &str = "tcp.";
/// istiod's shadow (dry-run) stat prefixes.
const SHADOW_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
const SHADOW_DENY_PREFIX: &str = "istio_dry_run_deny_";
/// The annotation that puts a policy in the shadow rules.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Everything the RBAC filters of one workload are built from: the policies that apply
/// (root namespace first, then the workload's namespace, each in name order) and the mesh
/// trust domain principals are rewritten to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AuthzKey {
    /// The applicable policies.
    pub policies: Vec<Arc<Config<AuthorizationPolicy>>>,
    /// The mesh trust domain (`cluster.local` in a principal means this one, as in istiod).
    pub trust_domain: String,
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
    }
}

/// The HTTP filters (AUDIT, DENY, ALLOW, those that have policies) to put before the
/// router of an HTTP chain.
pub fn http_filters(key: &AuthzKey) -> Vec<HttpFilter> {
    filter_configs(key, false)
        .into_iter()
        .map(|config| HttpFilter {
            name: HTTP_RBAC_FILTER.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                type_url: HTTP_RBAC_TYPE.into(),
                value: config,
            })),
            ..Default::default()
        })
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

/// The encoded filter configs, in istiod's order.
fn filter_configs(key: &AuthzKey, tcp: bool) -> Vec<Vec<u8>> {
    [
        (AuthorizationAction::Audit, RbacAction::Log),
        (AuthorizationAction::Deny, RbacAction::Deny),
        (AuthorizationAction::Allow, RbacAction::Allow),
    ]
    .into_iter()
    .filter_map(|(action, rbac_action)| {
        let built = build(key, action, rbac_action, tcp)?;
        Some(encode_filter(&built, tcp))
    })
    .collect()
}

/// The enforced and shadow (dry-run) rules of one action.
struct Built {
    action: RbacAction,
    rules: Option<BTreeMap<String, Policy>>,
    shadow: Option<BTreeMap<String, Policy>>,
}

fn build(
    key: &AuthzKey,
    action: AuthorizationAction,
    rbac_action: RbacAction,
    tcp: bool,
) -> Option<Built> {
    let mut out = Built {
        action: rbac_action,
        rules: None,
        shadow: None,
    };
    let mut any = false;
    for policy in key.policies.iter().filter(|p| p.spec.action == action) {
        any = true;
        let target = if dry_run(policy) {
            &mut out.shadow
        } else {
            &mut out.rules
        };
        let target = target.get_or_insert_with(BTreeMap::new);
        let (ns, name) = (&policy.meta.namespace, &policy.meta.name);
        if policy.spec.rules.is_empty() {
            target.insert(policy_name(ns, name, 0), match_never());
        }
        for (i, rule) in policy.spec.rules.iter().enumerate() {
            match translate_rule(rule, ns, &key.trust_domain, rbac_action, tcp) {
                Ok(p) => {
                    target.insert(policy_name(ns, name, i), p);
                }
                Err(error) => tracing::debug!(
                    policy = %format!("{ns}/{name}"),
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

fn encode_filter(built: &Built, tcp: bool) -> Vec<u8> {
    // istiod reads the shadow prefix off the shadow rules' action, which is ALLOW (0) when
    // there are none.
    let shadow_prefix = match built
        .shadow
        .as_ref()
        .map_or(RbacAction::Allow, |_| built.action)
    {
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

// ---------------------------------------------------------------------------------------
// Translation (istiod's authz model)

/// Why a value (or, in an ALLOW policy, its whole rule) was left out.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// An HTTP attribute on a TCP chain.
    #[error("{0} is HTTP only")]
    HttpOnly(&'static str),
    /// A value that is not an IP address or CIDR range.
    #[error("{attribute}: {value:?} is not an IP address or CIDR range")]
    BadAddress {
        /// The attribute.
        attribute: &'static str,
        /// The value.
        value: String,
    },
    /// A value that is not a port.
    #[error("{attribute}: {value:?} is not a port in 0-65535")]
    BadPort {
        /// The attribute.
        attribute: &'static str,
        /// The value.
        value: String,
    },
    /// A `when` key shoal does not know (refused at ingest; kept as istiod skips it).
    #[error("unknown attribute {0}")]
    UnknownKey(String),
}

/// What one condition is about. Each translates a value into a permission (what the
/// request does) or a principal (who sends it).
#[derive(Debug, Clone)]
enum Attr {
    Host,
    Method,
    Path,
    Port,
    DestinationIp,
    Sni,
    SourceIp,
    RemoteIp,
    Namespace,
    ServiceAccount,
    TrustDomain,
    Principal,
    Header(String),
}

struct Condition<'a> {
    attr: Attr,
    values: &'a [String],
    not_values: &'a [String],
}

enum Generated {
    Permission(Permission),
    Principal(Principal),
}

fn translate_rule(
    rule: &AuthorizationRule,
    policy_ns: &str,
    trust_domain: &str,
    action: RbacAction,
    tcp: bool,
) -> Result<Policy, TranslateError> {
    let mut base_permission: Vec<Condition<'_>> = Vec::new();
    let mut base_principal: Vec<Condition<'_>> = Vec::new();
    for when in &rule.when {
        let attr = when_attr(&when.key)?;
        let cond = Condition {
            attr,
            values: &when.values,
            not_values: &when.not_values,
        };
        if is_permission(&cond.attr) {
            base_permission.push(cond);
        } else {
            base_principal.push(cond);
        }
    }
    let ctx = Ctx {
        policy_ns,
        trust_domain,
        action,
        tcp,
    };

    let mut principals = Vec::new();
    for from in &rule.from {
        let s = &from.source;
        // istiod's order: principals, namespaces, remote IPs, IPs, then the `when` keys.
        let mut conds: Vec<Condition<'_>> = [
            (Attr::Principal, &s.principals, &s.not_principals),
            (Attr::Namespace, &s.namespaces, &s.not_namespaces),
            (Attr::RemoteIp, &s.remote_ip_blocks, &s.not_remote_ip_blocks),
            (Attr::SourceIp, &s.ip_blocks, &s.not_ip_blocks),
        ]
        .into_iter()
        .filter(|(_, v, n)| !v.is_empty() || !n.is_empty())
        .map(|(attr, values, not_values)| Condition {
            attr,
            values,
            not_values,
        })
        .collect();
        conds.extend(base_principal.iter().map(Condition::reborrow));
        principals.push(principal_and(ctx.principals(&conds)?));
    }
    if rule.from.is_empty() {
        principals.push(principal_and(ctx.principals(&base_principal)?));
    }

    let mut permissions = Vec::new();
    for to in &rule.to {
        let o = &to.operation;
        // istiod's order: hosts, methods, paths, ports, then the `when` keys.
        let mut conds: Vec<Condition<'_>> = [
            (Attr::Host, &o.hosts, &o.not_hosts),
            (Attr::Method, &o.methods, &o.not_methods),
            (Attr::Path, &o.paths, &o.not_paths),
            (Attr::Port, &o.ports, &o.not_ports),
        ]
        .into_iter()
        .filter(|(_, v, n)| !v.is_empty() || !n.is_empty())
        .map(|(attr, values, not_values)| Condition {
            attr,
            values,
            not_values,
        })
        .collect();
        conds.extend(base_permission.iter().map(Condition::reborrow));
        permissions.push(permission_and(ctx.permissions(&conds)?));
    }
    if rule.to.is_empty() {
        permissions.push(permission_and(ctx.permissions(&base_permission)?));
    }
    Ok(Policy {
        permissions,
        principals,
        ..Default::default()
    })
}

impl<'a> Condition<'a> {
    fn reborrow(&self) -> Condition<'a> {
        Condition {
            attr: self.attr.clone(),
            values: self.values,
            not_values: self.not_values,
        }
    }
}

fn when_attr(key: &str) -> Result<Attr, TranslateError> {
    Ok(match key {
        "destination.ip" => Attr::DestinationIp,
        "destination.port" => Attr::Port,
        "connection.sni" => Attr::Sni,
        "source.ip" => Attr::SourceIp,
        "remote.ip" => Attr::RemoteIp,
        "source.namespace" => Attr::Namespace,
        "source.serviceAccount" => Attr::ServiceAccount,
        "source.trustDomain" => Attr::TrustDomain,
        "source.principal" => Attr::Principal,
        _ => match request_header_name(key) {
            Some(name) => Attr::Header(name.to_string()),
            None => return Err(TranslateError::UnknownKey(key.to_string())),
        },
    })
}

/// `x-token` for `request.headers[x-token]`.
pub fn request_header_name(key: &str) -> Option<&str> {
    key.strip_prefix("request.headers[")?
        .strip_suffix(']')
        .filter(|n| !n.is_empty())
}

fn is_permission(attr: &Attr) -> bool {
    matches!(
        attr,
        Attr::Host | Attr::Method | Attr::Path | Attr::Port | Attr::DestinationIp | Attr::Sni
    )
}

struct Ctx<'a> {
    policy_ns: &'a str,
    trust_domain: &'a str,
    action: RbacAction,
    tcp: bool,
}

impl Ctx<'_> {
    /// The values of each condition ORed (and the not-values ORed and negated), all ANDed
    /// by the caller. A value that cannot be translated fails the rule of an ALLOW policy
    /// and is left out of a DENY or AUDIT one.
    fn generate(
        &self,
        conds: &[Condition<'_>],
    ) -> Result<Vec<(Vec<Generated>, bool)>, TranslateError> {
        let mut out = Vec::new();
        for c in conds {
            for (values, negated) in [(c.values, false), (c.not_values, true)] {
                let mut or = Vec::new();
                let values: Vec<String> = if matches!(c.attr, Attr::Principal) {
                    self.with_trust_domain(values)
                } else {
                    values.to_vec()
                };
                for v in &values {
                    match self.value(&c.attr, v) {
                        Ok(g) => or.push(g),
                        Err(e) if self.action == RbacAction::Allow => return Err(e),
                        Err(_) => {}
                    }
                }
                if !or.is_empty() {
                    out.push((or, negated));
                }
            }
        }
        Ok(out)
    }

    fn permissions(&self, conds: &[Condition<'_>]) -> Result<Vec<Permission>, TranslateError> {
        Ok(self
            .generate(conds)?
            .into_iter()
            .map(|(or, negated)| {
                let rules = or
                    .into_iter()
                    .filter_map(|g| match g {
                        Generated::Permission(p) => Some(p),
                        Generated::Principal(_) => None,
                    })
                    .collect();
                let or = Permission {
                    rule: Some(permission::Rule::OrRules(permission::Set { rules })),
                };
                if negated {
                    Permission {
                        rule: Some(permission::Rule::NotRule(Box::new(or))),
                    }
                } else {
                    or
                }
            })
            .collect())
    }

    fn principals(&self, conds: &[Condition<'_>]) -> Result<Vec<Principal>, TranslateError> {
        Ok(self
            .generate(conds)?
            .into_iter()
            .map(|(or, negated)| {
                let ids = or
                    .into_iter()
                    .filter_map(|g| match g {
                        Generated::Principal(p) => Some(p),
                        Generated::Permission(_) => None,
                    })
                    .collect();
                let or = Principal {
                    identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
                };
                if negated {
                    Principal {
                        identifier: Some(principal::Identifier::NotId(Box::new(or))),
                    }
                } else {
                    or
                }
            })
            .collect())
    }

    /// istiod's trust-domain migration with no aliases: a principal naming `cluster.local`
    /// (or the mesh trust domain) names the mesh trust domain.
    fn with_trust_domain(&self, principals: &[String]) -> Vec<String> {
        principals
            .iter()
            .map(|p| {
                let parts: Vec<&str> = p.split('/').collect();
                if parts.len() != 5 || parts[0] == "*" {
                    return p.clone();
                }
                let (td, mesh) = (parts[0], self.trust_domain);
                let in_bundle = td == mesh
                    || mesh == "*"
                    || prefix_match(td, mesh)
                    || prefix_match(mesh, td)
                    || suffix_match(td, mesh)
                    || suffix_match(mesh, td);
                if (in_bundle || td == "cluster.local") && !suffix_match(mesh, td) {
                    format!("{mesh}/{}", parts[1..].join("/"))
                } else {
                    p.clone()
                }
            })
            .collect()
    }

    fn value(&self, attr: &Attr, v: &str) -> Result<Generated, TranslateError> {
        let http_only = |name| {
            if self.tcp {
                Err(TranslateError::HttpOnly(name))
            } else {
                Ok(())
            }
        };
        let address = |attribute: &'static str| {
            cidr(v).ok_or_else(|| TranslateError::BadAddress {
                attribute,
                value: v.to_string(),
            })
        };
        let perm = |rule| Ok(Generated::Permission(Permission { rule: Some(rule) }));
        let princ = |identifier| {
            Ok(Generated::Principal(Principal {
                identifier: Some(identifier),
            }))
        };
        match attr {
            Attr::Host => {
                http_only("hosts")?;
                perm(permission::Rule::Header(header_matcher(
                    ":authority",
                    v,
                    true,
                )))
            }
            Attr::Method => {
                http_only("methods")?;
                perm(permission::Rule::Header(header_matcher(
                    ":method", v, false,
                )))
            }
            Attr::Path => {
                http_only("paths")?;
                if v.contains("{*}") || v.contains("{**}") {
                    perm(permission::Rule::UriTemplate(TypedExtensionConfig {
                        name: "uri-template".into(),
                        typed_config: Some(shoal_proto::pack(
                            URI_TEMPLATE_TYPE,
                            &UriTemplateMatchConfig {
                                path_template: v.to_string(),
                            },
                        )),
                    }))
                } else {
                    perm(permission::Rule::UrlPath(PathMatcher {
                        rule: Some(path_matcher::Rule::Path(string_matcher(v, ""))),
                    }))
                }
            }
            Attr::Port => {
                let port = v
                    .parse::<u32>()
                    .ok()
                    .filter(|p| *p <= 65535)
                    .ok_or_else(|| TranslateError::BadPort {
                        attribute: "ports",
                        value: v.to_string(),
                    })?;
                perm(permission::Rule::DestinationPort(port))
            }
            Attr::DestinationIp => {
                perm(permission::Rule::DestinationIp(address("destination.ip")?))
            }
            Attr::Sni => perm(permission::Rule::RequestedServerName(string_matcher(v, ""))),
            Attr::SourceIp => princ(principal::Identifier::DirectRemoteIp(address("ipBlocks")?)),
            Attr::RemoteIp => princ(principal::Identifier::RemoteIp(address("remoteIpBlocks")?)),
            Attr::Namespace => {
                let ns = v.split('*').map(quote_meta).collect::<Vec<_>>().join(".*");
                princ(authenticated(regex_matcher(format!(".*/ns/{ns}/.*"))))
            }
            Attr::ServiceAccount => {
                let (ns, sa) = v.split_once('/').unwrap_or((self.policy_ns, v));
                princ(authenticated(regex_matcher(format!(
                    "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                    quote_meta(ns),
                    quote_meta(sa)
                ))))
            }
            Attr::TrustDomain => {
                let m = if v == "*" {
                    prefix_matcher("spiffe://")
                } else if let Some((before, after)) = v.split_once('*') {
                    regex_matcher(format!(
                        "spiffe://{}[^/]*{}/.*",
                        quote_meta(before),
                        quote_meta(after)
                    ))
                } else {
                    prefix_matcher(&format!("spiffe://{v}/"))
                };
                princ(authenticated(m))
            }
            Attr::Principal => princ(authenticated(string_matcher(v, "spiffe://"))),
            Attr::Header(name) => {
                http_only("request.headers")?;
                princ(principal::Identifier::Header(header_matcher(
                    name, v, false,
                )))
            }
        }
    }
}

/// Whether `a` starts with `pattern` less its `*` suffix (and `pattern` has one).
fn prefix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_suffix('*').is_some_and(|p| a.starts_with(p))
}

/// Whether `a` ends with `pattern` less its `*` prefix (and `pattern` has one).
fn suffix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_prefix('*').is_some_and(|s| a.ends_with(s))
}

fn authenticated(name: StringMatcher) -> principal::Identifier {
    principal::Identifier::Authenticated(principal::Authenticated {
        principal_name: Some(name),
    })
}

fn permission_any() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn principal_any() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

fn permission_and(mut rules: Vec<Permission>) -> Permission {
    if rules.is_empty() {
        rules.push(permission_any());
    }
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    }
}

fn principal_and(mut ids: Vec<Principal>) -> Principal {
    if ids.is_empty() {
        ids.push(principal_any());
    }
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

/// istiod's `HeaderMatcher`/`HostMatcher`: `*` = present, `*x` suffix, `x*` prefix, else
/// exact.
fn header_matcher(name: &str, v: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if v == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else {
        let pattern = if let Some(s) = v.strip_prefix('*') {
            MatchPattern::Suffix(s.into())
        } else if let Some(p) = v.strip_suffix('*') {
            MatchPattern::Prefix(p.into())
        } else {
            MatchPattern::Exact(v.into())
        };
        HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ignore_case,
        })
    };
    HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

/// istiod's `StringMatcherWithPrefix`: `*` = any non-empty value, `*x` suffix, `x*` prefix,
/// else exact, each after `prefix`.
fn string_matcher(v: &str, prefix: &str) -> StringMatcher {
    if v == "*" {
        regex_matcher(".+".into())
    } else if let Some(s) = v.strip_prefix('*') {
        if prefix.is_empty() {
            StringMatcher {
                match_pattern: Some(MatchPattern::Suffix(s.into())),
                ignore_case: false,
            }
        } else {
            regex_matcher(format!("{prefix}.*{}", quote_meta(s)))
        }
    } else if let Some(p) = v.strip_suffix('*') {
        prefix_matcher(&format!("{prefix}{p}"))
    } else {
        StringMatcher {
            match_pattern: Some(MatchPattern::Exact(format!("{prefix}{v}"))),
            ignore_case: false,
        }
    }
}

fn prefix_matcher(p: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(MatchPattern::Prefix(p.into())),
        ignore_case: false,
    }
}

fn regex_matcher(regex: String) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher {
            regex,
            ..Default::default()
        })),
        ignore_case: false,
    }
}

/// Go's `regexp.QuoteMeta`.
fn quote_meta(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
