//! The desired bus state: what the ingester wants on the bus, by key, and the bus entry of
//! each kind of object. Both sources build their desired state from these entries, so
//! identical objects give identical entries; [`crate::publish`] writes what differs.
//!
//! - [`credentials`]: the sealed gateway credentials among the desired entries.
//! - [`scope`]: which namespaces a publish round recomputes.

pub mod credentials;
pub mod scope;

use crate::admit::normalize::{self, Workloads};
use crate::error::InvalidObject;
use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;
use shoal_common::bus::Bucket;
use shoal_common::envelope::{Envelope, EnvelopeError};
use shoal_common::keys;
use shoal_common::model::{ConfigObject, EndpointSet, Service};
use std::collections::BTreeMap;

/// A normalized object as published: the body of an [`Envelope`].
///
/// Serialized untagged, so the body on the wire is exactly the model object's encoding
/// and servers decode `Envelope<ConfigObject>` (etc.) directly.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StateObject {
    /// Istio config, in [`Bucket::Config`].
    Config(ConfigObject),
    /// A Service, in [`Bucket::Services`].
    Service(Service),
    /// An endpoint set, in [`Bucket::Endpoints`].
    Endpoints(EndpointSet),
}

impl StateObject {
    /// The body bytes: the rmp-serde encoding (named fields) of the model object.
    pub fn encode_body(&self) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        rmp_serde::to_vec_named(self)
    }

    /// Decodes an envelope read from `bucket` into its body; `Ok(None)` for buckets that
    /// hold no model objects.
    pub fn decode(bucket: Bucket, bytes: &[u8]) -> Result<Option<StateObject>, EnvelopeError> {
        Ok(Some(match bucket {
            Bucket::Config => StateObject::Config(Envelope::decode(bytes)?.body),
            Bucket::Services => StateObject::Service(Envelope::decode(bytes)?.body),
            Bucket::Endpoints => StateObject::Endpoints(Envelope::decode(bytes)?.body),
            Bucket::Meta => return Ok(None),
        }))
    }
}

/// A key on the bus: bucket and key.
pub type StateKey = (Bucket, String);

/// Everything the ingester wants on the bus, by key.
pub type DesiredState = BTreeMap<StateKey, StateObject>;

/// The bus entry of a Service seen in `cluster`; `Ok(None)` for services shoal does not
/// model. Shared by every source, so identical objects give identical entries.
pub fn service_entry(
    svc: &KubeService,
    cluster: &str,
) -> Result<Option<(StateKey, StateObject)>, InvalidObject> {
    Ok(normalize::service(svc, cluster)?.map(|s| {
        let key = keys::service_key(cluster, &s.meta.namespace, &s.meta.name);
        ((Bucket::Services, key), StateObject::Service(s))
    }))
}

/// The bus entry of an EndpointSlice seen in `cluster`, joined with `workloads`.
pub fn endpoints_entry(
    slice: &EndpointSlice,
    cluster: &str,
    workloads: &Workloads<'_>,
    network: &str,
) -> Result<Option<(StateKey, StateObject)>, InvalidObject> {
    Ok(
        normalize::endpoint_slice(slice, cluster, workloads)?.map(|mut set| {
            set.network = network.to_string();
            let key = keys::endpoints_key(cluster, &set.namespace, &set.service, &set.slice);
            ((Bucket::Endpoints, key), StateObject::Endpoints(set))
        }),
    )
}

/// The bus entry of a selected Namespace: its name and labels, which the Gateway API's
/// `allowedRoutes.namespaces.from: Selector` reads. A namespace the discovery selectors do
/// not select has none. The `kubernetes.io/metadata.name` label is implied, as the API
/// server sets it (a Namespace in a manifest file may lack it).
pub fn namespace_entry(name: &str, labels: &BTreeMap<String, String>) -> (StateKey, StateObject) {
    let mut labels = labels.clone();
    labels
        .entry(crate::selector::NAMESPACE_NAME_LABEL.to_string())
        .or_insert_with(|| name.to_string());
    config_entry(&ConfigObject {
        meta: shoal_common::model::ObjectMeta {
            name: name.to_string(),
            labels,
            ..Default::default()
        },
        spec: shoal_common::model::ConfigSpec::Namespace(Default::default()),
    })
}

/// The bus entry of a pod that no EndpointSlice names (see [`normalize::lone_pod`]).
pub fn lone_pod_entry(
    pod: &Pod,
    cluster: &str,
    workloads: &Workloads<'_>,
    network: &str,
) -> Option<(StateKey, StateObject)> {
    let mut set = normalize::lone_pod(pod, cluster, workloads)?;
    set.network = network.to_string();
    let key = keys::endpoints_key(cluster, &set.namespace, &set.service, &set.slice);
    Some(((Bucket::Endpoints, key), StateObject::Endpoints(set)))
}

/// The bus entry of an Istio config object.
pub fn config_entry(config: &ConfigObject) -> (StateKey, StateObject) {
    let key = keys::config_key(config.kind(), &config.meta.namespace, &config.meta.name);
    ((Bucket::Config, key), StateObject::Config(config.clone()))
}
