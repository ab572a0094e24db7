//! The secure port's serving certificate issued from the workload CA, as istiod issues its
//! own "DNS certificate" when it has no `--tlsCertFile` (`pilot/pkg/bootstrap/
//! certcontroller.go`): proxies verify the port with the mesh root they already hold
//! (`istio-ca-root-cert`), so no second CA is distributed.
//!
//! The certificate names the `--xds-dns-names`, lives in memory only (its key never touches
//! a disk), and is valid for [`TTL`] but never past the signing CA certificate. It is
//! renewed at half its lifetime (Istio's grace period ratio, 0.5) and whenever the CA
//! reloads with new files, so a rotated CA serves a certificate of its own without a
//! restart. A renewal that fails keeps the current certificate and is retried after
//! [`RETRY`]. Connections accepted after a renewal get the new certificate; open ones keep
//! theirs.

use crate::security::ca::{Ca, Issued};
use crate::security::metrics::SecurityMetrics;
use crate::security::reload::Reloading;
use crate::security::tls::{config_from_pem, TlsError, TlsServer};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Validity of each serving certificate (Istio's default workload certificate TTL; istiod
/// gives its own ten years, shoal renews in memory instead).
pub const TTL: Duration = crate::security::ca::DEFAULT_TTL;

/// Wait before retrying a renewal that failed.
pub const RETRY: Duration = Duration::from_secs(30);

/// Why a serving certificate is issued again (the `reason` label of
/// `shoal_xds_serving_cert_renewals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The CA in `--ca-dir` changed.
    CaChanged,
    /// Half the certificate's lifetime has passed.
    Expiring,
}

impl Renewal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Renewal::CaChanged => "ca_changed",
            Renewal::Expiring => "expiring",
        }
    }
}

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is renewed:
/// halfway through.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before) / 2
}

/// Whether the certificate must be issued again at `now` (Unix seconds).
pub fn due(now: i64, not_before: i64, not_after: i64, ca_changed: bool) -> Option<Renewal> {
    if ca_changed {
        Some(Renewal::CaChanged)
    } else if now >= renew_at(not_before, not_after) {
        Some(Renewal::Expiring)
    } else {
        None
    }
}

/// Issues the secure port's certificate from the workload CA and keeps it current.
pub struct ServingCert {
    ca: Reloading<Ca>,
    names: Vec<String>,
    client_ca: Option<PathBuf>,
    metrics: SecurityMetrics,
    /// The CA that issued `current`.
    signer: Arc<Ca>,
    current: Issued,
}

impl ServingCert {
    /// Issues the first certificate for `names` from `ca`; fails when the CA cannot issue
    /// one (a name that is not a DNS name, an expired CA) or the client CA is unusable.
    pub fn start(
        ca: Reloading<Ca>,
        names: Vec<String>,
        client_ca: Option<PathBuf>,
        metrics: SecurityMetrics,
    ) -> Result<(ServingCert, TlsServer), TlsError> {
        let signer = ca.get();
        let (current, config) = issue(&signer, &names, client_ca.as_deref())?;
        let this = ServingCert {
            ca,
            names,
            client_ca,
            metrics,
            signer,
            current,
        };
        this.show();
        Ok((this, TlsServer::new(config)))
    }

    fn show(&self) {
        self.metrics
            .xds_serving_cert_expiry
            .set(self.current.not_after);
        tracing::info!(
            names = ?self.names,
            not_after = self.current.not_after,
            "serving the secure xDS port with a certificate from the workload CA"
        );
    }

    /// Renews the certificate `tls` serves when due, and reloads the client CA file when
    /// it changes, forever.
    pub async fn renew(mut self, tls: TlsServer) {
        let mut client_ca_seen = self.client_ca_contents();
        // Monotonic, unlike the certificate's validity (wall clock).
        let mut retry_after = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(crate::security::reload::INTERVAL).await;
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            let ca = self.ca.get();
            let ca_changed = !Arc::ptr_eq(&ca, &self.signer);
            let reason = due(
                now,
                self.current.not_before,
                self.current.not_after,
                ca_changed,
            );
            let client_ca_now = self.client_ca_contents();
            if reason.is_none() && client_ca_now == client_ca_seen {
                continue;
            }
            if tokio::time::Instant::now() < retry_after {
                continue;
            }
            let built = match reason {
                Some(_) => issue(&ca, &self.names, self.client_ca.as_deref()),
                None => config_from_pem(
                    &self.current.chain,
                    &self.current.key,
                    self.client_ca.as_deref(),
                )
                .map(|config| (self.current.clone(), config)),
            };
            let label = reason.map(Renewal::label).unwrap_or("client_ca_changed");
            match built {
                Ok((issued, config)) => {
                    tls.set(config);
                    self.current = issued;
                    self.signer = ca;
                    client_ca_seen = client_ca_now;
                    match reason {
                        Some(reason) => {
                            self.metrics
                                .xds_serving_cert_renewals
                                .with_label_values(&[reason.label(), "ok"])
                                .inc();
                            self.show();
                        }
                        None => {
                            self.metrics.tls_reloads.with_label_values(&["ok"]).inc();
                            tracing::info!("reloaded the xDS client CA from its changed file");
                        }
                    }
                }
                Err(error) => {
                    retry_after = tokio::time::Instant::now() + RETRY;
                    match reason {
                        Some(reason) => self
                            .metrics
                            .xds_serving_cert_renewals
                            .with_label_values(&[reason.label(), "error"])
                            .inc(),
                        None => self.metrics.tls_reloads.with_label_values(&["error"]).inc(),
                    }
                    tracing::error!(
                        %error,
                        reason = label,
                        retry_in = ?RETRY,
                        "cannot renew the xDS serving certificate; still serving the current one"
                    );
                }
            }
        }
    }

    fn client_ca_contents(&self) -> Option<Vec<u8>> {
        self.client_ca
            .as_ref()
            .map(|path| std::fs::read(path).unwrap_or_default())
    }
}

/// Issues a certificate for `names` from `ca` and the TLS configuration serving it.
fn issue(
    ca: &Ca,
    names: &[String],
    client_ca: Option<&std::path::Path>,
) -> Result<(Issued, rustls::ServerConfig), TlsError> {
    let issued = ca
        .issue_serving(names, TTL)
        .map_err(|e| TlsError::Config(format!("cannot issue it from the workload CA: {e}")))?;
    let config = config_from_pem(&issued.chain, &issued.key, client_ca)?;
    Ok((issued, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_halfway_through_the_lifetime() {
        let (start, end) = (1_000, 1_000 + 24 * 3600);
        assert_eq!(renew_at(start, end), 1_000 + 12 * 3600);
        assert_eq!(due(start, start, end, false), None);
        assert_eq!(due(renew_at(start, end) - 1, start, end, false), None);
        assert_eq!(
            due(renew_at(start, end), start, end, false),
            Some(Renewal::Expiring)
        );
        // Past expiry (a renewal kept failing) it is still due.
        assert_eq!(due(end + 10, start, end, false), Some(Renewal::Expiring));
    }

    #[test]
    fn a_changed_ca_renews_at_once() {
        let (start, end) = (1_000, 1_000 + 24 * 3600);
        assert_eq!(due(start, start, end, true), Some(Renewal::CaChanged));
    }

    fn renewals(metrics: &SecurityMetrics, reason: &str, result: &str) -> u64 {
        metrics
            .xds_serving_cert_renewals
            .with_label_values(&[reason, result])
            .get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_reloaded_ca_renews_and_a_failed_renewal_waits_before_retrying() {
        use crate::security::ca::tests::cacerts_until;
        let dir = tempfile::tempdir().unwrap();
        let valid = time::OffsetDateTime::now_utc() + time::Duration::days(365);
        cacerts_until(dir.path(), valid);
        let ca = Reloading::new(Ca::load(dir.path()).unwrap());
        let metrics = SecurityMetrics::register(&prometheus::Registry::new());
        let names = vec!["shoal.example".to_string()];
        let (serving, tls) = ServingCert::start(ca.clone(), names, None, metrics.clone()).unwrap();
        let expiry = metrics.xds_serving_cert_expiry.get();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert!(
            (expiry - (now + TTL.as_secs() as i64)).abs() < 5,
            "{expiry}"
        );
        tokio::spawn(serving.renew(tls));

        // Nothing due: no renewal.
        tokio::time::sleep(crate::security::reload::INTERVAL * 10).await;
        assert_eq!(renewals(&metrics, "ca_changed", "ok"), 0);
        assert_eq!(renewals(&metrics, "expiring", "ok"), 0);

        // The CA reloads: renewed at the next tick.
        cacerts_until(dir.path(), valid);
        ca.set(Ca::load(dir.path()).unwrap());
        tokio::time::sleep(crate::security::reload::INTERVAL * 2).await;
        assert_eq!(renewals(&metrics, "ca_changed", "ok"), 1);

        // An expired CA cannot issue: counted once, then retried after RETRY, not each tick.
        let expired = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        cacerts_until(dir.path(), expired);
        ca.set(Ca::load(dir.path()).unwrap());
        tokio::time::sleep(crate::security::reload::INTERVAL * 2).await;
        assert_eq!(renewals(&metrics, "ca_changed", "error"), 1);
        tokio::time::sleep(RETRY / 2).await;
        assert_eq!(renewals(&metrics, "ca_changed", "error"), 1);
        tokio::time::sleep(RETRY).await;
        assert_eq!(renewals(&metrics, "ca_changed", "error"), 2);
        // The certificate in use stays the one from the last good CA.
        assert_eq!(renewals(&metrics, "ca_changed", "ok"), 1);
    }
}
