//! VirtualService validation, as Istio's admission webhook would refuse the object: every
//! error names the field, and nothing invalid (a bad regex, an impossible weight, a
//! percentage over 100) reaches Envoy, where one bad route would make it reject the whole
//! route table for every proxy on that port.

use crate::error::InvalidObject;
use shoal_common::model::{
    Destination, HeaderMatch, HttpMatchRequest, HttpRoute, Percent, RouteDestination, StringMatch,
    VirtualService,
};

/// The largest direct response body istiod admits (and the route tables allow).
const MAX_DIRECT_RESPONSE_BODY_BYTES: usize = 1024 * 1024;

type Result = std::result::Result<(), InvalidObject>;

fn invalid(reason: String) -> Result {
    Err(InvalidObject::new(reason))
}

/// Checks a VirtualService. One without hosts is a delegate: its HTTP rules are inserted
/// into the root rules that name it, so it may not bind gateways, have TCP or TLS rules, or
/// delegate itself (one level, as Istio).
pub fn validate(vs: &VirtualService) -> Result {
    let is_delegate = vs.hosts.is_empty();
    if is_delegate {
        for (field, set) in [
            ("gateways", !vs.gateways.is_empty()),
            ("tcp", !vs.tcp.is_empty()),
            ("tls", !vs.tls.is_empty()),
        ] {
            if set {
                return invalid(format!(
                    "{field}: a VirtualService without hosts is a delegate and may not set {field} \
                     (as in Istio)"
                ));
            }
        }
    }
    for (i, rule) in vs.http.iter().enumerate() {
        http_rule(rule, &format!("http[{i}]"), is_delegate)?;
    }
    for (i, rule) in vs.tcp.iter().enumerate() {
        let at = format!("tcp[{i}]");
        if rule.route.is_empty() {
            return invalid(format!("{at}.route is empty"));
        }
        l4_destinations(&rule.route, &at)?;
        for (j, m) in rule.matches.iter().enumerate() {
            port(m.port, &format!("{at}.match[{j}].port"))?;
            subnets(
                &m.destination_subnets,
                &format!("{at}.match[{j}].destinationSubnets"),
            )?;
        }
    }
    for (i, rule) in vs.tls.iter().enumerate() {
        let at = format!("tls[{i}]");
        if rule.route.is_empty() {
            return invalid(format!("{at}.route is empty"));
        }
        if rule.matches.is_empty() {
            return invalid(format!("{at}.match is empty: TLS routes match on sniHosts"));
        }
        l4_destinations(&rule.route, &at)?;
        for (j, m) in rule.matches.iter().enumerate() {
            if m.sni_hosts.is_empty() {
                return invalid(format!("{at}.match[{j}].sniHosts is empty"));
            }
            port(m.port, &format!("{at}.match[{j}].port"))?;
            subnets(
                &m.destination_subnets,
                &format!("{at}.match[{j}].destinationSubnets"),
            )?;
        }
    }
    Ok(())
}

fn http_rule(rule: &HttpRoute, at: &str, in_delegate: bool) -> Result {
    let actions = [
        !rule.route.is_empty(),
        rule.redirect.is_some(),
        rule.direct_response.is_some(),
    ];
    let action_count = actions.iter().filter(|a| **a).count();
    if let Some(d) = &rule.delegate {
        if in_delegate {
            return invalid(format!(
                "{at}.delegate: a delegate VirtualService (without hosts) may not delegate \
                 again; delegation is one level deep, as in Istio"
            ));
        }
        if d.name.is_empty() {
            return invalid(format!("{at}.delegate.name is empty"));
        }
        if action_count > 0 {
            return invalid(format!(
                "{at}.delegate: a rule that delegates has no route, redirect or directResponse \
                 (the delegate's rules route)"
            ));
        }
    } else {
        match action_count {
            0 => {
                return invalid(format!(
                    "{at}: one of route, redirect or directResponse is required"
                ))
            }
            1 => {}
            _ => {
                return invalid(format!(
                    "{at}: route, redirect and directResponse are mutually exclusive"
                ))
            }
        }
    }
    for (j, d) in rule.route.iter().enumerate() {
        destination(&d.destination, &format!("{at}.route[{j}].destination"))?;
    }
    weights(rule.route.iter().map(|d| d.weight), &format!("{at}.route"))?;
    for (j, m) in rule.matches.iter().enumerate() {
        http_match(m, &format!("{at}.match[{j}]"))?;
    }
    if let Some(r) = &rule.redirect {
        if let Some(code) = r.redirect_code {
            if ![301, 302, 303, 307, 308].contains(&code) {
                return invalid(format!(
                    "{at}.redirect.redirectCode {code} is not a redirect status"
                ));
            }
        }
        port(r.port, &format!("{at}.redirect.port"))?;
        match r.derive_port.as_deref() {
            None | Some("FROM_PROTOCOL_DEFAULT") | Some("FROM_REQUEST_PORT") => {}
            Some(other) => {
                return invalid(format!(
                    "{at}.redirect.derivePort {other:?} is not FROM_PROTOCOL_DEFAULT or FROM_REQUEST_PORT"
                ))
            }
        }
        if r.port.is_some() && r.derive_port.is_some() {
            return invalid(format!(
                "{at}.redirect: port and derivePort are mutually exclusive"
            ));
        }
    }
    if let Some(d) = &rule.direct_response {
        if !(200..=599).contains(&d.status) {
            return invalid(format!(
                "{at}.directResponse.status {} is not in 200-599",
                d.status
            ));
        }
        if let Some(b) = &d.body {
            if b.string.is_some() && b.bytes.is_some() {
                return invalid(format!(
                    "{at}.directResponse.body: string and bytes are mutually exclusive"
                ));
            }
            if let Some(bytes) = &b.bytes {
                if !is_base64(bytes) {
                    return invalid(format!("{at}.directResponse.body.bytes is not base64"));
                }
            }
            // istiod's webhook limit, which is also the route tables'
            // `max_direct_response_body_size_bytes`: a larger body would make Envoy reject
            // the whole route table.
            let size = match (&b.string, &b.bytes) {
                (Some(text), _) => text.len(),
                (None, Some(bytes)) => bytes.trim_end_matches('=').len() * 3 / 4,
                (None, None) => 0,
            };
            if size > MAX_DIRECT_RESPONSE_BODY_BYTES {
                return invalid(format!(
                    "{at}.directResponse.body: {size} bytes, more than 1 MiB"
                ));
            }
        }
    }
    if let Some(rw) = &rule.rewrite {
        if let Some(rr) = &rw.uri_regex_rewrite {
            if rw.uri.is_some() {
                return invalid(format!(
                    "{at}.rewrite: uri and uriRegexRewrite are mutually exclusive"
                ));
            }
            regex(&rr.pattern, &format!("{at}.rewrite.uriRegexRewrite.match"))?;
        }
    }
    if let Some(f) = &rule.fault {
        if let Some(d) = &f.delay {
            if d.fixed_delay.is_none() {
                return invalid(format!("{at}.fault.delay.fixedDelay is required"));
            }
            percent(d.percentage, &format!("{at}.fault.delay.percentage"))?;
            if d.percent.is_some_and(|p| p > 100) {
                return invalid(format!("{at}.fault.delay.percent is over 100"));
            }
        }
        if let Some(a) = &f.abort {
            percent(a.percentage, &format!("{at}.fault.abort.percentage"))?;
            match (&a.http_status, &a.grpc_status) {
                (Some(s), None) if (200..=599).contains(s) => {}
                (Some(s), None) => {
                    return invalid(format!("{at}.fault.abort.httpStatus {s} is not in 200-599"))
                }
                (None, Some(_)) if a.grpc_code().is_some() => {}
                (None, Some(g)) => {
                    return invalid(format!(
                        "{at}.fault.abort.grpcStatus {g:?} is not a gRPC status"
                    ))
                }
                _ => {
                    return invalid(format!(
                        "{at}.fault.abort needs exactly one of httpStatus or grpcStatus"
                    ))
                }
            }
        }
    }
    if let Some(m) = &rule.mirror {
        destination(m, &format!("{at}.mirror"))?;
        if !rule.mirrors.is_empty() {
            return invalid(format!("{at}: mirror and mirrors are mutually exclusive"));
        }
    }
    percent(rule.mirror_percentage, &format!("{at}.mirrorPercentage"))?;
    for (j, m) in rule.mirrors.iter().enumerate() {
        destination(&m.destination, &format!("{at}.mirrors[{j}].destination"))?;
        percent(m.percentage, &format!("{at}.mirrors[{j}].percentage"))?;
    }
    if let Some(c) = &rule.cors_policy {
        for (j, o) in c.allow_origins.iter().enumerate() {
            string_match(o, &format!("{at}.corsPolicy.allowOrigins[{j}]"))?;
        }
    }
    if let Some(r) = &rule.retries {
        if let Some(on) = &r.retry_on {
            for cond in on.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let is_code = cond.parse::<u16>().is_ok_and(|c| (100..600).contains(&c));
                if !is_code && !RETRY_ON.contains(&cond) {
                    return invalid(format!(
                        "{at}.retries.retryOn: {cond:?} is not a retry condition"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Envoy's HTTP and gRPC retry conditions (what istiod accepts in `retryOn`).
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

fn http_match(m: &HttpMatchRequest, at: &str) -> Result {
    for (field, sm) in [
        ("uri", &m.uri),
        ("method", &m.method),
        ("authority", &m.authority),
        ("scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            string_match(sm, &format!("{at}.{field}"))?;
        }
    }
    for (field, map) in [
        ("headers", &m.headers),
        ("withoutHeaders", &m.without_headers),
    ] {
        for (name, hm) in map {
            if name.is_empty() {
                return invalid(format!("{at}.{field} has an empty header name"));
            }
            if let HeaderMatch::Value(sm) = hm {
                string_match(sm, &format!("{at}.{field}.{name}"))?;
            }
        }
    }
    for (name, qm) in &m.query_params {
        match qm {
            HeaderMatch::Value(StringMatch::Prefix(_)) => {
                return invalid(format!(
                "{at}.queryParams.{name}: only exact and regex matches are supported (as in Istio)"
            ))
            }
            HeaderMatch::Value(sm) => string_match(sm, &format!("{at}.queryParams.{name}"))?,
            HeaderMatch::Present => {}
        }
    }
    port(m.port, &format!("{at}.port"))
}

fn string_match(sm: &StringMatch, at: &str) -> Result {
    match sm {
        StringMatch::Regex(r) => regex(r, at),
        _ => Ok(()),
    }
}

/// Validates a regex with RE2 semantics (the `regex` crate's syntax is RE2's: no
/// look-around, no back-references), so Envoy never receives one it rejects.
fn regex(r: &str, at: &str) -> Result {
    match regex::Regex::new(r) {
        Ok(_) => Ok(()),
        Err(e) => invalid(format!("{at}: invalid regex {r:?}: {e}")),
    }
}

fn destination(d: &Destination, at: &str) -> Result {
    if d.host.is_empty() {
        return invalid(format!("{at}.host is empty"));
    }
    if let Some(p) = &d.port {
        port(Some(p.number), &format!("{at}.port.number"))?;
    }
    Ok(())
}

fn l4_destinations(route: &[RouteDestination], at: &str) -> Result {
    for (j, d) in route.iter().enumerate() {
        destination(&d.destination, &format!("{at}.route[{j}].destination"))?;
    }
    weights(route.iter().map(|d| d.weight), &format!("{at}.route"))
}

/// Istio's weight rules: one destination takes all traffic whatever its weight; several
/// split by their weights, which must total more than 0 (any total: Envoy splits by it).
fn weights(weights: impl Iterator<Item = Option<u32>>, at: &str) -> Result {
    let w: Vec<Option<u32>> = weights.collect();
    if w.len() > 1 {
        let total: u64 = w.iter().map(|x| u64::from(x.unwrap_or(0))).sum();
        if total == 0 {
            return invalid(format!(
                "{at}: {} destinations without weights; give each a weight (Istio rejects this too)",
                w.len()
            ));
        }
        if total > u64::from(u32::MAX) {
            return invalid(format!("{at}: weights total {total}, over 2^32-1"));
        }
    }
    Ok(())
}

fn port(p: Option<u32>, at: &str) -> Result {
    match p {
        Some(n) if !(1..=65535).contains(&n) => invalid(format!("{at} {n} is not in 1-65535")),
        _ => Ok(()),
    }
}

fn percent(p: Option<Percent>, at: &str) -> Result {
    match p {
        Some(p) if !(0.0..=100.0).contains(&p.value) || p.value.is_nan() => {
            invalid(format!("{at} {} is not in 0-100", p.value))
        }
        _ => Ok(()),
    }
}

fn subnets(list: &[String], at: &str) -> Result {
    for s in list {
        let (addr, len) = s.split_once('/').unwrap_or((s, ""));
        let ok = match addr.parse::<std::net::IpAddr>() {
            Ok(ip) => {
                len.is_empty()
                    || len
                        .parse::<u8>()
                        .is_ok_and(|l| l <= if ip.is_ipv4() { 32 } else { 128 })
            }
            Err(_) => false,
        };
        if !ok {
            return invalid(format!("{at}: {s:?} is not an IP address or CIDR"));
        }
    }
    Ok(())
}

fn is_base64(s: &str) -> bool {
    s.bytes()
        .filter(|c| !c.is_ascii_whitespace())
        .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(yaml: &str) -> String {
        let vs: VirtualService = shoal_common::yaml::from_str(yaml).expect("test yaml");
        validate(&vs).expect_err("should be invalid").to_string()
    }

    fn ok(yaml: &str) {
        let vs: VirtualService = shoal_common::yaml::from_str(yaml).expect("test yaml");
        validate(&vs).unwrap_or_else(|e| panic!("{yaml}: {e}"));
    }

    #[test]
    fn weights_follow_istio() {
        ok("http:\n- route:\n  - {destination: {host: a}, weight: 1}\n  - {destination: {host: b}, weight: 3}\n");
        ok("http:\n- route:\n  - {destination: {host: a}, weight: 0}\n");
        assert!(reason(
            "http:\n- route:\n  - destination: {host: a}\n  - destination: {host: b}\n"
        )
        .contains("http[0].route: 2 destinations without weights"));
    }

    /// istiod's 1 MiB limit on direct response bodies (Envoy's route tables allow that).
    #[test]
    fn direct_response_bodies_stay_within_1_mib() {
        let vs = |body: &str| format!("http:\n- directResponse: {{status: 200, body: {body}}}\n");
        ok(&vs(&format!("{{string: {}}}", "a".repeat(1024 * 1024))));
        let r = reason(&vs(&format!("{{string: {}}}", "a".repeat(1024 * 1024 + 1))));
        assert!(r.contains("http[0].directResponse.body"), "{r}");
        // 1 MiB + 3 bytes, base64.
        let r = reason(&vs(&format!("{{bytes: {}}}", "QUFB".repeat(349_526))));
        assert!(r.contains("http[0].directResponse.body"), "{r}");
    }

    #[test]
    fn bad_regexes_never_reach_envoy() {
        let r = reason(
            "http:\n- match: [{uri: {regex: '/a(b'}}]\n  route: [{destination: {host: a}}]\n",
        );
        assert!(r.contains("http[0].match[0].uri: invalid regex"), "{r}");
        let r = reason("http:\n- match: [{headers: {x: {regex: '(?=a)'}}}]\n  route: [{destination: {host: a}}]\n");
        assert!(r.contains("http[0].match[0].headers.x"), "{r}");
        let r = reason("http:\n- route: [{destination: {host: a}}]\n  corsPolicy: {allowOrigins: [{regex: '['}]}\n");
        assert!(r.contains("corsPolicy.allowOrigins[0]"), "{r}");
    }

    #[test]
    fn fields_are_range_checked() {
        assert!(
            reason("http:\n- match: [{port: 70000}]\n  route: [{destination: {host: a}}]\n")
                .contains("http[0].match[0].port 70000")
        );
        assert!(reason("http:\n- route: [{destination: {host: a}}]\n  mirror: {host: b}\n  mirrorPercentage: {value: 101}\n").contains("mirrorPercentage"));
        assert!(reason(
            "http:\n- route: [{destination: {host: a}}]\n  fault: {abort: {httpStatus: 700}}\n"
        )
        .contains("httpStatus 700"));
        assert!(reason("http:\n- directResponse: {status: 99}\n").contains("directResponse.status"));
        assert!(
            reason("http:\n- route: [{destination: {host: a}}]\n  redirect: {uri: /x}\n")
                .contains("mutually exclusive")
        );
        assert!(reason("http:\n- match: [{queryParams: {q: {prefix: a}}}]\n  route: [{destination: {host: a}}]\n").contains("queryParams.q"));
        assert!(reason("http:\n- route: [{destination: {host: a}}]\n  retries: {attempts: 2, retryOn: 'connect-failure,sometimes'}\n").contains("sometimes"));
        assert!(reason("hosts: [a]\ntcp:\n- match: [{destinationSubnets: [10.0.0.0/33]}]\n  route: [{destination: {host: a}}]\n").contains("tcp[0].match[0].destinationSubnets"));
    }

    #[test]
    fn delegation_is_one_level_with_no_action_beside_it() {
        ok("hosts: [a]\nhttp:\n- match: [{uri: {prefix: /v2}}]\n  delegate: {name: child, namespace: other}\n  timeout: 5s\n");
        // A delegate: no hosts, plain rules.
        ok("http:\n- match: [{uri: {prefix: /v2/a}}]\n  route: [{destination: {host: a}}]\n");
        let r = reason("http:\n- delegate: {name: grandchild}\n");
        assert!(
            r.contains("http[0].delegate") && r.contains("one level"),
            "{r}"
        );
        let r = reason("hosts: [a]\nhttp:\n- delegate: {name: ''}\n");
        assert!(r.contains("http[0].delegate.name is empty"), "{r}");
        for action in [
            "route: [{destination: {host: a}}]",
            "redirect: {uri: /x}",
            "directResponse: {status: 200}",
        ] {
            let r = reason(&format!(
                "hosts: [a]\nhttp:\n- delegate: {{name: child}}\n  {action}\n"
            ));
            assert!(r.contains("http[0].delegate: a rule that delegates"), "{r}");
        }
        assert!(
            reason("gateways: [gw]\nhttp:\n- route: [{destination: {host: a}}]\n")
                .contains("gateways: a VirtualService without hosts is a delegate")
        );
        assert!(
            reason("tcp:\n- route: [{destination: {host: a}}]\n").contains("tcp: a VirtualService")
        );
    }
}
