//! An Istio config object as the indexes hold it.

use shoal_common::model::ObjectMeta;

/// A config object with its metadata, typed by spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config<T> {
    /// Name, namespace, labels.
    pub meta: ObjectMeta,
    /// The spec.
    pub spec: T,
}
