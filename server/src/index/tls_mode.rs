//! Whether a workload accepts Istio mutual TLS, from the labels injection sets.

/// The value of `security.istio.io/tlsMode` on workloads with a sidecar.
pub const TLS_MODE_ISTIO: &str = "istio";
/// The workload label saying whether it accepts Istio mutual TLS.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// Whether a pod has a sidecar that accepts Istio mutual TLS: its
/// `security.istio.io/tlsMode: istio` label, which injection sets.
pub fn pod_has_sidecar(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels.get(TLS_MODE_LABEL).map(String::as_str) == Some(TLS_MODE_ISTIO)
}

/// The same for a WorkloadEntry, as istiod: its `security.istio.io/tlsMode` label if set,
/// else whether it has a `serviceAccount` (an identity to present).
pub fn workload_entry_has_sidecar(we: &shoal_common::model::WorkloadEntry) -> bool {
    match we.labels.get(TLS_MODE_LABEL) {
        Some(mode) => mode == TLS_MODE_ISTIO,
        None => we
            .service_account
            .as_deref()
            .is_some_and(|sa| !sa.is_empty()),
    }
}
