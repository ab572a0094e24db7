//! One AuthorizationPolicy rule → one Envoy RBAC policy, as istiod's authz model
//! (pilot/pkg/security/authz/model, .../matcher): sources and `when` keys about the peer
//! become principals, operations and `when` keys about the destination permissions.

use crate::generate::authn::{JWT_FILTER, JWT_PAYLOAD_KEY};
use crate::generate::outbound::cidr;
use shoal_common::model::AuthorizationRule;
use shoal_proto::pb::envoy::config::core::v3::CidrRange;
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action as RbacAction, Permission, Policy, Principal,
};
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, HeaderMatcher,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher, path_matcher, string_matcher::MatchPattern, value_matcher,
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher,
    ValueMatcher,
};

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
    /// A path template (`{*}`, `{**}`), which Envoy's RBAC filter cannot load.
    #[error("path template {0:?} is not supported")]
    PathTemplate(String),
    /// A field shoal accepts but does not enforce (Envoy metadata). Fails closed: it drops an ALLOW or AUDIT
    /// rule and is left out of a DENY rule, which then denies more.
    #[error("{0} is not enforced by shoal")]
    Unenforced(String),
    /// An attribute asked of the wrong side (a bug: attributes are sorted by side).
    #[error("{0} is not an attribute of this side of a rule")]
    Misplaced(String),
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
    /// `requestPrincipals` (JWT `<iss>/<sub>`, from `jwt_authn`'s metadata).
    RequestPrincipal,
    /// A `request.auth.*` key (JWT attributes, from `jwt_authn`'s metadata).
    RequestAuth(String),
    /// An `experimental.envoy.filters.*` key (Envoy dynamic metadata).
    EnvoyMetadata(String),
}

struct Condition<'a> {
    attr: Attr,
    values: &'a [String],
    not_values: &'a [String],
}

/// The conditions of a source or an operation: its fields that are set, in the given order.
fn present<'a, const N: usize>(
    fields: [(Attr, &'a Vec<String>, &'a Vec<String>); N],
) -> Vec<Condition<'a>> {
    fields
        .into_iter()
        .filter(|(_, v, n)| !v.is_empty() || !n.is_empty())
        .map(|(attr, values, not_values)| Condition {
            attr,
            values,
            not_values,
        })
        .collect()
}

/// The RBAC policy of one rule of a policy in `policy_ns`, for an HTTP or a TCP chain.
pub(super) fn translate_rule(
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
        // istiod's order: principals, request principals, service accounts, trust domains,
        // namespaces, remote IPs, IPs, then the `when` keys.
        let mut conds = present([
            (Attr::Principal, &s.principals, &s.not_principals),
            (
                Attr::RequestPrincipal,
                &s.request_principals,
                &s.not_request_principals,
            ),
            (
                Attr::ServiceAccount,
                &s.service_accounts,
                &s.not_service_accounts,
            ),
            (Attr::TrustDomain, &s.trust_domains, &s.not_trust_domains),
            (Attr::Namespace, &s.namespaces, &s.not_namespaces),
            (Attr::RemoteIp, &s.remote_ip_blocks, &s.not_remote_ip_blocks),
            (Attr::SourceIp, &s.ip_blocks, &s.not_ip_blocks),
        ]);
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
        let mut conds = present([
            (Attr::Host, &o.hosts, &o.not_hosts),
            (Attr::Method, &o.methods, &o.not_methods),
            (Attr::Path, &o.paths, &o.not_paths),
            (Attr::Port, &o.ports, &o.not_ports),
        ]);
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
        _ if key.starts_with("request.auth.") => Attr::RequestAuth(key.to_string()),
        _ if key.starts_with("experimental.envoy.filters.") => Attr::EnvoyMetadata(key.to_string()),
        _ => match request_header_name(key) {
            Some(name) => Attr::Header(name.to_string()),
            None => return Err(TranslateError::UnknownKey(key.to_string())),
        },
    })
}

/// `x-token` for `request.headers[x-token]`.
fn request_header_name(key: &str) -> Option<&str> {
    key.strip_prefix("request.headers[")?
        .strip_suffix(']')
        .filter(|n| !n.is_empty())
}

fn is_permission(attr: &Attr) -> bool {
    matches!(
        attr,
        Attr::Host
            | Attr::Method
            | Attr::Path
            | Attr::Port
            | Attr::DestinationIp
            | Attr::Sni
            | Attr::EnvoyMetadata(_)
    )
}

struct Ctx<'a> {
    policy_ns: &'a str,
    trust_domain: &'a str,
    action: RbacAction,
    tcp: bool,
}

impl Ctx<'_> {
    /// Each condition's values ORed, and its not-values ORed and negated; the caller ANDs
    /// them. A value that cannot be translated fails the rule of an ALLOW policy and is
    /// left out of a DENY or AUDIT one (istiod's `checkError`); a field shoal does not
    /// enforce also fails an AUDIT rule (auditing what it cannot see would mislead).
    fn generate<T>(
        &self,
        conds: &[Condition<'_>],
        value: impl Fn(&Attr, &str) -> Result<T, TranslateError>,
        or: fn(Vec<T>) -> T,
        not: fn(T) -> T,
    ) -> Result<Vec<T>, TranslateError> {
        let mut out = Vec::new();
        for c in conds {
            for (values, negated) in [(c.values, false), (c.not_values, true)] {
                let values = if matches!(c.attr, Attr::Principal) {
                    self.with_trust_domain(values)
                } else {
                    values.to_vec()
                };
                let mut any = Vec::new();
                for v in &values {
                    match value(&c.attr, v) {
                        Ok(t) => any.push(t),
                        Err(e) if self.fails_rule(&e) => return Err(e),
                        Err(_) => {}
                    }
                }
                if !any.is_empty() {
                    let one = or(any);
                    out.push(if negated { not(one) } else { one });
                }
            }
        }
        Ok(out)
    }

    /// Whether an untranslatable value fails its whole rule (else it is left out). Never
    /// for DENY: leaving a value out of a DENY rule makes it deny more, which is safe.
    fn fails_rule(&self, error: &TranslateError) -> bool {
        match self.action {
            RbacAction::Allow => true,
            RbacAction::Log => matches!(error, TranslateError::Unenforced(_)),
            RbacAction::Deny => false,
        }
    }

    fn permissions(&self, conds: &[Condition<'_>]) -> Result<Vec<Permission>, TranslateError> {
        self.generate(
            conds,
            |attr, v| self.permission(attr, v),
            |rules| Permission {
                rule: Some(permission::Rule::OrRules(permission::Set { rules })),
            },
            |p| Permission {
                rule: Some(permission::Rule::NotRule(Box::new(p))),
            },
        )
    }

    fn principals(&self, conds: &[Condition<'_>]) -> Result<Vec<Principal>, TranslateError> {
        self.generate(
            conds,
            |attr, v| self.principal(attr, v),
            |ids| Principal {
                identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
            },
            |p| Principal {
                identifier: Some(principal::Identifier::NotId(Box::new(p))),
            },
        )
    }

    fn http_only(&self, field: &'static str) -> Result<(), TranslateError> {
        if self.tcp {
            Err(TranslateError::HttpOnly(field))
        } else {
            Ok(())
        }
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

    /// What a request does: hosts, methods, paths, ports, destination IP, SNI.
    fn permission(&self, attr: &Attr, v: &str) -> Result<Permission, TranslateError> {
        use permission::Rule;
        let rule = match attr {
            Attr::Host => {
                self.http_only("hosts")?;
                Rule::Header(header_matcher(":authority", v, true))
            }
            Attr::Method => {
                self.http_only("methods")?;
                Rule::Header(header_matcher(":method", v, false))
            }
            Attr::Path => {
                self.http_only("paths")?;
                // istiod sends templates as `uri_template`, which makes Envoy 1.40 abort
                // (std::terminate) when it loads the filter: refused at ingest, and left
                // out here like any value that cannot be translated.
                if v.contains("{*}") || v.contains("{**}") {
                    return Err(TranslateError::PathTemplate(v.to_string()));
                }
                Rule::UrlPath(PathMatcher {
                    rule: Some(path_matcher::Rule::Path(string_matcher(v, ""))),
                })
            }
            Attr::Port => {
                Rule::DestinationPort(v.parse::<u32>().ok().filter(|p| *p <= 65535).ok_or_else(
                    || TranslateError::BadPort {
                        attribute: "ports",
                        value: v.to_string(),
                    },
                )?)
            }
            Attr::DestinationIp => Rule::DestinationIp(address("destination.ip", v)?),
            Attr::Sni => Rule::RequestedServerName(string_matcher(v, "")),
            Attr::EnvoyMetadata(key) => return Err(TranslateError::Unenforced(key.clone())),
            other => return Err(TranslateError::Misplaced(format!("{other:?}"))),
        };
        Ok(Permission { rule: Some(rule) })
    }

    /// Who sends it: peer addresses and identities, request headers.
    fn principal(&self, attr: &Attr, v: &str) -> Result<Principal, TranslateError> {
        use principal::Identifier;
        let identifier = match attr {
            Attr::SourceIp => Identifier::DirectRemoteIp(address("ipBlocks", v)?),
            Attr::RemoteIp => Identifier::RemoteIp(address("remoteIpBlocks", v)?),
            Attr::Namespace => {
                let ns = v.split('*').map(quote_meta).collect::<Vec<_>>().join(".*");
                authenticated(regex_matcher(format!(".*/ns/{ns}/.*")))
            }
            Attr::ServiceAccount => {
                let (ns, sa) = v.split_once('/').unwrap_or((self.policy_ns, v));
                authenticated(regex_matcher(format!(
                    "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                    quote_meta(ns),
                    quote_meta(sa)
                )))
            }
            Attr::TrustDomain => authenticated(if v == "*" {
                prefix_matcher("spiffe://")
            } else if let Some((before, after)) = v.split_once('*') {
                regex_matcher(format!(
                    "spiffe://{}[^/]*{}/.*",
                    quote_meta(before),
                    quote_meta(after)
                ))
            } else {
                prefix_matcher(&format!("spiffe://{v}/"))
            }),
            Attr::Principal => authenticated(string_matcher(v, "spiffe://")),
            Attr::Header(name) => {
                self.http_only("request.headers")?;
                Identifier::Header(header_matcher(name, v, false))
            }
            Attr::RequestPrincipal => {
                self.http_only("requestPrincipals")?;
                return Ok(request_principal(v));
            }
            Attr::RequestAuth(key) => {
                self.http_only("request.auth")?;
                return request_auth(key, v);
            }
            other => return Err(TranslateError::Misplaced(format!("{other:?}"))),
        };
        Ok(Principal {
            identifier: Some(identifier),
        })
    }
}

/// istiod's `requestPrincipalGenerator`: `<iss>/<sub>` split at the last `/` (an issuer
/// may be a URL), `*` prefix/suffix matching, checked against the `iss` and `sub` claims
/// of the verified payload that `jwt_authn` left in the dynamic metadata.
fn request_principal(v: &str) -> Principal {
    let (iss, sub) = match v.rfind('/') {
        Some(i) => (&v[..i], Some(&v[i + 1..])),
        None => (v, None),
    };
    let any = || regex_matcher(".+".into());
    let exact = |s: &str| StringMatcher {
        match_pattern: Some(MatchPattern::Exact(s.into())),
        ignore_case: false,
    };
    let (iss_m, sub_m) = if v == "*" {
        (any(), any())
    } else if let Some(rest) = v.strip_prefix('*') {
        match sub {
            Some(sub) if iss == "*" => (any(), exact(sub)),
            Some(sub) => (
                StringMatcher {
                    match_pattern: Some(MatchPattern::Suffix(
                        iss.strip_prefix('*').unwrap_or(iss).into(),
                    )),
                    ignore_case: false,
                },
                exact(sub),
            ),
            None => (
                any(),
                StringMatcher {
                    match_pattern: Some(MatchPattern::Suffix(rest.into())),
                    ignore_case: false,
                },
            ),
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        match sub {
            Some("*") => (exact(iss), any()),
            Some(sub) => (
                exact(iss),
                prefix_matcher(sub.strip_suffix('*').unwrap_or(sub)),
            ),
            None => (prefix_matcher(rest), any()),
        }
    } else {
        (exact(iss), exact(sub.unwrap_or_default()))
    };
    // `metadata` is what istiod sends (Envoy prefers `sourced_metadata` now; both read the
    // dynamic metadata).
    #[allow(deprecated)]
    let claim = |name: &str, m: StringMatcher| Principal {
        identifier: Some(principal::Identifier::Metadata(jwt_metadata(
            &[name],
            ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
            },
        ))),
    };
    principal_and(vec![claim("iss", iss_m), claim("sub", sub_m)])
}

/// A `request.auth.*` condition value (istiod's request audiences, presenter, claims and
/// principal generators).
fn request_auth(key: &str, v: &str) -> Result<Principal, TranslateError> {
    let claims: Vec<String> = match key {
        "request.auth.principal" => return Ok(request_principal(v)),
        "request.auth.audiences" => vec!["aud".into()],
        "request.auth.presenter" => vec!["azp".into()],
        _ => match key.strip_prefix("request.auth.claims").and_then(claim_path) {
            Some(path) => path,
            None => return Err(TranslateError::UnknownKey(key.to_string())),
        },
    };
    let claims: Vec<&str> = claims.iter().map(String::as_str).collect();
    // A claim may be a list (`groups: [a, b]`) or a single value: match either.
    let one = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(string_matcher(
            v, "",
        ))),
    };
    let either = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: vec![
                ValueMatcher {
                    match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
                        ListMatcher {
                            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(
                                one.clone(),
                            ))),
                        },
                    ))),
                },
                one,
            ],
        })),
    };
    #[allow(deprecated)] // as in `request_principal`
    let identifier = principal::Identifier::Metadata(jwt_metadata(&claims, either));
    Ok(Principal {
        identifier: Some(identifier),
    })
}

/// `[a][b]` → `[a, b]` (istiod's nested claims); `None` when malformed.
fn claim_path(brackets: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = brackets;
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let end = inner.find(']')?;
        let name = &inner[..end];
        if name.is_empty() || name.contains('[') {
            return None;
        }
        out.push(name.to_string());
        rest = &inner[end + 1..];
    }
    (!out.is_empty()).then_some(out)
}

/// A matcher on the `jwt_authn` filter's metadata: `payload.<claims…>`.
fn jwt_metadata(claims: &[&str], value: ValueMatcher) -> MetadataMatcher {
    let key = |k: &str| metadata_matcher::PathSegment {
        segment: Some(metadata_matcher::path_segment::Segment::Key(k.into())),
    };
    MetadataMatcher {
        filter: JWT_FILTER.into(),
        path: std::iter::once(key(JWT_PAYLOAD_KEY))
            .chain(claims.iter().map(|c| key(c)))
            .collect(),
        value: Some(value),
        invert: false,
    }
}

fn address(attribute: &'static str, v: &str) -> Result<CidrRange, TranslateError> {
    cidr(v).ok_or_else(|| TranslateError::BadAddress {
        attribute,
        value: v.to_string(),
    })
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

pub(super) fn permission_any() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

pub(super) fn principal_any() -> Principal {
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
