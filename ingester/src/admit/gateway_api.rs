//! The Kubernetes Gateway API (`gateway.networking.k8s.io`): validation of what the server's
//! translation relies on, each error naming the field. Decoding (with unmodelled fields
//! refused by name) is shared with the Istio kinds ([`super::istio::config_spec`]).
//!
//! What the Gateway API allows but shoal does not implement is refused here rather than
//! served without it: a route without a filter it asked for could send traffic where its
//! author did not mean it to go.

use crate::error::InvalidObject;
use shoal_common::model::{
    BackendRef, GRPCRoute, HTTPRoute, HTTPRouteFilter, KubeGateway, L4Route, ParentReference,
    ReferenceGrant, GATEWAY_API_GROUP,
};

type Result = std::result::Result<(), InvalidObject>;

fn invalid(reason: String) -> Result {
    Err(InvalidObject::new(reason))
}

/// A Gateway: listeners with the protocols, TLS modes and route kinds shoal serves.
pub fn validate_gateway(gw: &KubeGateway) -> Result {
    if gw.gateway_class_name.is_empty() {
        return invalid("gatewayClassName is empty".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, l) in gw.listeners.iter().enumerate() {
        let at = format!("listeners[{i}]");
        if l.name.is_empty() {
            return invalid(format!("{at}.name is empty"));
        }
        if !names.insert(l.name.as_str()) {
            return invalid(format!("{at}.name {:?} is not unique", l.name));
        }
        if l.port == 0 || l.port > 65535 {
            return invalid(format!("{at}.port {} is not in 1-65535", l.port));
        }
        let tls_mode = l
            .tls
            .as_ref()
            .map(|t| t.mode.as_deref().unwrap_or("Terminate"));
        match (l.protocol.as_str(), tls_mode) {
            ("HTTP" | "TCP", None) => {}
            ("HTTP" | "TCP", Some(_)) => {
                return invalid(format!("{at}.tls is set on a {} listener", l.protocol))
            }
            ("HTTPS", Some("Terminate")) | ("TLS", Some("Terminate" | "Passthrough")) => {}
            ("HTTPS" | "TLS", None) => {
                return invalid(format!("{at}.tls is required on a {} listener", l.protocol))
            }
            ("HTTPS" | "TLS", Some(mode)) => {
                return invalid(format!(
                    "{at}.tls.mode {mode:?} is not valid on a {} listener",
                    l.protocol
                ))
            }
            (other, _) => {
                return invalid(format!(
                    "{at}.protocol {other:?} is not supported (HTTP, HTTPS, TLS and TCP are)"
                ))
            }
        }
        if let Some(tls) = &l.tls {
            if tls_mode == Some("Terminate") {
                if tls.certificate_refs.is_empty() {
                    return invalid(format!(
                        "{at}.tls.certificateRefs is empty (TLS termination needs a Secret)"
                    ));
                }
                if tls.certificate_refs.len() > 1 {
                    return invalid(format!(
                        "{at}.tls.certificateRefs[1]: one certificate per listener is supported"
                    ));
                }
                for (j, r) in tls.certificate_refs.iter().enumerate() {
                    let group = r.group.as_deref().unwrap_or("");
                    let kind = r.kind.as_deref().unwrap_or("Secret");
                    if !group.is_empty() || kind != "Secret" {
                        return invalid(format!(
                            "{at}.tls.certificateRefs[{j}] must be a core Secret (is {group}/{kind})"
                        ));
                    }
                    if r.namespace.is_some() {
                        return invalid(format!(
                            "{at}.tls.certificateRefs[{j}].namespace: Secrets of other \
                             namespaces are not supported yet (put the Secret in the \
                             Gateway's namespace)"
                        ));
                    }
                }
            }
        }
        if let Some(allowed) = &l.allowed_routes {
            if let Some(ns) = &allowed.namespaces {
                match ns.from.as_deref().unwrap_or("Same") {
                    "Same" | "All" => {}
                    "Selector" => {
                        let Some(selector) = &ns.selector else {
                            return invalid(format!(
                                "{at}.allowedRoutes.namespaces.selector is required with from: \
                                 Selector"
                            ));
                        };
                        // Kubernetes refuses such a selector; the server would admit no
                        // route with it.
                        if let Err(e) = selector.validate() {
                            return invalid(format!("{at}.allowedRoutes.namespaces.selector.{e}"));
                        }
                    }
                    other => {
                        return invalid(format!(
                            "{at}.allowedRoutes.namespaces.from {other:?} is not one of Same, \
                             All, Selector"
                        ))
                    }
                }
            }
            // A kind shoal does not serve, or one the listener's protocol does not carry,
            // admits nothing and is reported in the listener's status
            // (`ResolvedRefs: False`, `InvalidRouteKinds`), as istiod reports it.
        }
    }
    Ok(())
}

fn parent_refs(refs: &[ParentReference]) -> Result {
    for (i, p) in refs.iter().enumerate() {
        let group = p.group.as_deref().unwrap_or(GATEWAY_API_GROUP);
        let kind = p.kind.as_deref().unwrap_or("Gateway");
        let ok = (group == GATEWAY_API_GROUP && kind == "Gateway")
            || (group.is_empty() && kind == "Service");
        if !ok {
            return invalid(format!(
                "parentRefs[{i}] {group}/{kind} is not supported (a Gateway, or a core Service \
                 for the mesh)"
            ));
        }
        if p.name.is_empty() {
            return invalid(format!("parentRefs[{i}].name is empty"));
        }
    }
    Ok(())
}

fn backend_ref(at: &str, b: &BackendRef) -> Result {
    // Per-backend header filters have no place in the translated destination yet.
    if !b.filters.is_empty() {
        return invalid(format!("{at}.filters is not supported yet"));
    }
    let group = b.group.as_deref().unwrap_or("");
    let kind = b.kind.as_deref().unwrap_or("Service");
    if b.name.is_empty() {
        return invalid(format!("{at}.name is empty"));
    }
    // Another kind is not invalid input: the spec accepts the route and answers 500 for
    // that backend's share (its `InvalidKind` reference), which the server does.
    let resolvable = matches!(
        (group, kind),
        ("", "Service") | ("networking.istio.io", "Hostname")
    );
    if resolvable && b.port.is_none() {
        return invalid(format!("{at}.port is required"));
    }
    if kind == "Hostname" && b.namespace.is_some() {
        return invalid(format!("{at}.namespace may not be set with kind Hostname"));
    }
    Ok(())
}

fn header_value_ok(v: &str) -> bool {
    v.bytes().all(|c| c == b'\t' || (c >= 0x20 && c != 0x7f))
}

fn filter(at: &str, f: &HTTPRouteFilter) -> Result {
    let missing = |field: &str| invalid(format!("{at}.{field} is required with type {}", f.kind));
    match f.kind.as_str() {
        "RequestHeaderModifier" | "ResponseHeaderModifier" => {
            let (field, h) = if f.kind == "RequestHeaderModifier" {
                ("requestHeaderModifier", &f.request_header_modifier)
            } else {
                ("responseHeaderModifier", &f.response_header_modifier)
            };
            let Some(h) = h else { return missing(field) };
            for (k, header) in h.set.iter().chain(&h.add).enumerate() {
                if header.name.is_empty() || !header_value_ok(&header.value) {
                    return invalid(format!(
                        "{at}.{field}: header {k} ({:?}) has an empty name or a value with \
                         control characters",
                        header.name
                    ));
                }
            }
        }
        "RequestRedirect" => {
            let Some(r) = &f.request_redirect else {
                return missing("requestRedirect");
            };
            if let Some(code) = r.status_code {
                // Core 301/302 and the extended 303/307/308, all of which Envoy answers.
                if ![301, 302, 303, 307, 308].contains(&code) {
                    return invalid(format!(
                        "{at}.requestRedirect.statusCode {code} is not 301, 302, 303, 307 or 308"
                    ));
                }
            }
            if let Some(s) = &r.scheme {
                if s != "http" && s != "https" {
                    return invalid(format!(
                        "{at}.requestRedirect.scheme {s:?} is not http or https"
                    ));
                }
            }
            if let Some(p) = &r.path {
                path_modifier(&format!("{at}.requestRedirect.path"), p)?;
            }
        }
        "URLRewrite" => {
            let Some(r) = &f.url_rewrite else {
                return missing("urlRewrite");
            };
            if let Some(p) = &r.path {
                path_modifier(&format!("{at}.urlRewrite.path"), p)?;
            }
        }
        "RequestMirror" => {
            let Some(m) = &f.request_mirror else {
                return missing("requestMirror");
            };
            if m.backend_ref.weight.is_some() {
                return invalid(format!("{at}.requestMirror.backendRef.weight is not valid"));
            }
            backend_ref(&format!("{at}.requestMirror.backendRef"), &m.backend_ref)?;
            if m.percent.is_some_and(|p| p > 100) {
                return invalid(format!("{at}.requestMirror.percent is over 100"));
            }
            if let Some(f) = &m.fraction {
                if m.percent.is_some() {
                    return invalid(format!(
                        "{at}.requestMirror: percent and fraction may not both be set"
                    ));
                }
                let denominator = f.denominator.unwrap_or(100);
                if denominator == 0 || f.numerator > denominator {
                    return invalid(format!(
                        "{at}.requestMirror.fraction {}/{denominator} is not between 0 and 1",
                        f.numerator
                    ));
                }
            }
        }
        other => {
            return invalid(format!(
                "{at}.type {other:?} is not supported (RequestHeaderModifier, \
                 ResponseHeaderModifier, RequestRedirect, URLRewrite and RequestMirror are)"
            ))
        }
    }
    Ok(())
}

fn path_modifier(at: &str, p: &shoal_common::model::HTTPPathModifier) -> Result {
    match p.kind.as_str() {
        "ReplaceFullPath" if p.replace_full_path.is_some() => Ok(()),
        "ReplacePrefixMatch" if p.replace_prefix_match.is_some() => Ok(()),
        "ReplaceFullPath" => invalid(format!("{at}.replaceFullPath is required")),
        "ReplacePrefixMatch" => invalid(format!("{at}.replacePrefixMatch is required")),
        other => invalid(format!(
            "{at}.type {other:?} is not ReplaceFullPath or ReplacePrefixMatch"
        )),
    }
}

fn value_match_kind(at: &str, kind: Option<&str>) -> Result {
    match kind.unwrap_or("Exact") {
        "Exact" | "RegularExpression" => Ok(()),
        other => invalid(format!(
            "{at}.type {other:?} is not Exact or RegularExpression"
        )),
    }
}

/// An HTTPRoute.
pub fn validate_http_route(r: &HTTPRoute) -> Result {
    parent_refs(&r.parent_refs)?;
    for (i, rule) in r.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        for (j, m) in rule.matches.iter().enumerate() {
            let mat = format!("{at}.matches[{j}]");
            if let Some(p) = &m.path {
                match p.kind.as_deref().unwrap_or("PathPrefix") {
                    "PathPrefix" | "Exact" => {
                        if !p.value.as_deref().unwrap_or("/").starts_with('/') {
                            return invalid(format!("{mat}.path.value must start with /"));
                        }
                    }
                    "RegularExpression" => {}
                    other => {
                        return invalid(format!(
                            "{mat}.path.type {other:?} is not PathPrefix, Exact or \
                             RegularExpression"
                        ))
                    }
                }
            }
            for (k, h) in m.headers.iter().enumerate() {
                value_match_kind(&format!("{mat}.headers[{k}]"), h.kind.as_deref())?;
            }
            for (k, q) in m.query_params.iter().enumerate() {
                value_match_kind(&format!("{mat}.queryParams[{k}]"), q.kind.as_deref())?;
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (j, f) in rule.filters.iter().enumerate() {
            filter(&format!("{at}.filters[{j}]"), f)?;
            // The spec allows each filter once per rule, but for mirrors.
            if f.kind != "RequestMirror" && !seen.insert(f.kind.as_str()) {
                return invalid(format!("{at}.filters[{j}]: {} appears twice", f.kind));
            }
        }
        if seen.contains("RequestRedirect") && seen.contains("URLRewrite") {
            return invalid(format!(
                "{at}.filters: RequestRedirect and URLRewrite cannot be combined"
            ));
        }
        if seen.contains("RequestRedirect") && !rule.backend_refs.is_empty() {
            return invalid(format!(
                "{at}.backendRefs: a rule with RequestRedirect has no backends"
            ));
        }
        for (j, b) in rule.backend_refs.iter().enumerate() {
            backend_ref(&format!("{at}.backendRefs[{j}]"), b)?;
        }
    }
    Ok(())
}

/// A GRPCRoute.
pub fn validate_grpc_route(r: &GRPCRoute) -> Result {
    parent_refs(&r.parent_refs)?;
    for (i, rule) in r.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        for (j, m) in rule.matches.iter().enumerate() {
            if let Some(method) = &m.method {
                value_match_kind(&format!("{at}.matches[{j}].method"), method.kind.as_deref())?;
                if method.service.is_none() && method.method.is_none() {
                    return invalid(format!("{at}.matches[{j}].method needs service or method"));
                }
            }
            for (k, h) in m.headers.iter().enumerate() {
                value_match_kind(
                    &format!("{at}.matches[{j}].headers[{k}]"),
                    h.kind.as_deref(),
                )?;
            }
        }
        for (j, f) in rule.filters.iter().enumerate() {
            if !matches!(
                f.kind.as_str(),
                "RequestHeaderModifier" | "ResponseHeaderModifier" | "RequestMirror"
            ) {
                return invalid(format!(
                    "{at}.filters[{j}].type {:?} is not supported on a GRPCRoute",
                    f.kind
                ));
            }
            filter(&format!("{at}.filters[{j}]"), f)?;
        }
        for (j, b) in rule.backend_refs.iter().enumerate() {
            backend_ref(&format!("{at}.backendRefs[{j}]"), b)?;
        }
    }
    Ok(())
}

/// A TCPRoute or TLSRoute (`tls`: hostnames are allowed).
pub fn validate_l4_route(r: &L4Route, tls: bool) -> Result {
    parent_refs(&r.parent_refs)?;
    if !tls && !r.hostnames.is_empty() {
        return invalid("hostnames is not a TCPRoute field".into());
    }
    for (i, rule) in r.rules.iter().enumerate() {
        for (j, b) in rule.backend_refs.iter().enumerate() {
            backend_ref(&format!("rules[{i}].backendRefs[{j}]"), b)?;
        }
    }
    Ok(())
}

/// A ReferenceGrant.
pub fn validate_reference_grant(g: &ReferenceGrant) -> Result {
    if g.from.is_empty() {
        return invalid("from is empty".into());
    }
    if g.to.is_empty() {
        return invalid("to is empty".into());
    }
    for (i, f) in g.from.iter().enumerate() {
        if f.namespace.is_empty() || f.kind.is_empty() {
            return invalid(format!("from[{i}] needs kind and namespace"));
        }
    }
    for (i, t) in g.to.iter().enumerate() {
        if t.kind.is_empty() {
            return invalid(format!("to[{i}].kind is empty"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::admit::istio::{config_spec, validate};
    use shoal_common::model::ConfigKind;

    fn check(kind: ConfigKind, yaml: &str) -> Result<(), String> {
        let v: serde_json::Value = shoal_common::yaml::from_str(yaml).expect("test yaml");
        let spec = config_spec(kind, v).map_err(|e| e.to_string())?;
        validate(&spec).map_err(|e| e.reason)
    }

    #[test]
    fn gateway_listeners_are_checked_by_field() {
        let gw = ConfigKind::KubeGateway;
        let ok = "gatewayClassName: istio\nlisteners:\n- {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}\n- {name: https, port: 443, protocol: HTTPS, hostname: a.example, tls: {certificateRefs: [{name: cert}]}}\n- {name: tls, port: 8443, protocol: TLS, tls: {mode: Passthrough}}\n- {name: tcp, port: 9000, protocol: TCP}\n";
        check(gw, ok).unwrap();
        for (yaml, names) in [
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 80, protocol: UDP}]",
                "listeners[0].protocol",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 443, protocol: HTTPS}]",
                "listeners[0].tls is required",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: c, namespace: other}]}}]",
                "listeners[0].tls.certificateRefs[0].namespace",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 80, protocol: HTTP}, {name: a, port: 81, protocol: HTTP}]",
                "listeners[1].name",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 80, protocol: HTTP}]\naddresses: [{value: 1.2.3.4}]",
                "spec.addresses",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, selector: {matchExpressions: [{key: k, operator: In}]}}}}]",
                "listeners[0].allowedRoutes.namespaces.selector.matchExpressions[0] \"k\": operator In needs at least one value",
            ),
            (
                "gatewayClassName: istio\nlisteners: [{name: a, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, selector: {matchExpressions: [{key: k, operator: Near, values: [v]}]}}}}]",
                "listeners[0].allowedRoutes.namespaces.selector.matchExpressions[0] \"k\": unknown operator",
            ),
        ] {
            let e = check(gw, yaml).unwrap_err();
            assert!(e.contains(names), "{yaml}: {e}");
        }
    }

    #[test]
    fn http_route_filters_and_backends_are_checked_by_field() {
        let r = ConfigKind::HTTPRoute;
        check(r, "parentRefs: [{name: gw}]\nhostnames: [a.example]\nrules:\n- matches: [{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: y}], queryParams: [{name: q, value: v}], method: GET}]\n  filters:\n  - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: b}], remove: [c]}}\n  - {type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}}}\n  backendRefs: [{name: a, port: 80, weight: 3}, {name: b, port: 80}]\n  timeouts: {request: 2s}\n").unwrap();
        // A backend of a kind shoal cannot resolve is the spec's `InvalidKind`: accepted,
        // answered with 500 by the server.
        check(
            r,
            "parentRefs: [{name: gw}]\nrules: [{backendRefs: [{name: a, kind: Pod}]}]\n",
        )
        .unwrap();
        // Every redirect the spec defines: 301/302 (core), 303/307/308 and ReplacePrefixMatch
        // (extended).
        for code in [301, 302, 303, 307, 308] {
            check(r, &format!("parentRefs: [{{name: gw}}]\nrules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{statusCode: {code}, path: {{type: ReplacePrefixMatch, replacePrefixMatch: /b}}}}}}]}}]\n")).unwrap();
        }
        for (yaml, names) in [
            (
                "rules: [{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 304}}]}]",
                "requestRedirect.statusCode 304",
            ),
            (
                "rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, percent: 5, fraction: {numerator: 1}}}]}]",
                "percent and fraction",
            ),
            (
                "rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, fraction: {numerator: 3, denominator: 2}}}]}]",
                "requestMirror.fraction 3/2",
            ),
            (
                "rules: [{filters: [{type: ExtensionRef}]}]",
                "rules[0].filters[0].type",
            ),
            (
                "rules: [{backendRefs: [{name: a}]}]",
                "rules[0].backendRefs[0].port is required",
            ),
            ("rules: [{retry: {attempts: 2}}]", "spec.rules[0].retry"),
            (
                "parentRefs: [{name: x, kind: Mesh, group: istio.io}]",
                "parentRefs[0]",
            ),
        ] {
            let e = check(r, yaml).unwrap_err();
            assert!(e.contains(names), "{yaml}: {e}");
        }
    }
}
