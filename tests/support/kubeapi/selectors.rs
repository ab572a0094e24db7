//! Label and field selectors, parsed from query strings the way `k8s.io/apimachinery` parses
//! them.
//!
//! Label selectors: comma-separated requirements (AND): `key=value`, `key==value`,
//! `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key` (exists), `!key` (does not exist),
//! `key>N`, `key<N`. As in Kubernetes, `!=` and `notin` also match objects without the label.
//!
//! Field selectors: comma-separated `field=value`, `field==value`, `field!=value`, with `\`
//! escaping `,`, `=` and `\` in values. Every resource supports `metadata.name` and
//! `metadata.namespace`; some built-ins support a few more (see the resource table in
//! `store.rs`); any other field is rejected with 400 "field label not supported", like the
//! real server.

use serde_json::Value;
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: LabelOp,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `labelSelector`; the error is the message of a 400 response.
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!(
                    "unable to parse requirement: empty requirement in {text:?}"
                ));
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether there are no requirements.
    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with these labels (`metadata.labels`, maybe absent) matches.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|r| {
            let value = label(&r.key);
            match &r.op {
                LabelOp::Eq(v) => value == Some(v.as_str()),
                LabelOp::NotEq(v) => value != Some(v.as_str()),
                LabelOp::In(set) => value.is_some_and(|v| set.contains(v)),
                LabelOp::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::NotExists => value.is_none(),
                LabelOp::Gt(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                LabelOp::Lt(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("unable to parse requirement: unbalanced ')' in {text:?}")
                })?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!(
            "unable to parse requirement: unbalanced '(' in {text:?}"
        ));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    let bad = |why: &str| format!("unable to parse requirement: {part:?}: {why}");
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        validate_key(key).map_err(|e| bad(&e))?;
        return Ok(Requirement {
            key: key.to_string(),
            op: LabelOp::NotExists,
        });
    }
    if let Some(open) = part.find('(') {
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head[..] else {
            return Err(bad("expected `key in (...)` or `key notin (...)`"));
        };
        let inner = part[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| bad("expected ')' at the end"))?;
        let values: BTreeSet<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        for v in &values {
            validate_value(v).map_err(|e| bad(&e))?;
        }
        validate_key(key).map_err(|e| bad(&e))?;
        let op = match op {
            "in" => LabelOp::In(values),
            "notin" => LabelOp::NotIn(values),
            other => return Err(bad(&format!("unknown set operator {other:?}"))),
        };
        return Ok(Requirement {
            key: key.to_string(),
            op,
        });
    }
    for (token, make) in [
        ("!=", LabelOp::NotEq as fn(String) -> LabelOp),
        ("==", LabelOp::Eq),
        ("=", LabelOp::Eq),
    ] {
        if let Some((key, value)) = part.split_once(token) {
            let (key, value) = (key.trim(), value.trim());
            validate_key(key).map_err(|e| bad(&e))?;
            validate_value(value).map_err(|e| bad(&e))?;
            return Ok(Requirement {
                key: key.to_string(),
                op: make(value.to_string()),
            });
        }
    }
    for (token, greater) in [(">", true), ("<", false)] {
        if let Some((key, value)) = part.split_once(token) {
            let key = key.trim();
            validate_key(key).map_err(|e| bad(&e))?;
            let n: i64 = value
                .trim()
                .parse()
                .map_err(|_| bad("the value of `>` and `<` must be an integer"))?;
            return Ok(Requirement {
                key: key.to_string(),
                op: if greater {
                    LabelOp::Gt(n)
                } else {
                    LabelOp::Lt(n)
                },
            });
        }
    }
    if part.contains(char::is_whitespace) {
        return Err(bad("unexpected whitespace"));
    }
    validate_key(part).map_err(|e| bad(&e))?;
    Ok(Requirement {
        key: part.to_string(),
        op: LabelOp::Exists,
    })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of `[-._a-zA-Z0-9]`, starting and ending alphanumeric.
fn validate_key(key: &str) -> Result<(), String> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return Err(format!("invalid label key prefix {prefix:?}"));
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_label_token(name) {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of `[-._a-zA-Z0-9]`, starting and ending
/// alphanumeric.
fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_label_token(value)) {
        Ok(())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

fn is_label_token(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.chars()
        .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
        && s.chars().next().is_some_and(alnum)
        && s.chars().last().is_some_and(alnum)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `fieldSelector`, accepting `metadata.name`, `metadata.namespace` and the
    /// `extra` fields of the resource; the error is the message of a 400 response.
    pub(crate) fn parse(text: &str, extra: &[&str]) -> Result<FieldSelector, String> {
        let mut requirements = Vec::new();
        for part in split_unescaped(text, ',') {
            if part.trim().is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!(
                    "invalid field selector {text:?}: empty requirement"
                ));
            }
            let (field, value, equal) = if let Some((f, v)) = split_once_unescaped(&part, "!=") {
                (f, v, false)
            } else if let Some((f, v)) = split_once_unescaped(&part, "==") {
                (f, v, true)
            } else if let Some((f, v)) = split_once_unescaped(&part, "=") {
                (f, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim().to_string();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !extra.contains(&field.as_str())
            {
                return Err(format!("field label not supported: {field}"));
            }
            requirements.push(FieldRequirement {
                field,
                value: unescape(&value)?,
                equal,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether there are no requirements.
    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the object matches; a missing field reads as the empty string.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let pointer = format!("/{}", r.field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == r.value) == r.equal
        })
    }
}

/// Splits on `sep` not preceded by a backslash (escapes are kept).
fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(String::new());
            continue;
        }
        if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
}

fn split_once_unescaped(text: &str, op: &str) -> Option<(String, String)> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        if text[i..].starts_with(op) {
            return Some((text[..i].to_string(), text[i + op.len()..].to_string()));
        }
    }
    None
}

fn unescape(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                other => {
                    return Err(format!(
                        "invalid field selector value {value:?}: bad escape {other:?}"
                    ))
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns", "labels": labels}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_selectors_follow_the_kubernetes_grammar() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web,tier=front"));
        assert!(!m("app=web,tier=back"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web)"));
        assert!(m("missing notin (web)"));
        assert!(m("app"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("n>4") && m("n<6") && !m("n>5"));
        assert!(m("example.com/x notin (a),app in (web)"));
        for bad in ["=x", "app in (a", "a b", "app in web", "-bad=x", "a=b c"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should not parse");
        }
        // An empty value is valid.
        assert!(LabelSelector::parse("app=")
            .unwrap()
            .matches(&obj(json!({"app": ""}))));
    }

    #[test]
    fn field_selectors_support_metadata_and_listed_fields() {
        let o = obj(json!({}));
        let m = |s: &str| {
            FieldSelector::parse(s, &["status.phase"])
                .unwrap()
                .matches(&o)
        };
        assert!(m("metadata.name=n1"));
        assert!(m("metadata.name==n1,metadata.namespace=ns"));
        assert!(m("metadata.name!=n2"));
        assert!(!m("metadata.namespace!=ns"));
        assert!(m("status.phase=Running"));
        assert!(FieldSelector::parse("spec.foo=x", &[]).is_err());
        assert!(FieldSelector::parse("metadata.name", &[]).is_err());
        let escaped = FieldSelector::parse(r"metadata.name=a\,b", &[]).unwrap();
        assert!(escaped.matches(&json!({"metadata": {"name": "a,b"}})));
    }
}
