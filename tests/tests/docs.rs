//! The configuration reference is checked against the binaries: every flag and every
//! `SHOAL_*` environment variable that `--help` lists must be documented in
//! docs/configuration.md.

use std::collections::BTreeSet;
use std::process::Command;

fn help(binary: &str) -> String {
    let path = shoal_tests::shoal::binary(binary);
    let out = Command::new(&path)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {} --help: {e}", path.display()));
    assert!(out.status.success(), "{binary} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `--flag` names and `SHOAL_*` variables mentioned in a text.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')) {
        if (word.starts_with("--") && word.len() > 2 && word != "--help" && word != "--version")
            || word.starts_with("SHOAL_")
        {
            out.insert(word.trim_end_matches('-').to_string());
        }
    }
    out
}

#[test]
fn every_flag_and_env_var_is_documented() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs/configuration.md exists");
    let documented = names(&doc);
    let mut missing = Vec::new();
    for binary in ["shoal-server", "shoal-ingester"] {
        for name in names(&help(binary)) {
            if !documented.contains(&name) {
                missing.push(format!("{binary}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md:\n{}",
        missing.join("\n")
    );
}

/// Flags are described once, in docs/configuration.md: no other document (README included)
/// has a reference row for one, a table row whose first cell names a `--flag` and whose
/// second names a `SHOAL_*` variable. Other documents link to the reference instead of restating defaults that then
/// drift.
#[test]
fn flags_are_described_in_configuration_md_only() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut files = vec![std::path::PathBuf::from(format!("{root}/README.md"))];
    for entry in std::fs::read_dir(format!("{root}/docs")).expect("docs/ is readable") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") && !path.ends_with("configuration.md") {
            files.push(path);
        }
    }
    let mut restated = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("doc is readable");
        for (n, line) in text.lines().enumerate() {
            let cells: Vec<&str> = line.trim().split('|').collect();
            let row = line.trim_start().starts_with('|') && cells.len() > 3;
            if row && cells[1].contains("`--") && cells[2].contains("SHOAL_") {
                restated.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        restated.is_empty(),
        "flag reference rows outside docs/configuration.md (link to it instead):\n{}",
        restated.join("\n")
    );
}
