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
        serde_json::json!({"keys": [self.jwk(Some(self.kid))]}).to_string()
    }

    /// The public key as a JWK, with this key id or none.
    fn jwk(&self, kid: Option<&str>) -> serde_json::Value {
        let raw = self.key.public_key_raw();
        let mut jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
            "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
        });
        if let Some(kid) = kid {
            jwk["kid"] = kid.into();
        }
        jwk
    }

    fn token(&self, claims: serde_json::Value) -> String {
        self.token_with_kid(Some(self.kid), claims)
    }

    fn token_with_kid(&self, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_string);
        let key = EncodingKey::from_ec_der(&self.key.serialize_der());
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
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
    assert_eq!(caller.source, CredentialSource::Token);
    assert_eq!(caller.identities, vec![identity("shop", "web")]);
    // The cluster whose keys verified it, not the one a header or node names.
    assert_eq!(caller.cluster, ProvenCluster::Token("west".into()));
    // With istio-agent's clusterid header, only that cluster's keys count.
    let named = with_token(west.token(claims("shop", "web")), Some("west"));
    assert_eq!(
        auth.authenticate(&named).unwrap().cluster,
        ProvenCluster::Token("west".into())
    );
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
    assert_eq!(caller.source, CredentialSource::Certificate);
    assert_eq!(caller.cluster, ProvenCluster::Certificate);
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
        source: CredentialSource::Token,
        cluster: ProvenCluster::Token("east".into()),
        node: None,
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

#[test]
fn a_token_two_clusters_keys_verify_proves_no_cluster() {
    // Two clusters built with the same signing key: without the clusterid header the token
    // could be either's, so it proves neither (gateway credentials need a proven cluster).
    let shared = Signer::new("shared");
    let auth = authenticator(&[("east", &shared), ("west", &shared)]);
    let token = shared.token(claims("istio-system", "ingress"));
    let caller = auth.authenticate(&with_token(token.clone(), None)).unwrap();
    assert_eq!(caller.identities, vec![identity("istio-system", "ingress")]);
    assert_eq!(caller.cluster, ProvenCluster::Ambiguous);
    // The header restricts the check to one cluster's keys: that one is proven.
    let named = auth.authenticate(&with_token(token, Some("east"))).unwrap();
    assert_eq!(named.cluster, ProvenCluster::Token("east".into()));
}

#[test]
fn the_verified_identity_is_the_callers_service_accounts_in_the_proxys_namespace() {
    let caller = Caller {
        identities: vec![
            identity("istio-system", "ingress"),
            identity("shop", "web"),
            identity("istio-system", "backup"),
        ],
        source: CredentialSource::Certificate,
        cluster: ProvenCluster::Certificate,
        node: None,
    };
    let mut proxy = crate::testutil::router_proxy("istio-system", &[]);
    // What the node claims plays no part.
    proxy.service_account = Some("ingress".into());
    proxy.cluster_id = "elsewhere".into();
    let v = verified_identity(&proxy, &caller);
    assert_eq!(
        v.service_accounts.into_iter().collect::<Vec<_>>(),
        ["backup", "ingress"]
    );
    assert_eq!(v.cluster, ProvenCluster::Certificate);
}

#[test]
fn a_token_not_valid_yet_is_refused() {
    let east = Signer::new("k");
    let auth = authenticator(&[("east", &east)]);
    let mut future = claims("shop", "web");
    future["nbf"] = (now() + 3600).into();
    let e = auth
        .authenticate(&with_token(east.token(future), None))
        .unwrap_err();
    assert_eq!(e.reason(), "invalid_token", "{e}");
    assert!(e.to_string().contains("ImmatureSignature"), "{e}");
    // Within the leeway `exp` has (60 s): a signer's clock a little ahead.
    let mut soon = claims("shop", "web");
    soon["nbf"] = (now() + 30).into();
    assert!(auth
        .authenticate(&with_token(east.token(soon), None))
        .is_ok());
    let mut past = claims("shop", "web");
    past["nbf"] = (now() - 60).into();
    assert!(auth
        .authenticate(&with_token(east.token(past), None))
        .is_ok());
}

/// A made-up RSA public key (never verifies anything here; only its type matters).
fn rsa_jwk() -> serde_json::Value {
    serde_json::json!({"kty": "RSA", "alg": "RS256", "n": b64(&[0xc3; 256]), "e": "AQAB"})
}

#[test]
fn a_token_without_kid_is_checked_against_a_few_fitting_keys_only() {
    // East publishes two RSA keys and six EC keys, none with a key id; west six EC keys
    // with key ids.
    let east: Vec<Signer> = (0..6).map(|_| Signer::new("unused")).collect();
    let west: Vec<Signer> = (0..6).map(|_| Signer::new("unused")).collect();
    let mut east_keys = vec![rsa_jwk(), rsa_jwk()];
    east_keys.extend(east.iter().map(|s| s.jwk(None)));
    let west_keys: Vec<_> = west
        .iter()
        .enumerate()
        .map(|(i, s)| s.jwk(Some(&format!("w{i}"))))
        .collect();
    let issuers = Issuers::default();
    for (cluster, keys) in [("east", east_keys), ("west", west_keys)] {
        issuers
            .set(&ClusterIssuer {
                cluster: cluster.into(),
                issuer: ISSUER.into(),
                jwks: serde_json::json!({ "keys": keys }).to_string(),
            })
            .unwrap();
    }
    let auth = Authenticator::new(
        issuers.clone(),
        vec![DEFAULT_AUDIENCE.into()],
        "cluster.local",
    );
    let chosen = |alg, kid: Option<&str>, cluster: Option<&str>| {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_string);
        candidate_keys(&issuers.read(), &header, cluster)
            .iter()
            .map(|(id, _, key)| (id.to_string(), key.algorithm, key.kid.clone()))
            .collect::<Vec<_>>()
    };

    // A kid-less ES256 token: the first four EC keys, never an RSA key.
    let es = chosen(Algorithm::ES256, None, None);
    assert_eq!(es.len(), MAX_KEYS_WITHOUT_KID, "{es:?}");
    assert!(es
        .iter()
        .all(|(id, alg, _)| id == "east" && *alg == Algorithm::ES256));
    // A kid-less RS256 token: the RSA keys only.
    let rs = chosen(Algorithm::RS256, None, None);
    assert_eq!(rs.len(), 2, "{rs:?}");
    assert!(rs.iter().all(|(_, alg, _)| *alg == Algorithm::RS256));
    // A token with a key id: the key of that id (wherever it is), and guesses among the
    // keys published without one, bounded as well.
    let w5 = chosen(Algorithm::ES256, Some("w5"), None);
    assert_eq!(w5.len(), MAX_KEYS_WITHOUT_KID + 1, "{w5:?}");
    assert!(w5.contains(&("west".into(), Algorithm::ES256, Some("w5".into()))));
    assert_eq!(chosen(Algorithm::ES256, Some("w5"), Some("west")).len(), 1);

    // What that means for tokens: the fourth kid-less key verifies, the fifth is never
    // tried; a key id finds its key however many keys there are.
    let sa = || claims("shop", "web");
    assert!(auth
        .authenticate(&with_token(east[3].token_with_kid(None, sa()), None))
        .is_ok());
    let e = auth
        .authenticate(&with_token(east[4].token_with_kid(None, sa()), None))
        .unwrap_err();
    assert_eq!(e.reason(), "unknown_issuer", "{e}");
    assert!(auth
        .authenticate(&with_token(west[5].token_with_kid(Some("w5"), sa()), None))
        .is_ok());
}
