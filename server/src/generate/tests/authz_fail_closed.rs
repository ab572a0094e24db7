//! Fail closed: AuthorizationPolicies never let through a request that they would deny.
//! Requests are evaluated against the RBAC filters shoal generates, with Envoy's semantics
//! (JWT attributes read from `jwt_authn`'s payload metadata), and compared with Istio's
//! meaning of the policies, JWT included, for whatever token the request carries and
//! whatever CUSTOM's external authorizer (which shoal does not have) would say: on HTTP
//! exactly Istio's decision where every field is enforced, never more otherwise; on TCP,
//! where neither tokens nor methods are seen, never more than Istio grants whatever the
//! request's method and token. Then the translation, rule by rule (`translation`).

use crate::generate::authz::{self, AuthzKey};
use crate::index::config::Config;
use proptest::prelude::*;
use prost::Message;
use shoal_common::model::{
    AuthorizationAction, AuthorizationPolicy, AuthorizationRule, Condition, ExtensionProvider,
    ObjectMeta, Operation, RuleFrom, RuleTo, Source,
};
use shoal_proto::pb::envoy::config::listener::v3::filter;
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action, Permission, Principal, Rbac,
};
use shoal_proto::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;
use shoal_proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use shoal_proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use shoal_proto::pb::envoy::r#type::matcher::v3::MetadataMatcher;
use std::collections::BTreeMap;
use std::sync::Arc;

const PEERS: &[&str] = &[
    "cluster.local/ns/shop/sa/a",
    "cluster.local/ns/shop/sa/b",
    "cluster.local/ns/other/sa/c",
];
const JWT_PRINCIPALS: &[&str] = &["iss/alice", "iss/bob"];
const GROUPS: &[&str] = &["admin", "dev"];
const METHODS: &[&str] = &["GET", "POST", "DELETE"];
const PORTS: &[u32] = &[80, 8080];

/// A token's principal and its `groups` claim.
#[derive(Debug, Clone, Copy)]
struct Jwt {
    principal: &'static str,
    group: &'static str,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    method: &'static str,
    port: u32,
    /// The peer's identity (`None`: plaintext).
    peer: Option<&'static str>,
    /// The request's token (`None`: no token).
    jwt: Option<Jwt>,
}

// ---------------------------------------------------------------------------------------
// Istio's meaning of a policy set (the oracle)

fn any_in(list: &[String], v: Option<&str>) -> bool {
    v.is_some_and(|v| list.iter().any(|x| x == v))
}

/// `values` match (when set) and `not_values` do not; a missing attribute matches no value.
fn field(values: &[String], not_values: &[String], v: Option<&str>) -> bool {
    (values.is_empty() || any_in(values, v)) && !any_in(not_values, v)
}

fn source_matches(s: &Source, r: &Request) -> bool {
    let jwt = r.jwt.map(|j| j.principal);
    field(&s.principals, &s.not_principals, r.peer)
        && field(&s.request_principals, &s.not_request_principals, jwt)
}

fn operation_matches(o: &Operation, r: &Request) -> bool {
    let port = r.port.to_string();
    field(&o.methods, &o.not_methods, Some(r.method)) && field(&o.ports, &o.not_ports, Some(&port))
}

fn condition_matches(c: &Condition, r: &Request) -> bool {
    let port = r.port.to_string();
    let v = match c.key.as_str() {
        "request.auth.claims[groups]" => r.jwt.map(|j| j.group),
        "request.auth.principal" => r.jwt.map(|j| j.principal),
        "source.principal" => r.peer,
        "destination.port" => Some(port.as_str()),
        other => panic!("no oracle for {other}"),
    };
    field(&c.values, &c.not_values, v)
}

fn rule_matches(rule: &AuthorizationRule, r: &Request) -> bool {
    (rule.from.is_empty() || rule.from.iter().any(|f| source_matches(&f.source, r)))
        && (rule.to.is_empty() || rule.to.iter().any(|t| operation_matches(&t.operation, r)))
        && rule.when.iter().all(|c| condition_matches(c, r))
}

/// Istio's decision, whatever CUSTOM's external authorizer would say: a request a CUSTOM
/// rule matches may be denied by it, so it is allowed only when it matches none.
fn istio_allows(policies: &[AuthorizationPolicy], r: &Request) -> bool {
    let of = |action| policies.iter().filter(move |p| p.action == action);
    let matches = |p: &AuthorizationPolicy| p.rules.iter().any(|rule| rule_matches(rule, r));
    if of(AuthorizationAction::Deny).any(matches) || of(AuthorizationAction::Custom).any(matches) {
        return false;
    }
    let mut allow = of(AuthorizationAction::Allow).peekable();
    allow.peek().is_none() || allow.any(matches)
}

// ---------------------------------------------------------------------------------------
// Envoy's evaluation of the generated RBAC filters

fn header(name: &str, r: &Request, tcp: bool) -> Option<String> {
    match name {
        ":method" if !tcp => Some(r.method.to_string()),
        _ => None,
    }
}

fn string_match(m: &MatchPattern, v: &str) -> bool {
    match m {
        MatchPattern::Exact(x) => v == x,
        MatchPattern::Prefix(x) => v.starts_with(x.as_str()),
        MatchPattern::Suffix(x) => v.ends_with(x.as_str()),
        MatchPattern::SafeRegex(r) if r.regex == ".+" => !v.is_empty(),
        other => panic!("no evaluator for {other:?}"),
    }
}

fn permission_matches(p: &Permission, r: &Request, tcp: bool) -> bool {
    use permission::Rule;
    match p.rule.as_ref().expect("a rule") {
        Rule::Any(any) => *any,
        Rule::AndRules(s) => s.rules.iter().all(|p| permission_matches(p, r, tcp)),
        Rule::OrRules(s) => s.rules.iter().any(|p| permission_matches(p, r, tcp)),
        Rule::NotRule(p) => !permission_matches(p, r, tcp),
        Rule::DestinationPort(port) => *port == r.port,
        Rule::Header(h) => {
            let value = header(&h.name, r, tcp);
            match h.header_match_specifier.as_ref().expect("specifier") {
                HeaderMatchSpecifier::StringMatch(m) => value
                    .is_some_and(|v| string_match(m.match_pattern.as_ref().expect("pattern"), &v)),
                HeaderMatchSpecifier::PresentMatch(present) => value.is_some() == *present,
                other => panic!("no evaluator for {other:?}"),
            }
        }
        other => panic!("no evaluator for {other:?}"),
    }
}

fn principal_matches(p: &Principal, r: &Request) -> bool {
    use principal::Identifier;
    match p.identifier.as_ref().expect("an identifier") {
        Identifier::Any(any) => *any,
        Identifier::AndIds(s) => s.ids.iter().all(|p| principal_matches(p, r)),
        Identifier::OrIds(s) => s.ids.iter().any(|p| principal_matches(p, r)),
        Identifier::NotId(p) => !principal_matches(p, r),
        Identifier::Authenticated(a) => r.peer.is_some_and(|peer| {
            let name = a.principal_name.as_ref().expect("name");
            let uri = format!("spiffe://{peer}");
            string_match(name.match_pattern.as_ref().expect("pattern"), &uri)
        }),
        #[allow(deprecated)] // what istiod sends
        Identifier::Metadata(m) => jwt_metadata_matches(m, r),
        other => panic!("no evaluator for {other:?}"),
    }
}

/// A matcher on `jwt_authn`'s metadata: a request without a token has none (no match);
/// with one, `payload` holds `iss`, `sub` and `groups` (a list).
fn jwt_metadata_matches(m: &MetadataMatcher, r: &Request) -> bool {
    use shoal_proto::pb::envoy::r#type::matcher::v3::{
        list_matcher, metadata_matcher::path_segment::Segment, value_matcher::MatchPattern as V,
        ValueMatcher,
    };
    assert_eq!(m.filter, "envoy.filters.http.jwt_authn");
    let Some(jwt) = r.jwt else { return false };
    let path: Vec<&str> = m
        .path
        .iter()
        .map(|p| match &p.segment {
            Some(Segment::Key(k)) => k.as_str(),
            None => panic!("a path without a key"),
        })
        .collect();
    let (iss, sub) = jwt.principal.rsplit_once('/').expect("iss/sub");
    // (scalar, list) values of the claim.
    let (scalar, list): (Option<&str>, Vec<&str>) = match path[..] {
        ["payload", "iss"] => (Some(iss), vec![]),
        ["payload", "sub"] => (Some(sub), vec![]),
        ["payload", "groups"] => (None, vec![jwt.group]),
        _ => (None, vec![]),
    };
    fn value_matches(v: &ValueMatcher, scalar: Option<&str>, list: &[&str]) -> bool {
        match v.match_pattern.as_ref().expect("a pattern") {
            V::StringMatch(m) => {
                scalar.is_some_and(|s| string_match(m.match_pattern.as_ref().expect("pattern"), s))
            }
            V::OrMatch(or) => or
                .value_matchers
                .iter()
                .any(|v| value_matches(v, scalar, list)),
            V::ListMatch(l) => match l.match_pattern.as_ref().expect("pattern") {
                list_matcher::MatchPattern::OneOf(one) => {
                    list.iter().any(|item| value_matches(one, Some(item), &[]))
                }
            },
            other => panic!("no evaluator for {other:?}"),
        }
    }
    value_matches(m.value.as_ref().expect("a value"), scalar, &list)
}

/// Envoy's decision over the enforced rules of the filters, in order.
fn rbac_allows(filters: &[Option<Rbac>], r: &Request, tcp: bool) -> bool {
    for rbac in filters.iter().flatten() {
        let matched = rbac.policies.values().any(|p| {
            p.permissions.iter().any(|x| permission_matches(x, r, tcp))
                && p.principals.iter().any(|x| principal_matches(x, r))
        });
        match Action::try_from(rbac.action).expect("an action") {
            Action::Allow if !matched => return false,
            Action::Deny if matched => return false,
            _ => {}
        }
    }
    true
}

fn key(policies: &[AuthorizationPolicy]) -> AuthzKey {
    AuthzKey {
        policies: policies
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                Arc::new(Config {
                    meta: ObjectMeta {
                        name: format!("p{i}"),
                        namespace: "shop".into(),
                        ..Default::default()
                    },
                    spec: spec.clone(),
                })
            })
            .collect(),
        trust_domain: "cluster.local".into(),
        authn: Default::default(),
    }
}

fn http_rules(policies: &[AuthorizationPolicy]) -> Vec<Option<Rbac>> {
    authz::http_filters(&key(policies))
        .iter()
        .map(|f| match &f.config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => {
                HttpRbac::decode(&*any.value).expect("decodes").rules
            }
            other => panic!("{other:?}"),
        })
        .collect()
}

fn tcp_rules(policies: &[AuthorizationPolicy]) -> Vec<Option<Rbac>> {
    authz::network_filters(&key(policies))
        .iter()
        .map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(any)) => {
                NetworkRbac::decode(&*any.value).expect("decodes").rules
            }
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Whether the policies use a field shoal does not enforce (Envoy metadata conditions;
/// CUSTOM is modelled by the oracle).
fn has_unenforced(policies: &[AuthorizationPolicy]) -> bool {
    policies
        .iter()
        .flat_map(|p| &p.rules)
        .flat_map(|r| &r.when)
        .any(|c| c.key.starts_with("experimental.envoy.filters."))
}

/// `r` with every method and token (what a TCP chain cannot see).
fn variants(r: &Request) -> Vec<Request> {
    let jwts = JWT_PRINCIPALS
        .iter()
        .flat_map(|p| {
            GROUPS.iter().map(|g| {
                Some(Jwt {
                    principal: p,
                    group: g,
                })
            })
        })
        .chain([None]);
    jwts.flat_map(|jwt| {
        METHODS
            .iter()
            .map(move |method| Request { method, jwt, ..*r })
    })
    .collect()
}

// ---------------------------------------------------------------------------------------
// Generators

fn pick<T: Clone + std::fmt::Debug + 'static>(pool: &'static [T]) -> impl Strategy<Value = T> {
    prop::sample::select(pool)
}

fn values(pool: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    prop::sample::subsequence(pool, 0..=pool.len())
        .prop_map(|v| v.into_iter().map(str::to_string).collect())
}

fn ports() -> impl Strategy<Value = Vec<String>> {
    prop::sample::subsequence(PORTS, 0..=PORTS.len())
        .prop_map(|v| v.into_iter().map(|p| p.to_string()).collect())
}

fn source() -> impl Strategy<Value = Source> {
    (
        values(PEERS),
        values(PEERS),
        values(JWT_PRINCIPALS),
        values(JWT_PRINCIPALS),
    )
        .prop_map(
            |(principals, not_principals, request, not_request)| Source {
                principals,
                not_principals,
                request_principals: request,
                not_request_principals: not_request,
                ..Default::default()
            },
        )
}

fn operation() -> impl Strategy<Value = Operation> {
    (values(METHODS), values(METHODS), ports(), ports()).prop_map(
        |(methods, not_methods, ports, not_ports)| Operation {
            methods,
            not_methods,
            ports,
            not_ports,
            ..Default::default()
        },
    )
}

const KEYS: &[&str] = &[
    "request.auth.claims[groups]",
    "request.auth.principal",
    "source.principal",
    "destination.port",
];

fn condition() -> impl Strategy<Value = Condition> {
    (pick(KEYS), any::<bool>()).prop_flat_map(|(key, negated)| {
        let pool: &'static [&'static str] = match key {
            "request.auth.claims[groups]" => GROUPS,
            "request.auth.principal" => JWT_PRINCIPALS,
            "source.principal" => PEERS,
            _ => &["80", "8080"],
        };
        prop::sample::subsequence(pool, 1..=pool.len()).prop_map(move |v| {
            let v: Vec<String> = v.into_iter().map(str::to_string).collect();
            let (values, not_values) = if negated {
                (Vec::new(), v)
            } else {
                (v, Vec::new())
            };
            Condition {
                key: key.to_string(),
                values,
                not_values,
            }
        })
    })
}

fn rule() -> impl Strategy<Value = AuthorizationRule> {
    (
        prop::collection::vec(source(), 0..3),
        prop::collection::vec(operation(), 0..3),
        prop::collection::vec(condition(), 0..3),
    )
        .prop_map(|(from, to, when)| AuthorizationRule {
            from: from.into_iter().map(|source| RuleFrom { source }).collect(),
            to: to
                .into_iter()
                .map(|operation| RuleTo { operation })
                .collect(),
            when,
        })
}

const ACTIONS: &[AuthorizationAction] = &[
    AuthorizationAction::Allow,
    AuthorizationAction::Deny,
    AuthorizationAction::Audit,
    AuthorizationAction::Custom,
];

fn policy() -> impl Strategy<Value = AuthorizationPolicy> {
    (pick(ACTIONS), prop::collection::vec(rule(), 0..3)).prop_map(|(action, rules)| {
        AuthorizationPolicy {
            action,
            provider: (action == AuthorizationAction::Custom).then(|| ExtensionProvider {
                name: "ext-authz".into(),
            }),
            rules,
            ..Default::default()
        }
    })
}

/// Every request of the pools: methods × ports × peers (and plaintext) × tokens (and none).
fn all_requests() -> Vec<Request> {
    let peers = PEERS.iter().map(|p| Some(*p)).chain([None]);
    let jwts: Vec<Option<Jwt>> = JWT_PRINCIPALS
        .iter()
        .flat_map(|p| {
            GROUPS.iter().map(|g| {
                Some(Jwt {
                    principal: p,
                    group: g,
                })
            })
        })
        .chain([None])
        .collect();
    let mut out = Vec::new();
    for peer in peers {
        for &method in METHODS {
            for &port in PORTS {
                for jwt in &jwts {
                    out.push(Request {
                        method,
                        port,
                        peer,
                        jwt: *jwt,
                    });
                }
            }
        }
    }
    out
}

/// A policy edit: slot `0..3` gets a policy or is deleted.
fn edits() -> impl Strategy<Value = Vec<(usize, Option<AuthorizationPolicy>)>> {
    prop::collection::vec((0usize..3, prop::option::weighted(0.8, policy())), 1..6)
}

fn check(policies: &[AuthorizationPolicy]) -> Result<(), TestCaseError> {
    let http = http_rules(policies);
    let tcp = tcp_rules(policies);
    let unenforced = has_unenforced(policies);
    for r in all_requests() {
        let granted = rbac_allows(&http, &r, false);
        // Never more than Istio's meaning, whatever token the request carries...
        prop_assert!(
            !granted || istio_allows(policies, &r),
            "granted {r:?} that the policies deny: {policies:#?}"
        );
        // ...and exactly it where every field is enforced (the oracle is the real one).
        if !unenforced {
            prop_assert_eq!(
                granted,
                istio_allows(policies, &r),
                "{:?}: {:#?}",
                r,
                policies
            );
        }
        // TCP sees neither methods nor tokens: it grants only what every variant gets.
        if rbac_allows(&tcp, &r, true) {
            for v in variants(&r) {
                prop_assert!(
                    istio_allows(policies, &v),
                    "TCP granted {r:?}, the policies deny {v:?}: {policies:#?}"
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: shoal_common::proptest_cases(256),
        ..ProptestConfig::default()
    })]

    /// After every edit of a sequence, the policies in place grant nothing they deny.
    #[test]
    fn prop_policies_never_grant_what_they_deny(edits in edits()) {
        let mut slots: BTreeMap<usize, AuthorizationPolicy> = BTreeMap::new();
        for (slot, edit) in edits {
            match edit {
                Some(p) => slots.insert(slot, p),
                None => slots.remove(&slot),
            };
            let policies: Vec<AuthorizationPolicy> = slots.values().cloned().collect();
            check(&policies)?;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The translation, rule by rule

mod translation {
    use super::super::authz::{http, key, policy, render, strs, tcp, Rendered};
    use crate::index::config::Config;
    use shoal_common::model::ObjectMeta;
    use shoal_proto::pb::envoy::config::rbac::v3::rbac::Action;
    use std::sync::Arc;

    /// Fields shoal does not enforce (Envoy metadata) fail closed as istiod treats what it
    /// cannot translate: the ALLOW rule goes (here the policy's only rule, so it denies
    /// everything), the DENY rule loses only the field (so it denies more), the AUDIT rule
    /// goes. On TCP too. The policy itself always applies.
    #[test]
    fn unenforced_fields_drop_allow_and_audit_rules_and_widen_deny_rules() {
        let k = key(vec![
            policy(
                "shop",
                "md-allow",
                r#"
    rules:
    - when: [{key: "experimental.envoy.filters.a[b]", values: [c]}]
    "#,
            ),
            policy(
                "shop",
                "md-deny",
                r#"
    action: DENY
    rules:
    - when: [{key: "experimental.envoy.filters.a[b]", notValues: [c]}]
      to: [{operation: {ports: ["8080"]}}]
    - when: [{key: "experimental.envoy.filters.x.y[z]", values: [admin]}]
    - from: [{source: {namespaces: [a]}}]
      when: [{key: "experimental.envoy.filters.a[b]", values: [c]}]
    "#,
            ),
            policy(
                "shop",
                "md-audit",
                r#"
    action: AUDIT
    rules:
    - when: [{key: "experimental.envoy.filters.a[b]", values: [c]}]
    - to: [{operation: {ports: ["80"]}}]
    "#,
            ),
        ]);
        for (chain, filters) in [
            (
                "http",
                http(&k).into_iter().map(|f| f.rules).collect::<Vec<_>>(),
            ),
            ("tcp", tcp(&k).into_iter().map(|f| f.rules).collect()),
        ] {
            let [audit, deny, allow] = &filters[..] else {
                panic!("{chain}: {filters:?}")
            };
            let audit = render(audit.as_ref().expect("audit rules"));
            assert_eq!(
                audit.keys().collect::<Vec<_>>(),
                ["ns[shop]-policy[md-audit]-rule[1]"],
                "{chain}"
            );
            let deny = render(deny.as_ref().expect("deny rules"));
            assert_eq!(
                deny["ns[shop]-policy[md-deny]-rule[0]"],
                (strs(&["and(or(port(8080)))"]), strs(&["and(any)"])),
                "{chain}: no metadata check left, every request to 8080 is denied"
            );
            assert_eq!(
                deny["ns[shop]-policy[md-deny]-rule[1]"],
                (strs(&["and(any)"]), strs(&["and(any)"])),
                "{chain}: a DENY rule whose only condition is unenforced denies everything"
            );
            assert_eq!(
                deny["ns[shop]-policy[md-deny]-rule[2]"],
                (
                    strs(&["and(any)"]),
                    strs(&["and(or(peer(regex:.*/ns/a/.*)))"])
                ),
                "{chain}"
            );
            let allow = allow.as_ref().expect("allow rules");
            assert_eq!(allow.action, Action::Allow as i32);
            assert!(
                allow.policies.is_empty(),
                "{chain}: the ALLOW filter stays, without the rule: it denies all"
            );
        }
    }

    /// CUSTOM policies: shoal has no external authorizers, so, as istiod for a provider missing
    /// from MeshConfig, each provider's rules become a DENY filter ahead of the others (named
    /// istiod's way), translated as DENY rules (unenforced fields dropped: denies more). A
    /// dry-run CUSTOM policy denies nothing.
    #[test]
    fn custom_policies_deny_what_they_match_per_provider_first() {
        let k = key(vec![
            policy(
                "shop",
                "ext-b",
                r#"
    action: CUSTOM
    provider: {name: oauth}
    rules:
    - to: [{operation: {paths: ["/admin"]}}]
    - from: [{source: {requestPrincipals: ["*"]}}]
      to: [{operation: {ports: ["8080"]}}]
    "#,
            ),
            policy(
                "shop",
                "ext-a",
                "action: CUSTOM\nprovider: {name: authz}\nrules: [{to: [{operation: {methods: [POST]}}]}]",
            ),
            policy("shop", "allow", "rules: [{}]"),
            Arc::new(Config {
                meta: ObjectMeta {
                    name: "ext-dry".into(),
                    namespace: "shop".into(),
                    annotations: [("istio.io/dry-run".to_string(), "true".to_string())]
                        .into_iter()
                        .collect(),
                    ..Default::default()
                },
                spec: shoal_common::yaml::from_str(
                    "action: CUSTOM\nprovider: {name: zzz}\nrules: [{}]",
                )
                .expect("policy"),
            }),
        ]);
        let filters = http(&k);
        assert_eq!(filters.len(), 3, "authz, oauth, then ALLOW: {filters:?}");
        let authz = filters[0].rules.as_ref().expect("rules");
        assert_eq!(authz.action, Action::Deny as i32);
        assert_eq!(filters[0].shadow_rules_stat_prefix, "");
        assert_eq!(
            render(authz),
            [(
                "istio-ext-authz-authz-ns[shop]-policy[ext-a]-rule[0]-deny-due-to-bad-CUSTOM-action"
                    .to_string(),
                (
                    strs(&["and(or(header(:method=exact:POST)))"]),
                    strs(&["and(any)"])
                )
            )]
            .into_iter()
            .collect::<Rendered>()
        );
        let oauth = render(filters[1].rules.as_ref().expect("rules"));
        assert_eq!(
            oauth["istio-ext-authz-oauth-ns[shop]-policy[ext-b]-rule[1]-deny-due-to-bad-CUSTOM-action"],
            (
                strs(&["and(or(port(8080)))"]),
                strs(&["and(or(and(md(envoy.filters.http.jwt_authn:payload.iss=regex:.+), \
                        md(envoy.filters.http.jwt_authn:payload.sub=regex:.+))))"])
            ),
            "requests to 8080 with a valid token are denied"
        );
        assert_eq!(oauth.len(), 2);
        assert_eq!(
            filters[2].rules.as_ref().map(|r| r.action),
            Some(Action::Allow as i32)
        );
        // On TCP, the HTTP-only paths and methods are dropped from the DENY rules: the rules
        // deny every connection (istiod's DENY translation).
        let tcp_filters = tcp(&k);
        assert_eq!(tcp_filters.len(), 3);
        let tcp_authz = render(tcp_filters[0].rules.as_ref().expect("rules"));
        assert_eq!(
            tcp_authz.values().next(),
            Some(&(strs(&["and(any)"]), strs(&["and(any)"])))
        );
    }
}
