//! docs/quickstart.md, "A captured sidecar (Istio's default)", as written: the network
//! (`scripts/captured-demo.sh net`), `shoal-server --standalone docs/examples/captured` on
//! the host's address in it, `captured-demo.sh up`, every command the section shows, then
//! `captured-demo.sh down`, which must leave nothing behind.
//!
//! So that it runs beside other tests, the network gets a unique name and a free subnet
//! (`DEMO_NET`, `DEMO_OCTET=auto`), shoal a free port (`DEMO_XDS`), and the manifests the
//! subnet's pod addresses; the section's commands are run with the same substitutions
//! (network `demo` -> ours, `198.18.0.` -> our subnet, shoal's admin address).
//!
//! Needs root, iptables, Envoy, curl and the binaries (`bash scripts/test.sh`); fails
//! without netns support unless `SHOAL_SKIP_NETNS=1`.
#![forbid(unsafe_code)]

use serde_json::Value;
use shoal_tests::ports::free_port_on;
use shoal_tests::{http, netns, ShoalServer};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

const SECTION: &str = "## 6. A captured sidecar (Istio's default)";
/// `up` waits up to 60 s for shoal's configuration; the other commands are quick.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_demo_runs_as_documented() {
    if netns::skip_if_unavailable() {
        return;
    }
    let commands = documented_commands();

    // `captured-demo.sh net`, on a free subnet.
    let mut demo = Demo::new();
    let out = demo.script("net").await;
    let subnet = stdout(&out).trim().to_string();
    demo.octet = subnet
        .strip_prefix("198.18.")
        .and_then(|s| s.strip_suffix(".0/24"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("captured-demo.sh net printed {subnet:?}"));

    // shoal, standalone on the example manifests (with our subnet's pod addresses), on the
    // host's address in the network.
    let manifests = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo().join("docs/examples/captured")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            manifests.path().join(path.file_name().unwrap()),
            demo.localize(&text),
        )
        .unwrap();
    }
    let host = Ipv4Addr::new(198, 18, demo.octet, 254);
    let xds = SocketAddr::from((host, free_port_on(&[host])));
    let dir = manifests.path().to_str().unwrap();
    let mut server = ShoalServer::start_with_xds(&["--standalone", dir], xds).await;
    demo.xds = Some(xds);
    demo.admin = Some(server.admin_addr());

    // `captured-demo.sh up` returns once productpage reaches reviews through the sidecars.
    let out = demo.script("up").await;
    assert!(stdout(&out).contains("Up: productpage"), "{}", stdout(&out));

    through_both_sidecars(&demo).await;
    header_rule(&demo).await;

    // Every command the section shows between `up` and `down`.
    for command in &commands {
        let local = demo.localize(command);
        eprintln!("$ {local}");
        let out = demo.shell(&local).await;
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "documented command failed: {command}\nran: {local}\n{}",
            describe(&out)
        );
    }
    let status = demo.script("status").await;
    for pod in ["productpage", "reviews-v1", "reviews-v2"] {
        let line = stdout(&status)
            .lines()
            .find(|l| l.starts_with(pod))
            .unwrap_or_else(|| panic!("status lists no {pod}:\n{}", stdout(&status)))
            .to_string();
        assert!(
            line.contains("running  running") && line.contains("virtualInbound"),
            "{line}"
        );
    }

    // `down` stops everything it started and removes the network.
    let pids = demo.pids();
    assert_eq!(pids.len(), 6, "an app and an Envoy per pod: {pids:?}");
    demo.script("down").await;
    demo.down = true;
    let namespaces = sh("ip", &["netns", "list"]);
    let prefix = format!("{}-", demo.net);
    assert!(
        !namespaces.lines().any(|l| l.starts_with(&prefix)),
        "namespaces left behind:\n{namespaces}"
    );
    let links = sh("ip", &["-o", "link", "show"]);
    assert!(
        !links.contains(&format!(" {}-h", demo.net)),
        "host interface left behind:\n{links}"
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} survived down"
        );
    }
    assert!(!demo.state.exists(), "state directory left behind");
    server.process().assert_running();
}

/// productpage -> its sidecar (outbound) -> reviews' sidecar (inbound) -> reviews' app.
async fn through_both_sidecars(demo: &Demo) {
    let before_out = demo
        .stat(2, "|reviews.shop.svc.cluster.local.upstream_rq_total")
        .await;
    let before_in = demo
        .stat(3, "cluster.inbound|9080||.upstream_rq_total")
        .await
        + demo
            .stat(4, "cluster.inbound|9080||.upstream_rq_total")
            .await;
    for url in ["http://reviews:9080/", "http://198.19.0.11:9080/"] {
        let body = demo.curl(url, &[]).await;
        let backend = body["backend"].as_str().unwrap_or_default();
        assert!(backend.starts_with("reviews-v"), "{url}: {body}");
        // Passed to the app by its sidecar (inbound passthrough from 127.0.0.6), after
        // productpage's sidecar routed it (x-request-id).
        assert!(
            body["peer"]
                .as_str()
                .unwrap_or_default()
                .starts_with("127.0.0.6:"),
            "{url}: {body}"
        );
        assert!(body["headers"]["x-request-id"].is_string(), "{url}: {body}");
    }
    let after_out = demo
        .stat(2, "|reviews.shop.svc.cluster.local.upstream_rq_total")
        .await;
    let after_in = demo
        .stat(3, "cluster.inbound|9080||.upstream_rq_total")
        .await
        + demo
            .stat(4, "cluster.inbound|9080||.upstream_rq_total")
            .await;
    assert!(
        after_out >= before_out + 2,
        "productpage outbound: {before_out} -> {after_out}"
    );
    assert!(
        after_in >= before_in + 2,
        "reviews inbound: {before_in} -> {after_in}"
    );
}

/// The VirtualService: `end-user: jason` always gets v2; the rest reaches v1 too.
async fn header_rule(demo: &Demo) {
    for _ in 0..5 {
        let body = demo
            .curl("http://reviews:9080/", &["end-user: jason"])
            .await;
        assert_eq!(body["backend"], "reviews-v2", "{body}");
    }
    let mut v1 = false;
    for _ in 0..50 {
        v1 |= demo.curl("http://reviews:9080/", &[]).await["backend"] == "reviews-v1";
        if v1 {
            break;
        }
    }
    assert!(v1, "80% go to v1, but 50 requests never did");
}

/// The shell commands of the section's ```sh blocks that the test runs as they are: all but
/// `cargo` (the test runs the server itself) and `captured-demo.sh` (run at their moment).
/// Also checks that the section shows the steps the test takes.
fn documented_commands() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let start = text
        .find(SECTION)
        .expect("the captured section in docs/quickstart.md");
    let section = &text[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut lines = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh => {
                if let Some(head) = l.strip_suffix('\\') {
                    pending.push_str(head);
                } else {
                    lines.push(format!("{pending}{l}"));
                    pending.clear();
                }
            }
            _ => {}
        }
    }
    let joined = lines.join("\n");
    for step in [
        "cargo build --workspace --bins",
        "scripts/captured-demo.sh net",
        "cargo run -p shoal-server -- --standalone docs/examples/captured",
        "--xds-addr 198.18.0.254:15010",
        "scripts/captured-demo.sh up",
        "scripts/captured-demo.sh down",
    ] {
        assert!(joined.contains(step), "the section does not show `{step}`");
    }
    let run: Vec<String> = lines
        .into_iter()
        .filter(|l| !l.starts_with("cargo ") && !l.starts_with("scripts/captured-demo.sh"))
        .collect();
    assert!(
        run.iter()
            .any(|l| l.contains("exec demo productpage -- curl")),
        "no curl from productpage in the section: {run:?}"
    );
    run
}

/// One run of the demo (network, state, addresses); `down` on drop, logs printed if the
/// test failed.
struct Demo {
    net: String,
    octet: u8,
    state: PathBuf,
    xds: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    down: bool,
}

impl Demo {
    fn new() -> Demo {
        // The test networks' naming (tests/support/netns.rs): a run that dies leaves a
        // network the next test run removes.
        let net = format!("sh{}n90", std::process::id());
        assert!(net.len() <= 12, "network name {net} too long");
        Demo {
            state: std::env::temp_dir().join(format!("shoal-demo-{net}")),
            net,
            octet: 0,
            xds: None,
            admin: None,
            down: false,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("DEMO_NET", self.net.clone()),
            ("DEMO_OCTET", "auto".into()),
            ("DEMO_STATE", self.state.display().to_string()),
            (
                "SHOAL_BIN_DIR",
                shoal_tests::shoal::bin_dir().display().to_string(),
            ),
        ];
        if let Some(xds) = self.xds {
            env.push(("DEMO_XDS", xds.to_string()));
        }
        env
    }

    /// The documentation's addresses and names, for this run.
    fn localize(&self, text: &str) -> String {
        let mut out = text
            .replace("198.18.0.", &format!("198.18.{}.", self.octet))
            .replace(" demo ", &format!(" {} ", self.net));
        if let Some(admin) = self.admin {
            out = out.replace("127.0.0.1:15014", &admin.to_string());
        }
        out
    }

    /// `scripts/captured-demo.sh CMD`; panics with its output unless it succeeds.
    async fn script(&self, cmd: &str) -> Output {
        let out = self
            .run(
                "bash",
                &["scripts/captured-demo.sh".to_string(), cmd.into()],
            )
            .await;
        assert!(
            out.status.success(),
            "captured-demo.sh {cmd}: {}",
            describe(&out)
        );
        out
    }

    /// A documented command line, run by bash in the repository.
    async fn shell(&self, line: &str) -> Output {
        self.run("bash", &["-c".to_string(), line.to_string()])
            .await
    }

    async fn run(&self, program: &str, args: &[String]) -> Output {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(repo())
            .envs(self.env())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{program} {args:?} ran over {COMMAND_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }

    /// `curl` in productpage, as the quickstart does: the JSON the answering app sent.
    async fn curl(&self, url: &str, headers: &[&str]) -> Value {
        let mut line = format!(
            "scripts/mesh-netns.sh exec {} productpage -- curl -sf",
            self.net
        );
        for h in headers {
            line.push_str(&format!(" -H '{h}'"));
        }
        line.push_str(&format!(" --max-time 10 {url}"));
        let out = self.shell(&line).await;
        assert!(out.status.success(), "{line}: {}", describe(&out));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{line}: not JSON ({e}): {}", describe(&out)))
    }

    /// The sum of the stats matching `filter` of the sidecar of pod `198.18.N.<host>`.
    async fn stat(&self, host: u8, filter: &str) -> u64 {
        let admin = SocketAddr::from((Ipv4Addr::new(198, 18, self.octet, host), 15000));
        let r = http::get(admin, "/stats").await.expect("sidecar /stats");
        r.text()
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(name, _)| name.contains(filter))
            .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
            .sum()
    }

    /// The pids in the state directory's pid files.
    fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir(&self.state).expect("state directory") {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "pid") {
                let text = std::fs::read_to_string(&path).unwrap();
                pids.push(text.trim().parse().expect("a pid"));
            }
        }
        pids
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_logs(&self.state);
        }
        if !self.down {
            let out = std::process::Command::new("bash")
                .args(["scripts/captured-demo.sh", "down"])
                .current_dir(repo())
                .envs(self.env())
                .output();
            if let Ok(out) = out {
                if !out.status.success() {
                    eprintln!("captured-demo.sh down: {}", describe(&out));
                }
            }
        }
    }
}

fn print_logs(state: &Path) {
    let Ok(entries) = std::fs::read_dir(state) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(100).collect();
            eprintln!("----- {}", path.display());
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn sh(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        describe(&out)
    );
    stdout(&out)
}
