//! Tasks tied to their owner's lifetime: a neutral home, used by the Kubernetes source's
//! watches and by the ownership follower alike.

use tokio::task::JoinHandle;

/// A spawned task, aborted when dropped (a stopped watch stops at once).
#[derive(Debug)]
pub struct TaskGuard(JoinHandle<()>);

impl TaskGuard {
    /// Guards a spawned task.
    pub fn new(handle: JoinHandle<()>) -> Self {
        TaskGuard(handle)
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
