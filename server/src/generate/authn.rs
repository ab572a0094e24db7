//! RequestAuthentication → Envoy's `jwt_authn` HTTP filter, as istiod's authn policy
//! applier (pilot/pkg/security/authn `JwtFilter`, `convertToEnvoyJwtConfig`).
//!
//! The RequestAuthentications of the root namespace and of the workload's namespace whose
//! selector (if any) matches the workload's labels apply; their `jwtRules` are merged and
//! sorted by issuer. Rule `i` becomes provider `origins-<i>`. The requirement lets a request
//! without a token through (AuthorizationPolicy decides what it may do) and refuses one
//! with a token that no provider accepts (401):
//! - one provider: `requires_any { origins-0, allow_missing }`;
//! - several: `requires_any { origins-0, …, requires_all { requires_any { origins-i,
//!   allow_missing } … } }` — the outer providers cover providers that read the same
//!   header, for which the inner AND would always fail.
//!
//! Each provider writes the verified token's payload into the filter's dynamic metadata
//! under `payload`, which the RBAC filters read (`requestPrincipals`, `request.auth.*`).
//! Keys: an inline `jwks` goes in as `local_jwks`; for a `jwksUri` the server fetches the
//! keys ([`crate::security::jwks`]) and inlines them too, as istiod does; until the keys are
//! fetched (or when they never are) the provider gets [`FAIL_ALL_JWKS`], a key whose
//! private half was discarded, so every token of that issuer is refused.
//!
//! `providers` is a protobuf map, which prost encodes in hash order; the filter config is
//! encoded entry by entry in name order, so that replicas produce the same bytes.

use crate::index::config::Config;
use crate::index::hosts::labels_match;
use crate::index::proxy::Proxy;
use crate::index::push_context::PushContext;
use prost::Message as _;
use shoal_common::model::{JwtRule, RequestAuthentication};
use shoal_proto::pb::envoy::config::route::v3::{route_match::PathSpecifier, RouteMatch};
use shoal_proto::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::{JwksSourceSpecifier, NormalizePayload},
    jwt_requirement::RequiresType,
    requirement_rule::RequirementType,
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpFilter,
};
use shoal_proto::Any;

/// The `jwt_authn` HTTP filter's name (also the RBAC metadata namespace of its payloads).
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The metadata key under which each provider puts the verified payload (istiod's).
pub const JWT_PAYLOAD_KEY: &str = "payload";
const JWT_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";

/// A JWKS whose one RSA key's private half was generated and thrown away: no token
/// verifies against it. Inlined for a `jwksUri` whose keys are not (yet) known, so that
/// the issuer's tokens are refused rather than accepted unverified.
pub const FAIL_ALL_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","n":"1Nycsdp_ZKg4gK6U5BdXxP6coyTLDN12cIYRsfMAOAOddhFjRDDkFY_PzcPifFgmjf2D3t91dgFshPLqclblf50TjrUQYeRSTXoP8Q0um4DkqCeofR-5b_5BYzee6hIZW4kiMJN0fwDBW7Iccq8BhqFGLteRr8jRnL08wCWhfwGfGFrzTF30kp3x2csw8TpijUT9X9ZSQRNNSY40BxCTiLt4gnWey4gFndKiWqOfrr2Fk2OdmSeBdnfGeHO98LIHiJ6NoAp_viUmeKcqRelXV9fjyt2KNEbwbaHvsX0BcbNphIy4NGId2faWBa05wumqxiC6OPjEwBMiJEELSsMbfw"}]}"#;

/// Everything the `jwt_authn` filter of one workload is built from: the applicable
/// `jwtRules`, sorted by issuer, each with its keys resolved into `jwks` (inline, fetched,
/// or [`FAIL_ALL_JWKS`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct JwtKey {
    /// The rules, keys inlined.
    pub rules: Vec<JwtRule>,
}

/// The `jwtRules` that apply to a workload: those of the RequestAuthentications of the
/// root namespace and of its own namespace whose selector (if any) matches its labels.
pub fn applicable(ctx: &PushContext, proxy: &Proxy) -> JwtKey {
    let root = ctx.mesh.root_namespace.as_str();
    let mut namespaces = vec![root];
    if proxy.namespace != root {
        namespaces.push(proxy.namespace.as_str());
    }
    let mut rules: Vec<JwtRule> = namespaces
        .into_iter()
        .flat_map(|ns| ctx.request_authentications.get(ns).into_iter().flatten())
        .filter(|ra: &&std::sync::Arc<Config<RequestAuthentication>>| {
            ra.spec
                .selector
                .as_ref()
                .is_none_or(|s| labels_match(&s.match_labels, &proxy.labels))
        })
        .flat_map(|ra| ra.spec.jwt_rules.iter().cloned())
        .map(|mut rule| {
            if rule.jwks.is_empty() {
                rule.jwks = ctx
                    .jwks
                    .get(&rule.jwks_uri)
                    .map_or_else(|| FAIL_ALL_JWKS.to_string(), |keys| keys.to_string());
            }
            rule
        })
        .collect();
    // istiod sorts by issuer (stably) so that the filter does not depend on object order.
    rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    JwtKey { rules }
}

/// The `jwt_authn` filter of `key`, `None` without rules.
pub fn jwt_filter(key: &JwtKey) -> Option<HttpFilter> {
    if key.rules.is_empty() {
        return None;
    }
    Some(HttpFilter {
        name: JWT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: JWT_TYPE.into(),
            value: encode(key),
        })),
        ..Default::default()
    })
}

fn provider_name(i: usize) -> String {
    format!("origins-{i}")
}

fn provider(rule: &JwtRule) -> JwtProvider {
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: JWT_PAYLOAD_KEY.into(),
        normalize_payload_in_metadata: Some(NormalizePayload {
            space_delimited_claims: space_delimited_claims(&rule.space_delimited_claims),
        }),
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        jwks_source_specifier: Some(JwksSourceSpecifier::LocalJwks(
            shoal_proto::pb::envoy::config::core::v3::DataSource {
                specifier: Some(
                    shoal_proto::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                        rule.jwks.clone(),
                    ),
                ),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// istiod's list: `permission` and `scope` always, plus the rule's, sorted, deduplicated.
fn space_delimited_claims(extra: &[String]) -> Vec<String> {
    let all: std::collections::BTreeSet<String> = ["permission", "scope"]
        .into_iter()
        .map(String::from)
        .chain(extra.iter().cloned())
        .collect();
    all.into_iter().collect()
}

fn by_name(name: String) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(RequiresType::ProviderName(name)),
    }
}

fn any_of(requirements: Vec<JwtRequirement>) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
            requirements,
        })),
    }
}

/// istiod's requirement: a token, if present, must be valid for some provider.
fn requirement(count: usize) -> JwtRequirement {
    let or_missing = |i: usize| {
        any_of(vec![
            by_name(provider_name(i)),
            JwtRequirement {
                requires_type: Some(RequiresType::AllowMissing(Default::default())),
            },
        ])
    };
    if count == 1 {
        return or_missing(0);
    }
    let mut outer: Vec<JwtRequirement> = (0..count).map(|i| by_name(provider_name(i))).collect();
    outer.push(JwtRequirement {
        requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
            requirements: (0..count).map(or_missing).collect(),
        })),
    });
    any_of(outer)
}

/// The filter config, its `providers` map encoded entry by entry in name order
/// (`origins-10` sorts before `origins-2`, which is fine: only determinism matters).
fn encode(key: &JwtKey) -> Vec<u8> {
    let mut buf = JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(RequirementType::Requires(requirement(key.rules.len()))),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    }
    .encode_to_vec();
    let mut named: Vec<(String, JwtProvider)> = key
        .rules
        .iter()
        .enumerate()
        .map(|(i, rule)| (provider_name(i), provider(rule)))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, provider) in named {
        let one = JwtAuthentication {
            providers: [(name, provider)].into_iter().collect(),
            ..Default::default()
        };
        one.encode(&mut buf).expect("a Vec grows");
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::{ClaimToHeader, JwtHeader as RuleHeader};

    fn decode(filter: &HttpFilter) -> JwtAuthentication {
        match &filter.config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => {
                assert_eq!(any.type_url, JWT_TYPE);
                JwtAuthentication::decode(&*any.value).expect("decodes")
            }
            other => panic!("{other:?}"),
        }
    }

    fn rule(issuer: &str) -> JwtRule {
        JwtRule {
            issuer: issuer.into(),
            jwks: r#"{"keys":[]}"#.into(),
            ..Default::default()
        }
    }

    #[test]
    fn no_rules_no_filter() {
        assert!(jwt_filter(&JwtKey::default()).is_none());
    }

    #[test]
    fn one_rule_is_the_provider_or_a_missing_token() {
        let mut r = rule("https://issuer.example");
        r.audiences = vec!["a".into()];
        r.from_headers = vec![RuleHeader {
            name: "x-jwt".into(),
            prefix: "Bearer ".into(),
        }];
        r.from_params = vec!["token".into()];
        r.from_cookies = vec!["session".into()];
        r.forward_original_token = true;
        r.output_payload_to_header = "x-payload".into();
        r.space_delimited_claims = vec!["roles".into(), "scope".into()];
        r.output_claim_to_headers = vec![ClaimToHeader {
            header: "x-group".into(),
            claim: "groups".into(),
        }];
        let filter = jwt_filter(&JwtKey { rules: vec![r] }).expect("a filter");
        assert_eq!(filter.name, JWT_FILTER);
        let config = decode(&filter);
        assert!(config.bypass_cors_preflight);
        let p = &config.providers["origins-0"];
        assert_eq!(p.issuer, "https://issuer.example");
        assert_eq!(p.audiences, ["a"]);
        assert!(p.forward);
        assert_eq!(p.payload_in_metadata, "payload");
        assert_eq!(p.forward_payload_header, "x-payload");
        assert_eq!(p.from_headers[0].value_prefix, "Bearer ");
        assert_eq!(p.from_params, ["token"]);
        assert_eq!(p.from_cookies, ["session"]);
        assert_eq!(p.claim_to_headers[0].header_name, "x-group");
        assert_eq!(
            p.normalize_payload_in_metadata
                .as_ref()
                .map(|n| n.space_delimited_claims.clone()),
            Some(vec!["permission".into(), "roles".into(), "scope".into()])
        );
        assert!(matches!(
            p.jwks_source_specifier,
            Some(JwksSourceSpecifier::LocalJwks(_))
        ));
        let Some(RequirementType::Requires(req)) = &config.rules[0].requirement_type else {
            panic!("{config:?}")
        };
        let Some(RequiresType::RequiresAny(or)) = &req.requires_type else {
            panic!("{req:?}")
        };
        assert_eq!(or.requirements.len(), 2);
        assert_eq!(
            or.requirements[0].requires_type,
            Some(RequiresType::ProviderName("origins-0".into()))
        );
        assert_eq!(
            or.requirements[1].requires_type,
            Some(RequiresType::AllowMissing(Default::default()))
        );
    }

    #[test]
    fn several_rules_any_provider_or_all_valid_or_missing() {
        let key = JwtKey {
            rules: vec![rule("a"), rule("b")],
        };
        let config = decode(&jwt_filter(&key).expect("a filter"));
        assert_eq!(config.providers.len(), 2);
        let Some(RequirementType::Requires(req)) = &config.rules[0].requirement_type else {
            panic!()
        };
        let Some(RequiresType::RequiresAny(or)) = &req.requires_type else {
            panic!()
        };
        assert_eq!(or.requirements.len(), 3);
        let Some(RequiresType::RequiresAll(and)) = &or.requirements[2].requires_type else {
            panic!("{or:?}")
        };
        assert_eq!(and.requirements.len(), 2);
        // Deterministic bytes whatever the map's hash order.
        let a = jwt_filter(&key).expect("a filter");
        for _ in 0..10 {
            assert_eq!(jwt_filter(&key), Some(a.clone()));
        }
    }
}
