//! The Kubernetes API test server against the real kube-rs client: CRUD, selectors, paging,
//! watchers (resume, relist after 410), bookmarks, discovery, kubeconfigs.
//!
//! `client_checks_against_a_real_cluster` runs the client-side checks that do not depend on
//! test controls against the cluster of `$KUBECONFIG` too (in a namespace it creates and
//! deletes), so the server's behavior can be compared with a real API server.
#![forbid(unsafe_code)]

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ObjectList, PartialObjectMeta};
use kube::discovery::Discovery;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde_json::{json, Value};
use shoal_tests::eventually;
use shoal_tests::http::Request;
use shoal_tests::kubeapi::KubeApiServer;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// A watcher polled by its own task (a watcher only makes requests while it is polled, so a
/// test can wait for its watch to be open), with its events in a channel.
struct Events<K: Resource> {
    events: tokio::sync::mpsc::UnboundedReceiver<Result<Event<K>, watcher::Error>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: Resource> Drop for Events<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn events<K>(api: Api<K>, config: watcher::Config) -> Events<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + 'static,
{
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = watcher::watcher(api, config).boxed();
        while let Some(event) = stream.next().await {
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    Events { events, task }
}

/// `Init`, `InitApply(name)`, `InitDone`, `Apply(name)`, `Delete(name)`.
fn describe<K: Resource>(event: &Event<K>) -> String {
    match event {
        Event::Init => "Init".into(),
        Event::InitApply(o) => format!("InitApply({})", o.name_any()),
        Event::InitDone => "InitDone".into(),
        Event::Apply(o) => format!("Apply({})", o.name_any()),
        Event::Delete(o) => format!("Delete({})", o.name_any()),
    }
}

async fn next<K: Resource>(stream: &mut Events<K>) -> Result<Event<K>, watcher::Error> {
    tokio::time::timeout(WAIT, stream.events.recv())
        .await
        .unwrap_or_else(|_| panic!("no watcher event within {WAIT:?}"))
        .expect("a watcher stream never ends")
}

/// The next events, described, failing on errors.
async fn expect_events<K: Resource>(stream: &mut Events<K>, expected: &[&str]) -> Vec<Event<K>> {
    let mut seen = Vec::new();
    for want in expected {
        let event = next(stream)
            .await
            .unwrap_or_else(|e| panic!("watcher error {e} while waiting for {want}"));
        assert_eq!(
            describe(&event),
            *want,
            "after {:?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        );
        seen.push(event);
    }
    seen
}

fn api_status(error: &kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("not an API error: {other:?}"),
    }
}

fn namespace(name: &str) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
    }))
    .unwrap()
}

fn config_map(name: &str, labels: Value, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
        .unwrap()
}

fn virtual_service_crd() -> CustomResourceDefinition {
    let version = |name: &str, storage: bool| {
        json!({
            "name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            "subresources": {"status": {}},
        })
    };
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "virtualservices.networking.istio.io"},
        "spec": {
            "group": "networking.istio.io",
            "names": {"kind": "VirtualService", "plural": "virtualservices", "singular": "virtualservice",
                      "listKind": "VirtualServiceList", "shortNames": ["vs"]},
            "scope": "Namespaced",
            "versions": [version("v1alpha3", false), version("v1beta1", false), version("v1", true)],
        },
    }))
    .unwrap()
}

fn virtual_services(client: Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("networking.istio.io", version, "VirtualService");
    Api::namespaced_with(
        client,
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "virtualservices"),
    )
}

#[tokio::test]
async fn pods_crud_through_the_typed_api() {
    let server = KubeApiServer::start().await;
    let client = server.client();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace("demo"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");

    let created = pods
        .create(&PostParams::default(), &pod("web-1", json!({"app": "web"})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("demo"));
    assert!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "{meta:?}"
    );
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();
    assert_eq!(rv1, server.revision());

    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    pods.create(&dry_run, &pod("dry", json!({}))).await.unwrap();
    assert!(
        pods.get_opt("dry").await.unwrap().is_none(),
        "a dry run stores nothing"
    );
    let again = pods
        .create(&PostParams::default(), &pod("web-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_status(&again), (409, "AlreadyExists".into()));
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "nowhere");
    let missing_ns = elsewhere
        .create(&PostParams::default(), &pod("x", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_status(&missing_ns), (404, "NotFound".into()));

    // Replace with the current resourceVersion, then with the stale one.
    let mut changed = pods.get("web-1").await.unwrap();
    changed.labels_mut().insert("tier".into(), "front".into());
    let replaced = pods
        .replace("web-1", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert!(replaced.resource_version().unwrap().parse::<u64>().unwrap() > rv1);
    assert_eq!(
        replaced.metadata.generation,
        Some(1),
        "a label change is not a spec change"
    );
    let stale = pods
        .replace("web-1", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(api_status(&stale), (409, "Conflict".into()));
    let rv_before_noop = server.revision();
    pods.replace("web-1", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(
        server.revision(),
        rv_before_noop,
        "an unchanged object is not written"
    );

    // Patches: merge, JSON, and server-side apply (served as create-or-merge).
    let merged = pods
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": null, "v": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels().get("v").map(String::as_str), Some("2"));
    assert!(!merged.labels().contains_key("tier"));
    // (kube's `Patch::Json` needs its `jsonpatch` feature: send this one over plain HTTP.)
    let json_patch = Request {
        method: "PATCH".into(),
        path: "/api/v1/namespaces/demo/pods/web-1".into(),
        host: None,
        headers: vec![("Content-Type".into(), "application/json-patch+json".into())],
        body:
            json!([{"op": "replace", "path": "/spec/containers/0/image", "value": "example/app:2"}])
                .to_string()
                .into_bytes(),
        http10: false,
    };
    let response = json_patch.send(server.addr()).await.unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let patched = pods.get("web-1").await.unwrap();
    assert_eq!(
        patched.spec.unwrap().containers[0].image.as_deref(),
        Some("example/app:2")
    );
    assert_eq!(
        patched.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );
    let applied = pods
        .patch(
            "web-2",
            &PatchParams::apply("test"),
            &Patch::Apply(pod("web-2", json!({"app": "web"}))),
        )
        .await
        .unwrap();
    assert_eq!(applied.name_any(), "web-2");

    // Status through the subresource.
    let with_ip = pods
        .patch_status(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"podIP": "10.1.0.7"}})),
        )
        .await
        .unwrap();
    assert_eq!(with_ip.status.unwrap().pod_ip.as_deref(), Some("10.1.0.7"));
    let direct: Pod = server.get_as(Some("demo"), "web-1").unwrap();
    assert_eq!(direct.status.unwrap().pod_ip.as_deref(), Some("10.1.0.7"));

    let deleted = pods
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_left());
    let gone = pods.get("web-1").await.unwrap_err();
    assert_eq!(api_status(&gone), (404, "NotFound".into()));
    assert!(pods.get_opt("web-1").await.unwrap().is_none());
    let twice = pods
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_status(&twice), (404, "NotFound".into()));

    // Deleting the namespace deletes what is in it.
    Api::<Namespace>::all(client.clone())
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    assert!(server.list("pods", Some("demo")).is_empty());
    let system = Api::<Namespace>::all(client)
        .delete("default", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_status(&system), (403, "Forbidden".into()));
}

#[tokio::test]
async fn custom_resources_exist_only_with_their_crd() {
    let server = KubeApiServer::start().await;
    let client = server.client();
    let vs = virtual_services(client.clone(), "v1");
    let before = vs.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_status(&before).0, 404);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &virtual_service_crd())
        .await
        .unwrap();
    let conditions = crd.status.unwrap().conditions.unwrap();
    assert!(conditions
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True"));

    let mut object = DynamicObject::new(
        "reviews",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
            "virtualservices",
        ),
    );
    object.data = json!({"spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}});
    let created = vs.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(created.data["spec"]["hosts"][0], "reviews");

    // The same object at another served version.
    let old = virtual_services(client.clone(), "v1beta1")
        .get("reviews")
        .await
        .unwrap();
    assert_eq!(
        old.types.unwrap().api_version,
        "networking.istio.io/v1beta1"
    );
    assert_eq!(old.metadata.uid, created.metadata.uid);
    let unserved = virtual_services(client.clone(), "v2")
        .get("reviews")
        .await
        .unwrap_err();
    assert_eq!(api_status(&unserved).0, 404);

    let patched = vs
        .patch(
            "reviews",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hosts": ["reviews", "ratings"]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["hosts"], json!(["reviews", "ratings"]));
    assert_eq!(
        vs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    // A CRD whose name is not <plural>.<group> is invalid.
    let mut bad = virtual_service_crd();
    bad.metadata.name = Some("wrong.networking.istio.io".into());
    let invalid = crds.create(&PostParams::default(), &bad).await.unwrap_err();
    assert_eq!(api_status(&invalid), (422, "Invalid".into()));

    crds.delete(
        "virtualservices.networking.istio.io",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    assert_eq!(api_status(&vs.get("reviews").await.unwrap_err()).0, 404);
    assert!(server
        .get(
            "virtualservices.networking.istio.io",
            Some("default"),
            "reviews"
        )
        .is_none());
}

/// The `status` subresource of a custom resource, as the real API server serves it: a
/// PATCH (or PUT) of `.../status` changes only `.status`, gets a new resourceVersion and a
/// MODIFIED event, and leaves the generation alone; a CRD version without the subresource
/// has no `/status` path.
#[tokio::test]
async fn custom_resource_status_subresource() {
    let server = KubeApiServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &virtual_service_crd())
        .await
        .unwrap();
    let vs = virtual_services(client.clone(), "v1");
    let mut object = DynamicObject::new(
        "reviews",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
            "virtualservices",
        ),
    );
    object.data = json!({"spec": {"hosts": ["reviews"]}});
    let created = vs.create(&PostParams::default(), &object).await.unwrap();
    let rv = |o: &DynamicObject| -> u64 { o.resource_version().unwrap().parse().unwrap() };

    let mut watch = events(vs.clone(), watcher::Config::default());
    expect_events(&mut watch, &["Init", "InitApply(reviews)", "InitDone"]).await;

    // A status patch that also tries to change the spec and labels: only status changes.
    let status = json!({"conditions": [{"type": "Reconciled", "status": "False",
                                        "message": "hosts[0]: bad"}],
                        "observedGeneration": "1"});
    let patched = vs
        .patch_status(
            "reviews",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"sneaky": "yes"}},
                "spec": {"hosts": ["other"]},
                "status": status,
            })),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"], status);
    assert_eq!(
        patched.data["spec"]["hosts"],
        json!(["reviews"]),
        "spec unchanged"
    );
    assert!(patched.metadata.labels.is_none(), "labels unchanged");
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "status is not generation-relevant"
    );
    assert!(rv(&patched) > rv(&created));
    let events = expect_events(&mut watch, &["Apply(reviews)"]).await;
    let Event::Apply(seen) = &events[0] else {
        unreachable!()
    };
    assert_eq!(seen.data["status"], status);
    assert_eq!(rv(seen), rv(&patched));
    assert_eq!(
        server.status_writes_for("virtualservices.networking.istio.io"),
        1
    );

    // The same status again: counted, but a no-op (no new revision, no event).
    let again = vs
        .patch_status(
            "reviews",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&again), rv(&patched));
    assert_eq!(
        server.status_writes_for("virtualservices.networking.istio.io"),
        2
    );

    // A spec update keeps the status; a null status in a status merge patch removes it.
    let mut spec_only = vs.get("reviews").await.unwrap();
    spec_only.data = json!({"spec": {"hosts": ["reviews", "ratings"]}});
    let updated = vs
        .replace("reviews", &PostParams::default(), &spec_only)
        .await
        .unwrap();
    assert_eq!(updated.data["status"], status);
    assert_eq!(updated.metadata.generation, Some(2));
    let cleared = vs
        .patch_status(
            "reviews",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": null})),
        )
        .await
        .unwrap();
    assert!(cleared.data.get("status").is_none());
    assert_eq!(cleared.data["spec"]["hosts"], json!(["reviews", "ratings"]));
    expect_events(&mut watch, &["Apply(reviews)", "Apply(reviews)"]).await;

    // Missing object: 404. A CRD version without a status subresource: no such path.
    let missing = vs
        .patch_status(
            "nope",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&missing).0, 404);
    let mut plain = virtual_service_crd();
    plain.metadata.name = Some("gateways.networking.istio.io".into());
    plain.spec.names.kind = "Gateway".into();
    plain.spec.names.plural = "gateways".into();
    plain.spec.names.singular = Some("gateway".into());
    plain.spec.names.list_kind = Some("GatewayList".into());
    plain.spec.names.short_names = None;
    for version in &mut plain.spec.versions {
        version.subresources = None;
    }
    crds.create(&PostParams::default(), &plain).await.unwrap();
    let gateways: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "Gateway"),
            "gateways",
        ),
    );
    let mut gateway = DynamicObject::new(
        "gw",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "Gateway"),
            "gateways",
        ),
    );
    gateway.data = json!({"spec": {}});
    gateways
        .create(&PostParams::default(), &gateway)
        .await
        .unwrap();
    let no_subresource = gateways
        .patch_status(
            "gw",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&no_subresource).0, 404);
}

#[tokio::test]
async fn lists_filter_by_label_and_field_selectors() {
    let server = KubeApiServer::start().await;
    for (name, app, phase) in [
        ("a", "web", "Running"),
        ("b", "web", "Pending"),
        ("c", "db", "Running"),
    ] {
        server
            .apply(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
                "status": {"phase": phase},
            }))
            .unwrap();
    }
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}))
        .unwrap();
    server
        .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "other"}}))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let names = |list: ObjectList<Pod>| list.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    let list = |params: ListParams| {
        let pods = pods.clone();
        async move { names(pods.list(&params).await.unwrap()) }
    };

    assert_eq!(list(ListParams::default()).await, ["a", "b", "c"]);
    assert_eq!(
        list(ListParams::default().labels("app=web")).await,
        ["a", "b"]
    );
    assert_eq!(list(ListParams::default().labels("app!=web")).await, ["c"]);
    assert_eq!(
        list(ListParams::default().labels("app in (db,cache)")).await,
        ["c"]
    );
    assert_eq!(
        list(ListParams::default().labels("app notin (db)")).await,
        ["a", "b"]
    );
    assert_eq!(
        list(ListParams::default().labels("app")).await,
        ["a", "b", "c"]
    );
    assert!(list(ListParams::default().labels("!app")).await.is_empty());
    assert_eq!(
        list(ListParams::default().fields("metadata.name=b")).await,
        ["b"]
    );
    assert_eq!(
        list(ListParams::default().fields("metadata.name!=b")).await,
        ["a", "c"]
    );
    assert_eq!(
        list(
            ListParams::default()
                .fields("status.phase=Running")
                .labels("app=web")
        )
        .await,
        ["a"]
    );

    let everywhere: Api<Pod> = Api::all(server.client());
    let all = everywhere
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap();
    let keys: Vec<_> = all
        .items
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap(), p.name_any()))
        .collect();
    assert_eq!(keys, ["default/a", "other/a"], "namespace then name order");
    let in_other = everywhere
        .list(&ListParams::default().fields("metadata.namespace=other"))
        .await
        .unwrap();
    assert_eq!(in_other.items.len(), 1);

    let unsupported = pods
        .list(&ListParams::default().fields("spec.nope=x"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&unsupported), (400, "BadRequest".into()));
    let garbage = pods
        .list(&ListParams::default().labels("app in (web"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&garbage), (400, "BadRequest".into()));

    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=web"),
        )
        .await
        .unwrap();
    let deleted = deleted.left().expect("the deleted objects");
    assert_eq!(names(deleted), ["a", "b"]);
    assert_eq!(list(ListParams::default()).await, ["c"]);
}

#[tokio::test]
async fn lists_page_with_consistent_snapshots() {
    let server = KubeApiServer::start().await;
    for i in 0..25 {
        server
            .create(config_map(
                &format!("cm-{i:02}"),
                json!({}),
                json!({"i": i.to_string()}),
            ))
            .unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = cms.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let snapshot_rv = first.metadata.resource_version.clone().unwrap();

    // Changes after the first page are not in the later pages, which read the same revision.
    server
        .create(config_map("cm-99", json!({}), json!({})))
        .unwrap();
    server
        .delete("configmaps", Some("default"), "cm-24")
        .unwrap();

    let mut names: Vec<String> = first.items.iter().map(|c| c.name_any()).collect();
    let mut token = first.metadata.continue_;
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_ref(), Some(&snapshot_rv));
        names.extend(page.items.iter().map(|c| c.name_any()));
        token = page.metadata.continue_;
    }
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);

    // The watcher pages too (and sees the current state).
    let mut stream = events(cms.clone(), watcher::Config::default().page_size(7));
    let lists_before = server.lists_served();
    let mut applied = 0;
    loop {
        match next(&mut stream).await.unwrap() {
            Event::InitApply(_) => applied += 1,
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(applied, 25);
    assert_eq!(
        server.lists_served() - lists_before,
        4,
        "25 objects in pages of 7"
    );

    // A continue token older than the history is 410 Gone.
    let page = cms.list(&ListParams::default().limit(5)).await.unwrap();
    server.compact();
    let expired = cms
        .list(
            &ListParams::default()
                .limit(5)
                .continue_token(&page.metadata.continue_.unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&expired), (410, "Expired".into()));
}

#[tokio::test]
async fn watcher_sees_the_initial_state_then_changes() {
    let server = KubeApiServer::start().await;
    server
        .create(config_map("before", json!({"app": "web"}), json!({})))
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut all = events(cms.clone(), watcher::Config::default());
    let mut web = events(cms.clone(), watcher::Config::default().labels("app=web"));
    expect_events(&mut all, &["Init", "InitApply(before)", "InitDone"]).await;
    expect_events(&mut web, &["Init", "InitApply(before)", "InitDone"]).await;

    cms.create(
        &PostParams::default(),
        &config_map("db", json!({"app": "db"}), json!({})),
    )
    .await
    .unwrap();
    cms.create(
        &PostParams::default(),
        &config_map("web", json!({"app": "web"}), json!({})),
    )
    .await
    .unwrap();
    cms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.delete("web", &DeleteParams::default()).await.unwrap();
    let seen = expect_events(
        &mut all,
        &["Apply(db)", "Apply(web)", "Apply(web)", "Delete(web)"],
    )
    .await;
    match &seen[2] {
        Event::Apply(cm) => assert_eq!(cm.data.as_ref().unwrap()["k"], "v"),
        other => panic!("{}", describe(other)),
    }
    expect_events(&mut web, &["Apply(web)", "Apply(web)", "Delete(web)"]).await;

    // Streaming lists: the initial state as watch events, ended by a bookmark.
    let mut streaming = events(cms.clone(), watcher::Config::default().streaming_lists());
    expect_events(
        &mut streaming,
        &["Init", "InitApply(before)", "InitApply(db)", "InitDone"],
    )
    .await;

    // Metadata-only watchers get PartialObjectMetadata.
    let metadata_api: Api<PartialObjectMeta<ConfigMap>> =
        Api::namespaced(server.client(), "default");
    let mut metadata = events(metadata_api, watcher::Config::default());
    let mut seen: Vec<String> = Vec::new();
    loop {
        match next(&mut metadata).await.unwrap() {
            Event::InitApply(meta) => seen.push(meta.name_any()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(seen, ["before", "db"]);
}

#[tokio::test]
async fn watcher_resumes_after_dropped_watches_without_losing_events() {
    let server = KubeApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut stream = events(cms.clone(), watcher::Config::default());
    expect_events(&mut stream, &["Init", "InitDone"]).await;
    eventually(WAIT, POLL, || async {
        if server.open_watches() == 1 {
            Ok(())
        } else {
            Err("the watch is not open yet")
        }
    })
    .await;
    let (lists, watches) = (server.lists_served(), server.watches_opened());

    server.drop_watches();
    for name in ["one", "two", "three"] {
        server
            .create(config_map(name, json!({}), json!({})))
            .unwrap();
    }
    server.delete("configmaps", Some("default"), "two").unwrap();
    expect_events(
        &mut stream,
        &["Apply(one)", "Apply(two)", "Apply(three)", "Delete(two)"],
    )
    .await;
    assert_eq!(
        server.lists_served(),
        lists,
        "a resumed watch does not relist"
    );
    assert!(server.watches_opened() > watches);
    assert_eq!(
        server.watches_opened_for("configmaps"),
        server.watches_opened()
    );

    drop(stream);
    eventually(WAIT, POLL, || async {
        match server.open_watches() {
            0 => Ok(()),
            n => Err(format!("{n} watches still open after the client went away")),
        }
    })
    .await;
}

/// Follows a watcher's events like a reflector store.
#[derive(Default)]
struct Mirror {
    state: BTreeMap<String, Option<BTreeMap<String, String>>>,
    buffer: Option<BTreeMap<String, Option<BTreeMap<String, String>>>>,
    relists: usize,
    errors: Vec<u16>,
}

impl Mirror {
    fn apply(&mut self, event: Result<Event<ConfigMap>, watcher::Error>) {
        match event {
            Ok(Event::Init) => self.buffer = Some(BTreeMap::new()),
            Ok(Event::InitApply(cm)) => {
                if let Some(buffer) = &mut self.buffer {
                    buffer.insert(cm.name_any(), cm.data);
                }
            }
            Ok(Event::InitDone) => {
                self.state = self.buffer.take().unwrap_or_default();
                self.relists += 1;
            }
            Ok(Event::Apply(cm)) => {
                self.state.insert(cm.name_any(), cm.data);
            }
            Ok(Event::Delete(cm)) => {
                self.state.remove(&cm.name_any());
            }
            Err(watcher::Error::WatchError(status)) => self.errors.push(status.code),
            Err(other) => panic!("unexpected watcher error: {other}"),
        }
    }
}

#[tokio::test]
async fn watcher_relists_after_410_gone() {
    let server = KubeApiServer::start().await;
    for name in ["keep", "change", "remove"] {
        server
            .create(config_map(name, json!({}), json!({"v": "1"})))
            .unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut stream = events(cms.clone(), watcher::Config::default());
    let mut mirror = Mirror::default();
    while mirror.relists == 0 {
        mirror.apply(next(&mut stream).await);
    }
    assert_eq!(mirror.state.len(), 3);

    server.compact();
    server.drop_watches();
    server
        .apply(config_map("change", json!({}), json!({"v": "2"})))
        .unwrap();
    server
        .delete("configmaps", Some("default"), "remove")
        .unwrap();
    server
        .create(config_map("new", json!({}), json!({"v": "1"})))
        .unwrap();

    let expected: BTreeMap<String, Option<BTreeMap<String, String>>> = server
        .list("configmaps", Some("default"))
        .into_iter()
        .map(|cm| serde_json::from_value::<ConfigMap>(cm).unwrap())
        .map(|cm| (cm.name_any(), cm.data))
        .collect();
    tokio::time::timeout(WAIT, async {
        while mirror.relists < 2 || mirror.state != expected {
            mirror.apply(next(&mut stream).await);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no relist to {expected:?}; errors {:?}", mirror.errors));
    assert!(mirror.errors.contains(&410), "{:?}", mirror.errors);

    // A raw watch from a compacted version: HTTP 200, then one ERROR event with 410 Expired.
    server.compact();
    let mut raw = cms
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(WAIT, raw.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(WAIT, raw.next())
            .await
            .unwrap()
            .is_none(),
        "the stream ends"
    );
    let exact = cms
        .list(
            &ListParams::default()
                .at("1")
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&exact), (410, "Expired".into()));
}

#[tokio::test]
async fn raw_watches_get_bookmarks() {
    let server = KubeApiServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await;
    server
        .create(config_map("x", json!({}), json!({})))
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    // `WatchParams::default()` sets allowWatchBookmarks=true in kube 5.
    let mut stream = cms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = Vec::new();
    let bookmark_rv = tokio::time::timeout(WAIT, async {
        loop {
            match stream.next().await.expect("the watch stays open").unwrap() {
                WatchEvent::Added(cm) => added.push(cm.name_any()),
                WatchEvent::Bookmark(bookmark) => return bookmark.metadata.resource_version,
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("a bookmark");
    assert_eq!(added, ["x"]);
    assert_eq!(bookmark_rv, server.revision().to_string());

    // A shorter interval applies to the open watch right away.
    server.set_bookmark_interval(Duration::from_millis(20));
    let start = std::time::Instant::now();
    for _ in 0..5 {
        match tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        start.elapsed() < Duration::from_millis(190),
        "{:?} for 5 bookmarks",
        start.elapsed()
    );

    // Without allowWatchBookmarks there are none; timeoutSeconds ends the stream.
    let mut quiet = cms
        .watch(&WatchParams::default().disable_bookmarks().timeout(1), "0")
        .await
        .unwrap()
        .boxed();
    let mut lines = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(event) = quiet.next().await {
            lines.push(match event.unwrap() {
                WatchEvent::Added(cm) => format!("ADDED {}", cm.name_any()),
                other => format!("{other:?}"),
            });
        }
    })
    .await
    .expect("timeoutSeconds ends the watch");
    assert_eq!(lines, ["ADDED x"]);
}

#[tokio::test]
async fn relabeling_out_of_a_selected_watch_is_a_delete() {
    let server = KubeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let mut web = events(pods.clone(), watcher::Config::default().labels("app=web"));
    expect_events(&mut web, &["Init", "InitDone"]).await;
    pods.create(&PostParams::default(), &pod("p", json!({"app": "web"})))
        .await
        .unwrap();
    expect_events(&mut web, &["Apply(p)"]).await;
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    pods.patch("p", &PatchParams::default(), &relabel("db"))
        .await
        .unwrap();
    let deleted = expect_events(&mut web, &["Delete(p)"]).await;
    if let Event::Delete(p) = &deleted[0] {
        assert_eq!(
            p.labels()["app"],
            "web",
            "the DELETED event carries the last matching state"
        );
        assert_eq!(p.resource_version().unwrap(), server.revision().to_string());
    }
    pods.patch("p", &PatchParams::default(), &relabel("web"))
        .await
        .unwrap();
    expect_events(&mut web, &["Apply(p)"]).await;
}

/// The server lists the clients of its open watches as an API server's audit log knows
/// them: `User-Agent`, source address, and what they watch.
#[tokio::test]
async fn open_watches_name_their_clients() {
    let server = KubeApiServer::start().await;
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static("fleet-a/1"),
    ));
    let client = Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut web = events(pods, watcher::Config::default().labels("app=web"));
    expect_events(&mut web, &["Init", "InitDone"]).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(server.client());
    let mut all_nodes = events(nodes, watcher::Config::default());
    expect_events(&mut all_nodes, &["Init", "InitDone"]).await;
    eventually(WAIT, POLL, || {
        let clients = server.watch_clients();
        async move {
            match clients.len() {
                2 => Ok(()),
                n => Err(format!("{n} watch clients: {clients:?}")),
            }
        }
    })
    .await;
    let clients = server.watch_clients();
    let pod_watch = clients.iter().find(|c| c.resource == "pods").unwrap();
    assert_eq!(pod_watch.user_agent, "fleet-a/1");
    assert_eq!(pod_watch.namespace.as_deref(), Some("default"));
    assert_eq!(pod_watch.label_selector.as_deref(), Some("app=web"));
    assert!(pod_watch.source.ip().is_loopback());
    let node_watch = clients.iter().find(|c| c.resource == "nodes").unwrap();
    assert_eq!(node_watch.namespace, None);
    assert_eq!(node_watch.label_selector, None);
    assert_ne!(node_watch.user_agent, "fleet-a/1");
    assert_eq!(server.watching_agents().len(), 2);

    // A closed watch is no longer listed.
    drop(web);
    eventually(WAIT, POLL, || {
        let clients = server.watch_clients();
        async move {
            match clients.as_slice() {
                [only] if only.resource == "nodes" => Ok(()),
                other => Err(format!("watch clients: {other:?}")),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn discovery_follows_crds() {
    let server = KubeApiServer::start().await;
    let client = server.client();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for group in ["", "discovery.k8s.io", "apiextensions.k8s.io"] {
        assert!(discovery.has_group(group), "group {group:?}");
    }
    let core = discovery.get("").unwrap();
    let core_kinds: Vec<String> = core
        .recommended_resources()
        .into_iter()
        .map(|(r, _)| r.kind)
        .collect();
    for kind in ["Namespace", "Pod", "Service", "Node", "Secret"] {
        assert!(
            core_kinds.iter().any(|k| k == kind),
            "{kind} in {core_kinds:?}"
        );
    }
    let slices = GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice");
    let (resource, caps) = discovery.resolve_gvk(&slices).unwrap();
    assert_eq!(resource.plural, "endpointslices");
    assert!(caps.supports_operation("watch"));
    assert!(!discovery.has_group("networking.istio.io"));

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &virtual_service_crd())
        .await
        .unwrap();
    for discovery in [
        Discovery::new(client.clone()).run().await.unwrap(),
        Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        let istio = discovery.get("networking.istio.io").expect("the CRD group");
        assert_eq!(istio.preferred_version_or_latest(), "v1");
        let versions: Vec<&str> = istio.versions().collect();
        assert_eq!(versions, ["v1", "v1beta1", "v1alpha3"]);
        let (vs, _) = istio.recommended_kind("VirtualService").unwrap();
        assert_eq!(vs.plural, "virtualservices");
    }

    crds.delete(
        "virtualservices.networking.istio.io",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    assert!(!discovery.has_group("networking.istio.io"));
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "34")
    );
}

#[tokio::test]
async fn kubeconfig_reaches_the_server_and_clusters_are_separate() {
    let east = KubeApiServer::builder().name("east").start().await;
    let west = KubeApiServer::start().await;
    let yaml = east.kubeconfig();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        east.url()
    );
    let client = Client::try_from(config).unwrap();
    let namespaces: Vec<String> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(
        namespaces,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );

    Api::<ConfigMap>::default_namespaced(client)
        .create(
            &PostParams::default(),
            &config_map("only-east", json!({}), json!({})),
        )
        .await
        .unwrap();
    assert!(east
        .get("configmaps", Some("default"), "only-east")
        .is_some());
    assert!(west
        .get("configmaps", Some("default"), "only-east")
        .is_none());
    assert_eq!(east.name(), "east");
}

#[tokio::test]
async fn bad_requests_get_status_bodies() {
    let server = KubeApiServer::start().await;
    let send = |method: &str, path: &str, content_type: &str, body: &str| {
        let request = Request {
            method: method.into(),
            path: path.into(),
            host: None,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.as_bytes().to_vec(),
            http10: false,
        };
        let addr = server.addr();
        async move { request.send(addr).await.unwrap() }
    };
    let status = |code: u16, reason: &str, r: shoal_tests::http::Response| {
        let body = r.json().unwrap();
        assert_eq!(
            (r.status, body["kind"].as_str(), body["reason"].as_str()),
            (code, Some("Status"), Some(reason)),
            "{body}"
        );
        assert_eq!(body["code"], code);
    };
    let json_type = "application/json";
    status(
        400,
        "BadRequest",
        send("GET", "/api/v1/pods?labelSelector=a%20b%20c", json_type, "").await,
    );
    status(
        400,
        "BadRequest",
        send("GET", "/api/v1/pods?limit=ten", json_type, "").await,
    );
    status(
        400,
        "BadRequest",
        send("GET", "/api/v1/pods?continue=garbage", json_type, "").await,
    );
    status(
        400,
        "BadRequest",
        send("GET", "/api/v1/pods?watch=maybe", json_type, "").await,
    );
    status(
        400,
        "BadRequest",
        send(
            "POST",
            "/api/v1/namespaces/default/pods",
            json_type,
            "{not json",
        )
        .await,
    );
    status(
        400,
        "BadRequest",
        send("POST", "/api/v1/namespaces/default/pods", json_type, "[1]").await,
    );
    status(
        400,
        "BadRequest",
        send("GET", "/api/v1/pods?labelSelector=%zz", json_type, "").await,
    );
    status(
        404,
        "NotFound",
        send("GET", "/apis/nope.example.com/v1/things", json_type, "").await,
    );
    status(
        404,
        "NotFound",
        send("GET", "/api/v1/namespaces/default/pods/nope", json_type, "").await,
    );
    status(
        404,
        "NotFound",
        send("GET", "/api/v1/namespaces/default/nodes", json_type, "").await,
    );
    status(
        405,
        "MethodNotAllowed",
        send("POST", "/api/v1/pods", json_type, "{}").await,
    );
    status(
        422,
        "Invalid",
        send(
            "POST",
            "/api/v1/namespaces/default/pods",
            json_type,
            "{\"metadata\":{}}",
        )
        .await,
    );
    status(
        422,
        "Invalid",
        send(
            "GET",
            "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            json_type,
            "",
        )
        .await,
    );

    // kubectl-style writes over plain HTTP: create from YAML, merge-patch, delete.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  a: b\n";
    let created = send(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/yaml",
        yaml,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    status(
        415,
        "UnsupportedMediaType",
        send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/y",
            "text/plain",
            "{}",
        )
        .await,
    );
    let patched = send(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/y",
        "application/merge-patch+json",
        r#"{"data":{"a":null,"c":"d"}}"#,
    )
    .await;
    assert_eq!(patched.json().unwrap()["data"], json!({"c": "d"}));
    let stale = r#"{"metadata":{"resourceVersion":"1"},"data":{"e":"f"}}"#;
    status(
        409,
        "Conflict",
        send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/y",
            "application/merge-patch+json",
            stale,
        )
        .await,
    );
    let deleted = send(
        "DELETE",
        "/api/v1/namespaces/default/configmaps/y",
        json_type,
        "",
    )
    .await;
    assert_eq!(deleted.status, 200);
    let health = send("GET", "/readyz", json_type, "").await;
    assert_eq!((health.status, health.text().as_str()), (200, "ok"));
}

/// CRUD and a label-selected watcher on ConfigMaps in namespace `ns` (created and deleted
/// here): only what a real API server does too, so it runs against either.
async fn client_checks(client: Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &namespace(ns))
        .await
        .unwrap();
    let result = AssertUnwindSafe(client_checks_in(client, ns))
        .catch_unwind()
        .await;
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn client_checks_in(client: Client, ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client, ns);
    let selected = json!({"shoal-test": "yes"});
    let mut watch = events(
        cms.clone(),
        watcher::Config::default().labels("shoal-test=yes"),
    );
    expect_events(&mut watch, &["Init", "InitDone"]).await;

    let one = cms
        .create(
            &PostParams::default(),
            &config_map("one", selected.clone(), json!({"k": "1"})),
        )
        .await
        .unwrap();
    expect_events(&mut watch, &["Apply(one)"]).await;
    let again = cms
        .create(
            &PostParams::default(),
            &config_map("one", json!({}), json!({})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&again), (409, "AlreadyExists".into()));

    cms.patch(
        "one",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    expect_events(&mut watch, &["Apply(one)"]).await;
    let stale = cms
        .replace("one", &PostParams::default(), &one)
        .await
        .unwrap_err();
    assert_eq!(api_status(&stale), (409, "Conflict".into()));
    assert_eq!(cms.get("one").await.unwrap().data.unwrap()["k"], "2");

    cms.create(
        &PostParams::default(),
        &config_map("two", json!({}), json!({})),
    )
    .await
    .unwrap();
    let labeled = cms
        .list(&ListParams::default().labels("shoal-test=yes"))
        .await
        .unwrap();
    assert_eq!(
        labeled
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        ["one"]
    );
    let by_name = cms
        .list(&ListParams::default().fields("metadata.name=two"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);

    let label = |value: Value| Patch::Merge(json!({"metadata": {"labels": {"shoal-test": value}}}));
    cms.patch("two", &PatchParams::default(), &label(json!("yes")))
        .await
        .unwrap();
    expect_events(&mut watch, &["Apply(two)"]).await;
    cms.patch("two", &PatchParams::default(), &label(Value::Null))
        .await
        .unwrap();
    expect_events(&mut watch, &["Delete(two)"]).await;

    cms.delete("one", &DeleteParams::default()).await.unwrap();
    expect_events(&mut watch, &["Delete(one)"]).await;
    assert_eq!(
        api_status(&cms.get("one").await.unwrap_err()),
        (404, "NotFound".into())
    );
}

#[tokio::test]
async fn client_checks_against_the_test_server() {
    let server = KubeApiServer::start().await;
    client_checks(server.client(), "shoal-client-checks").await;
    assert!(server
        .get("namespaces", None, "shoal-client-checks")
        .is_none());
}

#[tokio::test]
async fn client_checks_against_a_real_cluster() {
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("skipped: KUBECONFIG not set");
        return;
    }
    let client = Client::try_default()
        .await
        .expect("a client for $KUBECONFIG");
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 1_000_000)
        .unwrap_or_default();
    client_checks(client, &format!("shoal-kubeapi-{suffix}")).await;
}
