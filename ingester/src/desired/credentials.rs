//! Gateway TLS credentials: the Kubernetes Secrets that Gateway servers name in
//! `tls.credentialName`, sealed for the bus ([`shoal_common::credential`]).
//!
//! Only Secrets a Gateway in the same namespace references are published (istiod's rule:
//! a gateway reads credentials from its own namespace): `<credentialName>` and, for the
//! client CA of `MUTUAL` servers, `<credentialName>-cacert`. Key names follow Istio:
//! `tls.crt`/`tls.key`/`ca.crt` (`kubernetes.io/tls`), else `cert`/`key`/`cacert`.

use crate::desired::{StateKey, StateObject};
use crate::error::InvalidObject;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use shoal_common::bus::Bucket;
use shoal_common::credential::{CredentialKeys, TlsCredential};
use shoal_common::keys;
use shoal_common::model::{ConfigObject, ConfigSpec, ObjectMeta};
use std::collections::{BTreeMap, BTreeSet};

/// The suffix of the Secret holding a `MUTUAL` server's client CA (Istio's convention).
pub const CACERT_SUFFIX: &str = "-cacert";

/// The Secrets Gateways reference, by namespace: every `credentialName` and its `-cacert`.
pub fn referenced(gateways: impl IntoIterator<Item = ConfigObject>) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for gw in gateways {
        // A Gateway API listener's certificate: a Secret of the Gateway's namespace
        // (ingest refuses others), served as the translated server's `credentialName`.
        if let ConfigSpec::KubeGateway(spec) = &gw.spec {
            for l in &spec.listeners {
                for r in l.tls.iter().flat_map(|t| &t.certificate_refs) {
                    out.insert((gw.meta.namespace.clone(), r.name.clone()));
                }
            }
            continue;
        }
        let ConfigSpec::Gateway(spec) = &gw.spec else {
            continue;
        };
        for server in &spec.servers {
            if let Some(name) = server.tls.as_ref().and_then(|t| t.credential_name.as_ref()) {
                out.insert((gw.meta.namespace.clone(), name.clone()));
                out.insert((gw.meta.namespace.clone(), format!("{name}{CACERT_SUFFIX}")));
            }
        }
    }
    out
}

/// The data keys a credential is read from (Istio's names).
const CREDENTIAL_KEYS: [&str; 6] = ["tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert"];

/// A watched Secret reduced to what a credential needs: name, namespace and the
/// credential keys of its data (other keys, labels and annotations dropped), so the
/// ingester keeps no other secret data in memory.
pub fn reduce(secret: KubeSecret) -> KubeSecret {
    let mut out = KubeSecret::default();
    out.metadata.name = secret.metadata.name;
    out.metadata.namespace = secret.metadata.namespace;
    out.data = secret.data.map(|d| {
        d.into_iter()
            .filter(|(k, _)| CREDENTIAL_KEYS.contains(&k.as_str()))
            .collect()
    });
    out
}

/// The credential a Secret holds, by Istio's key names; an error names what is missing.
pub fn credential(secret: &KubeSecret) -> Result<TlsCredential, InvalidObject> {
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        let text = String::from_utf8(v.0.clone())
            .map_err(|_| InvalidObject::new(format!("data.{k} is not PEM text (not UTF-8)")))?;
        data.insert(k.clone(), text);
    }
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.clone());
    }
    let take = |k: &str| data.get(k).filter(|v| !v.trim().is_empty()).cloned();
    let (cert, key, ca) = if data.contains_key("tls.crt") || data.contains_key("tls.key") {
        (take("tls.crt"), take("tls.key"), take("ca.crt"))
    } else {
        (take("cert"), take("key"), take("cacert"))
    };
    match (&cert, &key, &ca) {
        (Some(_), None, _) => Err(InvalidObject::new(
            "data has a certificate but no private key (tls.key or key)",
        )),
        (None, Some(_), _) => Err(InvalidObject::new(
            "data has a private key but no certificate (tls.crt or cert)",
        )),
        (None, None, None) => Err(InvalidObject::new(
            "data holds no credential (tls.crt/tls.key/ca.crt or cert/key/cacert)",
        )),
        _ => Ok(TlsCredential {
            cert_chain: cert,
            private_key: key,
            ca_cert: ca,
        }),
    }
}

/// The bus entries of the referenced Secrets of `cluster`, sealed for that cluster and keyed
/// by it ([`keys::credential_key`]); Secrets that hold no credential are logged and
/// skipped. Without keys nothing is published (credentials never go on the bus in the
/// clear) and each referenced Secret is logged.
pub fn entries<'a>(
    cluster: &str,
    secrets: impl IntoIterator<Item = &'a KubeSecret>,
    referenced: &BTreeSet<(String, String)>,
    keys: Option<&CredentialKeys>,
) -> Vec<(StateKey, StateObject)> {
    let mut out = Vec::new();
    for secret in secrets {
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let name = secret.metadata.name.clone().unwrap_or_default();
        if !referenced.contains(&(ns.clone(), name.clone())) {
            continue;
        }
        let Some(keys) = keys else {
            tracing::warn!(
                secret = %format!("{ns}/{name}"),
                "a Gateway references this Secret, but the ingester has no \
                 --credential-key-file: gateway credentials are not published"
            );
            continue;
        };
        let cred = match credential(secret) {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(secret = %format!("{ns}/{name}"), %error, "skipping gateway credential");
                continue;
            }
        };
        let sealed = keys.seal(cluster, &ns, &name, &cred);
        let obj = ConfigObject {
            meta: ObjectMeta {
                name: name.clone(),
                namespace: ns.clone(),
                ..Default::default()
            },
            spec: ConfigSpec::Credential(sealed),
        };
        let key = keys::credential_key(cluster, &ns, &name);
        out.push(((Bucket::Config, key), StateObject::Config(obj)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(ns: &str, name: &str, data: &[(&str, &str)]) -> KubeSecret {
        let mut s = KubeSecret::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    #[test]
    fn reads_tls_and_generic_secrets() {
        let tls = credential(&secret(
            "gw",
            "c",
            &[("tls.crt", "CERT"), ("tls.key", "KEY"), ("ca.crt", "CA")],
        ))
        .unwrap();
        assert_eq!(tls.cert_chain.as_deref(), Some("CERT"));
        assert_eq!(tls.ca_cert.as_deref(), Some("CA"));
        let generic = credential(&secret("gw", "c", &[("cert", "C"), ("key", "K")])).unwrap();
        assert_eq!(generic.private_key.as_deref(), Some("K"));
        let ca_only = credential(&secret("gw", "c-cacert", &[("cacert", "CA")])).unwrap();
        assert_eq!(ca_only.cert_chain, None);
        let e = credential(&secret("gw", "c", &[("tls.crt", "C")])).unwrap_err();
        assert!(e.reason.contains("no private key"), "{}", e.reason);
        let e = credential(&secret("gw", "c", &[("other", "x")])).unwrap_err();
        assert!(e.reason.contains("no credential"), "{}", e.reason);
    }

    #[test]
    fn publishes_only_referenced_secrets_sealed() {
        let keys = CredentialKeys::ephemeral();
        let referenced: BTreeSet<_> = [("gw".to_string(), "c".to_string())].into();
        let secrets = [
            secret("gw", "c", &[("tls.crt", "CERT"), ("tls.key", "PRIVATEKEY")]),
            secret(
                "other",
                "c",
                &[("tls.crt", "CERT"), ("tls.key", "PRIVATEKEY")],
            ),
            secret(
                "gw",
                "unrelated",
                &[("tls.crt", "CERT"), ("tls.key", "PRIVATEKEY")],
            ),
        ];
        let out = entries("c1", &secrets, &referenced, Some(&keys));
        assert_eq!(out.len(), 1);
        let ((bucket, key), StateObject::Config(obj)) = &out[0] else {
            panic!("a config entry")
        };
        assert_eq!(
            (*bucket, key.as_str()),
            (Bucket::Config, "Credential.c1.gw.c")
        );
        let body = StateObject::Config(obj.clone()).encode_body().unwrap();
        assert!(!body.windows(10).any(|w| w == b"PRIVATEKEY"));
        let ConfigSpec::Credential(sealed) = &obj.spec else {
            panic!("a credential")
        };
        assert_eq!(
            keys.open("c1", "gw", "c", sealed)
                .unwrap()
                .private_key
                .as_deref(),
            Some("PRIVATEKEY")
        );
        assert!(
            keys.open("c2", "gw", "c", sealed).is_err(),
            "another cluster's"
        );
        assert!(entries("c1", &secrets, &referenced, None).is_empty());
    }
}
