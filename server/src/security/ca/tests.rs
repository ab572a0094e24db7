use super::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa};

/// Writes Istio's `cacerts` layout for a new self-signed root into `dir`.
fn cacerts(dir: &Path) {
    cacerts_until(dir, rcgen::date_time_ymd(2036, 1, 1));
}

/// [`cacerts`] with a root valid until `not_after`.
pub(crate) fn cacerts_until(dir: &Path, not_after: time::OffsetDateTime) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "test root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = not_after - time::Duration::days(3650);
    params.not_after = not_after;
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("ca-cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("ca-key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("root-cert.pem"), cert.pem()).unwrap();
}

fn csr(uri: &str) -> String {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
    let key = KeyPair::generate().unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn web() -> Identity {
    Identity {
        trust_domain: "cluster.local".into(),
        namespace: "shop".into(),
        service_account: "web".into(),
    }
}

#[test]
fn signs_the_callers_identity_only_for_the_allowed_time() {
    let dir = tempfile_dir();
    cacerts(dir.path());
    let ca = Ca::load(dir.path()).unwrap();
    // The CSR asks for another identity: the certificate still names the caller's only.
    let chain = ca
        .sign(&csr("spiffe://cluster.local/ns/bank/sa/admin"), &[web()], 0)
        .unwrap();
    assert_eq!(chain.len(), 2, "leaf and root: {chain:?}");
    assert_eq!(chain[1], ca.root());
    // Expiry of the root and of the signing CA (here the same certificate), for the gauges.
    assert_eq!(ca.root_expiry(), 2_082_758_400, "2036-01-01T00:00:00Z");
    assert_eq!(ca.chain_expiry(), ca.root_expiry());
    let der = rustls_pki_types::CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
    assert_eq!(crate::security::auth::spiffe_identities(&der), vec![web()]);
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let validity = cert.validity().time_to_expiration().unwrap();
    assert!(
        validity.whole_seconds() > (DEFAULT_TTL - Duration::from_secs(60)).as_secs() as i64
            && validity.whole_seconds() <= DEFAULT_TTL.as_secs() as i64,
        "{validity:?}"
    );

    let one_hour = ca.sign(&csr("x://y"), &[web()], 3600).unwrap();
    assert_eq!(one_hour.len(), 2);
    let too_long = ca.sign(&csr("x://y"), &[web()], MAX_TTL.as_secs() as i64 + 1);
    assert_eq!(too_long.unwrap_err().result().as_str(), "bad_ttl");
    assert_eq!(
        ca.sign(&csr("x://y"), &[web()], -1)
            .unwrap_err()
            .result()
            .as_str(),
        "bad_ttl"
    );
    assert_eq!(
        ca.sign("garbage", &[web()], 0)
            .unwrap_err()
            .result()
            .as_str(),
        "bad_csr"
    );
}

#[test]
fn unusable_cacerts_name_the_file() {
    let dir = tempfile_dir();
    let e = Ca::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("ca-key.pem"), "{e}");
    cacerts(dir.path());
    std::fs::write(dir.path().join("root-cert.pem"), "").unwrap();
    let e = Ca::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("root-cert.pem"), "{e}");
}

#[test]
fn serving_certificates_name_the_dns_names_and_never_outlive_the_ca() {
    let dir = tempfile_dir();
    cacerts(dir.path());
    let ca = Ca::load(dir.path()).unwrap();
    let names = vec![
        "shoal-server.istio-system.svc".to_string(),
        "istiod.istio-system.svc".into(),
    ];
    let issued = ca.issue_serving(&names, DEFAULT_TTL).unwrap();
    // The root signs directly: the chain is the leaf alone (clients hold the root).
    assert_eq!(issued.chain.len(), 1, "{:?}", issued.chain);
    assert_eq!(
        issued.not_after - issued.not_before,
        DEFAULT_TTL.as_secs() as i64 + 120
    );
    let der = rustls_pki_types::CertificateDer::from_pem_slice(issued.chain[0].as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        sans,
        vec![
            "DNSName(shoal-server.istio-system.svc)",
            "DNSName(istiod.istio-system.svc)"
        ]
    );
    assert!(!cert.is_ca());
    assert_eq!(cert.validity().not_after.timestamp(), issued.not_after);
    // The key is the certificate's.
    let key = KeyPair::from_pem(&issued.key).unwrap();
    assert_eq!(
        key.public_key_raw(),
        cert.public_key().subject_public_key.data.as_ref()
    );

    // A validity beyond the signing certificate ends with it.
    let long = ca
        .issue_serving(&names, Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap();
    assert_eq!(long.not_after, ca.chain_expiry());
    // A name that is not a DNS name is refused, naming it.
    let e = ca
        .issue_serving(&["bad name\u{0}".to_string()], DEFAULT_TTL)
        .err()
        .unwrap();
    assert!(e.to_string().contains("bad name"), "{e}");
}

fn openssl(args: &[&str], dir: &Path) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (Debian package openssl)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openssl {args:?}: {stderr}");
}

#[test]
fn a_pkcs1_rsa_ca_key_signs_and_a_sec1_key_is_named() {
    // Helm's genCA (the chart's generated root) and Istio's sample cacerts hold an
    // `RSA PRIVATE KEY` (PKCS#1).
    let dir = tempfile_dir();
    let d = dir.path();
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "k8.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "30",
            "-subj",
            "/CN=rsa root",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        d,
    );
    openssl(
        &["rsa", "-traditional", "-in", "k8.pem", "-out", "ca-key.pem"],
        d,
    );
    std::fs::copy(d.join("ca-cert.pem"), d.join("root-cert.pem")).unwrap();
    let key = std::fs::read_to_string(d.join("ca-key.pem")).unwrap();
    assert!(key.starts_with("-----BEGIN RSA PRIVATE KEY-----"), "{key}");
    let ca = Ca::load(d).unwrap();
    let chain = ca.sign(&csr("x://y"), &[web()], 0).unwrap();
    assert_eq!(chain.len(), 2);
    let issued = ca
        .issue_serving(&["shoal.example".to_string()], DEFAULT_TTL)
        .unwrap();
    assert_eq!(issued.chain.len(), 1);

    // An EC key in SEC1 form: the error says how to convert it.
    openssl(
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ca-key.pem",
        ],
        d,
    );
    let e = Ca::load(d).err().unwrap().to_string();
    assert!(
        e.contains("ca-key.pem") && e.contains("openssl pkcs8"),
        "{e}"
    );
}

fn tempfile_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

use rustls_pki_types::pem::PemObject;
