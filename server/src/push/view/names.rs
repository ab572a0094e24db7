//! A set of requested resource names that a change of one name copies in part, not whole.
//!
//! A delta stream may subscribe to `MAX_NAMES_PER_SUBSCRIPTION` names and then change them
//! one request at a time. Each change makes a new set (the old one stays shared with the
//! view's outputs until they move on), so a sorted `BTreeSet` would be copied whole per
//! request: the names are kept in sorted runs shared by `Arc`, and a change copies the run
//! it is in. Interning compares a set's length and fingerprint before its names.

use crate::hashing::fingerprint;
use std::sync::Arc;

/// Names per run (a run holds 1 to `2 * RUN`).
const RUN: usize = 256;

/// A sorted set of names.
#[derive(Clone, Default)]
pub struct NameSet {
    /// Sorted, disjoint runs in order, none empty.
    runs: Vec<Arc<Vec<String>>>,
    len: usize,
    /// The wrapping sum of the names' hashes: equal sets have equal fingerprints, so sets
    /// are compared name by name only when length and fingerprint agree.
    fingerprint: u64,
}

impl NameSet {
    /// How many names.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The names, in order.
    pub fn iter(&self) -> Iter<'_> {
        self.runs.iter().flat_map(|r| r.iter())
    }

    /// The name at `position` in order (the position in [`NameSet::iter`]: equal sets agree).
    pub fn get(&self, mut position: usize) -> Option<&String> {
        for run in &self.runs {
            if position < run.len() {
                return run.get(position);
            }
            position -= run.len();
        }
        None
    }

    /// The run `name` is in or belongs in.
    fn run_of(&self, name: &str) -> usize {
        self.runs
            .partition_point(|r| r.first().is_some_and(|f| f.as_str() <= name))
            .saturating_sub(1)
    }

    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.runs
            .get(self.run_of(name))
            .is_some_and(|r| r.binary_search_by(|n| n.as_str().cmp(name)).is_ok())
    }

    /// Adds `name`; whether it was new.
    pub fn insert(&mut self, name: String) -> bool {
        if self.runs.is_empty() {
            self.runs.push(Arc::new(Vec::new()));
        }
        let i = self.run_of(&name);
        let Err(at) = self.runs[i].binary_search(&name) else {
            return false;
        };
        self.fingerprint = self.fingerprint.wrapping_add(fingerprint(&name));
        self.len += 1;
        let run = Arc::make_mut(&mut self.runs[i]);
        run.insert(at, name);
        if run.len() > 2 * RUN {
            let upper = run.split_off(RUN);
            self.runs.insert(i + 1, Arc::new(upper));
        }
        true
    }

    /// Removes `name`; whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let i = self.run_of(name);
        let Some(Ok(at)) = self
            .runs
            .get(i)
            .map(|r| r.binary_search_by(|n| n.as_str().cmp(name)))
        else {
            return false;
        };
        self.fingerprint = self.fingerprint.wrapping_sub(fingerprint(name));
        self.len -= 1;
        let run = Arc::make_mut(&mut self.runs[i]);
        run.remove(at);
        if run.is_empty() {
            self.runs.remove(i);
        }
        true
    }
}

impl FromIterator<String> for NameSet {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        let mut names: Vec<String> = iter.into_iter().collect();
        names.sort();
        names.dedup();
        let fingerprint = names
            .iter()
            .fold(0u64, |sum, n| sum.wrapping_add(fingerprint(n)));
        NameSet {
            len: names.len(),
            runs: names.chunks(RUN).map(|c| Arc::new(c.to_vec())).collect(),
            fingerprint,
        }
    }
}

/// The names of a set, in order.
pub type Iter<'a> = std::iter::FlatMap<
    std::slice::Iter<'a, Arc<Vec<String>>>,
    std::slice::Iter<'a, String>,
    fn(&'a Arc<Vec<String>>) -> std::slice::Iter<'a, String>,
>;

impl<'a> IntoIterator for &'a NameSet {
    type Item = &'a String;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl PartialEq for NameSet {
    fn eq(&self, other: &NameSet) -> bool {
        self.len == other.len
            && self.fingerprint == other.fingerprint
            && self.iter().eq(other.iter())
    }
}

impl Eq for NameSet {}

impl std::fmt::Debug for NameSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn behaves_as_a_sorted_set_and_copies_one_run_per_change() {
        let mut model: BTreeSet<String> = (0..2000).map(|i| format!("n{:05}", i * 2)).collect();
        let mut set: NameSet = model.iter().cloned().collect();
        let before = set.clone();
        for i in (0..4000).step_by(7) {
            let name = format!("n{i:05}");
            if i % 3 == 0 {
                assert_eq!(set.remove(&name), model.remove(&name), "{name}");
            } else {
                assert_eq!(
                    set.insert(name.clone()),
                    model.insert(name.clone()),
                    "{name}"
                );
            }
            assert_eq!(set.contains(&name), model.contains(&name));
        }
        assert_eq!(set.len(), model.len());
        assert!(set.iter().eq(model.iter()));
        let rebuilt: NameSet = model.iter().cloned().collect();
        assert_eq!(set, rebuilt, "equal whatever their runs");
        assert_ne!(set, before);
        // The copy made before the changes is untouched.
        assert_eq!(before.len(), 2000);
        // One change copies one run: the others stay shared.
        let mut one = before.clone();
        one.insert("n00001".into());
        let shared = one
            .runs
            .iter()
            .filter(|r| before.runs.iter().any(|b| Arc::ptr_eq(b, r)))
            .count();
        assert_eq!(shared, before.runs.len() - 1);
        let mut empty = NameSet::default();
        assert!(!empty.remove("x"));
        assert!(empty.insert("x".into()) && empty.contains("x") && empty.remove("x"));
        assert!(empty.is_empty() && empty.runs.is_empty());
    }
}
