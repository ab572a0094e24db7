//! Validation of Istio's security kinds (PeerAuthentication, RequestAuthentication,
//! AuthorizationPolicy): what the server relies on, with errors naming the field.

use crate::error::InvalidObject;
use shoal_common::model::{
    AuthorizationAction, AuthorizationPolicy, Condition, PeerAuthentication, RequestAuthentication,
};
use std::net::IpAddr;

/// Checks a PeerAuthentication as istiod's validation does.
pub fn validate_peer_authentication(pa: &PeerAuthentication) -> Result<(), InvalidObject> {
    let selects = pa
        .selector
        .as_ref()
        .is_some_and(|s| !s.match_labels.is_empty());
    if !pa.port_level_mtls.is_empty() && !selects {
        return Err(InvalidObject::new(
            "portLevelMtls needs a selector with matchLabels (a mesh or namespace policy \
             cannot set port modes, as in istiod)"
                .to_string(),
        ));
    }
    for port in pa.port_level_mtls.keys() {
        if !(1..=65535).contains(port) {
            return Err(InvalidObject::new(format!(
                "portLevelMtls key {port} is not a port in 1-65535"
            )));
        }
    }
    Ok(())
}

/// Checks a RequestAuthentication as istiod's validation does
/// (`ValidateRequestAuthentication`, `validateJwtRule`), and what Envoy would refuse: an
/// inline `jwks` that is not a JWKS document would make every proxy NACK the listener.
pub fn validate_request_authentication(ra: &RequestAuthentication) -> Result<(), InvalidObject> {
    let fail = |reason: String| Err(InvalidObject::new(reason));
    if ra
        .selector
        .as_ref()
        .is_some_and(|s| s.match_labels.iter().any(|(k, _)| k.is_empty()))
    {
        return fail("selector.matchLabels: a label key must not be empty".to_string());
    }
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        let at = format!("jwtRules[{i}]");
        if rule.issuer.is_empty() {
            return fail(format!("{at}.issuer must not be empty"));
        }
        if !rule.jwks_uri.is_empty() && !jwks_uri_ok(&rule.jwks_uri) {
            return fail(format!(
                "{at}.jwksUri {:?} is not an http or https URL with a host",
                rule.jwks_uri
            ));
        }
        if !rule.jwks.is_empty() {
            let doc: Result<serde_json::Value, _> = serde_json::from_str(&rule.jwks);
            let has_keys = doc
                .as_ref()
                .ok()
                .and_then(|d| d.get("keys"))
                .is_some_and(|k| k.is_array());
            if !has_keys {
                return fail(format!(
                    "{at}.jwks is not a JWKS document (a JSON object with a \"keys\" array)"
                ));
            }
        }
        for (j, h) in rule.from_headers.iter().enumerate() {
            if h.name.is_empty() {
                return fail(format!("{at}.fromHeaders[{j}].name must not be empty"));
            }
        }
        for (j, p) in rule.from_params.iter().enumerate() {
            if p.is_empty() {
                return fail(format!("{at}.fromParams[{j}] must not be empty"));
            }
        }
        for (j, c) in rule.space_delimited_claims.iter().enumerate() {
            if c.is_empty() {
                return fail(format!("{at}.spaceDelimitedClaims[{j}] must not be empty"));
            }
        }
        for (j, c) in rule.from_cookies.iter().enumerate() {
            if c.is_empty() {
                return fail(format!("{at}.fromCookies[{j}] must not be empty"));
            }
        }
        for (j, c) in rule.output_claim_to_headers.iter().enumerate() {
            let at = format!("{at}.outputClaimToHeaders[{j}]");
            if c.claim.is_empty() {
                return fail(format!("{at}.claim must not be empty"));
            }
            if !header_name_ok(&c.header) {
                return fail(format!("{at}.header {:?} is not a header name", c.header));
            }
        }
        if !rule.output_payload_to_header.is_empty()
            && !header_name_ok(&rule.output_payload_to_header)
        {
            return fail(format!(
                "{at}.outputPayloadToHeader {:?} is not a header name",
                rule.output_payload_to_header
            ));
        }
    }
    Ok(())
}

/// `http(s)://host[:port]/...` with a non-empty host.
fn jwks_uri_ok(uri: &str) -> bool {
    let Some(rest) = uri
        .strip_prefix("https://")
        .or_else(|| uri.strip_prefix("http://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    !host.is_empty()
        && port.is_none_or(|p| p.parse::<u16>().is_ok())
        && !uri.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// An HTTP header name (RFC 7230 token), lower or upper case.
fn header_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks an AuthorizationPolicy as istiod's validation does (`ValidateAuthorizationPolicy`,
/// `security.ValidateAttribute`). What shoal does not enforce (CUSTOM's external
/// authorizer, Envoy metadata) is accepted: the server fails closed on it
/// ([`unenforced_fields`]).
pub fn validate_authorization_policy(ap: &AuthorizationPolicy) -> Result<(), InvalidObject> {
    let fail = |reason: String| Err(InvalidObject::new(reason));
    match (&ap.action, &ap.provider) {
        (AuthorizationAction::Custom, None) => {
            return fail("action CUSTOM needs provider.name".to_string())
        }
        (AuthorizationAction::Custom, Some(p)) if p.name.is_empty() => {
            return fail("provider.name must not be empty".to_string())
        }
        (AuthorizationAction::Custom, Some(_)) | (_, None) => {}
        (action, Some(_)) => {
            return fail(format!(
                "provider needs action CUSTOM (the action is {action:?})"
            ))
        }
    }
    if ap.action == AuthorizationAction::Deny && ap.rules.is_empty() {
        return fail(
            "action DENY without rules never matches; add an empty rule `{}` to deny every \
             request (as istiod's validation)"
                .to_string(),
        );
    }
    for (i, rule) in ap.rules.iter().enumerate() {
        for (j, from) in rule.from.iter().enumerate() {
            let at = format!("rules[{i}].from[{j}].source");
            let s = &from.source;
            let lists = [
                ("principals", &s.principals),
                ("notPrincipals", &s.not_principals),
                ("requestPrincipals", &s.request_principals),
                ("notRequestPrincipals", &s.not_request_principals),
                ("serviceAccounts", &s.service_accounts),
                ("notServiceAccounts", &s.not_service_accounts),
                ("trustDomains", &s.trust_domains),
                ("notTrustDomains", &s.not_trust_domains),
                ("namespaces", &s.namespaces),
                ("notNamespaces", &s.not_namespaces),
                ("ipBlocks", &s.ip_blocks),
                ("notIpBlocks", &s.not_ip_blocks),
                ("remoteIpBlocks", &s.remote_ip_blocks),
                ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
            ];
            if lists.iter().all(|(_, v)| v.is_empty()) {
                return fail(format!("{at} must not be empty"));
            }
            let peers = [
                &s.principals,
                &s.not_principals,
                &s.namespaces,
                &s.not_namespaces,
            ];
            let accounts = [&s.service_accounts, &s.not_service_accounts];
            if peers.iter().any(|v| !v.is_empty()) && accounts.iter().any(|v| !v.is_empty()) {
                return fail(format!(
                    "{at}: serviceAccounts cannot be set with namespaces or principals (as istiod)"
                ));
            }
            for (field, values) in lists {
                let at = format!("{at}.{field}");
                non_empty(&at, values)?;
                match field {
                    _ if field.ends_with("IpBlocks") || field.ends_with("ipBlocks") => {
                        ip_blocks(&at, values)?
                    }
                    "serviceAccounts" | "notServiceAccounts" => service_accounts(&at, values)?,
                    "trustDomains" | "notTrustDomains" => wildcards(&at, values)?,
                    _ => {}
                }
            }
        }
        for (j, to) in rule.to.iter().enumerate() {
            let at = format!("rules[{i}].to[{j}].operation");
            let o = &to.operation;
            let lists = [
                ("hosts", &o.hosts),
                ("notHosts", &o.not_hosts),
                ("ports", &o.ports),
                ("notPorts", &o.not_ports),
                ("methods", &o.methods),
                ("notMethods", &o.not_methods),
                ("paths", &o.paths),
                ("notPaths", &o.not_paths),
            ];
            if lists.iter().all(|(_, v)| v.is_empty()) {
                return fail(format!("{at} must not be empty"));
            }
            for (field, values) in lists {
                let at = format!("{at}.{field}");
                non_empty(&at, values)?;
                match field {
                    "ports" | "notPorts" => ports(&at, values)?,
                    "paths" | "notPaths" => no_path_templates(&at, values)?,
                    _ => {}
                }
            }
        }
        for (j, when) in rule.when.iter().enumerate() {
            condition(&format!("rules[{i}].when[{j}]"), when)?;
        }
    }
    Ok(())
}

/// The `when` keys shoal translates, as istiod names them.
const WHEN_KEYS: &[&str] = &[
    "source.ip",
    "remote.ip",
    "source.namespace",
    "source.principal",
    "source.serviceAccount",
    "source.trustDomain",
    "destination.ip",
    "destination.port",
    "connection.sni",
];

/// The JWT attributes (RequestAuthentication) besides `request.auth.claims[<name>]`.
const JWT_KEYS: &[&str] = &[
    "request.auth.principal",
    "request.auth.audiences",
    "request.auth.presenter",
];

/// The fields of a valid AuthorizationPolicy that shoal accepts but cannot enforce (Envoy
/// metadata and CUSTOM's external authorizer; JWT attributes are enforced through
/// RequestAuthentication's `jwt_authn` metadata), each with what the server does instead. The server fails closed on them,
/// as istiod does with what it cannot translate: an ALLOW or AUDIT rule using one is
/// dropped (allows less), a DENY rule only loses it (denies more), and a CUSTOM policy's
/// rules deny what they match (istiod's rule for a provider it does not know). Said in the
/// ingester's warning and status naming the object.
pub fn unenforced_fields(ap: &AuthorizationPolicy) -> Vec<String> {
    let effect = match ap.action {
        AuthorizationAction::Deny | AuthorizationAction::Custom => {
            "ignored, so the rule denies more"
        }
        AuthorizationAction::Allow => "its rule is dropped, so the policy allows less",
        AuthorizationAction::Audit => "its rule is dropped",
    };
    let mut out = Vec::new();
    if let (AuthorizationAction::Custom, Some(provider)) = (&ap.action, &ap.provider) {
        out.push(format!(
            "provider.name {:?} (shoal has no external authorizers, so the requests the rules \
             match are denied, as istiod does for an unknown provider)",
            provider.name
        ));
    }
    for (i, rule) in ap.rules.iter().enumerate() {
        for (j, when) in rule.when.iter().enumerate() {
            if unenforced_key(&when.key) {
                out.push(format!("rules[{i}].when[{j}] {:?} ({effect})", when.key));
            }
        }
    }
    out
}

/// A `when` key shoal accepts but does not enforce.
fn unenforced_key(key: &str) -> bool {
    key.starts_with("experimental.envoy.filters.")
}

fn condition(at: &str, when: &Condition) -> Result<(), InvalidObject> {
    let key = when.key.as_str();
    let fail = |reason: String| Err(InvalidObject::new(format!("{at}.key {key:?}: {reason}")));
    if key.is_empty() {
        return Err(InvalidObject::new(format!("{at}.key must not be empty")));
    }
    if when.values.is_empty() && when.not_values.is_empty() {
        return Err(InvalidObject::new(format!(
            "{at}: at least one of values or notValues must be set for key {key:?}"
        )));
    }
    match key {
        _ if key.starts_with("request.auth.") => {
            let claim = key
                .strip_prefix("request.auth.claims[")
                .and_then(|k| k.strip_suffix(']'));
            let named = JWT_KEYS.contains(&key) || claim.is_some_and(|c| !c.is_empty());
            if !named {
                return fail(
                    "should be request.auth.principal, .audiences, .presenter or \
                     .claims[<name>]"
                        .into(),
                );
            }
        }
        _ if key.starts_with("experimental.envoy.filters.") => {
            if !(key.contains('[') && key.ends_with(']')) {
                return fail(
                    "should have the format experimental.envoy.filters.<filter>[<key>]".into(),
                );
            }
        }
        "destination.namespace" => return fail("replaced by the policy's namespace".into()),
        "destination.name" | "destination.user" => {
            return fail("deprecated: only supported in v1alpha1".into())
        }
        _ if key.starts_with("destination.labels") => {
            return fail("replaced by the workload selector".into())
        }
        _ if key.starts_with("request.headers") => {
            let name = key
                .strip_prefix("request.headers[")
                .and_then(|k| k.strip_suffix(']'));
            if name.is_none_or(|n| n.is_empty() || n.contains(['[', ']'])) {
                return fail("should have the format request.headers[<name>]".into());
            }
        }
        _ if WHEN_KEYS.contains(&key) => {}
        _ => return fail("unknown attribute".into()),
    }
    for (field, values) in [("values", &when.values), ("notValues", &when.not_values)] {
        let at = format!("{at}.{field}");
        non_empty(&at, values)?;
        match key {
            "source.ip" | "remote.ip" | "destination.ip" => ip_blocks(&at, values)?,
            "destination.port" => ports(&at, values)?,
            "source.serviceAccount" => service_accounts(&at, values)?,
            "source.trustDomain" => wildcards(&at, values)?,
            _ => {}
        }
    }
    Ok(())
}

fn non_empty(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    match values.iter().position(String::is_empty) {
        Some(k) => Err(InvalidObject::new(format!("{at}[{k}] must not be empty"))),
        None => Ok(()),
    }
}

/// IP addresses or CIDR ranges.
fn ip_blocks(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    for (k, v) in values.iter().enumerate() {
        let ok = match v.split_once('/') {
            Some((addr, len)) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
                match (addr.parse::<IpAddr>(), len.parse::<u8>()) {
                    (Ok(IpAddr::V4(_)), Ok(len)) => len <= 32,
                    (Ok(IpAddr::V6(_)), Ok(len)) => len <= 128,
                    _ => false,
                }
            }
            Some(_) => false,
            None => v.parse::<IpAddr>().is_ok(),
        };
        if !ok {
            return Err(InvalidObject::new(format!(
                "{at}[{k}] {v:?} is not an IP address or CIDR range"
            )));
        }
    }
    Ok(())
}

fn ports(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    for (k, v) in values.iter().enumerate() {
        if v.parse::<u32>().ok().is_none_or(|p| p > 65535) {
            return Err(InvalidObject::new(format!(
                "{at}[{k}] {v:?} is not a port in 0-65535"
            )));
        }
    }
    Ok(())
}

/// Path templates (`{*}`, `{**}`) are refused: istiod sends them to Envoy as RBAC
/// `uri_template`, which makes Envoy 1.40 abort (std::terminate) when it loads the filter,
/// taking every selected proxy down. Other braces are invalid, as in istiod.
fn no_path_templates(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    for (k, v) in values.iter().enumerate() {
        if v.contains(['{', '}']) {
            return Err(InvalidObject::new(format!(
                "{at}[{k}] {v:?}: path templates ({{*}}, {{**}}) are not supported (Envoy's \
                 RBAC filter aborts on uri_template), and other braces are invalid"
            )));
        }
    }
    Ok(())
}

/// `<sa>` or `<namespace>/<sa>`.
fn service_accounts(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    for (k, v) in values.iter().enumerate() {
        let ok = v.len() <= 320
            && match v.split_once('/') {
                Some((ns, sa)) => !ns.is_empty() && !sa.is_empty() && !sa.contains('/'),
                None => true,
            };
        if !ok {
            return Err(InvalidObject::new(format!(
                "{at}[{k}] {v:?}: expected 'serviceAccount' or 'namespace/serviceAccount'"
            )));
        }
    }
    Ok(())
}

/// A wildcard only at the start or the end.
fn wildcards(at: &str, values: &[String]) -> Result<(), InvalidObject> {
    for (k, v) in values.iter().enumerate() {
        let inner = v
            .strip_prefix('*')
            .or_else(|| v.strip_suffix('*'))
            .unwrap_or(v);
        if v != "*" && inner.contains('*') {
            return Err(InvalidObject::new(format!(
                "{at}[{k}] {v:?}: a wildcard is allowed only at the start or the end"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::admit::istio::{config_spec, validate};
    use shoal_common::model::{ConfigKind, ConfigSpec, MtlsMode};

    fn spec(kind: ConfigKind, yaml: &str) -> Result<ConfigSpec, String> {
        let value: serde_json::Value = shoal_common::yaml::from_str(yaml).expect("yaml");
        let spec = config_spec(kind, value).map_err(|e| e.to_string())?;
        validate(&spec).map_err(|e| e.to_string())?;
        Ok(spec)
    }

    #[test]
    fn peer_authentication_modes_and_port_levels() {
        let s = spec(
            ConfigKind::PeerAuthentication,
            "selector: {matchLabels: {app: r}}\nmtls: {mode: STRICT}\nportLevelMtls: {8080: {mode: DISABLE}}",
        )
        .expect("valid");
        let ConfigSpec::PeerAuthentication(pa) = s else {
            panic!("kind")
        };
        assert_eq!(pa.mtls.map(|m| m.mode), Some(MtlsMode::Strict));
        assert_eq!(pa.port_level_mtls[&8080].mode, MtlsMode::Disable);

        let e = spec(
            ConfigKind::PeerAuthentication,
            "portLevelMtls: {8080: {mode: DISABLE}}",
        )
        .unwrap_err();
        assert!(e.contains("portLevelMtls needs a selector"), "{e}");
        let e = spec(ConfigKind::PeerAuthentication, "mtls: {mode: LOOSE}").unwrap_err();
        assert!(e.contains("LOOSE"), "{e}");
    }

    #[test]
    fn authorization_policy_unmodelled_fields_and_bad_custom_are_refused() {
        spec(
            ConfigKind::AuthorizationPolicy,
            "action: DENY\nrules: [{from: [{source: {namespaces: [x]}}], to: [{operation: {methods: [GET]}}]}]",
        )
        .expect("valid");
        let e = spec(ConfigKind::AuthorizationPolicy, "action: CUSTOM").unwrap_err();
        assert!(e.contains("action CUSTOM needs provider.name"), "{e}");
        let e = spec(ConfigKind::AuthorizationPolicy, "provider: {name: ext}").unwrap_err();
        assert!(e.contains("provider needs action CUSTOM"), "{e}");
        let e = spec(
            ConfigKind::AuthorizationPolicy,
            "action: CUSTOM\nprovider: {name: \"\"}",
        )
        .unwrap_err();
        assert!(e.contains("provider.name must not be empty"), "{e}");
        let e = spec(
            ConfigKind::AuthorizationPolicy,
            "targetRefs: [{kind: Gateway}]",
        )
        .unwrap_err();
        assert!(e.contains("spec.targetRefs"), "{e}");
    }

    #[test]
    fn authorization_policy_values_are_checked_with_the_field_named() {
        let ok = |yaml: &str| {
            spec(ConfigKind::AuthorizationPolicy, yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        };
        let err = |yaml: &str, want: &str| {
            let e = spec(ConfigKind::AuthorizationPolicy, yaml).expect_err(yaml);
            assert!(e.contains(want), "{yaml}: {e}");
        };
        ok("{}");
        ok("action: DENY\nrules: [{}]");
        ok(
            r#"rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 10.1.2.3, "2001:db8::/32"]}}], to: [{operation: {ports: ["0", "65535"], paths: ["/a/*"]}}]}]"#,
        );
        ok(
            r#"rules: [{from: [{source: {serviceAccounts: [a, ns/b], notTrustDomains: ["*.corp"]}}]}]"#,
        );
        err(
            "rules: [{from: [{source: {serviceAccounts: [a], namespaces: [x]}}]}]",
            "rules[0].from[0].source: serviceAccounts cannot be set with namespaces",
        );
        err(
            "rules: [{from: [{source: {notServiceAccounts: [a/b/c]}}]}]",
            "rules[0].from[0].source.notServiceAccounts[0]",
        );
        err(
            "rules: [{from: [{source: {trustDomains: [a*b]}}]}]",
            "rules[0].from[0].source.trustDomains[0]",
        );
        ok(
            r#"rules: [{when: [{key: "request.headers[x-a]", values: [b]}, {key: source.serviceAccount, values: [a, ns/b]}, {key: source.trustDomain, values: ["*.corp"]}, {key: destination.port, notValues: ["80"]}, {key: connection.sni, values: [a]}]}]"#,
        );

        err("action: DENY", "action DENY without rules");
        err(
            "rules: [{from: [{source: {}}]}]",
            "rules[0].from[0].source must not be empty",
        );
        err(
            "rules: [{to: [{operation: {}}]}]",
            "rules[0].to[0].operation must not be empty",
        );
        err(
            "rules: [{}, {from: [{source: {notIpBlocks: [10.0.0.0/33]}}]}]",
            "rules[1].from[0].source.notIpBlocks[0] \"10.0.0.0/33\"",
        );
        err(
            "rules: [{from: [{source: {remoteIpBlocks: [1.2.3.4, x]}}]}]",
            "rules[0].from[0].source.remoteIpBlocks[1]",
        );
        err(
            "rules: [{from: [{source: {principals: [\"\"]}}]}]",
            "rules[0].from[0].source.principals[0] must not be empty",
        );
        err(
            r#"rules: [{to: [{operation: {ports: ["65536"]}}]}]"#,
            "rules[0].to[0].operation.ports[0] \"65536\" is not a port",
        );
        err(
            r#"rules: [{to: [{operation: {notPaths: ["/x", "/a/{*}"]}}]}]"#,
            "rules[0].to[0].operation.notPaths[1] \"/a/{*}\": path templates",
        );
        err(
            "rules: [{when: [{key: source.ip}]}]",
            "rules[0].when[0]: at least one of values or notValues",
        );
        err(
            "rules: [{when: [{key: \"request.headers[]\", values: [a]}]}]",
            "rules[0].when[0].key \"request.headers[]\"",
        );
        err(
            "rules: [{when: [{key: \"request.auth.claims[]\", values: [a]}]}]",
            "request.auth.principal, .audiences",
        );
        err(
            "rules: [{when: [{key: request.auth.subject, values: [a]}]}]",
            "request.auth.principal, .audiences",
        );
        err(
            "rules: [{when: [{key: experimental.envoy.filters.a, values: [a]}]}]",
            "experimental.envoy.filters.<filter>[<key>]",
        );
        err(
            "rules: [{when: [{key: \"destination.labels[app]\", values: [a]}]}]",
            "workload selector",
        );
        err(
            "rules: [{when: [{key: source.user, values: [a]}]}]",
            "unknown attribute",
        );
        err(
            "rules: [{when: [{key: remote.ip, notValues: [1.2.3]}]}]",
            "rules[0].when[0].notValues[0]",
        );
        err(
            "rules: [{when: [{key: destination.port, values: [http]}]}]",
            "rules[0].when[0].values[0]",
        );
        err(
            "rules: [{when: [{key: source.serviceAccount, values: [a/b/c]}]}]",
            "namespace/serviceAccount",
        );
        err(
            "rules: [{when: [{key: source.trustDomain, values: [a*b]}]}]",
            "wildcard",
        );
    }

    /// Fields shoal cannot enforce no longer refuse the policy (which would leave its
    /// workloads with fewer rules: open); they are kept, and each is named with what the
    /// server does instead. JWT attributes are enforced (RequestAuthentication), so they are
    /// not named.
    #[test]
    fn authorization_policy_unenforced_fields_are_kept_and_named() {
        use crate::admit::istio::unenforced_fields;
        let named = |yaml: &str| {
            let s = spec(ConfigKind::AuthorizationPolicy, yaml)
                .unwrap_or_else(|e| panic!("{yaml}: {e}"));
            unenforced_fields(&s)
        };
        assert_eq!(
            named(
                r#"
action: DENY
rules:
- from: [{source: {notRequestPrincipals: ["*"]}}]
- from: [{source: {namespaces: [a]}}, {source: {requestPrincipals: [iss/sub]}}]
  when:
  - {key: "request.auth.claims[groups]", values: [admin]}
  - {key: source.ip, values: [10.0.0.1]}
  - {key: request.auth.audiences, notValues: [x]}
  - {key: "experimental.envoy.filters.a.b[c]", values: [d]}
"#
            ),
            [
                "rules[1].when[3] \"experimental.envoy.filters.a.b[c]\" (ignored, so the rule \
              denies more)"
            ]
        );
        assert!(named("rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]").is_empty());
        assert_eq!(
            named(
                "action: AUDIT\nrules: [{when: [{key: \"experimental.envoy.filters.a[b]\", values: [a]}]}]"
            ),
            ["rules[0].when[0] \"experimental.envoy.filters.a[b]\" (its rule is dropped)"]
        );
        assert!(named("rules: [{from: [{source: {principals: [a]}}]}]").is_empty());
        assert_eq!(
            named(
                "action: CUSTOM\nprovider: {name: ext-authz}\nrules: [{when: [{key: request.auth.principal, values: [a]}]}]"
            ),
            ["provider.name \"ext-authz\" (shoal has no external authorizers, so the requests \
              the rules match are denied, as istiod does for an unknown provider)"]
        );
        // The values are still checked.
        let e = spec(
            ConfigKind::AuthorizationPolicy,
            "rules: [{from: [{source: {requestPrincipals: [\"\"]}}]}]",
        )
        .unwrap_err();
        assert!(
            e.contains("rules[0].from[0].source.requestPrincipals[0] must not be empty"),
            "{e}"
        );
    }

    #[test]
    fn request_authentication_fields_and_errors_name_the_field() {
        let ok = |yaml: &str| {
            let s = spec(ConfigKind::RequestAuthentication, yaml)
                .unwrap_or_else(|e| panic!("{yaml}: {e}"));
            let ConfigSpec::RequestAuthentication(ra) = s else {
                panic!("{s:?}")
            };
            ra
        };
        let err = |yaml: &str, want: &str| {
            let e = spec(ConfigKind::RequestAuthentication, yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        };
        let ra = ok(r#"
selector: {matchLabels: {app: httpbin}}
jwtRules:
- issuer: testing@secure.istio.io
  audiences: [a, b]
  jwksUri: https://example.com:8443/jwks.json
  fromHeaders: [{name: x-jwt, prefix: "Bearer "}]
  fromParams: [token]
  fromCookies: [session]
  forwardOriginalToken: true
  outputPayloadToHeader: x-payload
  outputClaimToHeaders: [{header: x-group, claim: groups}]
- issuer: other
  jwks: '{"keys": []}'
"#);
        let rule = &ra.jwt_rules[0];
        assert_eq!(rule.from_headers[0].prefix, "Bearer ");
        assert_eq!(rule.output_claim_to_headers[0].claim, "groups");
        assert!(rule.forward_original_token);
        assert_eq!(ra.jwt_rules[1].jwks, r#"{"keys": []}"#);

        err(
            "jwtRules: [{jwks: '{\"keys\": []}'}]",
            "jwtRules[0].issuer must not be empty",
        );
        err(
            "jwtRules: [{issuer: a, jwksUri: 'ftp://x/y'}]",
            "jwtRules[0].jwksUri",
        );
        err(
            "jwtRules: [{issuer: a, jwksUri: 'https://:80/y'}]",
            "jwtRules[0].jwksUri",
        );
        err(
            "jwtRules: [{issuer: a, jwks: 'not json'}]",
            "jwtRules[0].jwks is not a JWKS",
        );
        err(
            "jwtRules: [{issuer: a, fromHeaders: [{prefix: x}]}]",
            "jwtRules[0].fromHeaders[0].name",
        );
        err(
            "jwtRules: [{issuer: a, outputClaimToHeaders: [{header: 'a b', claim: c}]}]",
            "jwtRules[0].outputClaimToHeaders[0].header",
        );
        err("targetRefs: [{kind: Gateway, name: gw}]", "spec.targetRefs");
        err("targetRef: {kind: Gateway, name: gw}", "spec.targetRef");
        err(
            "jwtRules: [{issuer: a, timeout: 1s}]",
            "spec.jwtRules[0].timeout",
        );
    }
}
