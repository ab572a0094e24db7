//! Hashing inside the process: fingerprints of cache keys and resources, and sets of
//! strings. foldhash (hashbrown's default hasher) is several times faster than the
//! standard library's SipHash on the long keys the generators use (a route table's key
//! holds a thousand service views), and a fingerprint here never leaves the process.
//!
//! A fingerprint only finds a candidate: every user compares the whole value on a match,
//! so a collision costs a rebuild, never a wrong answer.

use std::hash::{BuildHasher, Hash};
use std::sync::LazyLock;

/// Seeded once per process: a fingerprint collision cannot be planned from outside.
static SEEDED: LazyLock<foldhash::quality::RandomState> = LazyLock::new(Default::default);

/// The same for every process and run (see [`stable_fingerprint`]).
const STABLE: foldhash::quality::FixedState = foldhash::quality::FixedState::with_seed(0x5_40a1);

/// A 64-bit fingerprint of `value`, stable for the life of the process.
pub fn fingerprint<T: Hash + ?Sized>(value: &T) -> u64 {
    SEEDED.hash_one(value)
}

/// A hasher for a [`fingerprint`] written piece by piece.
pub fn hasher() -> impl std::hash::Hasher {
    SEEDED.build_hasher()
}

/// A 64-bit fingerprint of `value` that is the same in every process of this build: for
/// decisions every replica must make alike.
pub fn stable_fingerprint<T: Hash + ?Sized>(value: &T) -> u64 {
    STABLE.hash_one(value)
}

/// A hash set with a per-set random seed (resistant to planned collisions, as the
/// standard library's), hashing with foldhash.
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_consistent_and_tell_values_apart() {
        assert_eq!(
            fingerprint("a.ns.svc.cluster.local"),
            fingerprint("a.ns.svc.cluster.local")
        );
        assert_ne!(fingerprint("a"), fingerprint("b"));
        assert_eq!(stable_fingerprint("route"), stable_fingerprint("route"));
        // The stable one does not depend on the process's seed.
        assert_eq!(
            stable_fingerprint("route"),
            foldhash::quality::FixedState::with_seed(0x5_40a1).hash_one("route")
        );
    }
}
