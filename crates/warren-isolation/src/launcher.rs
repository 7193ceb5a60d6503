//! The launchers of kernel-tier runtimes: `warren __runtime-init` processes started ahead
//! of need, each blocked reading its configuration on stdin (moved out of `backend.rs`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use crate::runtime::RUNTIME_INIT_ARG;

/// A started `warren __runtime-init`, blocked reading its configuration on stdin.
///
/// The process itself belongs to a task that waits for it, so it is reaped the moment it
/// exits, whether it launched a runtime, failed, or was retired (its stdin closed) while
/// it waited: a launcher never lingers as a zombie child of the server.
pub(crate) struct Launcher {
    pub(crate) stdin: tokio::process::ChildStdin,
    pub(crate) stdout: tokio::process::ChildStdout,
    /// Resolves once the launcher exited and was reaped.
    pub(crate) exited: tokio::task::JoinHandle<()>,
}

/// Starts `warren __runtime-init`, which then waits for its configuration on stdin.
pub(crate) fn spawn_launcher(program: &Path) -> std::io::Result<Launcher> {
    let mut child = tokio::process::Command::new(program)
        // argv[0] is what /proc shows; never the host path of warren's executable (I1).
        .arg0("warren-runtime-init")
        .arg(RUNTIME_INIT_ARG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(std::io::Error::other("the launcher's stdio is not piped"));
    };
    let exited = tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(Launcher {
        stdin,
        stdout,
        exited,
    })
}

/// A few launchers started ahead of need, each blocked reading its configuration.
///
/// Executing warren's binary and starting its runtime costs ~3 ms, a third of creating a
/// runtime; a waiting launcher takes that off the request's path. They hold nothing but a
/// pipe, and they are there only while runtimes are: the oldest is used first (none waits
/// for ever, or outlives an upgrade of the binary by long), and when the last runtime is
/// destroyed the waiting ones are retired (their stdin closes, they exit and are reaped),
/// so an idle server keeps no launcher. When warren exits their stdin closes too.
pub(crate) struct LauncherPool {
    program: PathBuf,
    ready: std::sync::Arc<Mutex<std::collections::VecDeque<Launcher>>>,
}

impl LauncherPool {
    const SIZE: usize = 2;

    pub(crate) fn new(program: PathBuf) -> Self {
        Self {
            program,
            ready: std::sync::Arc::new(Mutex::new(std::collections::VecDeque::new())),
        }
    }

    /// The oldest waiting launcher (or a fresh one when none waits); the pool refills
    /// behind.
    pub(crate) fn take(&self) -> std::io::Result<Launcher> {
        let taken = self
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let ready = self.ready.clone();
        let program = self.program.clone();
        tokio::spawn(async move {
            loop {
                if ready.lock().unwrap_or_else(|e| e.into_inner()).len() >= Self::SIZE {
                    return;
                }
                match spawn_launcher(&program) {
                    Ok(launcher) => ready
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(launcher),
                    Err(error) => {
                        tracing::warn!(%error, "cannot start a runtime launcher ahead of need");
                        return;
                    }
                }
            }
        });
        match taken {
            Some(launcher) => Ok(launcher),
            None => spawn_launcher(&self.program),
        }
    }

    /// Retires every waiting launcher: each sees its stdin close, exits, and is reaped.
    pub(crate) fn retire_all(&self) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
