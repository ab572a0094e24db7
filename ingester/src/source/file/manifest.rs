//! Parsing manifest files: YAML (multi-document) and JSON, one object per document or per
//! item of a `kind: List`.
//!
//! Parsing is in two steps on purpose. First every document is read as a generic value
//! (JSON's, as Kubernetes converts YAML to JSON before decoding it): if that fails the file
//! is not valid YAML (a half-written file, typically) and the whole file is set aside. Then
//! each document is decoded into its kind's type: a failure there concerns that document
//! only, and the caller keeps the object's last good version.

use crate::admit::istio;
use crate::admit::normalize::{self, DEFAULT_NAMESPACE};
use crate::error::IngestError;
use crate::object::{DocRef, ObjectId, ObjectKind};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as KubeMeta;
use serde::Deserialize;
use serde_json::Value;
use shoal_common::model::{ConfigKind, ConfigObject};
use shoal_common::{yaml, yaml_depth};
use std::path::Path;
use tracing::debug;

/// A decoded object of a kind the ingester reads. Kubernetes objects stay k8s-openapi
/// objects (they are joined later); Istio config is already typed and validated.
#[derive(Debug, Clone, PartialEq)]
pub enum ManifestObject {
    /// A Namespace: read for the discovery selectors and the network of the system
    /// namespace; a selected one publishes its labels (`desired::namespace_entry`).
    Namespace(Box<Namespace>),
    /// A Service.
    Service(Box<Service>),
    /// A Pod.
    Pod(Box<Pod>),
    /// A Node.
    Node(Box<Node>),
    /// An EndpointSlice.
    EndpointSlice(Box<EndpointSlice>),
    /// A Secret.
    Secret(Box<Secret>),
    /// Istio config.
    Config(Box<ConfigObject>),
}

/// One object parsed from a document.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedObject {
    /// Its identity.
    pub id: ObjectId,
    /// Where it is in its file.
    pub document: DocRef,
    /// The object.
    pub object: ManifestObject,
}

/// A document that was rejected.
#[derive(Debug)]
pub struct DocumentError {
    /// Where it is in its file.
    pub document: DocRef,
    /// The identity of the object it describes, when kind and name could be read.
    pub id: Option<ObjectId>,
    /// Why it was rejected.
    pub error: IngestError,
}

/// The outcome of parsing one valid YAML/JSON file.
#[derive(Debug, Default)]
pub struct ParsedFile {
    /// The good objects, in file order.
    pub objects: Vec<ParsedObject>,
    /// The rejected documents, in file order.
    pub errors: Vec<DocumentError>,
}

/// Whether a path names a manifest file (`.yaml`, `.yml`, `.json`).
pub fn is_manifest_path(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Parses one manifest file. `Err` when the file is not valid YAML/JSON at all; otherwise
/// every document ends up either in `objects`, in `errors`, or ignored (empty documents
/// and kinds the ingester does not read, logged at debug).
pub fn parse_file(path: &Path, text: &str) -> Result<ParsedFile, IngestError> {
    check_depth(path, text)?;
    let is_json = path.extension().and_then(|e| e.to_str()) == Some("json");
    let values = if is_json {
        json_documents(path, text)?
    } else {
        yaml_documents(path, text)?
    };
    let mut out = ParsedFile::default();
    for (index, value) in values.into_iter().enumerate() {
        let doc = DocRef { index, item: None };
        parse_document(path, value, doc, &mut out);
    }
    Ok(out)
}

/// Refuses text nested deeper than [`yaml_depth::MAX_DEPTH`] before any parser sees it:
/// the YAML parser's time grows with the square of the depth (100 000 nested `[`, 195 KiB,
/// took it 25 s), and every other change waits meanwhile.
pub fn check_depth(path: &Path, text: &str) -> Result<(), IngestError> {
    yaml_depth::check(text, yaml_depth::MAX_DEPTH).map_err(|e| IngestError::TooDeep {
        path: path.to_path_buf(),
        document: e.document,
        line: e.line,
        limit: e.limit,
    })
}

/// Every document, empty ones as null (so indices count them); `<<:` merge keys are
/// resolved, so anchors used as templates work as in kubectl.
fn yaml_documents(path: &Path, text: &str) -> Result<Vec<Value>, IngestError> {
    yaml::documents(text).map_err(|e| IngestError::Yaml {
        path: path.to_path_buf(),
        document: e.document,
        source: e.source,
    })
}

/// JSON files hold one value or several concatenated values.
fn json_documents(path: &Path, text: &str) -> Result<Vec<Value>, IngestError> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .enumerate()
        .map(|(document, v)| {
            v.map_err(|source| IngestError::Json {
                path: path.to_path_buf(),
                document,
                source,
            })
        })
        .collect()
}

/// How a document's `apiVersion` and `kind` are handled.
enum Classified {
    Read(ObjectKind),
    Ignored,
    UnsupportedVersion(ObjectKind, String),
}

fn classify(api_version: &str, kind: &str) -> Classified {
    let core = match kind {
        "Namespace" => Some(ObjectKind::Namespace),
        "Service" => Some(ObjectKind::Service),
        "Pod" => Some(ObjectKind::Pod),
        "Node" => Some(ObjectKind::Node),
        "Secret" => Some(ObjectKind::Secret),
        _ => None,
    };
    if let Some(k) = core {
        return match api_version {
            "v1" => Classified::Read(k),
            _ => Classified::Ignored,
        };
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    match (group, kind) {
        ("discovery.k8s.io", "EndpointSlice") => match version {
            "v1" => Classified::Read(ObjectKind::EndpointSlice),
            _ => Classified::UnsupportedVersion(
                ObjectKind::EndpointSlice,
                "discovery.k8s.io/v1".into(),
            ),
        },
        (group, _) if istio::GROUPS.contains(&group) => match ConfigKind::parse_in(group, kind) {
            Some(k) if k.versions().contains(&version) => Classified::Read(ObjectKind::Config(k)),
            Some(k) => Classified::UnsupportedVersion(ObjectKind::Config(k), versions_text(k)),
            None => Classified::Ignored,
        },
        _ => Classified::Ignored,
    }
}

/// The API versions shoal reads for an Istio kind, for errors (`security.istio.io/v1, v1beta1`).
fn versions_text(kind: ConfigKind) -> String {
    format!("{}/{}", kind.group(), kind.versions().join(", "))
}

fn str_field<'a>(map: &'a Value, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

fn parse_document(path: &Path, value: Value, doc: DocRef, out: &mut ParsedFile) {
    let file = path.display();
    let fail = |out: &mut ParsedFile, id: Option<ObjectId>, error: IngestError| {
        out.errors.push(DocumentError {
            document: doc,
            id,
            error,
        })
    };
    let not_object = |reason: &str| IngestError::NotAnObject {
        path: path.to_path_buf(),
        document: doc,
        reason: reason.to_string(),
    };
    if value.is_null() {
        debug!(%file, document = %doc, "ignoring empty document");
        return;
    }
    if !value.is_object() {
        return fail(out, None, not_object("document is not a mapping"));
    }
    let Some(kind) = str_field(&value, "kind") else {
        return fail(out, None, not_object("document has no `kind`"));
    };
    let api_version = str_field(&value, "apiVersion").unwrap_or_default();
    if kind == "List" {
        if doc.item.is_some() {
            return fail(
                out,
                None,
                not_object("a List inside a List is not supported"),
            );
        }
        let items = match value.get("items") {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items.clone(),
            Some(_) => return fail(out, None, not_object("List `items` is not a sequence")),
        };
        for (i, item) in items.into_iter().enumerate() {
            let item_doc = DocRef {
                index: doc.index,
                item: Some(i),
            };
            parse_document(path, item, item_doc, out);
        }
        return;
    }
    let object_kind = match classify(api_version, kind) {
        Classified::Read(k) => k,
        Classified::Ignored => {
            crate::admit::report_unread_kind(api_version, kind);
            debug!(
                %file,
                document = %doc,
                %api_version,
                %kind,
                "ignoring kind shoal does not read",
            );
            return;
        }
        Classified::UnsupportedVersion(k, supported) => {
            let error = IngestError::UnsupportedVersion {
                path: path.to_path_buf(),
                document: doc,
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                supported,
            };
            return fail(out, object_id(&value, k), error);
        }
    };
    let Some(id) = object_id(&value, object_kind) else {
        return fail(
            out,
            None,
            not_object(&format!("{kind} has no metadata.name")),
        );
    };
    match decode(object_kind, &id, value) {
        Ok(object) => out.objects.push(ParsedObject {
            id,
            document: doc,
            object,
        }),
        Err(Rejected::Decode(source)) => {
            let error = IngestError::Decode {
                path: path.to_path_buf(),
                document: doc,
                id: id.clone(),
                source,
            };
            fail(out, Some(id), error)
        }
        Err(Rejected::Invalid(source)) => {
            let error = IngestError::Invalid {
                path: path.to_path_buf(),
                document: doc,
                id: id.clone(),
                source: Box::new(source),
            };
            fail(out, Some(id), error)
        }
    }
}

/// The identity of a document of a known kind, when it has a name.
fn object_id(value: &Value, kind: ObjectKind) -> Option<ObjectId> {
    let meta = value.get("metadata");
    let name = meta.and_then(|m| str_field(m, "name")).unwrap_or_default();
    if name.is_empty() {
        return None;
    }
    let namespace = if kind.is_namespaced() {
        match meta.and_then(|m| str_field(m, "namespace")) {
            Some(ns) if !ns.is_empty() => ns,
            _ => DEFAULT_NAMESPACE,
        }
    } else {
        ""
    };
    Some(ObjectId {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

enum Rejected {
    Decode(serde_json::Error),
    Invalid(crate::error::InvalidObject),
}

/// The shape of an Istio object before its spec is typed.
#[derive(Deserialize)]
struct IstioDocument {
    #[serde(default)]
    metadata: KubeMeta,
    #[serde(default)]
    spec: Value,
}

fn decode(kind: ObjectKind, id: &ObjectId, value: Value) -> Result<ManifestObject, Rejected> {
    fn from<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Rejected> {
        serde_json::from_value(value).map_err(Rejected::Decode)
    }
    // Record the defaulted namespace in the object itself, so later stages agree with `id`.
    let namespaced = |meta: &mut KubeMeta| meta.namespace = Some(id.namespace.clone());
    Ok(match kind {
        ObjectKind::Namespace => ManifestObject::Namespace(from(value)?),
        ObjectKind::Node => ManifestObject::Node(from(value)?),
        ObjectKind::Pod => {
            let mut pod: Box<Pod> = from(value)?;
            namespaced(&mut pod.metadata);
            ManifestObject::Pod(pod)
        }
        ObjectKind::Service => {
            let mut svc: Box<Service> = from(value)?;
            namespaced(&mut svc.metadata);
            normalize::check_service(&svc).map_err(Rejected::Invalid)?;
            ManifestObject::Service(svc)
        }
        ObjectKind::Secret => {
            let mut secret: Box<Secret> = from(value)?;
            namespaced(&mut secret.metadata);
            ManifestObject::Secret(secret)
        }
        ObjectKind::EndpointSlice => {
            let mut slice: Box<EndpointSlice> = from(value)?;
            namespaced(&mut slice.metadata);
            normalize::check_endpoint_slice(&slice).map_err(Rejected::Invalid)?;
            ManifestObject::EndpointSlice(slice)
        }
        ObjectKind::Config(config_kind) => {
            let mut doc: IstioDocument = from(value)?;
            namespaced(&mut doc.metadata);
            // A missing or null spec is an empty spec (validation then says what is missing).
            let spec = match doc.spec {
                Value::Null => Value::Object(Default::default()),
                spec => spec,
            };
            let spec = istio::config_spec(config_kind, spec).map_err(Rejected::Decode)?;
            let meta = normalize::object_meta(&doc.metadata);
            let object = istio::config_object(meta, spec).map_err(Rejected::Invalid)?;
            ManifestObject::Config(Box::new(object))
        }
    })
}

/// Paths in the tests are only labels.
#[cfg(test)]
pub(crate) fn test_path(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/manifests/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::ConfigSpec;

    fn parse(name: &str, text: &str) -> ParsedFile {
        parse_file(&test_path(name), text).expect("file parses")
    }

    fn ids(f: &ParsedFile) -> Vec<String> {
        f.objects.iter().map(|o| o.id.to_string()).collect()
    }

    const ALL_KINDS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: bookinfo}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: bookinfo}
spec: {ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1}
spec: {containers: []}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-1, namespace: bookinfo, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
endpoints: []
---
# empty document follows
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec: {servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]}
---
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, annotations: {other: dropped}}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}}]}]}
---
apiVersion: networking.istio.io/v1alpha3
kind: DestinationRule
metadata: {name: reviews}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default}
spec: {egress: [{hosts: ['./*']}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext}
spec: {hosts: [api.example.com], ports: [{number: 443, name: tls, protocol: TLS}]}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm1}
spec: {address: 10.9.0.1}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: ignored}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: allow-get}
spec: {rules: [{to: [{operation: {methods: [GET]}}]}]}
---
apiVersion: networking.istio.io/v1
kind: PeerAuthentication
metadata: {name: wrong-group}
"#;

    #[test]
    fn every_kind_multi_document() {
        let f = parse("all.yaml", ALL_KINDS);
        assert!(f.errors.is_empty(), "{:?}", f.errors);
        assert_eq!(
            ids(&f),
            vec![
                "Namespace bookinfo",
                "Service bookinfo/reviews",
                "Pod default/reviews-v1",
                "Node node-a",
                "EndpointSlice bookinfo/reviews-1",
                "Gateway istio-system/gw",
                "VirtualService default/reviews",
                "DestinationRule default/reviews",
                "Sidecar default/default",
                "ServiceEntry default/ext",
                "WorkloadEntry default/vm1",
                "PeerAuthentication istio-system/default",
                "AuthorizationPolicy default/allow-get",
            ]
        );
        let indices: Vec<usize> = f.objects.iter().map(|o| o.document.index).collect();
        assert_eq!(indices, vec![0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 15, 16]);
        // The defaulted namespace is recorded in the object.
        let ManifestObject::Pod(pod) = &f.objects[2].object else {
            panic!("not a pod")
        };
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let ManifestObject::Config(vs) = &f.objects[6].object else {
            panic!("not config")
        };
        assert_eq!(vs.meta.namespace, "default");
        assert!(vs.meta.annotations.is_empty());
        assert!(matches!(vs.spec, ConfigSpec::VirtualService(ref s) if s.hosts == ["reviews"]));
    }

    #[test]
    fn list_items_are_documents() {
        let text = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: a}
  - apiVersion: v1
    kind: Service
    metadata: {name: b}
    spec: {ports: [{port: 0}]}
  - apiVersion: v1
    kind: Service
    metadata: {name: c}
"#;
        let f = parse("list.yml", text);
        assert_eq!(ids(&f), vec!["Service default/a", "Service default/c"]);
        assert_eq!(f.objects[1].document.to_string(), "0 item 2");
        assert_eq!(f.errors.len(), 1);
        let e = &f.errors[0];
        assert_eq!(e.id.as_ref().map(|i| i.name.as_str()), Some("b"));
        let msg = e.error.to_string();
        assert!(
            msg.contains("/manifests/list.yml document 0 item 1"),
            "{msg}"
        );
        assert!(msg.contains("spec.ports[0].port"), "{msg}");
    }

    #[test]
    fn json_files_single_and_concatenated() {
        let text = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"}}
{"apiVersion":"v1","kind":"Service","metadata":{"name":"b","namespace":"x"}}"#;
        let f = parse("svc.json", text);
        assert_eq!(ids(&f), vec!["Service default/a", "Service x/b"]);
        let err = parse_file(&test_path("bad.json"), "{\"kind\": ").unwrap_err();
        assert!(
            matches!(err, IngestError::Json { document: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn document_errors_carry_file_index_and_identity() {
        let text = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ok}
spec: {host: reviews}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: no-host, namespace: ns1}
spec: {subsets: []}
---
apiVersion: v1
kind: Service
metadata: {name: typo}
spec: {ports: [{port: "not-a-number"}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: x}
---
- just a list
---
metadata: {name: kindless}
---
apiVersion: networking.istio.io/v2
kind: VirtualService
metadata: {name: future}
---
apiVersion: security.istio.io/v1alpha1
kind: PeerAuthentication
metadata: {name: old}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan}
addressType: IPv4
endpoints: []
"#;
        let f = parse("mixed.yaml", text);
        assert_eq!(ids(&f), vec!["DestinationRule default/ok"]);
        let got: Vec<(usize, Option<String>)> = f
            .errors
            .iter()
            .map(|e| (e.document.index, e.id.as_ref().map(ToString::to_string)))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Some("DestinationRule ns1/no-host".into())),
                (2, Some("Service default/typo".into())),
                (3, None),
                (4, None),
                (5, None),
                (6, Some("VirtualService default/future".into())),
                (7, Some("PeerAuthentication default/old".into())),
                (8, Some("EndpointSlice default/orphan".into())),
            ]
        );
        for e in &f.errors {
            let msg = e.error.to_string();
            let want = format!("/manifests/mixed.yaml document {}", e.document.index);
            assert!(msg.starts_with(&want), "{msg}");
        }
        assert!(f.errors[0].error.to_string().contains("host is empty"));
        assert!(matches!(f.errors[1].error, IngestError::Decode { .. }));
        assert!(matches!(
            f.errors[5].error,
            IngestError::UnsupportedVersion { .. }
        ));
        let old = f.errors[6].error.to_string();
        assert!(old.contains("security.istio.io/v1, v1beta1"), "{old}");
    }

    #[test]
    fn invalid_yaml_fails_the_whole_file() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\nkind: [unclosed\n";
        let err = parse_file(&test_path("broken.yaml"), text).unwrap_err();
        assert!(
            matches!(err, IngestError::Yaml { document: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_name_file_document_and_line() {
        let text =
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n---\nkind: [unclosed\n";
        let err = parse_file(&test_path("broken.yaml"), text).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("/manifests/broken.yaml document 2: not valid YAML: "),
            "{msg}"
        );
        assert!(msg.contains("line 6"), "{msg}");
        let dup = "apiVersion: v1\nkind: Service\nmetadata: {name: a, name: b}\n";
        let msg = parse_file(&test_path("dup.yaml"), dup)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("document 0") && msg.contains("duplicate"),
            "{msg}"
        );
    }

    /// Spellings YAML 1.1 reads as booleans or octal numbers are strings (YAML 1.2, as
    /// shoal read them before): a string field takes them, a typed field refuses them by
    /// document; a non-finite float elsewhere does not fail the file.
    #[test]
    fn ambiguous_scalars_are_strings() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  \
                    labels: {enabled: yes, mode: on, version: 0755}\n\
                    ---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\n\
                    spec: {ports: [{port: 0755}]}\n\
                    ---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: c}\n\
                    spec: {x: .nan}\n";
        let f = parse("ambiguous.yaml", text);
        let ManifestObject::Service(svc) = &f.objects[0].object else {
            panic!("not a service: {:?}", f.objects)
        };
        let labels = svc.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["enabled"], "yes");
        assert_eq!(labels["mode"], "on");
        assert_eq!(labels["version"], "0755");
        assert_eq!(f.errors.len(), 1, "{:?}", f.errors);
        let msg = f.errors[0].error.to_string();
        assert!(
            msg.starts_with("/manifests/ambiguous.yaml document 1: Service default/b: "),
            "{msg}"
        );
        assert!(msg.contains("\"0755\""), "{msg}");
    }

    #[test]
    fn empty_file_and_merge_keys() {
        assert!(parse("empty.yaml", "").objects.is_empty());
        assert!(parse("blank.yaml", "---\n---\n").objects.is_empty());
        let text =
            "apiVersion: v1\nkind: Service\nmetadata:\n  <<: {namespace: merged}\n  name: a\n";
        assert_eq!(ids(&parse("merge.yaml", text)), vec!["Service merged/a"]);
    }

    #[test]
    fn manifest_extensions() {
        for (p, want) in [
            ("a.yaml", true),
            ("b.yml", true),
            ("c.json", true),
            ("d.txt", false),
            ("e", false),
        ] {
            assert_eq!(is_manifest_path(Path::new(p)), want, "{p}");
        }
    }
}

#[cfg(test)]
mod prop_tests;
