//! Which object, and where it was read: the identities that errors, the manifest parser
//! and the desired state share. A neutral home, so that the error type does not depend on
//! the parser that produces most of its variants.

use shoal_common::model::ConfigKind;

/// The kinds of object the ingester reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// v1 `Namespace`.
    Namespace,
    /// v1 `Service`.
    Service,
    /// v1 `Pod`.
    Pod,
    /// v1 `Node`.
    Node,
    /// discovery.k8s.io/v1 `EndpointSlice`.
    EndpointSlice,
    /// v1 `Secret` (published only when a Gateway names it in `credentialName`).
    Secret,
    /// An Istio config kind.
    Config(ConfigKind),
}

impl ObjectKind {
    /// The Kubernetes `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Namespace => "Namespace",
            ObjectKind::Service => "Service",
            ObjectKind::Pod => "Pod",
            ObjectKind::Node => "Node",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::Secret => "Secret",
            ObjectKind::Config(k) => k.as_str(),
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        match self {
            ObjectKind::Namespace | ObjectKind::Node => false,
            ObjectKind::Config(k) => k.is_namespaced(),
            _ => true,
        }
    }
}

/// The identity of an object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId {
    /// The kind.
    pub kind: ObjectKind,
    /// The namespace, or empty.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind.as_str(), self.name)
        } else {
            write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
        }
    }
}

/// Where in a file a document is: its index among the file's documents (from 0) and, for
/// items of a `kind: List`, the item's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocRef {
    /// Index of the document in the file, from 0.
    pub index: usize,
    /// Index in the List's `items`, when the document is a List.
    pub item: Option<usize>,
}

impl std::fmt::Display for DocRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.item {
            Some(item) => write!(f, "{} item {item}", self.index),
            None => write!(f, "{}", self.index),
        }
    }
}
