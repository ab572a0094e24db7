//! Validation of Istio's security kinds (PeerAuthentication, AuthorizationPolicy): what
//! the server relies on, with errors naming the field.

use crate::error::InvalidObject;
use shoal_common::model::{AuthorizationAction, AuthorizationPolicy, PeerAuthentication};

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

/// Checks an AuthorizationPolicy.
pub fn validate_authorization_policy(ap: &AuthorizationPolicy) -> Result<(), InvalidObject> {
    if ap.action == AuthorizationAction::Custom {
        return Err(InvalidObject::new(
            "action CUSTOM (an external authorizer) is not supported".to_string(),
        ));
    }
    for (i, rule) in ap.rules.iter().enumerate() {
        for (j, from) in rule.from.iter().enumerate() {
            let field = if !from.source.request_principals.is_empty() {
                "requestPrincipals"
            } else if !from.source.not_request_principals.is_empty() {
                "notRequestPrincipals"
            } else {
                continue;
            };
            return Err(InvalidObject::new(format!(
                "rules[{i}].from[{j}].source.{field} needs RequestAuthentication (JWT), which \
                 shoal does not implement"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::istio::{config_spec, validate};
    use shoal_common::model::{ConfigKind, ConfigSpec, MtlsMode};

    fn spec(kind: ConfigKind, yaml: &str) -> Result<ConfigSpec, String> {
        let value: serde_json::Value = serde_yaml::from_str(yaml).expect("yaml");
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
    fn authorization_policy_unmodelled_fields_and_custom_are_refused() {
        spec(
            ConfigKind::AuthorizationPolicy,
            "action: DENY\nrules: [{from: [{source: {namespaces: [x]}}], to: [{operation: {methods: [GET]}}]}]",
        )
        .expect("valid");
        let e = spec(ConfigKind::AuthorizationPolicy, "action: CUSTOM").unwrap_err();
        assert!(e.contains("CUSTOM"), "{e}");
        let e = spec(
            ConfigKind::AuthorizationPolicy,
            "action: CUSTOM\nprovider: {name: ext}",
        )
        .unwrap_err();
        assert!(e.contains("spec.provider"), "{e}");
        let e = spec(
            ConfigKind::AuthorizationPolicy,
            "targetRefs: [{kind: Gateway}]",
        )
        .unwrap_err();
        assert!(e.contains("spec.targetRefs"), "{e}");
    }
}
