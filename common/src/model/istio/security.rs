//! Istio security config (`security.istio.io/v1`): PeerAuthentication,
//! RequestAuthentication and AuthorizationPolicy, with Istio's field names.
//!
//! Every field of the API that shoal reads is modelled here; the ingester refuses the
//! fields that are not (with an error naming them) and validates what the server relies on.

use super::{BTreeMap, Deserialize, Serialize};

/// A label selector as the security API spells it (`selector.matchLabels`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Labels the workload must carry; empty selects every workload of the namespace.
    pub match_labels: BTreeMap<String, String>,
}

/// `PeerAuthentication`: whether a workload's inbound traffic must, may or must not be
/// mutual TLS. Mesh-wide in the root namespace, namespace-wide without a selector,
/// workload-wide with one; `portLevelMtls` overrides per workload port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PeerAuthentication {
    /// The workloads it applies to; none = the whole namespace (or mesh).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The mode for every port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtls: Option<PeerMtls>,
    /// Per workload (container) port overrides; needs a selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub port_level_mtls: BTreeMap<u32, PeerMtls>,
}

/// The `mtls` block of a PeerAuthentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PeerMtls {
    /// The mode.
    pub mode: MtlsMode,
}

/// A PeerAuthentication mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum MtlsMode {
    /// Inherit from the enclosing scope (PERMISSIVE at the top).
    #[default]
    #[serde(rename = "UNSET")]
    Unset,
    /// Plaintext only.
    #[serde(rename = "DISABLE")]
    Disable,
    /// Mutual TLS and plaintext.
    #[serde(rename = "PERMISSIVE")]
    Permissive,
    /// Mutual TLS only.
    #[serde(rename = "STRICT")]
    Strict,
}

/// `AuthorizationPolicy`: who may do what to the selected workloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct AuthorizationPolicy {
    /// The workloads it applies to; none = the whole namespace (or mesh, in the root
    /// namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// What a matching request gets.
    pub action: AuthorizationAction,
    /// The external authorizer of a CUSTOM policy (a MeshConfig extension provider).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<ExtensionProvider>,
    /// The rules; a request matching any rule matches the policy. ALLOW with no rules
    /// allows nothing; DENY with no rules denies nothing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<AuthorizationRule>,
}

/// `provider` of a CUSTOM AuthorizationPolicy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtensionProvider {
    /// The extension provider's name in MeshConfig.
    pub name: String,
}

/// An AuthorizationPolicy action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum AuthorizationAction {
    /// Allow matching requests (and, once any ALLOW policy selects a workload, deny the rest).
    #[default]
    #[serde(rename = "ALLOW")]
    Allow,
    /// Deny matching requests.
    #[serde(rename = "DENY")]
    Deny,
    /// Audit matching requests (no effect on the decision).
    #[serde(rename = "AUDIT")]
    Audit,
    /// An external authorizer (`provider`).
    #[serde(rename = "CUSTOM")]
    Custom,
}

/// One rule: sources, operations and conditions, all of which must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct AuthorizationRule {
    /// Any of these sources (none = any source).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    /// Any of these operations (none = any operation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    /// All of these conditions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

/// `rules[].from[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleFrom {
    /// The source.
    pub source: Source,
}

/// Where a request comes from; every non-empty field must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Source {
    /// Peer identities (`cluster.local/ns/<ns>/sa/<sa>`; `*` prefix/suffix matches).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    /// Negated `principals`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    /// JWT principals (`<iss>/<sub>`), from RequestAuthentication.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    /// Negated `requestPrincipals`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    /// Peer service accounts (`<sa>` in the policy's namespace, or `<ns>/<sa>`), from the
    /// peer identity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Negated `serviceAccounts`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    /// Peer trust domains (`*` prefix/suffix matches), from the peer identity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trust_domains: Vec<String>,
    /// Negated `trustDomains`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_trust_domains: Vec<String>,
    /// Peer namespaces (from the peer identity).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Negated `namespaces`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    /// Peer IPs or CIDRs (the connection's source).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    /// Negated `ipBlocks`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    /// Original client IPs or CIDRs (X-Forwarded-For / proxy protocol).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    /// Negated `remoteIpBlocks`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

/// `rules[].to[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleTo {
    /// The operation.
    pub operation: Operation,
}

/// What a request does; every non-empty field must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Operation {
    /// Hosts (`Host`/`:authority`; `*` prefix/suffix matches). HTTP only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Negated `hosts`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    /// Destination ports (as strings, as the API has them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// Negated `ports`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    /// HTTP methods. HTTP only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Negated `methods`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    /// Paths (`*` prefix/suffix matches). HTTP only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Negated `paths`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

/// `rules[].when[]`: an attribute and the values it must (not) have.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Condition {
    /// The attribute (`request.headers[x-token]`, `source.ip`, `source.principal`, ...).
    pub key: String,
    /// Any of these values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// None of these values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// `RequestAuthentication`: the JWTs a workload accepts. A request with a token that fails
/// every rule is refused (401); a request without a token passes, and AuthorizationPolicy
/// (`requestPrincipals`, `request.auth.*`) decides what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RequestAuthentication {
    /// The workloads it applies to; none = the whole namespace (or mesh, in the root
    /// namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The token issuers it accepts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub jwt_rules: Vec<JwtRule>,
}

/// `jwtRules[]`: one issuer, where its keys are and where its tokens are found.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct JwtRule {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` values accepted (none = any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where the issuer publishes its keys (fetched by the server, inlined to proxies).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jwks_uri: String,
    /// The keys, inline (a JWKS document); wins over `jwksUri`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jwks: String,
    /// Headers carrying the token (default: `Authorization: Bearer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    /// Query parameters carrying the token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    /// Cookies carrying the token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    /// Keep the token in the request sent on (default: it is removed).
    pub forward_original_token: bool,
    /// A header to put the token's payload in (base64url).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub output_payload_to_header: String,
    /// Claims copied into request headers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// Claims whose space-separated string value is matched as a list (besides `scope`
    /// and `permission`, which always are).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub space_delimited_claims: Vec<String>,
}

/// `jwtRules[].fromHeaders[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct JwtHeader {
    /// The header name.
    pub name: String,
    /// A prefix before the token (`Bearer `).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// `jwtRules[].outputClaimToHeaders[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ClaimToHeader {
    /// The request header to set.
    pub header: String,
    /// The claim whose value it gets.
    pub claim: String,
}
