//! The layers inside the server and ingester crates, checked from their sources.
//!
//! Each `crate::…` path in a module's code (comments and test modules left out) is an
//! import edge. Two rules hold:
//! - no import cycle among the sibling modules of any folder, in either crate;
//! - in the server, imports run one way between layers: `index` → `generate` → `push` →
//!   `security` → `xds` → the wiring on top (`app`, `admin`, `debug`, `metrics`). A module
//!   may import its own layer and the layers below it, never one above.
//!
//! docs/architecture.md describes the layers; this test keeps them true.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The server's layers, bottom first. A top-level module not listed is refused, so a new
/// one must be given its place here.
const SERVER_LAYERS: &[&[&str]] = &[
    &["hashing"],
    &["index"],
    &["generate"],
    &["push"],
    &["security"],
    &["xds"],
    &["admin", "app", "debug", "metrics"],
];

/// A module of a crate: its path (`index::store`) and its code.
struct Module {
    path: Vec<String>,
    code: String,
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

/// Whether a file holds tests only (`tests.rs`, `*_tests.rs`, `testutil.rs`, `testing.rs`,
/// anything under a `tests/` folder): test code may reach across layers.
fn is_test_file(rel: &Path) -> bool {
    rel.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        let stem = c.trim_end_matches(".rs");
        stem == "tests" || stem.ends_with("_tests") || stem == "testutil" || stem == "testing"
    })
}

/// The code of a file without comments and without its inline `#[cfg(test)] mod … { }`
/// (by convention the last item of a file).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            if let Some(next) = lines.peek() {
                let next = next.trim_start();
                if (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
                    && next.trim_end().ends_with('{')
                {
                    break;
                }
            }
        }
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("reads the source folder") {
            let path = entry.expect("reads a folder entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src").to_path_buf();
            if is_test_file(&rel) {
                continue;
            }
            let mut parts: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("reads a source file");
            out.push(Module {
                path: parts,
                code: code_of(&text),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The module paths a module's code names with `crate::` (in `use` lines, grouped
/// imports and inline paths), resolved to the longest known module.
fn imports(module: &Module, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let mut add = |path: Vec<String>| {
        for len in (1..=path.len()).rev() {
            if known.contains(&path[..len]) {
                out.insert(path[..len].to_vec());
                return;
            }
        }
    };
    let code = &module.code;
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // shoal_crate:: or the like
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find("};").unwrap_or(group.len());
            for item in group[..end].split(',') {
                add(segments(item.trim()));
            }
        } else {
            add(segments(rest));
        }
    }
    out
}

fn segments(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if word.is_empty() || !word.starts_with(|c: char| c.is_lowercase()) {
            break;
        }
        out.push(word.to_string());
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    out
}

/// Import edges between siblings: for a module importing another, the pair of their
/// ancestors that share a parent (`push::view` importing `index::store` is `push → index`).
fn sibling_edges(mods: &[Module]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for m in mods {
        for to in imports(m, &known) {
            let common = m.path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common >= m.path.len() || common >= to.len() {
                continue; // a module and its ancestor or descendant
            }
            edges
                .entry(m.path[..=common].to_vec())
                .or_default()
                .insert(to[..=common].to_vec());
        }
    }
    edges
}

/// Every strongly connected component of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&Vec<String>> = edges.keys().chain(edges.values().flatten()).collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn assert_no_cycles(krate: &str) {
    let mods = modules(&crate_src(krate));
    assert!(
        mods.len() > 10,
        "{krate}: found only {} modules",
        mods.len()
    );
    let found = cycles(&sibling_edges(&mods));
    assert!(
        found.is_empty(),
        "{krate}: import cycles among sibling modules (each line one cycle):\n{}",
        found
            .iter()
            .map(|c| c.join(" ↔ "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every import of `mods` that goes up `layers`, as `from → to`.
fn upward_imports(mods: &[Module], layers: &[&[&str]]) -> Result<Vec<String>, String> {
    let rank = |top: &str| layers.iter().position(|l| l.contains(&top));
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut up = Vec::new();
    for m in mods {
        let Some(top) = m.path.first() else {
            continue; // lib.rs
        };
        let from = rank(top).ok_or_else(|| format!("module `{top}` has no layer"))?;
        for to in imports(m, &known) {
            let to_rank = rank(&to[0]).ok_or_else(|| format!("module `{}` has no layer", to[0]))?;
            if to_rank > from {
                up.push(format!("{} → {}", m.path.join("::"), to.join("::")));
            }
        }
    }
    Ok(up)
}

#[test]
fn server_imports_run_down_the_layers() {
    let mods = modules(&crate_src("server"));
    let up = upward_imports(&mods, SERVER_LAYERS).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        up.is_empty(),
        "server: imports from a lower layer to a higher one (layers, bottom first: {SERVER_LAYERS:?}):\n{}",
        up.join("\n")
    );
}

#[test]
fn server_has_no_import_cycles() {
    assert_no_cycles("server");
}

#[test]
fn ingester_has_no_import_cycles() {
    assert_no_cycles("ingester");
}

#[test]
fn an_upward_import_is_caught() {
    // The check itself: an index module naming the xds layer fails it.
    let mods = vec![
        Module {
            path: vec!["index".into(), "store".into()],
            code: code_of("use crate::xds::registry::Registry;\n// crate::push in a comment\n"),
        },
        Module {
            path: vec!["xds".into(), "registry".into()],
            code: code_of("use crate::{index::store, push};\n"),
        },
        Module {
            path: vec!["push".into()],
            code: String::new(),
        },
    ];
    let up = upward_imports(&mods, SERVER_LAYERS).expect("every module has a layer");
    assert_eq!(up, vec!["index::store → xds::registry".to_string()]);
    let found = cycles(&sibling_edges(&mods));
    assert_eq!(found, vec![vec!["index".to_string(), "xds".to_string()]]);
}
