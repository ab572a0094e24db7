//! Interning by content: equal values built apart become one shared value, held weakly so
//! the table never keeps one alive. Generated resources are interned (a route table two
//! namespaces' parts build alike is one allocation, with one set of response encodings),
//! and so are the runs of view outputs (`push::view::output`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Live values by a hash of their content; entries whose values are gone are swept as the
/// table grows (amortized O(1) per insert).
pub struct Interner<T> {
    table: Mutex<Table<T>>,
}

struct Table<T> {
    by_hash: HashMap<u64, Vec<Weak<T>>>,
    sweep_at: usize,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            table: Mutex::new(Table {
                by_hash: HashMap::new(),
                sweep_at: 1024,
            }),
        }
    }
}

impl<T> Interner<T> {
    /// The live value with content hash `hash` that `same` says equals `value`, else
    /// `value`, kept for the next caller. `same` must compare the whole content: a hash
    /// collision then costs a second entry, never a wrong value.
    pub fn intern(&self, hash: u64, value: T, same: impl Fn(&T, &T) -> bool) -> Arc<T> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = table.by_hash.get(&hash).and_then(|list| {
            list.iter()
                .filter_map(Weak::upgrade)
                .find(|v| same(v, &value))
        }) {
            return found;
        }
        let value = Arc::new(value);
        let list = table.by_hash.entry(hash).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&value));
        if table.by_hash.len() > table.sweep_at {
            table.by_hash.retain(|_, list| {
                list.retain(|w| w.strong_count() > 0);
                !list.is_empty()
            });
            table.sweep_at = (2 * table.by_hash.len()).max(1024);
        }
        value
    }

    /// How many hashes have live entries (tests).
    #[cfg(test)]
    pub fn live(&self) -> usize {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .by_hash
            .values()
            .filter(|l| l.iter().any(|w| w.strong_count() > 0))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_one_and_dead_ones_are_not_kept() {
        let interner: Interner<String> = Interner::default();
        let eq = |a: &String, b: &String| a == b;
        let a = interner.intern(1, "x".to_string(), eq);
        let b = interner.intern(1, "x".to_string(), eq);
        assert!(Arc::ptr_eq(&a, &b));
        // A collision: same hash, other content.
        let c = interner.intern(1, "y".to_string(), eq);
        assert_eq!(*c, "y");
        drop((a, b));
        let d = interner.intern(1, "x".to_string(), eq);
        assert_eq!(*d, "x");
        assert_eq!(interner.live(), 1);
    }
}
