//! Admission: what an object must be to enter shoal's model, and its conversion into it.
//! Pure functions of one object, with no file, watch or bus context (callers add theirs to
//! the errors), so the file and the Kubernetes sources admit alike.
//!
//! - [`istio`]: Istio config into typed [`shoal_common::model::ConfigObject`]s, refusing
//!   unmodelled fields, validated kind by kind as Istio's webhook would
//!   ([`istio::virtual_service`], [`istio::destination_rule`], [`istio::security`]).
//! - [`normalize`]: Kubernetes Services, EndpointSlices, Pods and Nodes into the model.

#[cfg(test)]
mod compat_doc;
pub mod gateway_api;
pub mod istio;
pub mod normalize;

/// Says once per process, at INFO, that objects of a kind are ignored: a user whose config
/// shoal does not read must find out at the default log level, not from one DEBUG line per
/// object. Later objects of the kind are only counted at DEBUG by the caller.
/// Returns whether this call logged.
pub fn report_unread_kind(api_version: &str, kind: &str) -> bool {
    use std::collections::BTreeSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<BTreeSet<(String, String)>>> = OnceLock::new();
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    let first = SEEN
        .get_or_init(Default::default)
        .lock()
        .map(|mut seen| seen.insert((group.to_string(), kind.to_string())))
        // A poisoned set only means another thread panicked while logging: log again.
        .unwrap_or(true);
    if first {
        tracing::info!(
            %api_version,
            %kind,
            "objects of this kind are ignored: shoal does not read it \
             (docs/istio-compatibility.md lists what it reads); said once per kind"
        );
    }
    first
}

#[cfg(test)]
mod tests {
    #[test]
    fn unread_kinds_are_reported_once_per_kind() {
        assert!(super::report_unread_kind("apps/v1", "ShoalTestDeployment"));
        assert!(!super::report_unread_kind("apps/v1", "ShoalTestDeployment"));
        // Another version of the same group and kind is the same kind.
        assert!(!super::report_unread_kind("apps/v2", "ShoalTestDeployment"));
        assert!(super::report_unread_kind(
            "other.io/v1",
            "ShoalTestDeployment"
        ));
    }
}
