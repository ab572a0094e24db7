//! The root certificate in every namespace (`shoal-ingester --ca-root-cert`), as istiod's
//! namespace controller keeps it: the ConfigMap `istio-ca-root-cert` (key `root-cert.pem`)
//! in every selected namespace of every cluster, put back when edited or deleted,
//! rewritten when the file changes, and written by the fleet's leader only.
//!
//! Processes: Kubernetes API test servers (a config cluster and a remote one), a real
//! nats-server, `shoal-ingester --source kube`. Every assertion is on what the API servers
//! hold and on who wrote it (their write audit). Run `cargo build --workspace --bins` first.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::{config_cluster, namespace, remote_secret, Ingester, POLL};
use serde_json::{json, Value};
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::pki::TestCa;
use shoal_tests::{eventually, NatsServer};
use std::path::Path;
use std::time::Duration;

const CM: &str = "istio-ca-root-cert";
const WAIT: Duration = Duration::from_secs(30);

/// The root certificate in a namespace's ConfigMap, if there is one.
fn root_in(cluster: &KubeApiServer, ns: &str) -> Option<String> {
    let cm = cluster.get("configmaps", Some(ns), CM)?;
    cm.pointer("/data/root-cert.pem")
        .and_then(Value::as_str)
        .map(String::from)
}

/// Waits until each cluster's namespaces hold exactly `want` (a namespace not listed: no
/// ConfigMap at all).
async fn until_roots(clusters: &[(&KubeApiServer, &[&str])], want: &str) {
    eventually(WAIT, POLL, || async move {
        for (cluster, selected) in clusters {
            for ns in cluster.list("namespaces", None) {
                let ns = ns["metadata"]["name"].as_str().unwrap_or_default();
                let root = root_in(cluster, ns);
                let expected = selected.contains(&ns).then(|| want.to_string());
                if root != expected {
                    return Err(format!(
                        "{}/{ns}: has {}, want {}",
                        cluster.name(),
                        if root.is_some() { "a root" } else { "none" },
                        if expected.is_some() {
                            "the root"
                        } else {
                            "none"
                        },
                    ));
                }
            }
        }
        Ok(())
    })
    .await;
}

/// Writes a file as a Secret volume update does: a new file renamed over the old one.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `shoal_ingester_ca_root_writes_total{cluster,result}` of an ingester.
async fn writes_metric(ingester: &Ingester, cluster: &str, result: &str) -> u64 {
    let labels = format!(r#"cluster="{cluster}",result="{result}""#);
    ingester
        .metrics()
        .await
        .lines()
        .find(|l| l.starts_with("shoal_ingester_ca_root_writes_total") && l.contains(&labels))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Selected namespaces of every cluster get the root, others none; an edited or deleted
/// ConfigMap is put back (other keys kept); a new selected namespace gets it; a rotated root
/// file is written everywhere; failed writes are counted and retried; a settled ingester
/// writes nothing more.
#[tokio::test]
async fn root_certificate_in_every_selected_namespace() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    let remote = KubeApiServer::builder().name("remote").start().await;
    for cluster in [&config, &remote] {
        cluster
            .apply(namespace("shop", json!({"mesh": "on"})))
            .unwrap();
        cluster.apply(namespace("other", json!({}))).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    // Kubernetes' own namespaces selected too: kube-system gets the root, kube-public and
    // kube-node-lease never do (as istiod).
    std::fs::write(
        &mesh,
        "discoverySelectors:\n\
         - matchLabels: {mesh: \"on\"}\n\
         - matchExpressions:\n  \
           - {key: kubernetes.io/metadata.name, operator: In, values: [kube-system, kube-public, kube-node-lease]}\n",
    )
    .unwrap();
    let root_file = dir.path().join("root-cert.pem");
    let first = TestCa::new("root one").cert_pem;
    std::fs::write(&root_file, &first).unwrap();
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &[
            "--cluster-id",
            "main",
            "--mesh-config",
            mesh.to_str().unwrap(),
            "--ca-root-cert",
            root_file.to_str().unwrap(),
        ],
    );
    ingester.wait_ready().await;
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("remote", remote.kubeconfig())],
        ))
        .unwrap();
    let selected: &[&str] = &["shop", "kube-system"];
    let clusters = [(&config, selected), (&remote, selected)];
    until_roots(&clusters, &first).await;
    let cm = config.get("configmaps", Some("shop"), CM).unwrap();
    assert_eq!(cm["metadata"]["labels"]["istio.io/config"], "true", "{cm}");

    // Edited: the root is put back, a key someone added stays.
    let mut edited = cm.clone();
    edited["data"] = json!({"root-cert.pem": "edited", "extra": "kept"});
    config.update(&edited).unwrap();
    // Deleted: created again.
    remote.delete("configmaps", Some("shop"), CM).unwrap();
    until_roots(&clusters, &first).await;
    let cm = config.get("configmaps", Some("shop"), CM).unwrap();
    assert_eq!(cm["data"]["extra"], "kept", "{cm}");

    // A namespace that becomes selected, or is created selected, gets it.
    config
        .apply(namespace("other", json!({"mesh": "on"})))
        .unwrap();
    remote
        .apply(namespace("new", json!({"mesh": "on"})))
        .unwrap();
    until_roots(
        &[
            (&config, &["shop", "other", "kube-system"]),
            (&remote, &["shop", "new", "kube-system"]),
        ],
        &first,
    )
    .await;

    // The root file rotates: every ConfigMap gets the new root.
    let second = TestCa::new("root two").cert_pem;
    write_atomically(&root_file, &second);
    until_roots(
        &[
            (&config, &["shop", "other", "kube-system"]),
            (&remote, &["shop", "new", "kube-system"]),
        ],
        &second,
    )
    .await;
    // A file that is not a certificate keeps the previous root.
    write_atomically(&root_file, "not a certificate\n");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(root_in(&config, "shop").as_deref(), Some(second.as_str()));
    assert!(ingester
        .metrics()
        .await
        .contains("shoal_ingester_ca_root_reloads_total{result=\"error\"} 1"));

    // The API server fails every request for a while: the restore of a deleted ConfigMap
    // fails, is counted, and is retried until it works.
    config.fail_requests(Some(500));
    config.delete("configmaps", Some("shop"), CM).unwrap();
    eventually(WAIT, POLL, || async {
        match writes_metric(&ingester, "main", "failed").await {
            0 => Err("no failed write yet".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    assert_eq!(root_in(&config, "shop"), None);
    config.fail_requests(None);
    until_roots(
        &[
            (&config, &["shop", "other", "kube-system"]),
            (&remote, &["shop", "new", "kube-system"]),
        ],
        &second,
    )
    .await;

    // Settled: nothing more is written (no write storm on watch events or relists).
    let before = config.writes_for("configmaps").len() + remote.writes_for("configmaps").len();
    config.drop_watches();
    remote.compact();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = config.writes_for("configmaps").len() + remote.writes_for("configmaps").len();
    assert_eq!(before, after, "writes after settling");
    // Every write is counted, by cluster.
    let written = writes_metric(&ingester, "main", "written").await;
    let audited = config
        .writes_for("configmaps")
        .iter()
        .filter(|w| w.code < 300)
        .count() as u64;
    // (the test's own edits go through the server's handle, not its HTTP API: not audited)
    assert_eq!(written, audited, "{:?}", config.writes_for("configmaps"));
    assert!(writes_metric(&ingester, "remote", "written").await >= 4);
    assert_eq!(writes_metric(&ingester, "remote", "failed").await, 0);
}

/// Only the leader writes: a standby writes nothing even when a ConfigMap is deleted, and
/// puts it back once it leads.
#[tokio::test]
async fn a_standby_writes_no_root_certificate() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    config.apply(namespace("shop", json!({}))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root_file = dir.path().join("root-cert.pem");
    let root = TestCa::new("root").cert_pem;
    std::fs::write(&root_file, &root).unwrap();
    let start = |id: &str| {
        Ingester::start(
            &nats.url(),
            &config.kubeconfig(),
            &[
                "--instance-id",
                id,
                "--ca-root-cert",
                root_file.to_str().unwrap(),
            ],
        )
    };
    let mut leader = start("replica-a");
    leader.wait_leader().await;
    let mut standby = start("replica-b");
    standby.wait_ready().await;
    assert!(!standby.leads().await);
    let everywhere: &[&str] = &["default", "istio-system", "kube-system", "shop"];
    until_roots(&[(&config, everywhere)], &root).await;
    config.delete("configmaps", Some("shop"), CM).unwrap();
    until_roots(&[(&config, everywhere)], &root).await;
    let by = |agent: &str| {
        config
            .writes_for("configmaps")
            .into_iter()
            .filter(|w| w.user_agent.contains(agent))
            .count()
    };
    assert!(
        by("instance replica-a") >= 5,
        "{:?}",
        config.writes_for("configmaps")
    );
    assert_eq!(by("instance replica-b"), 0, "the standby wrote");

    leader.kill().await;
    standby.wait_leader().await;
    config.delete("configmaps", Some("shop"), CM).unwrap();
    until_roots(&[(&config, everywhere)], &root).await;
    assert_eq!(
        by("instance replica-b"),
        1,
        "the new leader puts it back, once"
    );
}
