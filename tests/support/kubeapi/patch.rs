//! Patch documents: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).
//!
//! Strategic merge patches and server-side apply are served as merge patches (see the module
//! docs of `kubeapi`): lists are replaced, not merged by key, and there is no field ownership.

use serde_json::Value;

/// The patch types of the `Content-Type` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json` (served as a merge patch)
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, served as create-or-merge)
    Apply,
}

impl PatchKind {
    /// The patch type of a `Content-Type` value, if it is one.
    pub(crate) fn from_content_type(content_type: &str) -> Option<PatchKind> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// Applies an RFC 7386 merge patch: objects merge recursively, `null` removes, anything else
/// replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`); the
/// error says which operation failed.
pub(crate) fn json_patch(target: &mut Value, operations: &Value) -> Result<(), String> {
    let operations = operations
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for (i, op) in operations.iter().enumerate() {
        apply_operation(target, op).map_err(|e| format!("operation {i} ({op}): {e}"))?;
    }
    Ok(())
}

fn apply_operation(target: &mut Value, op: &Value) -> Result<(), String> {
    let field = |name: &str| {
        op.get(name)
            .and_then(Value::as_str)
            .ok_or(format!("missing \"{name}\""))
    };
    let path = parse_pointer(field("path")?)?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| "missing \"value\"".to_string())
    };
    match field("op")? {
        "add" => add(target, &path, value()?),
        "remove" => remove(target, &path).map(drop),
        "replace" => {
            let slot = get_mut(target, &path).ok_or("path does not exist")?;
            *slot = value()?;
            Ok(())
        }
        "move" => {
            let from = parse_pointer(field("from")?)?;
            if path.starts_with(&from) && path.len() > from.len() {
                return Err("cannot move a value into itself".into());
            }
            let moved = remove(target, &from)?;
            add(target, &path, moved)
        }
        "copy" => {
            let from = parse_pointer(field("from")?)?;
            let copied = get_mut(target, &from)
                .ok_or("\"from\" does not exist")?
                .clone();
            add(target, &path, copied)
        }
        "test" => {
            let actual = get_mut(target, &path).ok_or("path does not exist")?;
            if *actual == value()? {
                Ok(())
            } else {
                Err("test failed".into())
            }
        }
        other => Err(format!("unknown operation {other:?}")),
    }
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or(format!("invalid JSON pointer {pointer:?}"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn get_mut<'a>(mut at: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    for token in path {
        at = match at {
            Value::Object(map) => map.get_mut(token)?,
            Value::Array(items) => {
                let index = array_index(token, items.len())?;
                items.get_mut(index)?
            }
            _ => return None,
        };
    }
    Some(at)
}

fn array_index(token: &str, len: usize) -> Option<usize> {
    if token.starts_with('+') || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse::<usize>().ok().filter(|i| *i < len)
}

fn add(target: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *target = value;
        return Ok(());
    };
    match get_mut(target, parent).ok_or("parent path does not exist")? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let index = if last == "-" {
                items.len()
            } else {
                array_index(last, items.len() + 1).ok_or(format!("bad array index {last:?}"))?
            };
            items.insert(index, value);
            Ok(())
        }
        _ => Err("parent is not an object or array".into()),
    }
}

fn remove(target: &mut Value, path: &[String]) -> Result<Value, String> {
    let (last, parent) = path
        .split_last()
        .ok_or("cannot remove the whole document")?;
    match get_mut(target, parent).ok_or("parent path does not exist")? {
        Value::Object(map) => map.remove(last).ok_or("path does not exist".into()),
        Value::Array(items) => {
            let index =
                array_index(last, items.len()).ok_or(format!("bad array index {last:?}"))?;
            Ok(items.remove(index))
        }
        _ => Err("parent is not an object or array".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut doc,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            doc,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
    }

    #[test]
    fn json_patch_follows_rfc_6902() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2, 3]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/metadata/labels/x", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a~1b"},
                {"op": "replace", "path": "/list/0", "value": 9},
                {"op": "add", "path": "/list/-", "value": 4},
                {"op": "copy", "from": "/list/0", "path": "/first"},
                {"op": "move", "from": "/first", "path": "/moved"},
                {"op": "test", "path": "/moved", "value": 9},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"x": "2"}}, "list": [9, 2, 3, 4], "moved": 9})
        );
        assert!(json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/moved", "value": 1}])
        )
        .is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(json_patch(&mut doc, &json!({"op": "add"})).is_err());
    }
}
