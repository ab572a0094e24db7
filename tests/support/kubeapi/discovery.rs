//! Discovery documents: `/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`
//! (legacy discovery, what `kube::discovery::Discovery::run` reads), the aggregated discovery
//! (`apidiscovery.k8s.io/v2`, served when the `Accept` header asks for it, what
//! `Discovery::run_aggregated` reads), and `/version`.

use super::store::{version_priority, ResourceDef};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// The `Content-Type` of aggregated discovery responses.
pub(crate) const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

/// Whether the `Accept` header asks for aggregated discovery.
pub(crate) fn wants_aggregated(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=APIGroupDiscoveryList"))
}

/// The non-core groups in discovery order (built-ins first, then CRD groups by name), each
/// with its versions in priority order.
fn groups(resources: &[ResourceDef]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for res in resources.iter().filter(|r| !r.group.is_empty()) {
        let index = match groups.iter().position(|(g, _)| *g == res.group) {
            Some(i) => i,
            None => {
                groups.push((res.group.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        let versions = &mut groups[index].1;
        for v in &res.versions {
            if !versions.contains(v) {
                versions.push(v.clone());
            }
        }
    }
    for (_, versions) in &mut groups {
        versions.sort_by(|a, b| version_priority(a, b));
    }
    groups
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv),
    })
}

/// `GET /api`.
pub(crate) fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

/// `GET /apis`.
pub(crate) fn group_list(resources: &[ResourceDef]) -> Value {
    let groups: Vec<Value> = groups(resources)
        .iter()
        .map(|(g, v)| group_json(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`.
pub(crate) fn group(resources: &[ResourceDef], group: &str) -> Option<Value> {
    let (name, versions) = groups(resources).into_iter().find(|(g, _)| g == group)?;
    let mut doc = group_json(&name, &versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`.
pub(crate) fn resource_list(
    resources: &[ResourceDef],
    group: &str,
    version: &str,
) -> Option<Value> {
    let mut entries = Vec::new();
    for res in resources
        .iter()
        .filter(|r| r.group == group && r.serves(version))
    {
        let mut entry = json!({
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": VERBS,
        });
        if !res.short_names.is_empty() {
            entry["shortNames"] = json!(res.short_names);
        }
        entries.push(entry);
        if res.status_subresource {
            entries.push(json!({
                "name": format!("{}/status", res.plural),
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    if entries.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }))
}

/// Aggregated discovery of the core group (`core`) or of all other groups.
pub(crate) fn aggregated(resources: &[ResourceDef], core: bool) -> Value {
    let group_names: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_string()])]
    } else {
        groups(resources)
    };
    let items: Vec<Value> = group_names
        .iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|version| {
                    let gvk = |res: &ResourceDef| json!({"group": group, "version": version, "kind": res.kind});
                    let resources: Vec<Value> = resources
                        .iter()
                        .filter(|r| r.group == *group && r.serves(version))
                        .map(|res| {
                            let subresources: Vec<Value> = if res.status_subresource {
                                vec![json!({"subresource": "status", "responseKind": gvk(res), "verbs": STATUS_VERBS})]
                            } else {
                                Vec::new()
                            };
                            json!({
                                "resource": res.plural,
                                "responseKind": gvk(res),
                                "scope": if res.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": res.singular,
                                "verbs": VERBS,
                                "shortNames": res.short_names,
                                "subresources": subresources,
                            })
                        })
                        .collect();
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": group}, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// `GET /version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.0-shoal-kubeapi",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}
