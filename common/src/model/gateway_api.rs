//! The Kubernetes Gateway API (`gateway.networking.k8s.io`), typed with its field names.
//!
//! Only the fields shoal implements are modelled: the ingester refuses an object that uses
//! another, naming the field, rather than applying it without that field. The server
//! translates these objects into its Istio model as istiod does (`server::index::gateway_api`).

use serde::{Deserialize, Serialize};

/// The API group of the Gateway API.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
/// The controller name of istiod's (and so shoal's) gateway controller.
pub const ISTIO_CONTROLLER: &str = "istio.io/gateway-controller";
/// The GatewayClass istiod owns without any GatewayClass object.
pub const ISTIO_CLASS: &str = "istio";
/// The label that names a Gateway API Gateway on its proxy pods.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// `GatewayClass` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayClass {
    /// The controller that manages Gateways of this class.
    pub controller_name: String,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A Gateway API `Gateway` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeGateway {
    /// The GatewayClass.
    pub gateway_class_name: String,
    /// The listeners.
    pub listeners: Vec<Listener>,
}

/// One listener of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Listener {
    /// Unique within the Gateway; what `sectionName` names.
    pub name: String,
    /// The host (`*.example.com` allowed); none = every host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The port.
    pub port: u32,
    /// HTTP, HTTPS, TLS or TCP.
    pub protocol: String,
    /// TLS settings (HTTPS, TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Which routes may attach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// A listener's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ListenerTls {
    /// `Terminate` (default) or `Passthrough`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The Secrets holding the certificate (the first is used).
    pub certificate_refs: Vec<ObjectReference>,
}

/// A reference to an object by group, kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectReference {
    /// API group (`""` = core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (defaults depend on the field: Secret, Service).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (default: the referring object's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Which routes may attach to a listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct AllowedRoutes {
    /// From which namespaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    /// Which route kinds (empty: those of the listener's protocol).
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteNamespaces {
    /// `Same` (default), `All` or `Selector`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The namespace label selector of `Selector`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<RouteLabelSelector>,
}

/// A Kubernetes label selector (`metav1.LabelSelector`): every `matchLabels` pair and
/// every `matchExpressions` requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteLabelSelector {
    /// Labels that must all match.
    pub match_labels: std::collections::BTreeMap<String, String>,
    /// Requirements that must all hold.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values of `In`/`NotIn` (non-empty); empty for `Exists`/`DoesNotExist`.
    pub values: Vec<String>,
}

/// Why a label selector selects nothing: Kubernetes refuses these selectors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelSelectorError {
    /// A requirement without a key.
    #[error("matchExpressions[{index}]: key is empty")]
    EmptyKey {
        /// The requirement's index.
        index: usize,
    },
    /// An operator Kubernetes does not define.
    #[error(
        "matchExpressions[{index}] {key:?}: unknown operator {operator:?} \
         (expected In, NotIn, Exists or DoesNotExist)"
    )]
    UnknownOperator {
        /// The requirement's index.
        index: usize,
        /// Its key.
        key: String,
        /// The operator given.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with some.
    #[error("matchExpressions[{index}] {key:?}: operator {operator} {why}")]
    BadValues {
        /// The requirement's index.
        index: usize,
        /// Its key.
        key: String,
        /// The operator given.
        operator: String,
        /// What is wrong with the values.
        why: &'static str,
    },
}

impl RouteLabelSelector {
    /// Whether the selector is one Kubernetes accepts.
    pub fn validate(&self) -> Result<(), LabelSelectorError> {
        for (index, r) in self.match_expressions.iter().enumerate() {
            if r.key.is_empty() {
                return Err(LabelSelectorError::EmptyKey { index });
            }
            let why = match r.operator.as_str() {
                "In" | "NotIn" if r.values.is_empty() => "needs at least one value",
                "Exists" | "DoesNotExist" if !r.values.is_empty() => "takes no values",
                "In" | "NotIn" | "Exists" | "DoesNotExist" => continue,
                _ => {
                    return Err(LabelSelectorError::UnknownOperator {
                        index,
                        key: r.key.clone(),
                        operator: r.operator.clone(),
                    })
                }
            };
            return Err(LabelSelectorError::BadValues {
                index,
                key: r.key.clone(),
                operator: r.operator.clone(),
                why,
            });
        }
        Ok(())
    }

    /// Whether `labels` satisfy the selector, as Kubernetes defines it (an empty selector
    /// matches everything; `NotIn` and `DoesNotExist` hold where the label is absent). An
    /// invalid selector ([`Self::validate`]) matches nothing.
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        if self.validate().is_err() {
            return false;
        }
        let pairs = self
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        pairs
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// A Kubernetes Namespace as the Gateway API reads it: its labels (in the object's
/// metadata), for `allowedRoutes.namespaces.from: Selector`. Published by the ingester
/// for each selected namespace; not a Gateway API kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct NamespaceLabels {}

/// A route kind (`group` defaults to the Gateway API group).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteGroupKind {
    /// API group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind.
    pub kind: String,
}

/// A route's reference to its parent: a Gateway (listener) or, for the mesh, a Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ParentReference {
    /// API group (default: the Gateway API's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Gateway`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace (default: the route's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// The listener name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The listener (or Service) port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// `HTTPRoute` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRoute {
    /// Parents (Gateways, or Services for the mesh).
    pub parent_refs: Vec<ParentReference>,
    /// Hostnames (intersected with the listener's).
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<HTTPRouteRule>,
}

/// One HTTPRoute rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRouteRule {
    /// The rule's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Matches, ORed; none = `PathPrefix /`.
    pub matches: Vec<HTTPRouteMatch>,
    /// Filters.
    pub filters: Vec<HTTPRouteFilter>,
    /// Weighted backends.
    pub backend_refs: Vec<BackendRef>,
    /// Timeouts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HTTPRouteTimeouts>,
}

/// One HTTPRoute match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRouteMatch {
    /// The path match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathMatch>,
    /// Header matches, ANDed.
    pub headers: Vec<HTTPValueMatch>,
    /// Query parameter matches, ANDed.
    pub query_params: Vec<HTTPValueMatch>,
    /// The method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// A path match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPPathMatch {
    /// `PathPrefix` (default), `Exact` or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The value (default `/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPValueMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The header or parameter name.
    pub name: String,
    /// The value.
    pub value: String,
}

/// One filter of a rule (or of a backendRef: header modifiers only).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRouteFilter {
    /// The filter type; the field of that name holds its settings.
    #[serde(rename = "type")]
    pub kind: String,
    /// `RequestHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HTTPHeaderFilter>,
    /// `ResponseHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HTTPHeaderFilter>,
    /// `RequestRedirect`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HTTPRequestRedirect>,
    /// `URLRewrite`.
    #[serde(rename = "urlRewrite", skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HTTPURLRewrite>,
    /// `RequestMirror`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HTTPRequestMirror>,
}

/// Header set/add/remove.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPHeaderFilter {
    /// Overwrite.
    pub set: Vec<HTTPHeader>,
    /// Append.
    pub add: Vec<HTTPHeader>,
    /// Remove by name.
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `RequestRedirect`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRequestRedirect {
    /// `http` or `https`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The new host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
    /// The new port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// 301 (default) or 302.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u32>,
}

/// A path modification.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The path of `ReplaceFullPath`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    /// The prefix of `ReplacePrefixMatch`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// `URLRewrite`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPURLRewrite {
    /// The new host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
}

/// `RequestMirror`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRequestMirror {
    /// Where to mirror.
    pub backend_ref: BackendRef,
    /// Percent of requests mirrored (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// The share of requests mirrored as a fraction (instead of `percent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// A fraction, `numerator / denominator`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Fraction {
    /// Numerator.
    pub numerator: u32,
    /// Denominator (default 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denominator: Option<u32>,
}

/// A backend of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct BackendRef {
    /// API group (`""` = core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service` (default) or Istio's `Hostname`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (default: the route's; another one needs a ReferenceGrant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Relative weight (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Filters applied to requests sent to this backend (HTTP header modifiers only).
    pub filters: Vec<HTTPRouteFilter>,
}

/// Rule timeouts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HTTPRouteTimeouts {
    /// The whole request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<super::Duration>,
    /// One try at the backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<super::Duration>,
}

/// `GRPCRoute` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GRPCRoute {
    /// Parents.
    pub parent_refs: Vec<ParentReference>,
    /// Hostnames.
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<GRPCRouteRule>,
}

/// One GRPCRoute rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GRPCRouteRule {
    /// Matches, ORed.
    pub matches: Vec<GRPCRouteMatch>,
    /// Filters (header modifiers and mirror).
    pub filters: Vec<HTTPRouteFilter>,
    /// Weighted backends.
    pub backend_refs: Vec<BackendRef>,
}

/// One GRPCRoute match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GRPCRouteMatch {
    /// Service/method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<GRPCMethodMatch>,
    /// Header matches.
    pub headers: Vec<HTTPValueMatch>,
}

/// A gRPC service/method match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GRPCMethodMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The service (`package.Service`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The method.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `TCPRoute` and `TLSRoute` spec (TCPRoute has no hostnames).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct L4Route {
    /// Parents.
    pub parent_refs: Vec<ParentReference>,
    /// SNI hostnames (TLSRoute only).
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<L4RouteRule>,
}

/// One TCPRoute/TLSRoute rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct L4RouteRule {
    /// Weighted backends.
    pub backend_refs: Vec<BackendRef>,
}

/// `ReferenceGrant` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrant {
    /// Who may refer.
    pub from: Vec<ReferenceGrantFrom>,
    /// To what in this namespace.
    pub to: Vec<ReferenceGrantTo>,
}

/// A `from` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrantFrom {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
}

/// A `to` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrantTo {
    /// API group (`""` = core).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// One object only, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn selector(
        match_labels: &[(&str, &str)],
        exprs: Vec<LabelSelectorRequirement>,
    ) -> RouteLabelSelector {
        RouteLabelSelector {
            match_labels: labels(match_labels),
            match_expressions: exprs,
        }
    }

    #[test]
    fn label_selectors_match_as_kubernetes_defines_them() {
        let ns = labels(&[("env", "prod"), ("team", "a")]);
        // An empty selector selects everything.
        assert!(selector(&[], vec![]).matches(&ns));
        assert!(selector(&[], vec![]).matches(&labels(&[])));
        assert!(selector(&[("env", "prod")], vec![]).matches(&ns));
        assert!(!selector(&[("env", "dev")], vec![]).matches(&ns));
        assert!(!selector(&[("env", "prod"), ("x", "y")], vec![]).matches(&ns));
        let one = |r| selector(&[], vec![r]);
        assert!(one(req("env", "In", &["dev", "prod"])).matches(&ns));
        assert!(!one(req("env", "In", &["dev"])).matches(&ns));
        assert!(!one(req("absent", "In", &["x"])).matches(&ns));
        assert!(one(req("env", "NotIn", &["dev"])).matches(&ns));
        assert!(!one(req("env", "NotIn", &["prod"])).matches(&ns));
        // NotIn and DoesNotExist hold where the label is absent.
        assert!(one(req("absent", "NotIn", &["x"])).matches(&ns));
        assert!(one(req("team", "Exists", &[])).matches(&ns));
        assert!(!one(req("absent", "Exists", &[])).matches(&ns));
        assert!(one(req("absent", "DoesNotExist", &[])).matches(&ns));
        assert!(!one(req("team", "DoesNotExist", &[])).matches(&ns));
        // Labels and expressions must all hold.
        let both = selector(&[("env", "prod")], vec![req("team", "In", &["b"])]);
        assert!(!both.matches(&ns));
    }

    #[test]
    fn invalid_label_selectors_select_nothing_and_say_why() {
        let ns = labels(&[("env", "prod")]);
        for (r, why) in [
            (req("env", "Near", &["prod"]), "unknown operator"),
            (req("env", "In", &[]), "needs at least one value"),
            (req("env", "NotIn", &[]), "needs at least one value"),
            (req("", "Exists", &[]), "key is empty"),
            (req("env", "Exists", &["prod"]), "takes no values"),
        ] {
            let s = selector(&[], vec![r]);
            let e = s.validate().expect_err("invalid").to_string();
            assert!(
                e.contains(why) && e.starts_with("matchExpressions[0]"),
                "{e}"
            );
            assert!(!s.matches(&ns));
        }
    }
}
