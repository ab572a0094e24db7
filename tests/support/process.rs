//! A child process owned by a test: output captured to a log file in the process's own
//! temporary directory, killed on drop, and its log printed when the test fails.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// How many trailing log lines a failed test prints per process.
const TAIL_LINES: usize = 400;

/// A running child process (see the module docs).
pub struct Process {
    name: String,
    child: Child,
    log_path: PathBuf,
    // Dropped after the child is killed (fields drop in declaration order).
    dir: TempDir,
}

impl Process {
    /// Spawns `cmd` with stdin closed and stdout and stderr appended to `<dir>/<name>.log`.
    /// `dir` is the process's working area (config, data); it is deleted on drop.
    ///
    /// Panics, naming `hint`, when the program cannot be started (typically: not installed).
    pub fn spawn(name: &str, cmd: Command, dir: TempDir, hint: &str) -> Process {
        match Process::try_spawn(name, cmd, dir) {
            Ok(process) => process,
            Err(e) => panic!("{e:#}; {hint}"),
        }
    }

    /// Like [`Process::spawn`], but returns an error (naming the program) instead of
    /// panicking, for callers that report failures themselves (the benchmark).
    pub fn try_spawn(name: &str, mut cmd: Command, dir: TempDir) -> anyhow::Result<Process> {
        use anyhow::Context;
        let log_path = dir.path().join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating the log file {}", log_path.display()))?;
        let log2 = log.try_clone().context("cloning the log file handle")?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name} ({cmd:?})"))?;
        Ok(Process {
            name: name.to_string(),
            child,
            log_path,
            dir,
        })
    }

    /// The name used in log prefixes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process's temporary working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The OS process id, while running.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Panics with the log when the process has exited (for startup loops).
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited early with {status}; its log:\n{}",
                self.name,
                self.log_tail()
            );
        }
    }

    /// Kills the process (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        // An already-exited child makes kill fail; that is the goal anyway.
        let _ = self.child.kill().await;
    }

    /// Asks the process to stop (SIGTERM, as Kubernetes does) and waits up to `grace` for
    /// it to exit; kills it (SIGKILL) if it has not by then. Returns whether it exited on
    /// its own.
    pub async fn terminate(&mut self, grace: std::time::Duration) -> bool {
        let Some(pid) = self.child.id() else {
            return true; // exited already
        };
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .is_ok_and(|s| s.success());
        if sent && tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
            return true;
        }
        self.kill().await;
        false
    }

    /// Sends `signal` (a `kill` signal name, e.g. `STOP`) to the process.
    pub async fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the process is running");
        let status = tokio::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .await
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Freezes the process (SIGSTOP): it runs no code until [`Process::resume`].
    pub async fn pause(&self) {
        self.signal("STOP").await;
    }

    /// Lets a paused process run again (SIGCONT).
    pub async fn resume(&self) {
        self.signal("CONT").await;
    }

    /// Everything the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last lines of the log, each prefixed with the process name.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let skip = lines.len().saturating_sub(TAIL_LINES);
        let mut out = String::new();
        if skip > 0 {
            out.push_str(&format!("[{}] ... {skip} earlier lines\n", self.name));
        }
        for line in &lines[skip..] {
            out.push_str(&format!("[{}] {line}\n", self.name));
        }
        out
    }
}

/// Whether logs are printed even for passing tests.
fn always_print_logs() -> bool {
    std::env::var_os("SHOAL_TEST_LOGS").is_some_and(|v| v != "0")
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() || always_print_logs() {
            eprintln!("----- {} log -----\n{}", self.name, self.log_tail());
        }
    }
}
