//! The workload certificate authority: istiod's `CreateCertificate`
//! (`security/pkg/server/ca/server.go`), on the TLS xDS port.
//!
//! The caller is authenticated as on xDS streams ([`crate::security::auth`]: SPIFFE client
//! certificate or service-account token, verified offline), so any server replica can sign.
//! The certificate's only SAN is the caller's own identity; the CSR contributes its public
//! key and nothing else (its SANs and subject are ignored, as istiod does). Impersonation
//! (`ImpersonatedIdentity`) is allowed only to a node agent (ztunnel,
//! [`NODE_AGENT_ACCOUNTS`]) whose token names its node, and only for an identity with a pod
//! on that node (istiod's `NodeAuthorizer`); every refusal is counted by reason. Validity: the requested duration,
//! or [`DEFAULT_TTL`] (Istio's `DEFAULT_WORKLOAD_CERT_TTL`) when none is asked; above
//! [`MAX_TTL`] (Istio's `MAX_WORKLOAD_CERT_TTL`) the request is refused.
//!
//! Key material is Istio's `cacerts` layout, read from a directory and reloaded when it
//! changes ([`crate::security::reload`]; a plugged-in intermediate rotates without a restart): `ca-cert.pem` and
//! `ca-key.pem` (the signing CA, an intermediate or the root), `root-cert.pem`, and
//! optionally `cert-chain.pem` (the signing CA up to the root). The response is the new
//! certificate, then the chain, then the root, one PEM certificate per entry, as istiod
//! returns it.

use crate::security::auth::Identity;
use rcgen::{
    CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Validity when the request asks for none (Istio: 24 h).
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

/// Longest validity granted (Istio: 90 days).
pub const MAX_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

/// The service accounts (`namespace`, `name`) that may ask for other identities'
/// certificates (`ImpersonatedIdentity`): istiod's default `CA_TRUSTED_NODE_ACCOUNTS`,
/// ztunnel. Only for identities with a pod on the caller's own node.
pub const NODE_AGENT_ACCOUNTS: &[(&str, &str)] = &[("istio-system", "ztunnel")];

/// How far back a certificate's validity starts, for clocks slightly behind ours.
const BACKDATE: Duration = Duration::from_secs(120);

/// Why a CA cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CaLoadError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{path}: {error}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    /// The CSR does not parse or its signature does not verify.
    #[error("the CSR is not a valid PEM certificate request: {0}")]
    BadCsr(String),
    /// The requested validity is above [`MAX_TTL`].
    #[error("requested validity {requested:?} is above the maximum {max:?}")]
    TooLong {
        /// Requested.
        requested: Duration,
        /// Allowed.
        max: Duration,
    },
    /// A negative validity.
    #[error("requested validity {0} s is negative")]
    Negative(i64),
    /// Signing failed.
    #[error("signing failed: {0}")]
    Signing(String),
}

impl SignError {
    /// The outcome it is counted as.
    pub fn result(&self) -> CaResult {
        match self {
            SignError::BadCsr(_) => CaResult::BadCsr,
            SignError::TooLong { .. } | SignError::Negative(_) => CaResult::BadTtl,
            SignError::Signing(_) => CaResult::SigningError,
        }
    }
}

/// The outcome of a certificate request: the `result` label of `shoal_ca_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaResult {
    /// A certificate was issued.
    Issued,
    /// The caller did not authenticate (or asked on the plaintext port).
    Unauthenticated,
    /// The caller asked for another identity (`ImpersonatedIdentity`) and is not a node
    /// agent ([`NODE_AGENT_ACCOUNTS`]).
    ImpersonationNotNodeAgent,
    /// A node agent asked to impersonate, but its token names no node.
    ImpersonationUnknownNode,
    /// The impersonated identity is not a SPIFFE identity of the caller's trust domain.
    ImpersonationBadIdentity,
    /// No pod of the impersonated identity runs on the node agent's node.
    ImpersonationNotOnNode,
    /// The request could not be read.
    BadRequest,
    /// The CSR does not parse or is not signed by its key.
    BadCsr,
    /// The requested lifetime is out of range.
    BadTtl,
    /// Signing failed.
    SigningError,
}

impl CaResult {
    /// Every result.
    pub const ALL: [CaResult; 10] = [
        CaResult::Issued,
        CaResult::Unauthenticated,
        CaResult::ImpersonationNotNodeAgent,
        CaResult::ImpersonationUnknownNode,
        CaResult::ImpersonationBadIdentity,
        CaResult::ImpersonationNotOnNode,
        CaResult::BadRequest,
        CaResult::BadCsr,
        CaResult::BadTtl,
        CaResult::SigningError,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CaResult::Issued => "issued",
            CaResult::Unauthenticated => "unauthenticated",
            CaResult::ImpersonationNotNodeAgent => "impersonation_not_node_agent",
            CaResult::ImpersonationUnknownNode => "impersonation_unknown_node",
            CaResult::ImpersonationBadIdentity => "impersonation_bad_identity",
            CaResult::ImpersonationNotOnNode => "impersonation_not_on_node",
            CaResult::BadRequest => "bad_request",
            CaResult::BadCsr => "bad_csr",
            CaResult::BadTtl => "bad_ttl",
            CaResult::SigningError => "signing_error",
        }
    }
}

/// A loaded signing CA.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The signing CA up to (excluding) the root, PEM certificates.
    chain: Vec<String>,
    /// The root, PEM.
    root: String,
    /// When the root expires, Unix seconds.
    root_expiry: i64,
    /// When the first certificate of the signing chain (the signing CA, an intermediate or
    /// the root) expires, Unix seconds: issuance breaks then.
    chain_expiry: i64,
}

/// When a PEM certificate expires (Unix seconds).
fn expiry(path: &Path, pem: &str) -> Result<i64, CaLoadError> {
    use rustls_pki_types::pem::PemObject;
    let invalid = |error: String| CaLoadError::Invalid {
        path: path.to_path_buf(),
        error,
    };
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| invalid(format!("not an X.509 certificate: {e}")))?;
    Ok(cert.validity().not_after.timestamp())
}

fn read(path: &Path) -> Result<String, CaLoadError> {
    std::fs::read_to_string(path).map_err(|source| CaLoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The CA's key from PEM: PKCS#8 (`PRIVATE KEY`), or PKCS#1 (`RSA PRIVATE KEY`, what Helm's
/// `genCA`, `openssl genrsa -traditional` and Istio's sample `cacerts` hold), which the
/// signer (ring) takes only wrapped in PKCS#8.
fn signing_key(pem: &str) -> Result<KeyPair, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("no PEM private key: {e}"))?;
    let pkcs8 =
        match &key {
            PrivateKeyDer::Pkcs8(_) => key,
            PrivateKeyDer::Pkcs1(rsa) => PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                pkcs8_of_rsa(rsa.secret_pkcs1_der()),
            )),
            _ => return Err(
                "an EC PRIVATE KEY (SEC1): convert it to PKCS#8 (`openssl pkcs8 -topk8 -nocrypt`)"
                    .into(),
            ),
        };
    KeyPair::try_from(&pkcs8).map_err(|e| e.to_string())
}

/// PKCS#8 `PrivateKeyInfo` around a PKCS#1 RSA key (RFC 5208: version 0, rsaEncryption
/// with NULL parameters, the key as an OCTET STRING).
fn pkcs8_of_rsa(pkcs1: &[u8]) -> Vec<u8> {
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }
    // SEQUENCE { OID 1.2.840.113549.1.1.1, NULL }
    const RSA_ALGORITHM: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(RSA_ALGORITHM);
    body.extend(tlv(0x04, pkcs1));
    tlv(0x30, &body)
}

/// Splits a PEM bundle into its certificates (each ending with a newline).
fn certificates(pem: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in pem.lines() {
        let line = line.trim_end();
        if line == "-----BEGIN CERTIFICATE-----" {
            current.clear();
        }
        current.push_str(line);
        current.push('\n');
        if line == "-----END CERTIFICATE-----" {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

impl Ca {
    /// The files of Istio's `cacerts` layout in `dir` (to follow for changes).
    pub fn files(dir: &Path) -> Vec<PathBuf> {
        [
            "ca-cert.pem",
            "ca-key.pem",
            "root-cert.pem",
            "cert-chain.pem",
        ]
        .iter()
        .map(|f| dir.join(f))
        .collect()
    }

    /// Loads Istio's `cacerts` layout from `dir`.
    pub fn load(dir: &Path) -> Result<Ca, CaLoadError> {
        let (cert_path, key_path) = (dir.join("ca-cert.pem"), dir.join("ca-key.pem"));
        let root_path = dir.join("root-cert.pem");
        let invalid = |path: &Path, error: String| CaLoadError::Invalid {
            path: path.to_path_buf(),
            error,
        };
        let key = signing_key(&read(&key_path)?)
            .map_err(|e| invalid(&key_path, format!("not a usable private key: {e}")))?;
        let cert = read(&cert_path)?;
        let issuer = Issuer::from_ca_cert_pem(&cert, key)
            .map_err(|e| invalid(&cert_path, format!("not a usable CA certificate: {e}")))?;
        let root = certificates(&read(&root_path)?);
        let [root] = root.as_slice() else {
            return Err(invalid(
                &root_path,
                "must hold exactly one certificate".into(),
            ));
        };
        let chain_path = dir.join("cert-chain.pem");
        let mut chain = match chain_path.exists() {
            true => certificates(&read(&chain_path)?),
            false => certificates(&cert),
        };
        // The chain file of Istio's layout ends with the root, which is sent separately.
        chain.retain(|c| c != root);
        let root_expiry = expiry(&root_path, root)?;
        let chain_expiry = match certificates(&cert).first() {
            Some(signing) => expiry(&cert_path, signing)?,
            None => return Err(invalid(&cert_path, "holds no PEM certificate".into())),
        };
        Ok(Ca {
            issuer,
            chain,
            root: root.clone(),
            root_expiry,
            chain_expiry,
        })
    }

    /// The root certificate, PEM (what proxies trust: istio-ca-root-cert).
    pub fn root(&self) -> &str {
        &self.root
    }

    /// When the root expires, Unix seconds.
    pub fn root_expiry(&self) -> i64 {
        self.root_expiry
    }

    /// When the signing CA certificate (`ca-cert.pem`) expires, Unix seconds.
    pub fn chain_expiry(&self) -> i64 {
        self.chain_expiry
    }

    /// Signs `csr_pem` for `identities` (the caller's), valid for `requested_secs` (0: the
    /// default). Returns the chain: the new certificate, the signing chain, the root.
    pub fn sign(
        &self,
        csr_pem: &str,
        identities: &[Identity],
        requested_secs: i64,
    ) -> Result<Vec<String>, SignError> {
        let Some(first) = identities.first() else {
            return Err(SignError::Signing("no identity to certify".into()));
        };
        let ttl = match requested_secs {
            0 => DEFAULT_TTL,
            n if n < 0 => return Err(SignError::Negative(n)),
            n => Duration::from_secs(n as u64),
        };
        if ttl > MAX_TTL {
            return Err(SignError::TooLong {
                requested: ttl,
                max: MAX_TTL,
            });
        }
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| SignError::BadCsr(e.to_string()))?;
        let sans = identities
            .iter()
            .map(|id| {
                id.to_string()
                    .try_into()
                    .map(SanType::URI)
                    .map_err(|e| SignError::Signing(format!("identity {id} is not a URI: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let now = time::OffsetDateTime::now_utc();
        let params = &mut csr.params;
        params.subject_alt_names = sans;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, first.trust_domain.as_str());
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + ttl;
        params.use_authority_key_identifier_extension = true;
        let cert = csr
            .signed_by(&self.issuer)
            .map_err(|e| SignError::Signing(e.to_string()))?;
        let mut out = vec![cert.pem()];
        out.extend(self.chain.iter().cloned());
        out.push(self.root.clone());
        Ok(out)
    }

    /// Issues a serving certificate for `dns_names` (istiod's own "DNS certificate",
    /// `GenKeyCert`) with a new key, valid for `ttl` but never past the signing
    /// certificate. The chain is the new certificate then the signing chain, without the
    /// root (clients hold it: `istio-ca-root-cert`).
    pub fn issue_serving(&self, dns_names: &[String], ttl: Duration) -> Result<Issued, SignError> {
        let sans = dns_names
            .iter()
            .map(|name| {
                let bad =
                    |e: String| SignError::Signing(format!("{name:?} is not a DNS name: {e}"));
                rustls_pki_types::DnsName::try_from(name.as_str())
                    .map_err(|e| bad(e.to_string()))?;
                name.clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|e: rcgen::Error| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let now = time::OffsetDateTime::now_utc();
        let chain_end = time::OffsetDateTime::from_unix_timestamp(self.chain_expiry)
            .map_err(|e| SignError::Signing(format!("signing certificate expiry: {e}")))?;
        let not_after = (now + ttl).min(chain_end);
        if not_after <= now {
            return Err(SignError::Signing(
                "the signing CA certificate has expired".into(),
            ));
        }
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans;
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(first) = dns_names.first() {
            params
                .distinguished_name
                .push(DnType::CommonName, first.as_str());
        }
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now - BACKDATE;
        params.not_after = not_after;
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(|e| SignError::Signing(e.to_string()))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| SignError::Signing(e.to_string()))?;
        let mut chain = vec![cert.pem()];
        chain.extend(self.chain.iter().cloned());
        Ok(Issued {
            chain,
            key: key.serialize_pem(),
            not_before: (now - BACKDATE).unix_timestamp(),
            not_after: not_after.unix_timestamp(),
        })
    }
}

/// A certificate issued with a key of its own ([`Ca::issue_serving`]).
#[derive(Clone)]
pub struct Issued {
    /// The certificate, then the signing chain up to (excluding) the root, PEM.
    pub chain: Vec<String>,
    /// The private key, PEM (PKCS#8).
    pub key: String,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

#[cfg(test)]
pub(crate) mod tests;
