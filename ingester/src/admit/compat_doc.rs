//! Keeps docs/istio-compatibility.md true: every row's example goes through the ingest path
//! (decode with unmodelled fields refused, then validation). A supported or accepted field
//! must be taken; a rejected one refused with an error naming it; a `fail closed` one
//! (accepted, not enforced, the server fails closed on it) taken and named in the warning.

use crate::admit::istio::{config_spec, unenforced_fields, validate};
use shoal_common::model::ConfigKind;

const DOC: &str = include_str!("../../../docs/istio-compatibility.md");

/// One table row: kind, field path (`http[].fault`), status, example (YAML).
struct Row {
    kind: ConfigKind,
    path: String,
    status: String,
    example: String,
}

fn rows() -> Vec<Row> {
    let mut out = Vec::new();
    let mut kind = None;
    for line in DOC.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            let h = h.trim();
            kind = match h.strip_prefix("Gateway API: ") {
                Some(k) => ConfigKind::parse_in(shoal_common::model::GATEWAY_API_GROUP, k),
                None => ConfigKind::parse(h),
            };
            continue;
        }
        let Some(kind) = kind else { continue };
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `path` | status | `example` | notes |
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let unquote = |s: &str| s.trim_matches('`').to_string();
        out.push(Row {
            kind,
            path: unquote(cells[1]),
            status: cells[2].to_string(),
            example: unquote(cells[3]),
        });
    }
    out
}

/// `{a: [{b: <value>}]}` for `a[].b`.
fn spec_for(path: &str, value: serde_json::Value) -> serde_json::Value {
    path.rsplit('.')
        .fold(value, |inner, seg| match seg.strip_suffix("[]") {
            Some(name) => serde_json::json!({ name: [inner] }),
            None => serde_json::json!({ seg: inner }),
        })
}

/// The least a valid object of `kind` needs besides the row's field (a rule needs a host; a
/// VirtualService without hosts is a delegate, with a delegate's restrictions), so that a
/// rejection is about the row's field.
fn with_base(kind: ConfigKind, mut spec: serde_json::Value) -> serde_json::Value {
    let base = match kind {
        ConfigKind::DestinationRule => Some(("host", serde_json::json!("reviews"))),
        ConfigKind::VirtualService => Some(("hosts", serde_json::json!(["reviews"]))),
        ConfigKind::KubeGateway => Some(("gatewayClassName", serde_json::json!("istio"))),
        ConfigKind::GatewayClass => Some(("controllerName", serde_json::json!("x/y"))),
        // `provider` goes with CUSTOM only.
        ConfigKind::AuthorizationPolicy if spec.get("provider").is_some() => {
            Some(("action", serde_json::json!("CUSTOM")))
        }
        _ => None,
    };
    if let (Some((field, value)), Some(obj)) = (base, spec.as_object_mut()) {
        obj.entry(field).or_insert(value);
    }
    spec
}

/// What the ingest path says about a spec: the fields it does not enforce, or the error
/// text.
fn ingest(kind: ConfigKind, spec: serde_json::Value) -> Result<Vec<String>, String> {
    let spec = with_base(kind, spec);
    let spec = config_spec(kind, spec).map_err(|e| e.to_string())?;
    validate(&spec).map_err(|e| e.to_string())?;
    Ok(unenforced_fields(&spec))
}

#[test]
fn every_row_of_the_compatibility_doc_holds() {
    let rows = rows();
    assert!(
        rows.len() > 100,
        "the doc's tables were not found ({} rows)",
        rows.len()
    );
    let mut failures = Vec::new();
    for row in &rows {
        let value: serde_json::Value = match shoal_common::yaml::from_str(&row.example) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!(
                    "{}: example {:?} is not YAML: {e}",
                    row.path, row.example
                ));
                continue;
            }
        };
        let indexed = row.path.replace("[]", "[0]");
        let result = ingest(row.kind, spec_for(&row.path, value));
        match row.status.as_str() {
            "supported" | "accepted" => {
                if let Err(e) = &result {
                    if e.contains("unsupported field") {
                        failures.push(format!(
                            "{} {}: documented {} but refused: {e}",
                            row.kind, row.path, row.status
                        ));
                    }
                }
            }
            "fail closed" => match &result {
                Ok(unenforced) if unenforced.iter().any(|f| f.starts_with(&indexed)) => {}
                Ok(unenforced) => failures.push(format!(
                    "{} {}: documented fail closed but not named as unenforced: {unenforced:?}",
                    row.kind, row.path
                )),
                Err(e) => failures.push(format!(
                    "{} {}: documented fail closed but refused: {e}",
                    row.kind, row.path
                )),
            },
            "rejected" => match &result {
                Ok(_) => failures.push(format!(
                    "{} {}: documented rejected but accepted",
                    row.kind, row.path
                )),
                Err(e) if !e.contains(&indexed) => failures.push(format!(
                    "{} {}: refused, but the error does not name {indexed}: {e}",
                    row.kind, row.path
                )),
                Err(_) => {}
            },
            other => failures.push(format!("{}: unknown status {other:?}", row.path)),
        }
    }
    assert!(
        failures.is_empty(),
        "docs/istio-compatibility.md is out of date:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_kind_has_a_table() {
    let rows = rows();
    for kind in ConfigKind::ALL {
        assert!(rows.iter().any(|r| r.kind == kind), "no table for {kind}");
    }
}
