//! AuthorizationPolicy → RBAC: each translation against istiod's output (pilot/pkg/security/
//! authz/builder/testdata), filter order, the TCP rules for HTTP-only fields, and where the
//! filters go on `virtualInbound`.

use crate::generate::authz::{self, AuthzKey};
use crate::index::config::Config;
use crate::testutil::*;
use prost::Message;
use shoal_common::model::{AuthorizationPolicy, ObjectMeta};
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action, Permission, Principal, Rbac,
};
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, HeaderMatcher,
};
use shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use shoal_proto::pb::envoy::r#type::matcher::v3::MetadataMatcher;
use shoal_proto::pb::envoy::r#type::matcher::v3::{
    path_matcher, string_matcher::MatchPattern, StringMatcher,
};
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Fixtures and a compact rendering of RBAC trees

pub(super) fn policy(ns: &str, name: &str, yaml: &str) -> Arc<Config<AuthorizationPolicy>> {
    let spec: AuthorizationPolicy =
        shoal_common::yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad policy: {e}\n{yaml}"));
    Arc::new(Config {
        meta: ObjectMeta {
            name: name.into(),
            namespace: ns.into(),
            ..Default::default()
        },
        spec,
    })
}

pub(super) fn key(policies: Vec<Arc<Config<AuthorizationPolicy>>>) -> AuthzKey {
    AuthzKey {
        policies,
        trust_domain: "cluster.local".into(),
        authn: Default::default(),
    }
}

pub(super) fn http(key: &AuthzKey) -> Vec<HttpRbac> {
    authz::http_filters(key)
        .iter()
        .map(|f| {
            assert_eq!(f.name, "envoy.filters.http.rbac");
            match &f.config_type {
                Some(http_filter::ConfigType::TypedConfig(any)) => {
                    HttpRbac::decode(&*any.value).expect("decodes")
                }
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

pub(super) fn tcp(key: &AuthzKey) -> Vec<NetworkRbac> {
    authz::network_filters(key)
        .iter()
        .map(network_rbac)
        .collect()
}

fn network_rbac(f: &Filter) -> NetworkRbac {
    assert_eq!(f.name, "envoy.filters.network.rbac");
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => {
            NetworkRbac::decode(&*any.value).expect("decodes")
        }
        other => panic!("{other:?}"),
    }
}

/// Policy name → (permissions, principals), rendered.
pub(super) type Rendered = BTreeMap<String, (Vec<String>, Vec<String>)>;

pub(super) fn render(rbac: &Rbac) -> Rendered {
    rbac.policies
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                (
                    p.permissions.iter().map(perm).collect(),
                    p.principals.iter().map(princ).collect(),
                ),
            )
        })
        .collect()
}

/// The one policy of the one (enforced) filter.
fn only_policy(rbac: Option<&Rbac>) -> (Vec<String>, Vec<String>) {
    let rendered = render(rbac.expect("rules"));
    assert_eq!(rendered.len(), 1, "{rendered:?}");
    rendered.into_values().next().expect("one")
}

fn sm(m: &StringMatcher) -> String {
    let s = match &m.match_pattern {
        Some(MatchPattern::Exact(v)) => format!("exact:{v}"),
        Some(MatchPattern::Prefix(v)) => format!("prefix:{v}"),
        Some(MatchPattern::Suffix(v)) => format!("suffix:{v}"),
        Some(MatchPattern::SafeRegex(r)) => format!("regex:{}", r.regex),
        other => format!("{other:?}"),
    };
    if m.ignore_case {
        format!("{s}/i")
    } else {
        s
    }
}

fn hm(h: &HeaderMatcher) -> String {
    match &h.header_match_specifier {
        Some(HeaderMatchSpecifier::PresentMatch(true)) => format!("header({} present)", h.name),
        Some(HeaderMatchSpecifier::StringMatch(m)) => format!("header({}={})", h.name, sm(m)),
        other => format!("{other:?}"),
    }
}

fn join<T>(items: &[T], f: fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(", ")
}

fn perm(p: &Permission) -> String {
    use permission::Rule;
    match p.rule.as_ref().expect("a rule") {
        Rule::Any(true) => "any".into(),
        Rule::AndRules(s) => format!("and({})", join(&s.rules, perm)),
        Rule::OrRules(s) => format!("or({})", join(&s.rules, perm)),
        Rule::NotRule(n) => format!("not({})", perm(n)),
        Rule::Header(h) => hm(h),
        Rule::UrlPath(p) => match &p.rule {
            Some(path_matcher::Rule::Path(m)) => format!("path({})", sm(m)),
            other => format!("{other:?}"),
        },
        Rule::DestinationPort(port) => format!("port({port})"),
        Rule::DestinationIp(c) => format!(
            "dst_ip({}/{})",
            c.address_prefix,
            c.prefix_len.map(|l| l.value).unwrap_or_default()
        ),
        Rule::RequestedServerName(m) => format!("sni({})", sm(m)),
        other => format!("{other:?}"),
    }
}

fn princ(p: &Principal) -> String {
    use principal::Identifier;
    let cidr = |c: &shoal_proto::pb::envoy::config::core::v3::CidrRange| {
        format!(
            "{}/{}",
            c.address_prefix,
            c.prefix_len.map(|l| l.value).unwrap_or_default()
        )
    };
    match p.identifier.as_ref().expect("an identifier") {
        Identifier::Any(true) => "any".into(),
        Identifier::AndIds(s) => format!("and({})", join(&s.ids, princ)),
        Identifier::OrIds(s) => format!("or({})", join(&s.ids, princ)),
        Identifier::NotId(n) => format!("not({})", princ(n)),
        Identifier::Authenticated(a) => {
            format!("peer({})", sm(a.principal_name.as_ref().expect("name")))
        }
        Identifier::DirectRemoteIp(c) => format!("ip({})", cidr(c)),
        Identifier::RemoteIp(c) => format!("remote_ip({})", cidr(c)),
        Identifier::Header(h) => hm(h),
        #[allow(deprecated)] // what istiod sends
        Identifier::Metadata(m) => metadata(m),
        other => format!("{other:?}"),
    }
}

/// `md(envoy.filters.http.jwt_authn:payload.iss=exact:x)`, `…:payload.groups has exact:a`
/// for istiod's list-or-value matcher.
fn metadata(m: &MetadataMatcher) -> String {
    use shoal_proto::pb::envoy::r#type::matcher::v3::{
        list_matcher, metadata_matcher::path_segment::Segment, value_matcher::MatchPattern as V,
    };
    let path = m
        .path
        .iter()
        .map(|p| match &p.segment {
            Some(Segment::Key(k)) => k.clone(),
            None => "?".into(),
        })
        .collect::<Vec<_>>()
        .join(".");
    let value = match m.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
        Some(V::StringMatch(x)) => format!("={}", sm(x)),
        Some(V::OrMatch(or)) => match &or.value_matchers[..] {
            [list, one] => {
                let Some(V::ListMatch(l)) = &list.match_pattern else {
                    return format!("{m:?}");
                };
                let Some(list_matcher::MatchPattern::OneOf(inner)) = &l.match_pattern else {
                    return format!("{m:?}");
                };
                assert_eq!(**inner, *one, "a list holding the value, or the value");
                match &one.match_pattern {
                    Some(V::StringMatch(x)) => format!(" has {}", sm(x)),
                    other => format!("{other:?}"),
                }
            }
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    };
    format!("md({}:{path}{value})", m.filter)
}

pub(super) fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------------------
// Translations

/// JWT attributes match the payload `jwt_authn` leaves in the metadata, as istiod builds
/// them: `requestPrincipals` split at the last `/` into `iss` and `sub` (with `*` prefix and
/// suffix forms), claims as a list holding the value or the value. HTTP only: on TCP the
/// ALLOW rule is dropped.
#[test]
fn jwt_attributes_match_the_jwt_authn_payload() {
    let k = key(vec![policy(
        "shop",
        "jwt",
        r#"
rules:
- from:
  - source:
      requestPrincipals: ["https://iss.example/alice", "*"]
      notRequestPrincipals: ["*/bob", "iss/*", "*ample", "pre*"]
  when:
  - {key: "request.auth.claims[groups]", values: [admin, "dev*"]}
  - {key: "request.auth.claims[nested][key]", values: [v]}
  - {key: request.auth.audiences, values: [web]}
  - {key: request.auth.presenter, notValues: [cli]}
  - {key: request.auth.principal, values: ["iss/sub"]}
"#,
    )]);
    let filters = http(&k);
    let (permissions, principals) = only_policy(filters[0].rules.as_ref());
    assert_eq!(permissions, strs(&["and(any)"]));
    let md = "md(envoy.filters.http.jwt_authn:payload";
    let want = [
        format!(
            "or(and({md}.iss=exact:https://iss.example), {md}.sub=exact:alice)), \
             and({md}.iss=regex:.+), {md}.sub=regex:.+)))"
        ),
        format!(
            "not(or(and({md}.iss=regex:.+), {md}.sub=exact:bob)), \
             and({md}.iss=exact:iss), {md}.sub=regex:.+)), \
             and({md}.iss=regex:.+), {md}.sub=suffix:ample)), \
             and({md}.iss=prefix:pre), {md}.sub=regex:.+))))"
        ),
        format!("or({md}.groups has exact:admin), {md}.groups has prefix:dev))"),
        format!("or({md}.nested.key has exact:v))"),
        format!("or({md}.aud has exact:web))"),
        format!("not(or({md}.azp has exact:cli)))"),
        format!("or(and({md}.iss=exact:iss), {md}.sub=exact:sub)))"),
    ];
    assert_eq!(principals, [format!("and({})", want.join(", "))]);
    let tcp = tcp(&k);
    assert!(
        tcp[0].rules.as_ref().expect("rules").policies.is_empty(),
        "on TCP the ALLOW rule is dropped: {tcp:?}"
    );
}

#[test]
fn principals_and_namespaces_match_the_peer_identity() {
    let k = key(vec![policy(
        "shop",
        "peers",
        r#"
rules:
- from:
  - source:
      principals: [cluster.local/ns/shop/sa/a, "*/ns/shop/sa/b", "cluster.local/ns/shop/*", "*"]
      notNamespaces: ["kube-*", "a.b"]
"#,
    )]);
    let (perms, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(perms, strs(&["and(any)"]));
    assert_eq!(
        princs,
        strs(&["and(or(peer(exact:spiffe://cluster.local/ns/shop/sa/a), \
             peer(regex:spiffe://.*/ns/shop/sa/b), \
             peer(prefix:spiffe://cluster.local/ns/shop/), peer(regex:.+)), \
             not(or(peer(regex:.*/ns/kube-.*/.*), peer(regex:.*/ns/a\\.b/.*))))"])
    );
    // Principals and namespaces are peer identities: they work on TCP too.
    let (_, tcp_princs) = only_policy(tcp(&k)[0].rules.as_ref());
    assert_eq!(tcp_princs, princs);
}

#[test]
fn principals_in_cluster_local_name_the_mesh_trust_domain() {
    let mut k = key(vec![policy(
        "shop",
        "td",
        "rules: [{from: [{source: {principals: [cluster.local/ns/a/sa/b, other.td/ns/a/sa/b, example.org/ns/a/sa/c]}}]}]",
    )]);
    k.trust_domain = "example.org".into();
    let (_, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(
        princs,
        strs(&["and(or(peer(exact:spiffe://example.org/ns/a/sa/b), \
                peer(exact:spiffe://other.td/ns/a/sa/b), \
                peer(exact:spiffe://example.org/ns/a/sa/c)))"])
    );
}

#[test]
fn ip_blocks_are_the_peer_address_and_remote_ip_blocks_the_client() {
    let k = key(vec![policy(
        "shop",
        "ips",
        "rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 192.168.1.1], notIpBlocks: [10.1.0.0/16], remoteIpBlocks: [1.2.3.4], notRemoteIpBlocks: [\"2001:db8::/32\"]}}]}]",
    )]);
    let (_, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(
        princs,
        strs(&[
            "and(or(remote_ip(1.2.3.4/32)), not(or(remote_ip(2001:db8::/32))), \
                or(ip(10.0.0.0/8), ip(192.168.1.1/32)), not(or(ip(10.1.0.0/16))))"
        ])
    );
}

#[test]
fn operations_hosts_methods_paths_ports() {
    let k = key(vec![policy(
        "shop",
        "ops",
        r#"
rules:
- to:
  - operation:
      hosts: [example.com, "*.example.com", "*"]
      methods: [GET, HEAD]
      paths: [/allowed, /api/*, "*/info"]
      ports: ["8080"]
      notPorts: ["9090"]
  - operation:
      notHosts: [admin.example.com]
      notMethods: [DELETE]
      notPaths: [/admin*]
"#,
    )]);
    let (perms, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(
        perms,
        strs(&[
            "and(or(header(:authority=exact:example.com/i), \
             header(:authority=suffix:.example.com/i), header(:authority present)), \
             or(header(:method=exact:GET), header(:method=exact:HEAD)), \
             or(path(exact:/allowed), path(prefix:/api/), path(suffix:/info)), \
             or(port(8080)), not(or(port(9090))))",
            "and(not(or(header(:authority=exact:admin.example.com/i))), \
             not(or(header(:method=exact:DELETE))), not(or(path(prefix:/admin))))",
        ])
    );
    assert_eq!(princs, strs(&["and(any)"]));
}

#[test]
fn when_conditions_go_to_permissions_or_principals_as_istiod() {
    let k = key(vec![policy(
        "shop",
        "when",
        r#"
rules:
- from: [{source: {namespaces: [shop]}}]
  to: [{operation: {methods: [GET]}}]
  when:
  - {key: "request.headers[x-token]", values: [secret, "tok*"], notValues: ["*"]}
  - {key: source.ip, values: [10.0.0.1]}
  - {key: remote.ip, notValues: [1.1.1.1]}
  - {key: source.namespace, values: [shop]}
  - {key: source.principal, values: [cluster.local/ns/shop/sa/a]}
  - {key: source.serviceAccount, values: [a, other/b]}
  - {key: source.trustDomain, values: [td.example, "*.corp"]}
  - {key: destination.ip, values: [10.1.0.0/16]}
  - {key: destination.port, values: ["9080"]}
  - {key: connection.sni, values: ["*.example.com"]}
"#,
    )]);
    let (perms, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(
        perms,
        strs(&[
            "and(or(header(:method=exact:GET)), or(dst_ip(10.1.0.0/16)), or(port(9080)), \
                or(sni(suffix:.example.com)))"
        ])
    );
    assert_eq!(
        princs,
        strs(&["and(or(peer(regex:.*/ns/shop/.*)), \
                or(header(x-token=exact:secret), header(x-token=prefix:tok)), \
                not(or(header(x-token present))), \
                or(ip(10.0.0.1/32)), not(or(remote_ip(1.1.1.1/32))), \
                or(peer(regex:.*/ns/shop/.*)), \
                or(peer(exact:spiffe://cluster.local/ns/shop/sa/a)), \
                or(peer(regex:spiffe://.+/ns/shop/(.+/|)sa/a(/.+)?), \
                peer(regex:spiffe://.+/ns/other/(.+/|)sa/b(/.+)?)), \
                or(peer(prefix:spiffe://td.example/), peer(regex:spiffe://[^/]*\\.corp/.*)))"])
    );
}

/// `source.serviceAccounts` and `source.trustDomains` translate as their `when` keys do, in
/// istiod's order (after principals, before namespaces and IPs).
#[test]
fn service_accounts_and_trust_domains_of_the_source() {
    let k = key(vec![policy(
        "shop",
        "sa",
        r#"
rules:
- from:
  - source:
      ipBlocks: [10.0.0.1]
      serviceAccounts: [a, other/b]
      notServiceAccounts: [shop/c]
      trustDomains: [td.example, "*.corp"]
      notTrustDomains: ["*"]
"#,
    )]);
    let (_, princs) = only_policy(http(&k)[0].rules.as_ref());
    assert_eq!(
        princs,
        strs(
            &["and(or(peer(regex:spiffe://.+/ns/shop/(.+/|)sa/a(/.+)?), \
                peer(regex:spiffe://.+/ns/other/(.+/|)sa/b(/.+)?)), \
                not(or(peer(regex:spiffe://.+/ns/shop/(.+/|)sa/c(/.+)?))), \
                or(peer(prefix:spiffe://td.example/), peer(regex:spiffe://[^/]*\\.corp/.*)), \
                not(or(peer(prefix:spiffe://))), \
                or(ip(10.0.0.1/32)))"]
        )
    );
    // Peer identities: they hold on TCP too.
    let (_, tcp_princs) = only_policy(tcp(&k)[0].rules.as_ref());
    assert_eq!(tcp_princs, princs);
}

#[test]
fn audit_deny_allow_in_istiods_order_with_istiods_names_and_prefixes() {
    let k = key(vec![
        policy(
            "istio-system",
            "mesh-deny",
            "action: DENY\nrules: [{to: [{operation: {paths: [/x]}}]}]",
        ),
        policy(
            "shop",
            "allow-get",
            "rules: [{to: [{operation: {methods: [GET]}}]}, {}]",
        ),
        policy("shop", "audit", "action: AUDIT\nrules: [{}]"),
    ]);
    let filters = http(&k);
    let actions: Vec<i32> = filters
        .iter()
        .map(|f| f.rules.as_ref().expect("rules").action)
        .collect();
    assert_eq!(
        actions,
        [
            Action::Log as i32,
            Action::Deny as i32,
            Action::Allow as i32
        ]
    );
    let names: Vec<Vec<String>> = filters
        .iter()
        .map(|f| {
            render(f.rules.as_ref().expect("rules"))
                .into_keys()
                .collect()
        })
        .collect();
    assert_eq!(
        names,
        [
            strs(&["ns[shop]-policy[audit]-rule[0]"]),
            strs(&["ns[istio-system]-policy[mesh-deny]-rule[0]"]),
            strs(&[
                "ns[shop]-policy[allow-get]-rule[0]",
                "ns[shop]-policy[allow-get]-rule[1]"
            ]),
        ]
    );
    // An empty rule matches everything.
    assert_eq!(
        render(filters[2].rules.as_ref().expect("rules"))["ns[shop]-policy[allow-get]-rule[1]"],
        (strs(&["and(any)"]), strs(&["and(any)"]))
    );
    // istiod's stat prefixes: none on HTTP (the shadow prefix is set regardless), `tcp.` on
    // TCP.
    for f in &filters {
        assert_eq!(f.shadow_rules_stat_prefix, "istio_dry_run_allow_");
        assert!(f.shadow_rules.is_none());
    }
    for f in tcp(&k) {
        assert_eq!(f.stat_prefix, "tcp.");
    }
}

#[test]
fn no_allow_policy_no_allow_filter_and_an_allow_policy_without_rules_denies_all() {
    let deny_only = key(vec![policy(
        "shop",
        "d",
        "action: DENY\nrules: [{from: [{source: {ipBlocks: [10.0.0.1]}}]}]",
    )]);
    let filters = http(&deny_only);
    assert_eq!(filters.len(), 1);
    assert_eq!(
        filters[0].rules.as_ref().expect("rules").action,
        Action::Deny as i32
    );
    assert!(http(&key(Vec::new())).is_empty());
    assert!(tcp(&key(Vec::new())).is_empty());

    let nothing = key(vec![policy("shop", "allow-nothing", "{}")]);
    for rules in [
        http(&nothing)[0].rules.clone(),
        tcp(&nothing)[0].rules.clone(),
    ] {
        let rules = rules.expect("rules");
        assert_eq!(rules.action, Action::Allow as i32);
        assert_eq!(
            render(&rules),
            BTreeMap::from([(
                "ns[shop]-policy[allow-nothing]-rule[0]".to_string(),
                (strs(&["not(any)"]), strs(&["not(any)"]))
            )])
        );
    }
}

/// The security property of istiod's TCP translation: an ALLOW rule that needs HTTP is
/// dropped (allows less), a DENY rule loses only its HTTP values (denies more).
#[test]
fn http_only_fields_on_tcp_drop_allow_rules_and_widen_deny_rules() {
    let allow = key(vec![policy(
        "shop",
        "a",
        r#"
rules:
- to: [{operation: {methods: [GET]}}]
- to: [{operation: {ports: ["3306"]}}]
- from: [{source: {ipBlocks: [10.0.0.1]}}]
  when: [{key: "request.headers[x-a]", values: [b]}]
"#,
    )]);
    let tcp_allow = render(tcp(&allow)[0].rules.as_ref().expect("rules"));
    assert_eq!(
        tcp_allow.keys().collect::<Vec<_>>(),
        ["ns[shop]-policy[a]-rule[1]"],
        "only the rule without HTTP fields"
    );
    assert_eq!(
        render(http(&allow)[0].rules.as_ref().expect("rules")).len(),
        3
    );

    // Only HTTP rules: the TCP ALLOW filter has no policy, so it denies every connection.
    let http_only = key(vec![policy(
        "shop",
        "h",
        "rules: [{to: [{operation: {paths: [/a]}}]}]",
    )]);
    let rules = tcp(&http_only)[0].rules.clone().expect("rules");
    assert_eq!(rules.action, Action::Allow as i32);
    assert!(rules.policies.is_empty());

    let deny = key(vec![policy(
        "shop",
        "d",
        r#"
action: DENY
rules:
- from: [{source: {ipBlocks: [10.0.0.0/8]}}]
  to: [{operation: {methods: [POST], ports: ["3306"]}}]
- when: [{key: "request.headers[x-a]", values: [b]}]
"#,
    )]);
    let tcp_deny = render(tcp(&deny)[0].rules.as_ref().expect("rules"));
    assert_eq!(
        tcp_deny["ns[shop]-policy[d]-rule[0]"],
        (
            strs(&["and(or(port(3306)))"]),
            strs(&["and(or(ip(10.0.0.0/8)))"])
        )
    );
    // The header condition is dropped: on TCP the rule denies every connection.
    assert_eq!(
        tcp_deny["ns[shop]-policy[d]-rule[1]"],
        (strs(&["and(any)"]), strs(&["and(any)"]))
    );
    let http_deny = render(http(&deny)[0].rules.as_ref().expect("rules"));
    assert_eq!(
        http_deny["ns[shop]-policy[d]-rule[0]"].0,
        strs(&["and(or(header(:method=exact:POST)), or(port(3306)))"])
    );
}

#[test]
fn dry_run_policies_are_shadow_rules() {
    let mut p = policy("shop", "dry", "action: DENY\nrules: [{}]");
    Arc::make_mut(&mut p)
        .meta
        .annotations
        .insert("istio.io/dry-run".into(), "true".into());
    let filters = http(&key(vec![p]));
    assert_eq!(filters.len(), 1);
    assert!(filters[0].rules.is_none(), "a dry run enforces nothing");
    let shadow = filters[0].shadow_rules.as_ref().expect("shadow rules");
    assert_eq!(shadow.action, Action::Deny as i32);
    assert_eq!(render(shadow).len(), 1);
    assert_eq!(filters[0].shadow_rules_stat_prefix, "istio_dry_run_deny_");
}

#[test]
fn filter_bytes_are_deterministic() {
    let rules: String = (0..30)
        .map(|i| format!("- to: [{{operation: {{paths: [/p{i}]}}}}]\n"))
        .collect();
    let k = key(vec![policy("shop", "many", &format!("rules:\n{rules}"))]);
    let first = authz::http_filters(&k);
    for _ in 0..5 {
        assert_eq!(authz::http_filters(&k), first);
    }
    assert_eq!(render(http(&k)[0].rules.as_ref().expect("rules")).len(), 30);
}

// ---------------------------------------------------------------------------------------
// Which policies apply, and where the filters go

const POD_IP: &str = "10.1.0.9";

fn mesh() -> Mesh {
    let mut reviews = service("shop", "reviews", &[("http", 9080)]);
    reviews.selector = labels(&[("app", "reviews")]);
    let mut db = service("shop", "reviews-db", &[("tcp", 3306)]);
    db.selector = labels(&[("app", "reviews")]);
    Mesh::new().with_service(reviews).with_service(db)
}

fn inbound(mesh: &Mesh) -> Listener {
    let p = captured_proxy("shop", POD_IP, &[("app", "reviews"), ("version", "v1")]);
    listeners(&gen(XdsType::Listener, &p, &mesh.snapshot(), &[]))
        .remove("virtualInbound")
        .expect("virtualInbound")
}

fn chain<'a>(l: &'a Listener, name: &str, tcp: bool) -> &'a FilterChain {
    l.filter_chains
        .iter()
        .find(|c| {
            c.name == name
                && c.filters
                    .last()
                    .is_some_and(|f| (f.name == "envoy.filters.network.tcp_proxy") == tcp)
        })
        .unwrap_or_else(|| panic!("no chain {name}"))
}

fn chain_hcm(c: &FilterChain) -> HttpConnectionManager {
    match &c.filters.last().expect("hcm").config_type {
        Some(filter::ConfigType::TypedConfig(any)) => {
            HttpConnectionManager::decode(&*any.value).expect("decodes")
        }
        other => panic!("{other:?}"),
    }
}

/// The policy names of the RBAC filters of every chain, by chain (HTTP chains marked).
fn rbac_by_chain(l: &Listener) -> Vec<(String, Vec<String>)> {
    l.filter_chains
        .iter()
        .map(|c| {
            let last = c.filters.last().expect("a filter");
            let names = if last.name == "envoy.filters.network.http_connection_manager" {
                let hcm = chain_hcm(c);
                let filters: Vec<String> =
                    hcm.http_filters.iter().map(|f| f.name.clone()).collect();
                assert_eq!(
                    filters.last().map(String::as_str),
                    Some("envoy.filters.http.router")
                );
                hcm.http_filters
                    .iter()
                    .filter(|f| f.name == "envoy.filters.http.rbac")
                    .flat_map(|f| match &f.config_type {
                        Some(http_filter::ConfigType::TypedConfig(any)) => {
                            let r = HttpRbac::decode(&*any.value).expect("decodes");
                            render(r.rules.as_ref().expect("rules"))
                                .into_keys()
                                .collect()
                        }
                        _ => Vec::new(),
                    })
                    .collect()
            } else {
                c.filters[..c.filters.len() - 1]
                    .iter()
                    .flat_map(|f| {
                        render(network_rbac(f).rules.as_ref().expect("rules")).into_keys()
                    })
                    .collect()
            };
            let kind = if last.name == "envoy.filters.network.tcp_proxy" {
                "tcp"
            } else {
                "http"
            };
            (format!("{} {kind}", c.name), names)
        })
        .collect()
}

#[test]
fn root_namespace_and_own_namespace_policies_with_matching_selectors_apply() {
    let m = mesh()
        .with_config(authorization_policy("istio-system", "mesh", "action: DENY\nrules: [{from: [{source: {ipBlocks: [10.9.0.0/16]}}]}]"))
        .with_config(authorization_policy("istio-system", "mesh-other", "selector: {matchLabels: {app: other}}\naction: DENY\nrules: [{}]"))
        .with_config(authorization_policy("shop", "ns-wide", "rules: [{from: [{source: {ipBlocks: [10.0.0.0/8]}}]}]"))
        .with_config(authorization_policy("shop", "v1", "selector: {matchLabels: {app: reviews, version: v1}}\nrules: [{to: [{operation: {methods: [GET]}}]}]"))
        .with_config(authorization_policy("shop", "v2", "selector: {matchLabels: {version: v2}}\nrules: [{}]"))
        .with_config(authorization_policy("other", "elsewhere", "action: DENY\nrules: [{}]"));
    let l = inbound(&m);
    let all = strs(&[
        "ns[istio-system]-policy[mesh]-rule[0]",
        "ns[shop]-policy[ns-wide]-rule[0]",
        "ns[shop]-policy[v1]-rule[0]",
    ]);
    // v1's rule needs a method: dropped on TCP chains.
    let tcp = strs(&[
        "ns[istio-system]-policy[mesh]-rule[0]",
        "ns[shop]-policy[ns-wide]-rule[0]",
    ]);
    // Every chain of a port (mTLS and plaintext under PERMISSIVE) carries the same filters.
    let mut by_chain = rbac_by_chain(&l);
    by_chain.dedup();
    assert_eq!(
        by_chain,
        [
            ("virtualInbound-blackhole tcp".to_string(), Vec::new()),
            ("0.0.0.0_3306 tcp".to_string(), tcp.clone()),
            ("0.0.0.0_9080 http".to_string(), all.clone()),
            ("virtualInbound-catchall-http http".to_string(), all),
            ("virtualInbound tcp".to_string(), tcp),
        ]
    );
    // HTTP: RBAC first (DENY then ALLOW), then fault, CORS, router. TCP: RBAC, tcp_proxy.
    let hcm = chain_hcm(chain(&l, "0.0.0.0_9080", false));
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.rbac",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    let tcp_chain = chain(&l, "0.0.0.0_3306", true);
    let names: Vec<&str> = tcp_chain.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
}

#[test]
fn without_policies_no_rbac_filter_and_a_policy_change_changes_the_listener() {
    let before = inbound(&mesh());
    for (chain, names) in rbac_by_chain(&before) {
        assert!(names.is_empty(), "{chain}: {names:?}");
    }
    let hcm = chain_hcm(chain(&before, "0.0.0.0_9080", false));
    assert!(hcm
        .http_filters
        .iter()
        .all(|f| f.name != "envoy.filters.http.rbac"));

    let after = inbound(&mesh().with_config(authorization_policy("shop", "a", "{}")));
    assert_ne!(before, after);
}

/// Gateways: policies selected by the gateway's labels guard its HTTP listeners (before the
/// router) and its TCP/TLS chains (before tcp_proxy); sidecars' outbound listeners get none.
#[test]
fn gateway_listeners_carry_the_gateways_policies() {
    let mut db = service("shop", "db", &[("tcp", 5432)]);
    db.cluster_ips = vec!["10.96.0.30".into()];
    let m = Mesh::new()
        .with_service(db)
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "edge",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
- port: {number: 31400, name: tcp, protocol: TCP}
  hosts: ["*"]
"#,
        ))
        .with_config(virtual_service(
            "shop",
            "db",
            "hosts: [\"*\"]\ngateways: [istio-system/edge]\ntcp: [{route: [{destination: {host: db}}]}]",
        ))
        .with_config(authorization_policy(
            "istio-system",
            "edge-allow",
            "selector: {matchLabels: {istio: ingressgateway}}\nrules: [{from: [{source: {remoteIpBlocks: [203.0.113.0/24]}}]}]",
        ))
        .with_config(authorization_policy(
            "shop",
            "sidecars",
            "action: DENY\nrules: [{}]",
        ));
    let snap = m.snapshot();
    let gw = router_proxy("istio-system", &[("istio", "ingressgateway")]);
    let ls = listeners(&gen(XdsType::Listener, &gw, &snap, &[]));
    let http = hcm(&ls["0.0.0.0_80"]);
    let names: Vec<&str> = http.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    let tcp_chain = &ls["0.0.0.0_31400"].filter_chains[0];
    let names: Vec<&str> = tcp_chain.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    let rules = network_rbac(&tcp_chain.filters[0]).rules.expect("rules");
    assert_eq!(
        render(&rules)["ns[istio-system]-policy[edge-allow]-rule[0]"].1,
        strs(&["and(or(remote_ip(203.0.113.0/24)))"])
    );

    // A sidecar in `shop` (the DENY policy's namespace): its outbound listeners carry no
    // RBAC filter, only its virtualInbound.
    let p = captured_proxy("shop", POD_IP, &[("app", "client")]);
    for (name, l) in listeners(&gen(XdsType::Listener, &p, &snap, &[])) {
        let has_rbac = rbac_by_chain(&l).iter().any(|(_, names)| !names.is_empty());
        assert_eq!(has_rbac, name == "virtualInbound", "{name}");
    }
}

/// RequestAuthentication: the selected workloads' HTTP chains (inbound and gateway) get
/// `jwt_authn` first, before RBAC, as istiod orders them; TCP chains, outbound listeners and
/// workloads no RequestAuthentication selects get none. A `jwksUri` rule gets the fetched
/// keys inline once the server has them, and a key set that fails every token before.
#[test]
fn request_authentication_puts_jwt_authn_before_rbac_on_http_chains() {
    use crate::generate::authn::FAIL_ALL_JWKS;
    use shoal_proto::pb::envoy::extensions::filters::http::jwt_authn::v3::{
        jwt_provider::JwksSourceSpecifier, JwtAuthentication,
    };
    const URI: &str = "https://issuer.example/jwks.json";
    let m = mesh()
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "edge",
            "selector: {istio: ingressgateway}
servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"]}]",
        ))
        .with_config(request_authentication(
            "shop",
            "reviews",
            &format!(
                "selector: {{matchLabels: {{app: reviews}}}}\njwtRules: [{{issuer: b, jwksUri: \"{URI}\"}}, {{issuer: a, jwks: '{{\"keys\": []}}'}}]"
            ),
        ))
        .with_config(request_authentication(
            "istio-system",
            "edge",
            "selector: {matchLabels: {istio: ingressgateway}}\njwtRules: [{issuer: gw, jwks: '{\"keys\": []}'}]",
        ))
        .with_config(authorization_policy("shop", "allow", "rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]"));
    let jwt_of = |hcm: &HttpConnectionManager| -> Option<JwtAuthentication> {
        hcm.http_filters
            .iter()
            .find(|f| f.name == "envoy.filters.http.jwt_authn")
            .map(|f| match &f.config_type {
                Some(http_filter::ConfigType::TypedConfig(any)) => {
                    JwtAuthentication::decode(&*any.value).expect("decodes")
                }
                other => panic!("{other:?}"),
            })
    };
    let inline = |jwt: &JwtAuthentication, provider: &str| -> String {
        use shoal_proto::pb::envoy::config::core::v3::data_source::Specifier;
        match &jwt.providers[provider].jwks_source_specifier {
            Some(JwksSourceSpecifier::LocalJwks(ds)) => match &ds.specifier {
                Some(Specifier::InlineString(s)) => s.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    let l = inbound(&m);
    let inbound_hcm = chain_hcm(chain(&l, "0.0.0.0_9080", false));
    let names: Vec<&str> = inbound_hcm
        .http_filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.jwt_authn",
            "envoy.filters.http.rbac",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    let jwt = jwt_of(&inbound_hcm).expect("jwt_authn");
    // Sorted by issuer: `a` is origins-0; `b`'s keys are not fetched yet.
    assert_eq!(jwt.providers["origins-0"].issuer, "a");
    assert_eq!(inline(&jwt, "origins-0"), r#"{"keys": []}"#);
    assert_eq!(inline(&jwt, "origins-1"), FAIL_ALL_JWKS);
    let catchall = chain_hcm(chain(&l, "virtualInbound-catchall-http", false));
    assert!(jwt_of(&catchall).is_some(), "the sniffed HTTP chain");
    let tcp_chain = chain(&l, "0.0.0.0_3306", true);
    assert!(tcp_chain.filters.iter().all(|f| !f.name.contains("jwt")));

    // Fetched keys are inlined.
    let mut fetched = m;
    fetched.state.jwks = Arc::new([(URI.to_string(), Arc::from(r#"{"keys":["fetched"]}"#))].into());
    let fetched_hcm = chain_hcm(chain(&inbound(&fetched), "0.0.0.0_9080", false));
    let jwt = jwt_of(&fetched_hcm).expect("jwt_authn");
    assert_eq!(inline(&jwt, "origins-1"), r#"{"keys":["fetched"]}"#);

    // The gateway's HTTP listener: its own RequestAuthentication.
    let snap = fetched.snapshot();
    let gw = router_proxy("istio-system", &[("istio", "ingressgateway")]);
    let ls = listeners(&gen(XdsType::Listener, &gw, &snap, &[]));
    let gw_hcm = hcm(&ls["0.0.0.0_80"]);
    assert_eq!(gw_hcm.http_filters[0].name, "envoy.filters.http.jwt_authn");
    assert_eq!(
        jwt_of(&gw_hcm).expect("jwt").providers["origins-0"].issuer,
        "gw"
    );

    // A workload no RequestAuthentication selects, and outbound listeners: none.
    let p = captured_proxy("shop", POD_IP, &[("app", "client")]);
    for (name, l) in listeners(&gen(XdsType::Listener, &p, &snap, &[])) {
        for c in &l.filter_chains {
            if c.filters
                .last()
                .is_some_and(|f| f.name.ends_with("http_connection_manager"))
            {
                assert!(jwt_of(&chain_hcm(c)).is_none(), "{name} {}", c.name);
            }
        }
    }
}

/// istiod translates path templates to `uri_template`, which makes Envoy 1.40 abort on load:
/// shoal refuses them at ingest, and a template that reaches the server anyway is a value
/// that cannot be translated (the ALLOW rule is dropped, the DENY value left out).
#[test]
fn path_templates_are_never_sent_to_envoy() {
    let k = key(vec![
        policy(
            "shop",
            "a",
            "rules: [{to: [{operation: {paths: [\"/a/{*}\"]}}]}, {to: [{operation: {paths: [/b]}}]}]",
        ),
        policy(
            "shop",
            "d",
            "action: DENY\nrules: [{to: [{operation: {paths: [\"/c/{**}\", /d]}}]}]",
        ),
    ]);
    let filters = http(&k);
    let deny = render(filters[0].rules.as_ref().expect("deny"));
    assert_eq!(
        deny["ns[shop]-policy[d]-rule[0]"].0,
        strs(&["and(or(path(exact:/d)))"])
    );
    let allow = render(filters[1].rules.as_ref().expect("allow"));
    assert_eq!(
        allow.keys().collect::<Vec<_>>(),
        ["ns[shop]-policy[a]-rule[1]"]
    );
}
