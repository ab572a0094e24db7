//! Gateway TLS credentials (the Kubernetes Secrets a Gateway server names in
//! `credentialName`) and their sealing for the bus.
//!
//! A credential never travels in the clear: the ingester seals it with AES-256-GCM under a
//! key both tiers read from a key file ([`CredentialKeys`]), and servers open it in memory.
//! The associated data is the Secret's cluster, namespace and name, so a sealed value copied
//! to another key on the bus (another Secret, or the same Secret name of another cluster)
//! does not open. The nonce is derived from the key, the associated
//! data and the plaintext (HMAC-SHA256, SIV-style): sealing the same Secret twice gives
//! the same bytes, so an unchanged Secret is never rewritten (the ingester compares
//! content), and a nonce repeats only for identical messages.

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hmac;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// A credential that could not be sealed, opened or read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The key file could not be read.
    #[error("cannot read credential key file {path}: {source}")]
    KeyFile {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of the key file is not a base64-encoded 32-byte key.
    #[error("credential key file {path}, line {line}: not a base64-encoded 32-byte key")]
    BadKey {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
    },
    /// The key file holds no key.
    #[error("credential key file {path} holds no key")]
    NoKey {
        /// The file.
        path: String,
    },
    /// The value was sealed with a key this process does not have.
    #[error("sealed with key {key_id:?}, which the credential key file does not hold")]
    UnknownKey {
        /// The key id in the sealed value.
        key_id: String,
    },
    /// The value does not open (tampered, or sealed for another Secret).
    #[error("sealed value does not open (tampered, or moved from another Secret)")]
    Open,
    /// The opened value is not a credential.
    #[error("opened value does not decode: {0}")]
    Decode(String),
}

/// A TLS credential in the clear (memory only). `Debug` never shows the private key.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct TlsCredential {
    /// PEM certificate chain (`tls.crt` or `cert`), if the Secret has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_chain: Option<String>,
    /// PEM private key (`tls.key` or `key`), if the Secret has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// PEM CA bundle for client validation (`ca.crt` or `cacert`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
}

impl std::fmt::Debug for TlsCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCredential")
            .field("cert_chain", &self.cert_chain.as_ref().map(|c| c.len()))
            .field(
                "private_key",
                &self.private_key.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_cert", &self.ca_cert.as_ref().map(|c| c.len()))
            .finish()
    }
}

/// A sealed [`TlsCredential`]: what `shoal-config` holds under
/// `Credential.<cluster>.<ns>.<name>` ([`crate::keys::credential_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct SealedCredential {
    /// The cluster whose Secret it is (bound into the sealed value: it opens for this
    /// cluster only).
    pub cluster: String,
    /// Which key sealed it ([`CredentialKeys`] key id).
    pub key_id: String,
    /// Base64 of nonce ‖ AES-256-GCM ciphertext ‖ tag.
    pub sealed: String,
}

struct CredentialKey {
    id: String,
    aead: LessSafeKey,
    nonce_key: hmac::Key,
}

/// The credential keys of a process: the first seals, every one opens (rotation: add the
/// new key second everywhere, then make it first, then drop the old one).
pub struct CredentialKeys {
    keys: Vec<CredentialKey>,
}

impl std::fmt::Debug for CredentialKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("CredentialKeys").field("ids", &ids).finish()
    }
}

impl CredentialKeys {
    /// Reads a key file: one base64-encoded 32-byte key per line; blank lines and `#`
    /// comments are skipped.
    pub fn load(path: &Path) -> Result<CredentialKeys, CredentialError> {
        let text = std::fs::read_to_string(path).map_err(|source| CredentialError::KeyFile {
            path: path.display().to_string(),
            source,
        })?;
        CredentialKeys::parse(&text, &path.display().to_string())
    }

    /// Parses key file contents (`origin` names the file in errors).
    pub fn parse(text: &str, origin: &str) -> Result<CredentialKeys, CredentialError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || CredentialError::BadKey {
                path: origin.to_string(),
                line: i + 1,
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(line)
                .map_err(|_| bad())?;
            if bytes.len() != 32 {
                return Err(bad());
            }
            keys.push(CredentialKey::new(&bytes).ok_or_else(bad)?);
        }
        if keys.is_empty() {
            return Err(CredentialError::NoKey {
                path: origin.to_string(),
            });
        }
        Ok(CredentialKeys { keys })
    }

    /// A fresh random key, for a process that seals and opens by itself (standalone mode).
    pub fn ephemeral() -> CredentialKeys {
        use ring::rand::SecureRandom as _;
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system random generator works");
        let key = CredentialKey::new(&bytes).expect("32 bytes make an AES-256 key");
        CredentialKeys { keys: vec![key] }
    }

    /// The id of the sealing key.
    pub fn sealing_key_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Seals a credential for the Secret `namespace/name` of `cluster`.
    pub fn seal(
        &self,
        cluster: &str,
        namespace: &str,
        name: &str,
        credential: &TlsCredential,
    ) -> SealedCredential {
        let key = &self.keys[0];
        let aad = aad(cluster, namespace, name);
        let mut data = rmp_serde::to_vec_named(credential).expect("a credential always encodes");
        let mut mac_input = Vec::with_capacity(aad.len() + data.len() + 1);
        mac_input.extend_from_slice(aad.as_bytes());
        mac_input.push(0);
        mac_input.extend_from_slice(&data);
        let tag = hmac::sign(&key.nonce_key, &mac_input);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&tag.as_ref()[..NONCE_LEN]);
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .expect("AES-GCM seals any message under 64 GiB");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        SealedCredential {
            cluster: cluster.to_string(),
            key_id: key.id.clone(),
            sealed: base64::engine::general_purpose::STANDARD.encode(out),
        }
    }

    /// Opens a credential sealed for the Secret `namespace/name` of `cluster`.
    pub fn open(
        &self,
        cluster: &str,
        namespace: &str,
        name: &str,
        sealed: &SealedCredential,
    ) -> Result<TlsCredential, CredentialError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.id == sealed.key_id)
            .ok_or_else(|| CredentialError::UnknownKey {
                key_id: sealed.key_id.clone(),
            })?;
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&sealed.sealed)
            .map_err(|_| CredentialError::Open)?;
        if bytes.len() < NONCE_LEN {
            return Err(CredentialError::Open);
        }
        let mut ciphertext = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| CredentialError::Open)?;
        let aad = aad(cluster, namespace, name);
        let plain = key
            .aead
            .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut ciphertext)
            .map_err(|_| CredentialError::Open)?;
        rmp_serde::from_slice(plain).map_err(|e| CredentialError::Decode(e.to_string()))
    }
}

impl CredentialKey {
    fn new(bytes: &[u8]) -> Option<CredentialKey> {
        let digest = Sha256::digest(bytes);
        let id: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        // Separate keys for encryption and nonce derivation, both derived from the file key.
        let derive = |label: &[u8]| {
            let mut h = Sha256::new();
            h.update(label);
            h.update(bytes);
            h.finalize()
        };
        let enc = derive(b"shoal credential aead\0");
        let mac = derive(b"shoal credential nonce\0");
        Some(CredentialKey {
            id,
            aead: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &enc).ok()?),
            nonce_key: hmac::Key::new(hmac::HMAC_SHA256, &mac),
        })
    }
}

/// The associated data of a Secret's sealed value. NUL never occurs in a cluster ID, a
/// namespace or a name, so no two Secrets share it, and no value sealed before clusters
/// were bound (`<namespace>/<name>`) opens.
fn aad(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{cluster}\0{namespace}\0{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEY_B: &str = "HxweHRwbGhkYFxYVFBMSERAPDg0MCwoJCAcGBQQDAgE=";

    fn cred() -> TlsCredential {
        TlsCredential {
            cert_chain: Some("-----BEGIN CERTIFICATE-----\nCERT\n".into()),
            private_key: Some("-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYBYTES\n".into()),
            ca_cert: None,
        }
    }

    #[test]
    fn seals_deterministically_and_opens() {
        let keys = CredentialKeys::parse(KEY_A, "test").unwrap();
        let a = keys.seal("c1", "ns", "cert", &cred());
        assert_eq!(
            a,
            keys.seal("c1", "ns", "cert", &cred()),
            "same input, same bytes"
        );
        assert!(!a.sealed.contains("TOPSECRET"));
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&a.sealed)
            .unwrap();
        assert!(!raw.windows(9).any(|w| w == b"TOPSECRET"));
        assert_eq!(keys.open("c1", "ns", "cert", &a).unwrap(), cred());
        let mut other = cred();
        other.private_key = Some("other".into());
        assert_ne!(keys.seal("c1", "ns", "cert", &other), a);
    }

    #[test]
    fn refuses_moved_tampered_and_unknown() {
        let keys = CredentialKeys::parse(KEY_A, "test").unwrap();
        let a = keys.seal("c1", "ns", "cert", &cred());
        assert!(matches!(
            keys.open("c1", "other", "cert", &a),
            Err(CredentialError::Open)
        ));
        // The same Secret name of another cluster is another Secret.
        assert_eq!(a.cluster, "c1");
        assert!(matches!(
            keys.open("c2", "ns", "cert", &a),
            Err(CredentialError::Open)
        ));
        let mut t = a.clone();
        t.sealed
            .replace_range(20..21, if &t.sealed[20..21] == "A" { "B" } else { "A" });
        assert!(matches!(
            keys.open("c1", "ns", "cert", &t),
            Err(CredentialError::Open)
        ));
        let b = CredentialKeys::parse(KEY_B, "test").unwrap();
        assert!(matches!(
            b.open("c1", "ns", "cert", &a),
            Err(CredentialError::UnknownKey { .. })
        ));
    }

    #[test]
    fn rotation_opens_with_any_key_and_seals_with_the_first() {
        let old = CredentialKeys::parse(KEY_A, "t").unwrap();
        let both =
            CredentialKeys::parse(&format!("# new first\n{KEY_B}\n\n{KEY_A}\n"), "t").unwrap();
        let sealed_old = old.seal("c1", "ns", "c", &cred());
        assert_eq!(both.open("c1", "ns", "c", &sealed_old).unwrap(), cred());
        assert_ne!(both.sealing_key_id(), old.sealing_key_id());
        assert_eq!(
            both.seal("c1", "ns", "c", &cred()).key_id,
            both.sealing_key_id()
        );
    }

    #[test]
    fn bad_key_files_name_the_line() {
        let e = CredentialKeys::parse("# c\nnot-base64!\n", "f").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = CredentialKeys::parse("AAAA\n", "f").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(matches!(
            CredentialKeys::parse("\n# only\n", "f"),
            Err(CredentialError::NoKey { .. })
        ));
        let debug = format!("{:?}", cred());
        assert!(!debug.contains("TOPSECRET"), "{debug}");
    }
}
