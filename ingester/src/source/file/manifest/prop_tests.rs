//! Property tests of manifest parsing: arbitrary YAML-ish text and mutated copies of the
//! example mesh (docs/examples/mesh) never panic, and every error says where it is.

use super::*;
use proptest::prelude::*;

const SEEDS: &[&str] = &[
    include_str!("../../../../../docs/examples/mesh/00-namespaces.yaml"),
    include_str!("../../../../../docs/examples/mesh/10-services.yaml"),
    include_str!("../../../../../docs/examples/mesh/20-workloads.yaml"),
    include_str!("../../../../../docs/examples/mesh/30-gateway.yaml"),
    include_str!("../../../../../docs/examples/mesh/40-virtualservice.yaml"),
    include_str!("../../../../../docs/examples/mesh/50-destinationrule.yaml"),
    include_str!("../../../../../docs/examples/mesh/60-sidecar.yaml"),
    include_str!("../../../../../docs/examples/mesh/70-serviceentry.yaml"),
];

/// Pieces of YAML and JSON syntax, field names and values the parser cares about.
const TOKENS: &[&str] = &[
    "---\n",
    "\n",
    "  ",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\"",
    "'",
    "#",
    "&a ",
    "*a",
    "<<: *a",
    "!!binary ",
    "!!str ",
    "|\n",
    ">-\n",
    "~",
    "null",
    "true",
    "0x1F",
    "-1",
    "99999999999999999999",
    "1e400",
    ".nan",
    "apiVersion: ",
    "kind: ",
    "metadata:",
    "name: ",
    "namespace: ",
    "spec:",
    "v1",
    "networking.istio.io/v1",
    "networking.istio.io/v2",
    "discovery.k8s.io/v1",
    "VirtualService",
    "DestinationRule",
    "Gateway",
    "ServiceEntry",
    "Sidecar",
    "WorkloadEntry",
    "Service",
    "Pod",
    "Node",
    "EndpointSlice",
    "Namespace",
    "hosts:",
    "http:",
    "route:",
    "destination:",
    "host: ",
    "port:",
    "number: ",
    "subsets:",
    "servers:",
    "ports:",
    "endpoints:",
    "addresses:",
    "labels:",
    "items:",
    "List",
];

fn yamlish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(TOKENS).prop_map(str::to_string),
            1 => ".{0,6}",
        ],
        0..60,
    )
    .prop_map(|parts| parts.concat())
}

#[derive(Debug, Clone)]
enum Mutation {
    Remove(usize),
    Duplicate(usize),
    Insert(usize, String),
    Indent(usize, usize),
    Dedent(usize),
    ReplaceValue(usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let token = || prop::sample::select(TOKENS).prop_map(str::to_string);
    prop_oneof![
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), prop_oneof![token(), ".{0,10}"]).prop_map(|(i, s)| Mutation::Insert(i, s)),
        (any::<usize>(), 1usize..5).prop_map(|(i, n)| Mutation::Indent(i, n)),
        any::<usize>().prop_map(Mutation::Dedent),
        (any::<usize>(), prop_oneof![token(), ".{0,10}"])
            .prop_map(|(i, s)| Mutation::ReplaceValue(i, s)),
    ]
}

fn mutate(seed: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = seed.lines().map(str::to_string).collect();
    for m in mutations {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match m {
            Mutation::Remove(i) => {
                lines.remove(i % n);
            }
            Mutation::Duplicate(i) => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Insert(i, s) => lines.insert(i % (n + 1), s.clone()),
            Mutation::Indent(i, k) => lines[i % n].insert_str(0, &" ".repeat(*k)),
            Mutation::Dedent(i) => {
                let l = &mut lines[i % n];
                *l = l.trim_start().to_string();
            }
            Mutation::ReplaceValue(i, s) => {
                let l = &mut lines[i % n];
                if let Some(at) = l.find(": ") {
                    l.truncate(at + 2);
                    l.push_str(s);
                } else {
                    l.push_str(s);
                }
            }
        }
    }
    lines.join("\n")
}

/// Parses `text` as a YAML and as a JSON file and checks every error names its file and
/// document.
fn check(text: &str) -> Result<(), TestCaseError> {
    for name in ["fuzz.yaml", "fuzz.json"] {
        let path = test_path(name);
        match parse_file(&path, text) {
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("/manifests/fuzz."), "no file in {msg}");
                prop_assert!(msg.contains("document"), "no document in {msg}");
            }
            Ok(parsed) => {
                for e in &parsed.errors {
                    let msg = e.error.to_string();
                    prop_assert!(msg.contains("/manifests/fuzz."), "no file in {msg}");
                    prop_assert!(msg.contains("document"), "no document in {msg}");
                    prop_assert!(msg.len() < 64 * 1024 + text.len(), "runaway message");
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(512), ..ProptestConfig::default() })]

    #[test]
    fn prop_yamlish_text_never_panics(text in yamlish()) {
        check(&text)?;
    }

    #[test]
    fn prop_mutated_example_manifests_never_panic(
        seed in prop::sample::select(SEEDS),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        check(&mutate(seed, &mutations))?;
    }
}

/// The seeds themselves are clean: the mutations above start from valid files.
#[test]
fn the_seeds_parse_without_errors() {
    for seed in SEEDS {
        let parsed = parse_file(&test_path("seed.yaml"), seed).expect("parses");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert!(!parsed.objects.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: shoal_common::proptest_cases(128),
        ..ProptestConfig::default()
    })]

    /// With the example mesh loaded, a bad edit of one file never takes accepted objects
    /// down: a file that does not parse keeps the whole desired state, and a rejected
    /// document keeps its object's previous version (unless the file now defines it
    /// validly elsewhere).
    #[test]
    fn prop_bad_edits_keep_the_accepted_objects(
        which in 0..SEEDS.len(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        use crate::source::file::store::ManifestStore;
        let mut store = ManifestStore::new();
        for (i, seed) in SEEDS.iter().enumerate() {
            let path = test_path(&format!("{i}.yaml"));
            store.apply(&path, parse_file(&path, seed));
        }
        let before = store.desired_state("c1");
        let path = test_path(&format!("{which}.yaml"));
        let previous: Vec<ParsedObject> = store.objects(&path).unwrap_or_default().to_vec();
        let parsed = parse_file(&path, &mutate(SEEDS[which], &mutations));
        let kept: Vec<ParsedObject> = match &parsed {
            Err(_) => previous.clone(),
            Ok(p) => p
                .errors
                .iter()
                .filter_map(|e| e.id.as_ref())
                .filter(|id| !p.objects.iter().any(|o| &o.id == *id))
                .filter_map(|id| previous.iter().find(|o| &o.id == id).cloned())
                .collect(),
        };
        let unparseable = parsed.is_err();
        store.apply(&path, parsed);
        let now = store.objects(&path).unwrap_or_default();
        for old in &kept {
            prop_assert!(now.contains(old), "{} was dropped", old.id);
        }
        if unparseable {
            prop_assert_eq!(store.desired_state("c1"), before);
        }
    }
}
