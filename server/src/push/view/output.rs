//! A view's output of one type: its resources in shared runs, what a proxy holds of it, and
//! the difference between two (see the `view` module).

use crate::generate::intern::Interner;
use crate::generate::{Resource, Side};
use crate::push::chunks::{Chunks, Gathered};
use shoal_proto::content_version;
use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, LazyLock, OnceLock};

/// Resources per run of an [`Output`], on average (a run holds from 1 to `2 * RUN`): a
/// derived output copies the runs it changes and shares the others, and a diff skips the
/// runs two outputs share, so a change to a few of a huge subscription's resources costs
/// one pointer per run plus a run per changed resource, not a pass over every resource.
const RUN: usize = 128;

/// A run of an output's resources (ordered by name), with their response entries gathered
/// once. Runs are cut where the content says ([`ends_run`]) and interned ([`Run::of`]), so
/// equal runs are one object: in the outputs derived from each other, and in the outputs
/// of different views that hold the same resources (every sidecar view of a namespace
/// holds the same outbound clusters and listeners beside its own inbound ones).
#[derive(Debug)]
struct Run {
    resources: Vec<Arc<Resource>>,
    gathered: Gathered,
}

/// Whether a run ends after the resource named `name`. It depends on the name alone, so a
/// sequence of resources is cut the same way whatever comes before it in an output, and a
/// new version of a resource does not move a cut. (A fixed seed: the same on every
/// replica.)
fn ends_run(name: &str) -> bool {
    crate::hashing::stable_fingerprint(name).is_multiple_of(RUN as u64)
}

/// The live runs (see [`crate::generate::intern`]).
static RUNS: LazyLock<Interner<Run>> = LazyLock::new(Interner::default);

impl Run {
    /// The run of these resources: the live one with the same resources, else a new one.
    fn of(resources: &[Arc<Resource>]) -> Arc<Run> {
        let mut h = crate::hashing::hasher();
        for r in resources {
            r.name.hash(&mut h);
            r.version.hash(&mut h);
        }
        let h = h.finish();
        let run = Run {
            resources: resources.to_vec(),
            gathered: Gathered::default(),
        };
        RUNS.intern(h, run, |a, b| {
            a.resources.len() == b.resources.len()
                && a.resources
                    .iter()
                    .zip(&b.resources)
                    .all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
        })
    }
}

/// Cuts resources (ordered by name) into interned runs: after each resource that
/// [`ends_run`], and after `2 * RUN` resources without one. A sidecar's inbound resource
/// ([`Side::is_inbound_name`]) is a run of its own, so that a view's output composed of its
/// part's outbound resources and its own inbound ones shares every other run (and its
/// gathered entries) with the other views of the part.
fn cut(resources: &[Arc<Resource>]) -> Vec<Arc<Run>> {
    let mut runs = Vec::with_capacity(resources.len() / RUN + 1);
    let mut start = 0;
    for (i, r) in resources.iter().enumerate() {
        let alone = Side::is_inbound_name(&r.name);
        if alone && start < i {
            runs.push(Run::of(&resources[start..i]));
            start = i;
        }
        if alone || ends_run(&r.name) || i + 1 - start >= 2 * RUN {
            runs.push(Run::of(&resources[start..=i]));
            start = i + 1;
        }
    }
    if start < resources.len() {
        runs.push(Run::of(&resources[start..]));
    }
    runs
}

/// A 256-bit sum of resource digests (mod 2^256): a hash of a set that is updated per
/// resource added or removed, whatever order or runs the set is in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SetSum([u64; 4]);

impl SetSum {
    fn limbs(d: &[u8; 32]) -> [u64; 4] {
        let mut out = [0u64; 4];
        for (i, chunk) in d.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            out[i] = u64::from_le_bytes(b);
        }
        out
    }

    fn add(&mut self, r: &Resource) {
        let mut carry = false;
        for (a, b) in self.0.iter_mut().zip(Self::limbs(r.digest())) {
            let (x, c1) = a.overflowing_add(b);
            let (y, c2) = x.overflowing_add(u64::from(carry));
            *a = y;
            carry = c1 || c2;
        }
    }

    fn sub(&mut self, r: &Resource) {
        let mut borrow = false;
        for (a, b) in self.0.iter_mut().zip(Self::limbs(r.digest())) {
            let (x, c1) = a.overflowing_sub(b);
            let (y, c2) = x.overflowing_sub(u64::from(borrow));
            *a = y;
            borrow = c1 || c2;
        }
    }
}

/// One type's resources for a view, ordered by name.
#[derive(Debug, Default)]
pub struct Output {
    /// The resources, in runs (see [`RUN`]).
    runs: Vec<Arc<Run>>,
    len: usize,
    /// The sum of the resources' digests (the version's input).
    sum: SetSum,
    version: OnceLock<String>,
    /// The runs' gathered response entries, in order (made on first use: a list of shared
    /// chunks, nothing copied).
    delta: OnceLock<Chunks>,
    sotw: OnceLock<Chunks>,
}

impl Output {
    /// An output of these resources.
    pub fn new(resources: Vec<Arc<Resource>>) -> Output {
        let resources = crate::generate::finish(resources);
        let mut sum = SetSum::default();
        for r in &resources {
            sum.add(r);
        }
        Output {
            runs: cut(&resources),
            len: resources.len(),
            sum,
            version: OnceLock::new(),
            delta: OnceLock::new(),
            sotw: OnceLock::new(),
        }
    }

    /// How many of this output's runs `other` does not share (tests: what two views
    /// hold apart).
    #[cfg(test)]
    pub fn runs_apart_from(&self, other: &Output) -> usize {
        self.runs
            .iter()
            .filter(|r| !other.runs.iter().any(|o| Arc::ptr_eq(o, r)))
            .count()
    }

    /// Every resource's delta response entry, in order: the runs' gathered chunks.
    pub fn delta_entries(&self) -> &Chunks {
        self.delta.get_or_init(|| {
            Chunks::concat(self.runs.iter().map(|r| r.gathered.delta(&r.resources)))
        })
    }

    /// Every resource's State-of-the-World response entry, in order.
    pub fn sotw_entries(&self) -> &Chunks {
        self.sotw
            .get_or_init(|| Chunks::concat(self.runs.iter().map(|r| r.gathered.sotw(&r.resources))))
    }

    /// The resources, ordered by name. (No flat list is kept: at 2,000 captured proxies
    /// one per output held 16 KiB per proxy.)
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Resource>> + Clone {
        self.runs.iter().flat_map(|r| r.resources.iter())
    }

    /// The resources as one list (tests).
    #[cfg(test)]
    pub fn resources(&self) -> Vec<Arc<Resource>> {
        self.iter().cloned().collect()
    }

    /// How many resources there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run `name` is in or belongs in: the last whose first name is not after it.
    fn run_of(&self, name: &str) -> usize {
        self.runs
            .partition_point(|r| r.resources.first().is_some_and(|f| f.name.as_str() <= name))
            .saturating_sub(1)
    }

    /// Whether a resource is named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.runs.get(self.run_of(name)).is_some_and(|run| {
            run.resources
                .binary_search_by(|r| r.name.as_str().cmp(name))
                .is_ok()
        })
    }

    /// This output with `changed` resources put in place of those of the same names,
    /// sharing every run none of them is in; `None` if a name is not here (the output
    /// must then be built afresh).
    pub fn replaced(&self, changed: Vec<Arc<Resource>>) -> Option<Output> {
        if changed.iter().any(|r| !self.contains(&r.name)) {
            return None;
        }
        Some(self.with_changes(changed, &[]))
    }

    /// This output with `upserts` put in (replacing resources of the same names) and the
    /// resources named in `removed` taken out, sharing every run no change is in. Cost:
    /// a binary search and a run copy per change, and one pointer per run.
    pub fn with_changes(&self, upserts: Vec<Arc<Resource>>, removed: &[String]) -> Output {
        let mut copies: BTreeMap<usize, Vec<Arc<Resource>>> = BTreeMap::new();
        let mut sum = self.sum;
        let mut len = self.len;
        for name in removed {
            let run = copy_run(&mut copies, &self.runs, self.run_of(name));
            if let Ok(i) = run.binary_search_by(|r| r.name.as_str().cmp(name)) {
                sum.sub(&run.remove(i));
                len -= 1;
            }
        }
        for r in upserts {
            let run = copy_run(&mut copies, &self.runs, self.run_of(&r.name));
            match run.binary_search_by(|x| x.name.cmp(&r.name)) {
                Ok(i) if Arc::ptr_eq(&run[i], &r) || run[i].version == r.version => {}
                Ok(i) => {
                    sum.sub(&run[i]);
                    sum.add(&r);
                    run[i] = r;
                }
                Err(i) => {
                    sum.add(&r);
                    run.insert(i, r);
                    len += 1;
                }
            }
        }
        let unchanged = copies.iter().all(|(&i, c)| {
            self.runs.get(i).is_some_and(|r| {
                r.resources.len() == c.len()
                    && r.resources.iter().zip(c).all(|(a, b)| Arc::ptr_eq(a, b))
            })
        });
        let runs = if unchanged {
            self.runs.clone()
        } else {
            let mut runs = Vec::with_capacity(self.runs.len() + copies.len());
            let mut copies = copies.into_iter().peekable();
            for (i, run) in self.runs.iter().enumerate() {
                match copies.next_if(|(c, _)| *c == i) {
                    Some((_, copy)) => runs.extend(cut(&copy)),
                    None => runs.push(run.clone()),
                }
            }
            // Into an empty output (run 0 did not exist).
            for (_, copy) in copies {
                runs.extend(cut(&copy));
            }
            runs
        };
        Output {
            runs,
            len,
            sum,
            version: OnceLock::new(),
            delta: OnceLock::new(),
            sotw: OnceLock::new(),
        }
    }

    /// The State-of-the-World version of the whole set: a hash of the sum of the
    /// resources' digests (each a hash of name and version) and their number. It depends
    /// on the content alone, so it is identical on every replica, and a derived output
    /// updates the sum per change instead of hashing every resource again.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| {
            let mut buf = Vec::with_capacity(40);
            for limb in self.sum.0 {
                buf.extend_from_slice(&limb.to_le_bytes());
            }
            buf.extend_from_slice(&(self.len as u64).to_le_bytes());
            content_version(&buf)
        })
    }
}

/// The copy of run `run` being changed (made on first use; an empty run past the end).
fn copy_run<'a>(
    copies: &'a mut BTreeMap<usize, Vec<Arc<Resource>>>,
    runs: &[Arc<Run>],
    run: usize,
) -> &'a mut Vec<Arc<Resource>> {
    copies.entry(run).or_insert_with(|| {
        runs.get(run)
            .map(|r| r.resources.clone())
            .unwrap_or_default()
    })
}

/// What a proxy holds of one type: exactly a view output it was sent (shared, no per-stream
/// copy), or its own name → version map (a resuming delta proxy's initial versions, or a
/// held set the proxy changed by unsubscribing).
#[derive(Debug, Clone)]
pub enum Held {
    /// Exactly this output.
    Shared(Arc<Output>),
    /// These names at these versions.
    Own(BTreeMap<String, String>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Own(BTreeMap::new())
    }
}

impl Held {
    /// How many resources are held.
    pub fn len(&self) -> usize {
        match self {
            Held::Shared(o) => o.len(),
            Held::Own(m) => m.len(),
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a resource of this name is held.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Held::Shared(o) => o.contains(name),
            Held::Own(m) => m.contains_key(name),
        }
    }

    /// The proxy dropped `name` (unsubscribed): if it subscribes again, it must be sent
    /// again.
    pub fn forget(&mut self, name: &str) {
        match self {
            // The same output less `name`: it shares the runs, so the next diff against
            // the view's output still skips what both have.
            Held::Shared(o) if o.contains(name) => {
                *self = Held::Shared(Arc::new(o.with_changes(Vec::new(), &[name.to_string()])));
            }
            Held::Shared(_) => {}
            Held::Own(m) => {
                m.remove(name);
            }
        }
    }
}

/// The difference between what a proxy holds and a new output.
#[derive(Debug, Default)]
pub struct Diff {
    /// Resources new or changed, by name.
    pub changed: Vec<Arc<Resource>>,
    /// Names held that the output no longer has.
    pub removed: Vec<String>,
    /// Resources held at their current version.
    pub unchanged: usize,
    /// The changed resources' response entries, gathered once for every stream sending
    /// this diff.
    pub gathered: Gathered,
}

/// A position in an output's resources.
struct Cursor<'a> {
    runs: &'a [Arc<Run>],
    run: usize,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(output: &'a Output) -> Self {
        Cursor {
            runs: &output.runs,
            run: 0,
            at: 0,
        }
    }

    fn peek(&self) -> Option<&'a Arc<Resource>> {
        self.runs.get(self.run)?.resources.get(self.at)
    }

    fn advance(&mut self) {
        self.at += 1;
        if self
            .runs
            .get(self.run)
            .is_some_and(|r| self.at >= r.resources.len())
        {
            self.run += 1;
            self.at = 0;
        }
    }

    /// The run starting here, if the cursor is at the start of one.
    fn whole_run(&self) -> Option<&'a Arc<Run>> {
        (self.at == 0).then(|| self.runs.get(self.run)).flatten()
    }
}

impl Diff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }

    /// What `cur` changes for a proxy holding `held`.
    pub fn between(held: &Held, cur: &Output) -> Diff {
        let mut diff = Diff::default();
        match held {
            Held::Shared(prev) if std::ptr::eq(prev.as_ref(), cur) => {
                diff.unchanged = cur.len();
            }
            Held::Shared(prev) => {
                // Both ordered by name: one merge pass, skipping the runs both share
                // (an output derived from the other shares all it did not change).
                let (mut a, mut b) = (Cursor::new(prev), Cursor::new(cur));
                loop {
                    if let (Some(x), Some(y)) = (a.whole_run(), b.whole_run()) {
                        if Arc::ptr_eq(x, y) {
                            diff.unchanged += x.resources.len();
                            a.run += 1;
                            b.run += 1;
                            continue;
                        }
                    }
                    match (a.peek(), b.peek()) {
                        (None, None) => break,
                        (Some(p), None) => {
                            diff.removed.push(p.name.clone());
                            a.advance();
                        }
                        (Some(p), Some(r)) if p.name < r.name => {
                            diff.removed.push(p.name.clone());
                            a.advance();
                        }
                        (Some(p), Some(r)) if p.name == r.name => {
                            if Arc::ptr_eq(p, r) || p.version == r.version {
                                diff.unchanged += 1;
                            } else {
                                diff.changed.push(r.clone());
                            }
                            a.advance();
                            b.advance();
                        }
                        (_, Some(r)) => {
                            diff.changed.push(r.clone());
                            b.advance();
                        }
                    }
                }
            }
            Held::Own(map) => {
                for r in cur.iter() {
                    if map.get(&r.name) == Some(&r.version) {
                        diff.unchanged += 1;
                    } else {
                        diff.changed.push(r.clone());
                    }
                }
                diff.removed = map.keys().filter(|n| !cur.contains(n)).cloned().collect();
            }
        }
        diff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(name: &str, version: &str) -> Arc<Resource> {
        Arc::new(Resource::from_parts(
            name.into(),
            version.into(),
            Default::default(),
        ))
    }

    /// Derived outputs are what building afresh gives (same resources, same version),
    /// share the runs no change is in, and diff against their source run by run.
    #[test]
    fn derived_outputs_equal_fresh_ones_and_share_runs() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
        let all: Vec<Arc<Resource>> = names.iter().map(|n| res(n, "1")).collect();
        let base = Arc::new(Output::new(all.clone()));
        let upserts = vec![res("n0500", "2"), res("a-first", "1"), res("n0500x", "1")];
        let removed = vec![
            "n0001".to_string(),
            "n0999".to_string(),
            "absent".to_string(),
        ];
        let derived = base.with_changes(upserts, &removed);
        let mut expected: Vec<Arc<Resource>> = all
            .iter()
            .filter(|r| !removed.contains(&r.name) && r.name != "n0500")
            .cloned()
            .collect();
        expected.extend([res("n0500", "2"), res("a-first", "1"), res("n0500x", "1")]);
        let fresh = Output::new(expected);
        assert_eq!(derived.len(), fresh.len());
        assert_eq!(derived.version(), fresh.version());
        let names_of = |o: &Output| -> Vec<(String, String)> {
            o.resources()
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect()
        };
        assert_eq!(names_of(&derived), names_of(&fresh));
        assert!(derived.contains("n0500x") && !derived.contains("n0001"));
        let shared = derived
            .runs
            .iter()
            .filter(|r| base.runs.iter().any(|b| Arc::ptr_eq(b, r)))
            .count();
        assert_eq!(shared, base.runs.len() - 3, "three runs changed");
        let d = Diff::between(&Held::Shared(base.clone()), &derived);
        let changed: Vec<&str> = d.changed.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(changed, ["a-first", "n0500", "n0500x"]);
        assert_eq!(d.removed, ["n0001", "n0999"]);
        assert_eq!(d.unchanged, 997);
        // No change: the same runs.
        let same = base.with_changes(vec![res("n0002", "1")], &[]);
        assert_eq!(same.version(), base.version());
        assert!(same
            .runs
            .iter()
            .zip(&base.runs)
            .all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    /// Two outputs holding the same 1 000 resources beside a few of their own (two sidecar
    /// views of a namespace: shared outbound clusters, own inbound ones) are one set of
    /// runs but for the runs their own resources are in, and share those runs' gathered
    /// response entries.
    #[test]
    fn outputs_of_different_views_share_runs_of_equal_resources() {
        let common: Vec<Arc<Resource>> = (0..1000)
            .map(|i| res(&format!("outbound|80||svc-{i:04}"), "1"))
            .collect();
        let with = |own: &[&str]| {
            let mut all: Vec<Arc<Resource>> = common.clone();
            all.extend(own.iter().map(|n| res(n, "1")));
            Output::new(all)
        };
        let a = with(&["inbound|8080||", "inbound|9090||"]);
        // Equal resources built separately (another view's generation): equal runs too.
        let b = Output::new(
            (0..1000)
                .map(|i| res(&format!("outbound|80||svc-{i:04}"), "1"))
                .chain([res("inbound|7070||", "1")])
                .collect(),
        );
        let shared = b
            .runs
            .iter()
            .filter(|r| a.runs.iter().any(|x| Arc::ptr_eq(x, r)))
            .count();
        assert!(
            shared + 1 >= b.runs.len() && b.runs.len() > 2,
            "{shared} of {} runs shared",
            b.runs.len()
        );
        let (ea, eb) = (a.delta_entries(), b.delta_entries());
        let same_bytes = eb
            .chunks
            .iter()
            .filter(|c| ea.chunks.iter().any(|x| x.as_ptr() == c.as_ptr()))
            .count();
        assert!(same_bytes + 2 >= eb.chunks.len(), "gathered once per run");
        let total: usize = b.resources().iter().map(|r| r.delta_entry().len()).sum();
        assert_eq!(eb.len, total);
    }

    #[test]
    fn diff_of_shared_and_own_held_sets() {
        let prev = Arc::new(Output::new(vec![
            res("a", "1"),
            res("b", "1"),
            res("c", "1"),
        ]));
        let cur = Output::new(vec![res("b", "2"), res("c", "1"), res("d", "1")]);
        for held in [
            Held::Shared(prev.clone()),
            Held::Own(
                [("a", "1"), ("b", "1"), ("c", "1")]
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            ),
        ] {
            let d = Diff::between(&held, &cur);
            let changed: Vec<&str> = d.changed.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(changed, ["b", "d"]);
            assert_eq!(d.removed, ["a"]);
            assert_eq!(d.unchanged, 1);
        }
        let same = Diff::between(&Held::Shared(prev.clone()), &prev);
        assert!(same.is_empty());
        assert_eq!(same.unchanged, 3);
    }

    #[test]
    fn forgetting_a_shared_name_keeps_the_rest() {
        let out = Arc::new(Output::new(vec![res("a", "1"), res("b", "1")]));
        let mut held = Held::Shared(out.clone());
        held.forget("x");
        assert!(
            matches!(&held, Held::Shared(o) if Arc::ptr_eq(o, &out)),
            "nothing to forget"
        );
        held.forget("a");
        let Held::Shared(rest) = &held else {
            panic!("the rest is still a shared output")
        };
        let names: Vec<&str> = rest.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["b"]);
        // Subscribing to `a` again sends it again.
        let d = Diff::between(&held, &out);
        assert_eq!(d.changed.len(), 1);
    }
}
