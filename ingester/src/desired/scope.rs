//! What a publish round recomputes: the namespaces a change touched, or everything.
//!
//! Both sources scope their rounds with it, so that a change costs what it touches: an
//! endpoint change recomputes and compares its namespace's keys, not the whole mesh's.

use super::StateKey;
use shoal_common::bus::Bucket;
use shoal_common::keys;
use std::collections::BTreeSet;

/// The namespaces whose state must be recomputed (or all of them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirty {
    all: bool,
    namespaces: BTreeSet<String>,
}

impl Dirty {
    /// Everything to recompute.
    pub fn everything() -> Self {
        Dirty {
            all: true,
            namespaces: BTreeSet::new(),
        }
    }

    /// Whether everything must be recomputed.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// Nothing to recompute.
    pub fn is_empty(&self) -> bool {
        !self.all && self.namespaces.is_empty()
    }

    /// Everything must be recomputed.
    pub fn add_all(&mut self) {
        self.all = true;
        self.namespaces.clear();
    }

    /// One namespace must be recomputed.
    pub fn add_namespace(&mut self, namespace: &str) {
        if !self.all {
            self.namespaces.insert(namespace.to_string());
        }
    }

    /// Whether a namespace is to be recomputed.
    pub fn contains_namespace(&self, namespace: &str) -> bool {
        self.all || self.namespaces.contains(namespace)
    }

    /// Whether a bus key is in scope: its namespace is dirty. Unparseable keys are in
    /// scope only of a full round.
    pub fn contains_key(&self, key: &StateKey) -> bool {
        self.all || key_namespace(key).is_some_and(|ns| self.namespaces.contains(&ns))
    }

    /// The namespaces to recompute: the dirty ones, or every namespace `present` returns.
    pub(crate) fn select<'a>(
        &'a self,
        present: impl FnOnce() -> BTreeSet<&'a str>,
    ) -> BTreeSet<&'a str> {
        if self.all {
            present()
        } else {
            self.namespaces.iter().map(String::as_str).collect()
        }
    }
}

/// The namespace of a bus key.
pub fn key_namespace((bucket, key): &StateKey) -> Option<String> {
    match bucket {
        // A Namespace's labels entry belongs to the namespace it describes, so that a
        // relabel (which dirties that namespace) recomputes it.
        Bucket::Config => keys::parse_config_key(key).ok().map(|id| match id.kind {
            shoal_common::model::ConfigKind::Namespace => id.name,
            _ => id.namespace,
        }),
        Bucket::Services => keys::parse_service_key(key).ok().map(|id| id.namespace),
        Bucket::Endpoints => keys::parse_endpoints_key(key).ok().map(|id| id.namespace),
        Bucket::Meta => None,
    }
}
