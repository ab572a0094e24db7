use super::*;
use crate::testutil::sidecar_proxy;
use base64::Engine;
use jsonwebtoken::{EncodingKey, Header};

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// A signing key and its JWKS, as a cluster's API server serves it.
struct Signer {
    key: rcgen::KeyPair,
    kid: &'static str,
}

impl Signer {
    fn new(kid: &'static str) -> Signer {
        Signer {
            key: rcgen::KeyPair::generate().unwrap(),
            kid,
        }
    }

    fn jwks(&self) -> String {
        let raw = self.key.public_key_raw();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
        }]})
        .to_string()
    }

    fn token(&self, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.into());
        let key = EncodingKey::from_ec_der(&self.key.serialize_der());
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims of a projected service-account token for istio-agent.
fn claims(ns: &str, sa: &str) -> serde_json::Value {
    serde_json::json!({
        "aud": ["istio-ca"], "iss": ISSUER, "iat": now(), "exp": now() + 3600,
        "sub": format!("system:serviceaccount:{ns}:{sa}"),
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": "u"},
                          "pod": {"name": "p", "uid": "u"}},
    })
}

fn authenticator(clusters: &[(&str, &Signer)]) -> Authenticator {
    let issuers = Issuers::default();
    for (cluster, signer) in clusters {
        issuers
            .set(&ClusterIssuer {
                cluster: cluster.to_string(),
                issuer: ISSUER.into(),
                jwks: signer.jwks(),
            })
            .unwrap();
    }
    Authenticator::new(issuers, vec![DEFAULT_AUDIENCE.into()], "cluster.local")
}

fn with_token(token: String, cluster: Option<&str>) -> Credentials {
    Credentials {
        token: Some(token),
        cluster_id: cluster.map(str::to_string),
        ..Credentials::default()
    }
}

fn identity(ns: &str, sa: &str) -> Identity {
    Identity {
        trust_domain: "cluster.local".into(),
        namespace: ns.into(),
        service_account: sa.into(),
    }
}

#[test]
fn spiffe_uris_parse_only_in_istios_form() {
    assert_eq!(
        Identity::parse("spiffe://cluster.local/ns/shop/sa/web"),
        Some(identity("shop", "web"))
    );
    for bad in [
        "spiffe://cluster.local/ns/shop",
        "spiffe://cluster.local/ns//sa/web",
        "https://cluster.local/ns/shop/sa/web",
        "spiffe://cluster.local/ns/shop/sa/web/extra",
        "spiffe:///ns/shop/sa/web",
    ] {
        assert_eq!(Identity::parse(bad), None, "{bad}");
    }
    assert_eq!(
        identity("shop", "web").to_string(),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
}

#[test]
fn a_valid_token_of_a_known_cluster_is_its_service_account() {
    let (east, west) = (Signer::new("east-1"), Signer::new("west-1"));
    // Both clusters use the default issuer name: the keys tell them apart.
    let auth = authenticator(&[("east", &east), ("west", &west)]);
    let caller = auth
        .authenticate(&with_token(west.token(claims("shop", "web")), None))
        .unwrap();
    assert_eq!(caller.source, "token");
    assert_eq!(caller.identities, vec![identity("shop", "web")]);
    // With istio-agent's clusterid header, only that cluster's keys count.
    let named = with_token(west.token(claims("shop", "web")), Some("west"));
    assert!(auth.authenticate(&named).is_ok());
    let wrong = with_token(west.token(claims("shop", "web")), Some("east"));
    assert_eq!(
        auth.authenticate(&wrong).unwrap_err().reason(),
        "unknown_issuer"
    );
}

#[test]
fn legacy_tokens_with_only_a_subject_still_name_their_service_account() {
    let east = Signer::new("k");
    let auth = authenticator(&[("east", &east)]);
    let mut c = claims("shop", "web");
    c.as_object_mut().unwrap().remove("kubernetes.io");
    let caller = auth.authenticate(&with_token(east.token(c), None)).unwrap();
    assert_eq!(caller.identities, vec![identity("shop", "web")]);
}

#[test]
fn bad_tokens_are_refused_with_their_reason() {
    let east = Signer::new("k");
    let stranger = Signer::new("k");
    let auth = authenticator(&[("east", &east)]);
    let reason = |token: String| auth.authenticate(&with_token(token, None)).unwrap_err();

    let mut expired = claims("shop", "web");
    expired["exp"] = (now() - 3600).into();
    let e = reason(east.token(expired));
    assert_eq!(e.reason(), "invalid_token", "{e}");
    assert!(e.to_string().contains("ExpiredSignature"), "{e}");

    let mut audience = claims("shop", "web");
    audience["aud"] = serde_json::json!(["kubernetes"]);
    assert_eq!(reason(east.token(audience)).reason(), "invalid_token");

    let mut issuer = claims("shop", "web");
    issuer["iss"] = "https://elsewhere".into();
    assert_eq!(reason(east.token(issuer)).reason(), "unknown_issuer");

    // Same key id, another key: an unknown signer, not this cluster's.
    assert_eq!(
        reason(stranger.token(claims("shop", "web"))).reason(),
        "unknown_issuer"
    );
    assert_eq!(reason("not-a-jwt".into()).reason(), "malformed_token");

    let mut anonymous = claims("shop", "web");
    let map = anonymous.as_object_mut().unwrap();
    map.remove("kubernetes.io");
    map.insert("sub".into(), "alice".into());
    assert_eq!(reason(east.token(anonymous)).reason(), "no_service_account");

    assert_eq!(
        auth.authenticate(&Credentials::default()).unwrap_err(),
        AuthError::NoCredentials
    );
    // Every refusal is Unauthenticated; only authorization is PermissionDenied.
    assert_eq!(
        AuthError::NoCredentials.status().code(),
        tonic::Code::Unauthenticated
    );
}

fn certificate(uris: &[&str]) -> CertificateDer<'static> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = uris
        .iter()
        .map(|u| rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap()))
        .collect();
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().clone()
}

#[test]
fn a_client_certificate_is_its_spiffe_identities() {
    let auth = authenticator(&[]);
    let creds = Credentials {
        certificates: vec![certificate(&[
            "https://example.com/not-spiffe",
            "spiffe://cluster.local/ns/shop/sa/web",
        ])],
        ..Credentials::default()
    };
    let caller = auth.authenticate(&creds).unwrap();
    assert_eq!(caller.source, "certificate");
    assert_eq!(caller.identities, vec![identity("shop", "web")]);

    let plain = Credentials {
        certificates: vec![certificate(&[])],
        ..Credentials::default()
    };
    assert_eq!(
        auth.authenticate(&plain).unwrap_err(),
        AuthError::NoSpiffeIdentity
    );
}

#[test]
fn a_proxy_gets_config_only_for_its_own_namespace_and_service_account() {
    let caller = Caller {
        identities: vec![identity("shop", "web")],
        source: "token",
    };
    let mut proxy = sidecar_proxy("shop", &[]);
    assert_eq!(authorize(&proxy, &caller), Ok(identity("shop", "web")));
    proxy.service_account = Some("web".into());
    assert!(authorize(&proxy, &caller).is_ok());
    proxy.service_account = Some("db".into());
    let e = authorize(&proxy, &caller).unwrap_err();
    assert_eq!(e.reason(), "forbidden");
    assert_eq!(e.status().code(), tonic::Code::PermissionDenied);
    assert!(e.to_string().contains("\"db\""), "{e}");
    let other = sidecar_proxy("bank", &[]);
    let e = authorize(&other, &caller).unwrap_err();
    assert!(
        e.to_string()
            .contains("spiffe://cluster.local/ns/shop/sa/web"),
        "{e}"
    );
}

#[test]
fn unusable_key_sets_are_errors_naming_the_cluster() {
    let issuers = Issuers::default();
    let record = |jwks: &str| ClusterIssuer {
        cluster: "east".into(),
        issuer: ISSUER.into(),
        jwks: jwks.into(),
    };
    let e = issuers.set(&record("nope")).unwrap_err();
    assert!(e.to_string().contains("east"), "{e}");
    let e = issuers
        .set(&record(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#))
        .unwrap_err();
    assert!(matches!(e, IssuerError::NoKeys { .. }), "{e}");
    assert!(issuers.clusters().is_empty());
}
