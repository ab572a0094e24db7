//! Discovery selectors: which namespaces the mesh sees (MeshConfig `discoverySelectors`).
//!
//! Istio's semantics: a list of Kubernetes label selectors on Namespaces; a namespace is
//! selected when any entry matches (entries are ORed), and an entry matches when all of its
//! `matchLabels` and `matchExpressions` do (ANDed). No selectors at all selects every
//! namespace. An empty entry (`{}`) matches every namespace, as in Kubernetes.
//!
//! Pure logic, shared by the file and Kubernetes sources, so both select alike; a selector
//! is matched and validated by `shoal_common`'s label selector, as the Gateway API's
//! namespace selectors are.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use shoal_common::model::{LabelSelectorRequirement, RouteLabelSelector};
use std::collections::BTreeMap;

/// The label the API server puts on every Namespace, naming it. Namespaces read from files
/// (or not read at all) get it too, so selectors on it work the same in every source.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// A label selector that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("discoverySelectors[{index}]: {reason}")]
pub struct SelectorError {
    /// Index of the offending entry.
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

/// Parsed discovery selectors. The default selects every namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoverySelectors {
    entries: Vec<RouteLabelSelector>,
}

impl DiscoverySelectors {
    /// Selectors that select every namespace (no `discoverySelectors`).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses Kubernetes label selectors, rejecting operators Kubernetes would reject.
    pub fn new(selectors: &[LabelSelector]) -> Result<Self, SelectorError> {
        let mut entries = Vec::with_capacity(selectors.len());
        for (index, s) in selectors.iter().enumerate() {
            let entry = RouteLabelSelector {
                match_labels: s.match_labels.clone().unwrap_or_default(),
                match_expressions: s
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.clone(),
                        values: r.values.clone().unwrap_or_default(),
                    })
                    .collect(),
            };
            entry.validate().map_err(|e| SelectorError {
                index,
                reason: e.to_string(),
            })?;
            entries.push(entry);
        }
        Ok(DiscoverySelectors { entries })
    }

    /// Whether every namespace is selected whatever its labels.
    pub fn selects_all(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a namespace with these labels is selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.entries.is_empty() || self.entries.iter().any(|e| e.matches(labels))
    }

    /// Whether namespace `name` is selected, given its labels when its Namespace object is
    /// known. The `kubernetes.io/metadata.name` label is implied, as the API server sets it;
    /// an unknown namespace has only that label.
    pub fn selects_namespace(&self, name: &str, labels: Option<&Labels>) -> bool {
        if self.selects_all() {
            return true;
        }
        let mut effective = labels.cloned().unwrap_or_default();
        effective
            .entry(NAMESPACE_NAME_LABEL.to_string())
            .or_insert_with(|| name.to_string());
        self.matches(&effective)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selectors(yaml: &str) -> Result<DiscoverySelectors, SelectorError> {
        let list: Vec<LabelSelector> = shoal_common::yaml::from_str(yaml).expect("test yaml");
        DiscoverySelectors::new(&list)
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_selectors_select_everything() {
        let s = selectors("[]").unwrap();
        assert!(s.selects_all());
        assert!(s.matches(&Labels::new()));
        assert!(DiscoverySelectors::all().selects_namespace("x", None));
    }

    #[test]
    fn match_labels_and_expressions_are_anded_entries_ored() {
        let s = selectors(
            r#"
- matchLabels: {team: a}
  matchExpressions:
  - {key: env, operator: In, values: [prod, staging]}
- matchExpressions:
  - {key: legacy, operator: Exists}
  - {key: frozen, operator: DoesNotExist}
"#,
        )
        .unwrap();
        assert!(s.matches(&labels(&[("team", "a"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("team", "a")])), "env missing");
        assert!(!s.matches(&labels(&[("team", "b"), ("env", "prod")])));
        assert!(s.matches(&labels(&[("legacy", "")])), "second entry");
        assert!(!s.matches(&labels(&[("legacy", "1"), ("frozen", "1")])));
        assert!(!s.matches(&Labels::new()));
    }

    #[test]
    fn not_in_matches_missing_labels() {
        let s = selectors("[{matchExpressions: [{key: env, operator: NotIn, values: [dev]}]}]")
            .unwrap();
        assert!(s.matches(&Labels::new()));
        assert!(s.matches(&labels(&[("env", "prod")])));
        assert!(!s.matches(&labels(&[("env", "dev")])));
    }

    #[test]
    fn empty_entry_matches_everything() {
        let s = selectors("[{}]").unwrap();
        assert!(!s.selects_all());
        assert!(s.matches(&Labels::new()));
    }

    #[test]
    fn namespace_name_label_is_implied() {
        let s = selectors("[{matchLabels: {kubernetes.io/metadata.name: bookinfo}}]").unwrap();
        assert!(s.selects_namespace("bookinfo", None));
        assert!(s.selects_namespace("bookinfo", Some(&labels(&[("a", "b")]))));
        assert!(!s.selects_namespace("other", None));
        let by_label = selectors("[{matchLabels: {mesh: on}}]").unwrap();
        assert!(
            !by_label.selects_namespace("bookinfo", None),
            "unknown: no labels"
        );
        assert!(by_label.selects_namespace("bookinfo", Some(&labels(&[("mesh", "on")]))));
    }

    #[test]
    fn invalid_selectors_name_the_entry() {
        for (yaml, want) in [
            (
                "[{}, {matchExpressions: [{key: a, operator: In}]}]",
                "discoverySelectors[1]: matchExpressions[0] \"a\": operator In needs at least one value",
            ),
            (
                "[{matchExpressions: [{key: a, operator: Exists, values: [x]}]}]",
                "discoverySelectors[0]: matchExpressions[0] \"a\": operator Exists takes no values",
            ),
            (
                "[{matchExpressions: [{key: a, operator: Gt, values: ['1']}]}]",
                "unknown operator \"Gt\"",
            ),
            (
                "[{matchExpressions: [{key: '', operator: Exists}]}]",
                "key is empty",
            ),
        ] {
            let err = selectors(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }
}
