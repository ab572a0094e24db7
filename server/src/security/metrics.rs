//! Metrics of the secure port's certificates, the token issuers and the workload CA's
//! files (`shoal_xds_tls_*`, `shoal_xds_serving_cert_*`, `shoal_token_issuers*`,
//! `shoal_ca_*` but requests, which the streams count).

use prometheus::core::Collector;
use prometheus::{opts, IntCounterVec, IntGauge, Registry};

/// Why an issuer record was refused: the `reason` label of
/// `shoal_token_issuers_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuerRefusalReason {
    /// Not written under its fleet's current lease epoch.
    Fenced,
    /// Its fleet has no lease.
    Unleased,
    /// Unusable keys.
    Invalid,
}

impl IssuerRefusalReason {
    /// Every reason.
    pub const ALL: [IssuerRefusalReason; 3] = [
        IssuerRefusalReason::Fenced,
        IssuerRefusalReason::Unleased,
        IssuerRefusalReason::Invalid,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            IssuerRefusalReason::Fenced => "fenced",
            IssuerRefusalReason::Unleased => "unleased",
            IssuerRefusalReason::Invalid => "invalid",
        }
    }
}

/// The security subsystem's metrics. Cheap to clone.
#[derive(Clone)]
pub struct SecurityMetrics {
    /// Reloads of the xDS serving certificate, by result (`ok`, `error`).
    pub tls_reloads: IntCounterVec,
    /// When the secure port's serving certificate issued from the workload CA expires,
    /// Unix seconds.
    pub xds_serving_cert_expiry: IntGauge,
    /// Renewals of that certificate, by reason (`expiring`, `ca_changed`) and result.
    pub xds_serving_cert_renewals: IntCounterVec,
    /// Clusters whose token issuer keys are loaded.
    pub token_issuers: IntGauge,
    /// Token issuer records refused, by reason (see [`crate::security::auth::IssuerRefusal::reason`]).
    pub token_issuers_refused: IntCounterVec,
    /// Loads of the workload CA's files, by result (`ok`, `error`).
    pub ca_reloads: IntCounterVec,
    /// When the workload CA's root certificate expires, Unix seconds.
    pub ca_root_expiry: IntGauge,
    /// When the workload CA's signing certificate expires, Unix seconds.
    pub ca_chain_expiry: IntGauge,
    /// Fetches of RequestAuthentication `jwksUri`s, by result (`ok` or a
    /// [`crate::security::jwks::JwksError::reason`]).
    pub jwks_fetches: IntCounterVec,
}

impl SecurityMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> SecurityMetrics {
        let m = SecurityMetrics {
            tls_reloads: IntCounterVec::new(
                opts!(
                    "shoal_xds_tls_reloads_total",
                    "Loads of the xDS serving certificate and client CA, by result (ok, error)."
                ),
                &["result"],
            )
            .expect("valid metric"),
            xds_serving_cert_expiry: IntGauge::new(
                "shoal_xds_serving_cert_expiry_timestamp",
                "When the TLS xDS port's serving certificate issued from the workload CA \
                 (--xds-dns-names) expires, Unix seconds; 0 when the certificate comes from \
                 --xds-tls-cert.",
            )
            .expect("valid metric"),
            xds_serving_cert_renewals: IntCounterVec::new(
                opts!(
                    "shoal_xds_serving_cert_renewals_total",
                    "Renewals of the TLS xDS port's serving certificate issued from the \
                     workload CA, by reason (expiring: half its lifetime passed; ca_changed: \
                     the CA in --ca-dir changed) and result (ok, error)."
                ),
                &["reason", "result"],
            )
            .expect("valid metric"),
            token_issuers: IntGauge::new(
                "shoal_token_issuers",
                "Clusters whose service-account token issuer keys are loaded.",
            )
            .expect("valid metric"),
            token_issuers_refused: IntCounterVec::new(
                opts!(
                    "shoal_token_issuers_refused_total",
                    "Token issuer records refused, by reason (fenced: not written under its \
                     fleet's current lease epoch; unleased: its fleet has no lease; invalid: \
                     unusable keys)."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            ca_reloads: IntCounterVec::new(
                opts!(
                    "shoal_ca_reloads_total",
                    "Loads of the workload CA's files (--ca-dir), by result (ok, error)."
                ),
                &["result"],
            )
            .expect("valid metric"),
            ca_root_expiry: IntGauge::new(
                "shoal_ca_root_cert_expiry_timestamp",
                "When the workload CA's root certificate (root-cert.pem) expires, Unix seconds \
                 (Citadel's citadel_server_root_cert_expiry_timestamp).",
            )
            .expect("valid metric"),
            ca_chain_expiry: IntGauge::new(
                "shoal_ca_cert_chain_expiry_timestamp",
                "When the workload CA's signing certificate (ca-cert.pem) expires, Unix \
                 seconds: no certificate is issued after it (Citadel's \
                 citadel_server_cert_chain_expiry_timestamp).",
            )
            .expect("valid metric"),
            jwks_fetches: IntCounterVec::new(
                opts!(
                    "shoal_jwks_fetches_total",
                    "Fetches of RequestAuthentication jwksUri key sets, by result (ok, \
                     timeout, connect, http, status, too_large, not_jwks, bad_uri); a failed \
                     refresh keeps the last good keys."
                ),
                &["result"],
            )
            .expect("valid metric"),
        };
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.jwks_fetches.clone()),
            Box::new(m.tls_reloads.clone()),
            Box::new(m.xds_serving_cert_expiry.clone()),
            Box::new(m.xds_serving_cert_renewals.clone()),
            Box::new(m.token_issuers.clone()),
            Box::new(m.token_issuers_refused.clone()),
            Box::new(m.ca_reloads.clone()),
            Box::new(m.ca_root_expiry.clone()),
            Box::new(m.ca_chain_expiry.clone()),
        ];
        shoal_common::metrics::register_all(registry, collectors);
        // Every known label value at 0 from the first scrape.
        for result in ["ok", "error"] {
            m.ca_reloads.with_label_values(&[result]);
            m.tls_reloads.with_label_values(&[result]);
            for reason in ["expiring", "ca_changed"] {
                m.xds_serving_cert_renewals
                    .with_label_values(&[reason, result]);
            }
        }
        for reason in IssuerRefusalReason::ALL {
            m.token_issuers_refused
                .with_label_values(&[reason.as_str()]);
        }
        for result in crate::security::jwks::RESULTS {
            m.jwks_fetches.with_label_values(&[result]);
        }
        m
    }
}
