//! Every Istio sample and istio.io task YAML in `../shared/istio-samples/` (Istio's own,
//! verbatim; read at run time from beside the clone, never copied here) goes through the
//! manifest ingest path: each document is accepted, or rejected with an error naming the
//! field, and every rejection is listed in docs/istio-compatibility.md.

use crate::admit::normalize;
use crate::source::file::manifest::{parse_file, ManifestObject};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const DOC: &str = include_str!("../../../../docs/istio-compatibility.md");

/// Documents shoal refuses, by file (relative to the samples directory), and the field
/// the error must name. Empty: every sample is accepted today.
const REJECTED: &[(&str, &str)] = &[];

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/istio-samples")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (Istio's samples live in ../shared beside the clone)",
            dir.display()
        )
    });
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

#[test]
fn every_istio_sample_is_accepted_or_rejected_by_field() {
    let dir = samples_dir();
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    files.sort();
    assert!(files.len() >= 40, "only {} sample files", files.len());
    let expected: BTreeMap<&str, &str> = REJECTED.iter().copied().collect();
    let mut accepted = 0;
    let mut config = 0;
    let mut unexpected = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&dir)
            .expect("under the samples dir")
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).expect("readable sample");
        let parsed = parse_file(path, &text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for obj in &parsed.objects {
            accepted += 1;
            match &obj.object {
                ManifestObject::Config(_) => config += 1,
                // A Service must also survive normalization (ports, protocols).
                ManifestObject::Service(svc) => {
                    if let Err(e) = normalize::service(svc, "Kubernetes") {
                        unexpected.push(format!("{rel}: {e}"));
                    }
                }
                _ => {}
            }
        }
        for err in &parsed.errors {
            // The error and its causes: the field is named in one of them.
            let mut message = err.error.to_string();
            let mut source = std::error::Error::source(&err.error);
            while let Some(s) = source {
                message.push_str(": ");
                message.push_str(&s.to_string());
                source = s.source();
            }
            match expected.get(rel.as_str()) {
                Some(field) if message.contains(field) => {
                    assert!(
                        DOC.contains(&format!("`{rel}`")),
                        "{rel} is rejected but docs/istio-compatibility.md does not list it"
                    );
                }
                _ => unexpected.push(format!("{rel} document {}: {message}", err.document)),
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "samples refused without an entry in REJECTED:\n{}",
        unexpected.join("\n")
    );
    assert!(config >= 30, "only {config} Istio objects read");
    eprintln!(
        "{} files, {accepted} objects accepted ({config} Istio config)",
        files.len()
    );
}
