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

/// How deeply a parsed value nests (a scalar: 0).
fn value_depth(v: &Value) -> usize {
    match v {
        Value::Array(s) => 1 + s.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The depth `yaml_depth` counts for `text` (the least limit it passes).
fn counted_depth(text: &str) -> usize {
    (0..=yaml_depth::MAX_DEPTH)
        .find(|&limit| yaml_depth::check(text, limit).is_ok())
        .unwrap_or(usize::MAX)
}

/// The nesting check never counts fewer levels than the parser builds, for any text the
/// parser accepts (aliases aside: they repeat a node without nesting it in the text).
fn check_depth_bound(text: &str) -> Result<(), TestCaseError> {
    if text.contains('*') {
        return Ok(());
    }
    let Ok(docs) = yaml_documents(&test_path("fuzz.yaml"), text) else {
        return Ok(());
    };
    let parsed = docs.iter().map(value_depth).max().unwrap_or(0);
    let counted = counted_depth(text);
    prop_assert!(
        counted >= parsed,
        "counted {counted} levels, the parser built {parsed}:\n{text}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(512), ..ProptestConfig::default() })]

    #[test]
    fn prop_nesting_count_covers_the_parsed_depth(text in yamlish()) {
        check_depth_bound(&text)?;
    }

    #[test]
    fn prop_nesting_count_covers_the_parsed_depth_of_edited_manifests(
        seed in prop::sample::select(SEEDS),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        check_depth_bound(&mutate(seed, &mutations))?;
    }
}

/// Real manifests are far below the limit: the example mesh counts at most this deep.
#[test]
fn the_example_mesh_nests_far_below_the_limit() {
    for seed in SEEDS {
        let counted = counted_depth(seed);
        assert!(counted <= 15, "{counted} levels counted in\n{seed}");
        let parsed = yaml_documents(&test_path("seed.yaml"), seed)
            .expect("parses")
            .iter()
            .map(value_depth)
            .max()
            .unwrap_or(0);
        assert!(counted >= parsed, "{counted} < {parsed}");
    }
}

/// A YAML node, rendered in flow or block style (for the nesting count's exactness).
#[derive(Debug, Clone)]
enum Node {
    Plain(String),
    /// Quoted (single or double): brackets inside are text.
    Quoted(String, bool),
    /// A literal block scalar: brackets inside are text.
    Literal(Vec<String>),
    FlowSeq(Vec<Node>),
    FlowMap(Vec<Node>),
    BlockSeq(Vec<Node>),
    BlockMap(Vec<Node>),
}

fn node() -> impl Strategy<Value = Node> {
    let text = "[a-z\\[\\]{}#:, ]{0,8}";
    let leaf = prop_oneof![
        "[a-z][a-z0-9]{0,5}".prop_map(Node::Plain),
        (text, any::<bool>()).prop_map(|(t, double)| Node::Quoted(t, double)),
        prop::collection::vec(text, 1..3).prop_map(Node::Literal),
    ];
    leaf.prop_recursive(12, 64, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Node::FlowSeq),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Node::FlowMap),
            prop::collection::vec(inner.clone(), 1..4).prop_map(Node::BlockSeq),
            prop::collection::vec(inner, 1..4).prop_map(Node::BlockMap),
        ]
    })
}

impl Node {
    fn depth(&self) -> usize {
        match self {
            Node::Plain(_) | Node::Quoted(..) | Node::Literal(_) => 0,
            Node::FlowSeq(items)
            | Node::FlowMap(items)
            | Node::BlockSeq(items)
            | Node::BlockMap(items) => 1 + items.iter().map(Node::depth).max().unwrap_or(0),
        }
    }

    fn is_block(&self) -> bool {
        matches!(
            self,
            Node::BlockSeq(_) | Node::BlockMap(_) | Node::Literal(_)
        )
    }

    /// In flow style (block collections become flow ones, literals quoted).
    fn flow(&self) -> String {
        match self {
            Node::Plain(s) => s.clone(),
            Node::Quoted(s, true) => format!("{s:?}"),
            Node::Quoted(s, false) => format!("'{}'", s.replace('\'', "''")),
            Node::Literal(lines) => format!("{:?}", lines.join("\n")),
            Node::FlowSeq(items) | Node::BlockSeq(items) => {
                let items: Vec<String> = items.iter().map(Node::flow).collect();
                format!("[{}]", items.join(", "))
            }
            Node::FlowMap(items) | Node::BlockMap(items) => {
                let items: Vec<String> = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("k{i}: {}", v.flow()))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }

    /// As the value after `key:` or `-` at indentation `indent`: the rest of that line and
    /// the lines after it.
    fn block(&self, indent: usize) -> String {
        let pad = " ".repeat(indent + 2);
        match self {
            Node::Literal(lines) => {
                let body: Vec<String> = lines.iter().map(|l| format!("{pad}x{l}")).collect();
                format!(" |\n{}\n", body.join("\n"))
            }
            Node::BlockSeq(items) => {
                let body: String = items
                    .iter()
                    .map(|v| format!("{pad}-{}", v.block_or_inline(indent + 2)))
                    .collect();
                format!("\n{body}")
            }
            Node::BlockMap(items) => {
                let body: String = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{pad}k{i}:{}", v.block_or_inline(indent + 2)))
                    .collect();
                format!("\n{body}")
            }
            _ => format!(" {}\n", self.flow()),
        }
    }

    fn block_or_inline(&self, indent: usize) -> String {
        if self.is_block() {
            self.block(indent)
        } else {
            format!(" {}\n", self.flow())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(512), ..ProptestConfig::default() })]

    /// On documents mixing flow and block collections, quoted scalars and block scalars
    /// with brackets and `#` inside, the count is exact: no level missed, none invented.
    #[test]
    fn prop_nesting_count_is_exact_on_generated_documents(root in node()) {
        let text = format!("root:{}", root.block_or_inline(0));
        let docs = yaml_documents(&test_path("gen.yaml"), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let parsed = docs.iter().map(value_depth).max().unwrap_or(0);
        prop_assert_eq!(parsed, root.depth() + 1, "{}", text);
        prop_assert_eq!(counted_depth(&text), parsed, "{}", text);
    }
}
