//! Istio config (`networking.istio.io` and `security.istio.io`) into typed
//! [`ConfigObject`]s, validated for what the server relies on.

pub mod destination_rule;
pub mod security;
pub mod virtual_service;

use crate::error::InvalidObject;
use serde::{Deserialize, Deserializer};
use shoal_common::model::{ConfigKind, ConfigObject, ConfigSpec, ObjectMeta};

/// The API groups of the config kinds shoal reads: Istio's and the Gateway API.
pub const GROUPS: [&str; 3] = [
    shoal_common::model::NETWORKING_GROUP,
    shoal_common::model::SECURITY_GROUP,
    shoal_common::model::GATEWAY_API_GROUP,
];

/// Deserializes the `spec` of an Istio object of the given kind. Generic over the
/// deserializer so YAML manifests and JSON from the Kubernetes API share it.
///
/// A field shoal does not model is an error naming it: applying the rest of the object
/// without it could make a rule match more than its author wrote, or behave differently
/// from istiod without a word (docs/istio-compatibility.md lists every field).
pub fn config_spec<'de, D: Deserializer<'de>>(
    kind: ConfigKind,
    spec: D,
) -> Result<ConfigSpec, D::Error> {
    let mut unsupported: Vec<String> = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unsupported.push(field_path(&path));
    let out = typed_spec(kind, serde_ignored::Deserializer::new(spec, &mut record))?;
    if !unsupported.is_empty() {
        let fields = unsupported.join(", ");
        return Err(serde::de::Error::custom(format!(
            "unsupported field{} {fields}: shoal does not implement {} yet, so the object is \
             rejected rather than applied without {} (see docs/istio-compatibility.md)",
            if unsupported.len() > 1 { "s" } else { "" },
            if unsupported.len() > 1 { "them" } else { "it" },
            if unsupported.len() > 1 { "them" } else { "it" },
        )));
    }
    Ok(out)
}

/// `spec.http[0].fault` style path of an ignored field.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => "spec".to_string(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => format!("{}.{key}", field_path(parent)),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

fn typed_spec<'de, D: Deserializer<'de>>(
    kind: ConfigKind,
    spec: D,
) -> Result<ConfigSpec, D::Error> {
    Ok(match kind {
        ConfigKind::Gateway => ConfigSpec::Gateway(Deserialize::deserialize(spec)?),
        ConfigKind::VirtualService => ConfigSpec::VirtualService(Deserialize::deserialize(spec)?),
        ConfigKind::DestinationRule => ConfigSpec::DestinationRule(Deserialize::deserialize(spec)?),
        ConfigKind::Sidecar => ConfigSpec::Sidecar(Deserialize::deserialize(spec)?),
        ConfigKind::ServiceEntry => ConfigSpec::ServiceEntry(Deserialize::deserialize(spec)?),
        ConfigKind::WorkloadEntry => ConfigSpec::WorkloadEntry(Deserialize::deserialize(spec)?),
        ConfigKind::PeerAuthentication => {
            ConfigSpec::PeerAuthentication(Deserialize::deserialize(spec)?)
        }
        ConfigKind::AuthorizationPolicy => {
            ConfigSpec::AuthorizationPolicy(Deserialize::deserialize(spec)?)
        }
        ConfigKind::RequestAuthentication => {
            ConfigSpec::RequestAuthentication(Deserialize::deserialize(spec)?)
        }
        ConfigKind::GatewayClass => ConfigSpec::GatewayClass(Deserialize::deserialize(spec)?),
        ConfigKind::KubeGateway => ConfigSpec::KubeGateway(Deserialize::deserialize(spec)?),
        ConfigKind::HTTPRoute => ConfigSpec::HTTPRoute(Deserialize::deserialize(spec)?),
        ConfigKind::GRPCRoute => ConfigSpec::GRPCRoute(Deserialize::deserialize(spec)?),
        ConfigKind::TCPRoute => ConfigSpec::TCPRoute(Deserialize::deserialize(spec)?),
        ConfigKind::TLSRoute => ConfigSpec::TLSRoute(Deserialize::deserialize(spec)?),
        ConfigKind::ReferenceGrant => ConfigSpec::ReferenceGrant(Deserialize::deserialize(spec)?),
        // Not an Istio kind: credentials come from Secrets (`crate::desired::credentials`).
        ConfigKind::Credential => {
            return Err(serde::de::Error::custom(
                "Credential is not an Istio kind (gateway credentials come from Secrets)",
            ))
        }
        // Not an Istio kind: published from Namespaces (`crate::desired::namespace_entry`).
        ConfigKind::Namespace => {
            return Err(serde::de::Error::custom(
                "Namespace is not an Istio kind (namespace labels come from Namespaces)",
            ))
        }
    })
}

/// Builds a config object, rejecting specs the server cannot use. A security object whose
/// rules use fields shoal does not enforce is kept (the server fails closed on those
/// fields: refusing the whole object would leave its workloads with fewer rules, i.e.
/// open), with a warning naming the object and each field.
pub fn config_object(meta: ObjectMeta, spec: ConfigSpec) -> Result<ConfigObject, InvalidObject> {
    validate(&spec)?;
    let mut object = ConfigObject { meta, spec };
    // A cluster-scoped kind (GatewayClass) has no namespace, whatever defaulted one.
    if !object.kind().is_namespaced() {
        object.meta.namespace.clear();
    }
    let unenforced = unenforced_fields(&object.spec);
    if !unenforced.is_empty() {
        let meta = &object.meta;
        tracing::warn!(
            kind = %object.kind(),
            namespace = %meta.namespace,
            name = %meta.name,
            fields = %unenforced.join("; "),
            "accepted with fields shoal does not enforce; it fails closed on them \
             (docs/istio-compatibility.md#fail-closed)"
        );
    }
    Ok(object)
}

/// The fields of a valid object that shoal accepts without enforcing them, each with what
/// happens instead (see [`security::unenforced_fields`]).
pub fn unenforced_fields(spec: &ConfigSpec) -> Vec<String> {
    match spec {
        ConfigSpec::AuthorizationPolicy(ap) => security::unenforced_fields(ap),
        _ => Vec::new(),
    }
}

/// Whether a `credentialName` is a Secret name (a DNS subdomain): no namespace prefix and
/// no `sds://`-style provider, which shoal does not serve.
fn credential_name_ok(name: &str) -> bool {
    name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
}

/// Checks the invariants the server relies on; the error names the offending field.
pub fn validate(spec: &ConfigSpec) -> Result<(), InvalidObject> {
    let invalid = |reason: String| Err(InvalidObject::new(reason));
    match spec {
        ConfigSpec::VirtualService(vs) => virtual_service::validate(vs)?,
        ConfigSpec::DestinationRule(dr) => destination_rule::validate(dr)?,
        ConfigSpec::PeerAuthentication(pa) => security::validate_peer_authentication(pa)?,
        ConfigSpec::AuthorizationPolicy(ap) => security::validate_authorization_policy(ap)?,
        ConfigSpec::RequestAuthentication(ra) => security::validate_request_authentication(ra)?,
        ConfigSpec::Gateway(gw) => {
            for (i, server) in gw.servers.iter().enumerate() {
                let protocol = server.port.protocol.to_ascii_uppercase();
                let tls = server.tls.as_ref();
                let mode = tls.and_then(|t| t.mode.as_deref());
                let credential = tls.and_then(|t| t.credential_name.as_deref());
                let tls_port = matches!(protocol.as_str(), "TLS" | "HTTPS");
                match mode {
                    Some("PASSTHROUGH") if tls_port => {}
                    // An east-west gateway: Istio mTLS passed through by its SNI. istiod
                    // accepts it on TLS servers only.
                    Some("AUTO_PASSTHROUGH") if protocol == "TLS" => {}
                    Some("AUTO_PASSTHROUGH") => {
                        return invalid(format!(
                            "servers[{i}].tls.mode \"AUTO_PASSTHROUGH\" needs port.protocol TLS \
                             (the server's protocol is {protocol})"
                        ))
                    }
                    Some("SIMPLE" | "MUTUAL") if tls_port => match credential {
                        None | Some("") => {
                            return invalid(format!(
                                "servers[{i}].tls.credentialName is required with tls.mode {} \
                                 (certificate files on the gateway are not supported)",
                                mode.unwrap_or_default()
                            ))
                        }
                        Some(name) if !credential_name_ok(name) => {
                            return invalid(format!(
                                "servers[{i}].tls.credentialName {name:?} is not a Secret name \
                                 (a Secret in the gateway's namespace; lowercase letters, \
                                 digits, '-' and '.')"
                            ))
                        }
                        Some(_) => {}
                    },
                    None if !tls_port => {}
                    None => {
                        return invalid(format!(
                            "servers[{i}].tls.mode is required on a {protocol} server \
                             (PASSTHROUGH, SIMPLE and MUTUAL are supported)"
                        ))
                    }
                    Some(mode) if tls_port => {
                        return invalid(format!(
                            "servers[{i}].tls.mode {mode:?} is not supported (PASSTHROUGH, \
                             AUTO_PASSTHROUGH, SIMPLE and MUTUAL are)"
                        ))
                    }
                    Some(mode) => {
                        return invalid(format!(
                            "servers[{i}].tls.mode {mode:?} needs port.protocol HTTPS or TLS \
                             (the server's protocol is {protocol})"
                        ))
                    }
                }
                if server.port.number == 0 {
                    return invalid(format!("servers[{i}].port.number is missing"));
                }
                if server.port.number > 65535 {
                    return invalid(format!(
                        "servers[{i}].port.number {} is not in 1-65535",
                        server.port.number
                    ));
                }
                if server.hosts.is_empty() {
                    return invalid(format!("servers[{i}].hosts is empty"));
                }
                // What is not implemented is refused rather than left out of the gateway
                // without a word.
                if !matches!(
                    protocol.as_str(),
                    "HTTP"
                        | "HTTP2"
                        | "GRPC"
                        | "TCP"
                        | "MONGO"
                        | "MYSQL"
                        | "REDIS"
                        | "TLS"
                        | "HTTPS"
                ) {
                    return invalid(format!(
                        "servers[{i}].port.protocol {:?} is not supported (HTTP, HTTP2, GRPC, \
                         TCP, MONGO, MYSQL, REDIS, TLS and HTTPS are)",
                        server.port.protocol
                    ));
                }
            }
        }
        ConfigSpec::ServiceEntry(se) => {
            if se.hosts.is_empty() {
                return invalid("hosts is empty".into());
            }
            if se.ports.is_empty() {
                return invalid("ports is empty".into());
            }
            for (i, port) in se.ports.iter().enumerate() {
                if port.number == 0 {
                    return invalid(format!("ports[{i}].number is missing"));
                }
            }
        }
        ConfigSpec::Sidecar(sc) => {
            for (i, l) in sc.ingress.iter().enumerate() {
                if l.port.number == 0 || l.port.number > 65535 {
                    return invalid(format!("ingress[{i}].port.number is not in 1-65535"));
                }
                if l.capture_mode.as_deref() == Some("NONE") {
                    return invalid(format!(
                        "ingress[{i}].captureMode NONE is not supported yet (bound inbound \
                         listeners for uncaptured sidecars)"
                    ));
                }
            }
            for (i, l) in sc.egress.iter().enumerate() {
                if l.hosts.is_empty() {
                    return invalid(format!("egress[{i}].hosts is empty"));
                }
            }
        }
        ConfigSpec::KubeGateway(gw) => super::gateway_api::validate_gateway(gw)?,
        ConfigSpec::HTTPRoute(r) => super::gateway_api::validate_http_route(r)?,
        ConfigSpec::GRPCRoute(r) => super::gateway_api::validate_grpc_route(r)?,
        ConfigSpec::TCPRoute(r) => super::gateway_api::validate_l4_route(r, false)?,
        ConfigSpec::TLSRoute(r) => super::gateway_api::validate_l4_route(r, true)?,
        ConfigSpec::ReferenceGrant(g) => super::gateway_api::validate_reference_grant(g)?,
        ConfigSpec::GatewayClass(c) => {
            if c.controller_name.is_empty() {
                return invalid("controllerName is empty".into());
            }
        }
        ConfigSpec::WorkloadEntry(_) | ConfigSpec::Credential(_) | ConfigSpec::Namespace(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: ConfigKind, yaml: &str) -> ConfigSpec {
        let v: serde_json::Value = shoal_common::yaml::from_str(yaml).expect("test yaml");
        config_spec(kind, v).expect("spec decodes")
    }

    fn reason(kind: ConfigKind, yaml: &str) -> String {
        validate(&spec(kind, yaml)).unwrap_err().reason
    }

    #[test]
    fn gateway_tls_termination_validation() {
        let gw = ConfigKind::Gateway;
        let server = |port: &str, tls: &str| {
            format!("servers: [{{port: {{number: 443, name: https, protocol: {port}}}, hosts: ['*'], tls: {tls}}}]")
        };
        for ok in [
            server("HTTPS", "{mode: SIMPLE, credentialName: web-cert}"),
            server("HTTPS", "{mode: MUTUAL, credentialName: web-cert}"),
            server("TLS", "{mode: SIMPLE, credentialName: db.cert}"),
            server("TLS", "{mode: PASSTHROUGH}"),
            server("TLS", "{mode: AUTO_PASSTHROUGH}"),
        ] {
            assert!(validate(&spec(gw, &ok)).is_ok(), "{ok}");
        }
        for (yaml, names) in [
            (
                server("HTTPS", "{mode: SIMPLE}"),
                "servers[0].tls.credentialName is required",
            ),
            (
                server("HTTPS", "{mode: MUTUAL, credentialName: ''}"),
                "servers[0].tls.credentialName is required",
            ),
            (
                server("HTTPS", "{mode: SIMPLE, credentialName: other/cert}"),
                "servers[0].tls.credentialName \"other/cert\"",
            ),
            (
                server("HTTPS", "{mode: SIMPLE, credentialName: 'sds://x'}"),
                "servers[0].tls.credentialName",
            ),
            (
                server("HTTPS", "{mode: ISTIO_MUTUAL}"),
                "servers[0].tls.mode \"ISTIO_MUTUAL\" is not supported",
            ),
            (
                server("HTTPS", "{mode: AUTO_PASSTHROUGH}"),
                "servers[0].tls.mode \"AUTO_PASSTHROUGH\" needs port.protocol TLS",
            ),
            (
                server("HTTPS", "{credentialName: c}"),
                "servers[0].tls.mode is required",
            ),
            (
                server("HTTP", "{mode: SIMPLE, credentialName: c}"),
                "servers[0].tls.mode \"SIMPLE\" needs port.protocol HTTPS or TLS",
            ),
        ] {
            let r = reason(gw, &yaml);
            assert!(r.starts_with(names), "{yaml}: {r}");
        }
    }

    #[test]
    fn virtual_service_validation() {
        let vs = ConfigKind::VirtualService;
        let ok = "hosts: [reviews]\nhttp:\n- route:\n  - destination: {host: reviews, subset: v1}\n    weight: 75\n  - destination: {host: reviews, subset: v2}\n    weight: 25\n";
        assert!(validate(&spec(vs, ok)).is_ok());
        // Any positive total, as in Istio.
        assert!(validate(&spec(vs, "http:\n- route:\n  - destination: {host: a}\n    weight: 50\n  - destination: {host: b}\n")).is_ok());
        assert_eq!(
            reason(vs, "http:\n- route: [{destination: {host: a}}]\n- route: [{destination: {subset: v1}}]\n"),
            "http[1].route[0].destination.host is empty"
        );
    }

    #[test]
    fn unmodelled_fields_are_rejected_by_name() {
        let v: serde_json::Value = shoal_common::yaml::from_str(
            "hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n  match: [{uri: {prefix: /}, sourceIp: 1.2.3.4}]\n  tcpRetries: 1\n",
        )
        .unwrap();
        let err = config_spec(ConfigKind::VirtualService, v)
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.http[0].match[0].sourceIp"), "{err}");
        assert!(err.contains("spec.http[0].tcpRetries"), "{err}");
        assert!(err.contains("unsupported fields"), "{err}");
    }

    #[test]
    fn destination_rule_gateway_and_service_entry_validation() {
        let dr = ConfigKind::DestinationRule;
        assert!(validate(&spec(dr, "host: r\nsubsets: [{name: v1}, {name: v2}]")).is_ok());
        assert_eq!(reason(dr, "subsets: []"), "host is empty");
        assert!(reason(dr, "host: r\nsubsets: [{name: v1}, {name: v1}]").contains("subsets[1]"));

        let gw = ConfigKind::Gateway;
        assert!(validate(&spec(
            gw,
            "servers: [{port: {number: 80, protocol: HTTP, name: http}, hosts: ['*']}]"
        ))
        .is_ok());
        assert_eq!(
            reason(gw, "servers: [{hosts: ['*']}]"),
            "servers[0].port.number is missing"
        );

        let se = ConfigKind::ServiceEntry;
        assert!(validate(&spec(
            se,
            "hosts: [a.example]\nports: [{number: 443, name: tls, protocol: TLS}]"
        ))
        .is_ok());
        assert_eq!(reason(se, "ports: [{number: 1}]"), "hosts is empty");
        assert_eq!(reason(se, "hosts: [a]"), "ports is empty");
    }

    #[test]
    fn spec_kind_follows_requested_kind() {
        let s = spec(ConfigKind::Sidecar, "egress: [{hosts: ['./*']}]");
        assert!(matches!(s, ConfigSpec::Sidecar(ref sc) if sc.egress.len() == 1));
        let s = spec(
            ConfigKind::WorkloadEntry,
            "address: 10.0.0.1\nlabels: {app: x}",
        );
        assert!(matches!(s, ConfigSpec::WorkloadEntry(ref we) if we.address == "10.0.0.1"));
    }
}

#[cfg(test)]
pub(crate) mod prop_tests;
