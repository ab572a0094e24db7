//! YAML as shoal reads and writes it: one parser (`serde-saphyr`, which kube uses too) and
//! one set of reading rules for every YAML input of the workspace (manifests, MeshConfig,
//! test fixtures).
//!
//! The rules keep what shoal read before with `serde_yaml` 0.9 (the YAML 1.2 core schema),
//! where `serde-saphyr`'s defaults lean to YAML 1.1:
//!
//! - Booleans are `true`/`false` (also `True`, `TRUE`, ...) only; `yes`, `no`, `on`, `off`,
//!   `y` and `n` are strings, and a boolean field given one is an error.
//! - A plain integer with leading zeros (`0755`) or underscores (`1_000`) read without a
//!   type is a string: YAML 1.1 reads `0755` as 493 and YAML 1.2 as 755, so a typed field
//!   refuses it rather than guess.
//! - `.inf` and `.nan` read without a type are the strings `.inf` and `.nan` (JSON has no
//!   such numbers), so they fail only the field that has them.
//! - A key repeated in one mapping is an error; `<<` merge keys are expanded.
//!
//! Nesting is limited twice: callers run [`crate::yaml_depth::check`] first (one linear
//! pass), and the parser's own budget refuses deeper nesting as well. Alias expansion is
//! capped by the parser (alias bombs). Counts that only grow with the input's size are not
//! limited here: callers bound the size (`--max-manifest-bytes`, Secret sizes).

use crate::yaml_depth::MAX_DEPTH;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::{Budget, DuplicateKeyPolicy, MergeKeyPolicy, NonFiniteFloatPolicy, Spanned};

pub use serde_saphyr::{Error, SerializeError};

/// The options every YAML input is read with (see the module doc for the rules).
pub fn options() -> serde_saphyr::Options {
    let mut budget = Budget::default();
    // A second line behind `yaml_depth::check`, at the same depth.
    budget.max_depth = MAX_DEPTH;
    // These grow at most linearly with the input, whose size the caller bounds; the
    // defaults (1 024 documents, 250 000 nodes) would refuse a large valid manifest file.
    budget.max_documents = usize::MAX;
    budget.max_events = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    // A heuristic that refuses more than 10 aliases per anchor (from 100 aliases on), which
    // valid files may have; alias expansion stays capped by `alias_limits` (1 000 000
    // replayed events by default).
    budget.enforce_alias_anchor_ratio = false;
    serde_saphyr::options! {
        budget: Some(budget),
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: NonFiniteFloatPolicy::AsString,
        duplicate_keys: DuplicateKeyPolicy::Error,
        merge_keys: MergeKeyPolicy::Merge,
        emit_comments: false,
        // One-line errors: a snippet would copy input lines (maybe a Secret's) into logs.
        with_snippet: false,
    }
}

/// Reads one YAML document (or JSON) into `T`. An empty text is YAML's null: `Option<T>`
/// reads it as `None`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Writes `value` as YAML. Strings YAML 1.1 would read as something else (`yes`, `0755`)
/// are quoted.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, SerializeError> {
    serde_saphyr::to_string(value)
}

/// A YAML stream that is not valid YAML, with the document where it failed.
#[derive(Debug, thiserror::Error)]
#[error("document {document}: {source}")]
pub struct DocumentsError {
    /// Index (from 0) of the document that failed, counting empty documents.
    pub document: usize,
    /// The parser's error (it gives the line and column in the whole text; boxed, as it
    /// is large).
    #[source]
    pub source: Box<Error>,
}

/// Reads every document of a YAML stream as a generic value, in order. An empty document
/// is [`serde_json::Value::Null`] and keeps its place, so indices match what a reader counts
/// (`---` separators), as they did with `serde_yaml`.
///
/// Objects are read as JSON values on purpose: that is how Kubernetes reads YAML
/// (converted to JSON, then decoded), and how the Kubernetes API source receives them.
/// Non-string keys become strings (`80: x` is `"80": x`).
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, DocumentsError> {
    let starts = document_start_lines(text);
    // The parser skips empty documents; each root's line says which document it is.
    let parsed: Vec<Spanned<serde_json::Value>> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(|source| {
            let line = source.location().map(|l| l.line());
            DocumentsError {
                document: document_at(&starts, line),
                source: Box::new(source),
            }
        })?;
    let mut out = vec![serde_json::Value::Null; starts.len()];
    let mut next = 0;
    for doc in parsed {
        // Documents come in order; never let two land on one index.
        let index = document_at(&starts, Some(doc.referenced.line())).max(next);
        if index >= out.len() {
            out.resize(index + 1, serde_json::Value::Null);
        }
        out[index] = doc.value;
        next = index + 1;
    }
    Ok(out)
}

/// The line (from 1) where each document starts, `---` or its first content. Stops at a
/// syntax error: the full parse that follows fails there too (same parser, same limits).
fn document_start_lines(text: &str) -> Vec<u64> {
    let mut parser_options = serde_saphyr::granit_parser::Options::default();
    // As `options()` parses: no comment events; block nesting at least the budget's depth.
    parser_options.emit_comments = false;
    parser_options.block_nesting_limit = parser_options.block_nesting_limit.max(MAX_DEPTH + 1);
    let mut starts = Vec::new();
    for event in Parser::new_from_str_with_options(text, parser_options) {
        match event {
            Ok((Event::DocumentStart(..), span)) => {
                starts.push(u64::try_from(span.start.line()).unwrap_or(u64::MAX));
            }
            Ok((Event::StreamEnd, _)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    starts
}

/// The index of the document that `line` is in: the last one starting at or before it.
/// Without a line (an error the parser could not place), the last document started.
fn document_at(starts: &[u64], line: Option<u64>) -> usize {
    let started = match line {
        Some(line) if line > 0 => starts.partition_point(|&start| start <= line),
        _ => starts.len(),
    };
    started.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_documents_keep_their_index() {
        let text = "a: 1\n---\n---\n# only a comment\n---\n--- {b: 2}\n---\nc\n...\nd: [1]\n";
        let docs = documents(text).unwrap();
        assert_eq!(
            docs,
            vec![
                json!({"a": 1}),
                json!(null),
                json!(null),
                json!(null),
                json!({"b": 2}),
                json!("c"),
                json!({"d": [1]}),
            ]
        );
        assert_eq!(documents("").unwrap(), Vec::<serde_json::Value>::new());
        assert_eq!(documents("---\n---\n").unwrap(), vec![json!(null); 2]);
        // A leading `---` starts the first document, not a second one.
        assert_eq!(
            documents("# c\n---\na: 1\n").unwrap(),
            vec![json!({"a": 1})]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: crate::proptest_cases(256),
            ..Default::default()
        })]

        /// Whatever mix of empty, comment-only, block, flow and scalar documents a stream
        /// has, every document keeps its index.
        #[test]
        fn prop_every_document_keeps_its_index(kinds in proptest::collection::vec(0usize..6, 0..12)) {
            let mut text = String::new();
            let mut want = Vec::new();
            for (i, kind) in kinds.iter().enumerate() {
                let (doc, value) = match kind {
                    0 => (String::new(), json!(null)),
                    1 => ("# a comment\n".to_string(), json!(null)),
                    2 => (format!("a: {i}\nb:\n- x\n"), json!({"a": i, "b": ["x"]})),
                    3 => (format!("{{a: {i}}}\n"), json!({"a": i})),
                    4 => (format!("s{i}\n...\n"), json!(format!("s{i}"))),
                    _ => ("~\n".to_string(), json!(null)),
                };
                text.push_str("---\n");
                text.push_str(&doc);
                want.push(value);
            }
            proptest::prop_assert_eq!(documents(&text).unwrap(), want, "{}", text);
        }
    }

    #[test]
    fn errors_name_the_document_and_line() {
        let err = documents("a: 1\n---\nb: 2\n---\nkind: [unclosed\n").unwrap_err();
        assert_eq!(err.document, 2, "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with("document 2: "), "{msg}");
        assert!(msg.contains("line 5"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");

        let err = documents("a: 1\n---\nb: 1\nb: 2\n").unwrap_err();
        assert_eq!(err.document, 1, "{err}");
        assert!(err.to_string().contains("duplicate"), "{err}");
    }

    /// The scalars whose reading differs between YAML 1.1 and 1.2 read as `serde_yaml`
    /// read them (YAML 1.2 core schema; ambiguous numbers stay strings).
    #[test]
    fn scalars_read_as_yaml_1_2() {
        let text = "a: yes\nb: on\nc: 0755\nd: 1_000\ne: .inf\nf: 0x1F\ng: True\nh: ~\n\
                    i: 1.5\nj: -3\nk: n\nl: .nan\nm: 0o17\n";
        let v: serde_json::Value = from_str(text).unwrap();
        assert_eq!(
            v,
            json!({
                "a": "yes", "b": "on", "c": "0755", "d": "1_000", "e": ".inf", "f": 31,
                "g": true, "h": null, "i": 1.5, "j": -3, "k": "n", "l": ".nan", "m": 15,
            })
        );
        // A typed boolean refuses a YAML 1.1 spelling rather than guess.
        assert!(from_str::<bool>("yes").is_err());
        assert!(from_str::<bool>("True").unwrap());
        // Typed strings take any scalar as written.
        assert_eq!(from_str::<String>("0755").unwrap(), "0755");
    }

    #[test]
    fn keys_become_strings_and_merge_keys_expand() {
        let v: serde_json::Value = from_str("80: x\ntrue: y\n").unwrap();
        assert_eq!(v, json!({"80": "x", "true": "y"}));
        let v: serde_json::Value =
            from_str("base: &b {x: 1, y: 2}\nobj:\n  <<: *b\n  y: 3\n").unwrap();
        assert_eq!(v["obj"], json!({"x": 1, "y": 3}));
    }

    #[test]
    fn empty_text_is_null() {
        assert_eq!(from_str::<Option<serde_json::Value>>("").unwrap(), None);
        assert_eq!(
            from_str::<Option<serde_json::Value>>("# c\n").unwrap(),
            None
        );
    }

    #[test]
    fn the_budget_refuses_deep_nesting_and_alias_bombs() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(from_str::<serde_json::Value>(&deep).is_err());
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        assert!(from_str::<serde_json::Value>(&ok).is_ok());
        // Nine levels of ten aliases each: 10^9 nodes if expanded.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [{}]\n",
                vec![format!("*a{p}"); 10].join(", ")
            ));
        }
        // Refused after a bounded amount of work: expanding it would take hours. The bound
        // is loose on purpose: the refusal takes ~4 s in a debug build on a quiet 2-core
        // machine, and tests share those cores with compilers and end-to-end tests.
        let started = std::time::Instant::now();
        assert!(from_str::<serde_json::Value>(&bomb).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn many_documents_and_nodes_are_read() {
        // Over the parser's default budget (1 024 documents, 250 000 nodes); the last `---`
        // starts an empty document.
        let text =
            "{a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}\n---\n"
                .repeat(13_000);
        let docs = documents(&text).unwrap();
        assert_eq!(docs.len(), 13_001);
        assert!(docs[12_999].is_object() && docs[13_000].is_null());
    }

    #[test]
    fn written_strings_read_back_as_strings() {
        let v = json!({"a": "yes", "b": "0755", "c": "true", "d": "", "e": "~", "f": "n",
                       "g": "multi\nline\n", "h": 5, "i": [true, null]});
        let text = to_string(&v).unwrap();
        assert_eq!(from_str::<serde_json::Value>(&text).unwrap(), v, "{text}");
    }
}
