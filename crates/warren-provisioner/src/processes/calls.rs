//! Every call on a process, wherever its runtime runs (issue 32).
//!
//! A process lives on the node that owns its runtime (issue 14). A call that reaches
//! another replica goes to the owner over the [`PeerLink`](crate::PeerLink): the unary
//! calls as one [`ProcessCall`], the output as a follow stream, stdin as a streamed body.
//! The owner serves them with the same code as its own clients' calls
//! ([`Provisioner::process_call_as_owner`], [`Provisioner::follow_process_as_owner`],
//! [`Provisioner::write_stdin_as_owner`]), never forwarding again. Nothing of a process is
//! held on a replica that does not own it, so reattaching through any replica reads the
//! owner's one log and loses nothing still kept there.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::TerminalSize;
use warren_core::SandboxId;

use super::{OutputEvent, OutputRead, ProcessInfo, StartProcess};
use crate::exec::{Route, NOT_OWNER_CODE};
use crate::ownership::Placement;
use crate::{FencePermit, FenceToken, PeerNode, Provisioner, ProvisionerError};

/// Longest a read waits for output to come.
pub const MAX_OUTPUT_WAIT: Duration = Duration::from_secs(60);

/// A call on a sandbox's processes, as a replica forwards it to the runtime's owner.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum ProcessCall {
    /// Start one; the caller's execution guard token is checked by the owner.
    Start {
        /// What to start.
        input: StartProcess,
        /// The caller's execution guard token.
        fence: Option<i64>,
    },
    /// List them.
    List,
    /// Describe one.
    Info {
        /// Its pid.
        pid: i32,
    },
    /// Describe the newest one with a tag.
    ByTag {
        /// The tag.
        tag: String,
    },
    /// Read its output from an offset, waiting up to `wait_ms` for some.
    Read {
        /// Its pid.
        pid: i32,
        /// The offset.
        from: u64,
        /// How long to wait when nothing is there yet.
        wait_ms: u64,
    },
    /// Signal it or its group.
    Signal {
        /// Its pid.
        pid: i32,
        /// The signal number.
        signal: i32,
        /// To its process group.
        group: bool,
    },
    /// Resize its terminal.
    Resize {
        /// Its pid.
        pid: i32,
        /// The new size.
        size: TerminalSize,
    },
    /// Close its stdin.
    CloseStdin {
        /// Its pid.
        pid: i32,
    },
    /// Kill its tree and wait for its end.
    Kill {
        /// Its pid.
        pid: i32,
    },
}

/// What the owner answered to a [`ProcessCall`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "answer", content = "value", rename_all = "snake_case")]
pub enum ProcessAnswer {
    /// One process.
    Process(ProcessInfo),
    /// The sandbox's processes.
    Processes(Vec<ProcessInfo>),
    /// Output read.
    Read(ProcessRead),
    /// Done; nothing to say.
    Done,
}

/// A read of a process's output, with what the process is after it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessRead {
    /// What was read.
    pub read: OutputRead,
    /// The process, after the read.
    pub process: ProcessInfo,
}

impl Provisioner {
    /// Starts a long-running process in the sandbox's runtime, starting the runtime if it
    /// is not running (I12): here, or at the node that owns the runtime. The start is the
    /// acceptance point of the execution guard (I33), as for an exec.
    pub async fn start_process(
        &self,
        id: &SandboxId,
        input: StartProcess,
        permit: FencePermit,
    ) -> Result<ProcessInfo, ProvisionerError> {
        self.start_process_routed(id, input, permit, Route::ToOwner)
            .await
    }

    /// The sandbox's processes: running ones and those that ended recently, by pid.
    pub async fn list_processes(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<ProcessInfo>, ProvisionerError> {
        match self.call_process(id, ProcessCall::List).await? {
            ProcessAnswer::Processes(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// One process of the sandbox.
    pub async fn process_info(
        &self,
        id: &SandboxId,
        pid: i32,
    ) -> Result<ProcessInfo, ProvisionerError> {
        self.call_process(id, ProcessCall::Info { pid })
            .await
            .and_then(into_process)
    }

    /// The newest process of the sandbox with this tag, running ones first.
    pub async fn process_by_tag(
        &self,
        id: &SandboxId,
        tag: &str,
    ) -> Result<ProcessInfo, ProvisionerError> {
        let tag = tag.to_owned();
        self.call_process(id, ProcessCall::ByTag { tag })
            .await
            .and_then(into_process)
    }

    /// The process's output from offset `from`, as much as one read hands out; when there
    /// is none yet, waits up to `wait` (at most [`MAX_OUTPUT_WAIT`]) for some or for the
    /// end.
    pub async fn read_process_output(
        &self,
        id: &SandboxId,
        pid: i32,
        from: u64,
        wait: Duration,
    ) -> Result<ProcessRead, ProvisionerError> {
        let wait_ms = u64::try_from(wait.min(MAX_OUTPUT_WAIT).as_millis()).unwrap_or(0);
        match self
            .call_process(id, ProcessCall::Read { pid, from, wait_ms })
            .await?
        {
            ProcessAnswer::Read(read) => Ok(read),
            other => Err(unexpected(&other)),
        }
    }

    /// Follows the process's output from offset `from`: what is kept from there, then what
    /// comes, until it ended and its output is complete ([`OutputEvent::End`]). Dropping
    /// the stream stops following; the process runs on. Followed at the owner, the stream
    /// ends early, without `End`, when the owner cannot be reached any more: the reader
    /// resumes from its offset.
    pub async fn follow_process(
        &self,
        id: &SandboxId,
        pid: i32,
        from: u64,
    ) -> Result<BoxStream<'static, OutputEvent>, ProvisionerError> {
        self.sandbox(id).await?;
        if let Some(owner) = self.owner_elsewhere(id).await? {
            let link = self.forwarding_to(&owner, id)?;
            let followed = link.follow_process(&owner, id, pid, from).await;
            return match self.after_forward(id, followed) {
                Err(error) if is_not_owner(&error) => self.follow_held(id, pid, from),
                other => other,
            };
        }
        self.follow_held(id, pid, from)
    }

    fn follow_held(
        &self,
        id: &SandboxId,
        pid: i32,
        from: u64,
    ) -> Result<BoxStream<'static, OutputEvent>, ProvisionerError> {
        Ok(self.held_process(id, pid)?.follow(from).boxed())
    }

    /// Writes `bytes` to the process's stdin, waiting while it does not read
    /// (backpressure); with `close`, closes stdin after them.
    pub async fn write_stdin(
        &self,
        id: &SandboxId,
        pid: i32,
        bytes: &[u8],
        close: bool,
    ) -> Result<u64, ProvisionerError> {
        if close && bytes.is_empty() {
            self.call_process(id, ProcessCall::CloseStdin { pid })
                .await?;
            return Ok(0);
        }
        let chunk = futures::stream::iter([Ok::<_, std::io::Error>(bytes.to_vec())]);
        self.write_stdin_stream(id, pid, chunk, close).await
    }

    /// Writes a stream of chunks to the process's stdin, in order and with no other
    /// writer's bytes between them, each waiting while the process does not read
    /// (backpressure: a client streaming a large body is slowed to the process's pace);
    /// with `close`, closes stdin once the stream ended. Returns the bytes written. The
    /// provisioner token is refused in stdin (I13), also split across chunks: nothing of a
    /// chunk that would complete it is written.
    pub async fn write_stdin_stream<B, E>(
        &self,
        id: &SandboxId,
        pid: i32,
        chunks: impl futures::Stream<Item = Result<B, E>> + Send + 'static,
        close: bool,
    ) -> Result<u64, ProvisionerError>
    where
        B: AsRef<[u8]> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        self.sandbox(id).await?;
        if let Some(owner) = self.owner_elsewhere(id).await? {
            let link = self.forwarding_to(&owner, id)?;
            let chunks = chunks
                .map(|chunk| match chunk {
                    Ok(bytes) => Ok(bytes.as_ref().to_vec()),
                    Err(error) => Err(std::io::Error::other(error.to_string())),
                })
                .boxed();
            let written = link.write_stdin(&owner, id, pid, chunks, close).await;
            // The body went to the owner: nothing is left to write here, whatever it said.
            return self.after_forward(id, written).map_err(|error| {
                if is_not_owner(&error) {
                    ProvisionerError::ProcessNotFound {
                        sandbox: id.clone(),
                        pid,
                    }
                } else {
                    error
                }
            });
        }
        let process = self.held_process(id, pid)?;
        self.write_held_stdin(&process, chunks, close).await
    }

    /// Sends a signal to the process, or to its process group.
    pub async fn signal_process(
        &self,
        id: &SandboxId,
        pid: i32,
        signal: i32,
        group: bool,
    ) -> Result<(), ProvisionerError> {
        self.call_process(id, ProcessCall::Signal { pid, signal, group })
            .await
            .map(drop)
    }

    /// Kills the process's whole tree, background processes included (I24), and waits
    /// until it ended.
    pub async fn kill_process(
        &self,
        id: &SandboxId,
        pid: i32,
    ) -> Result<ProcessInfo, ProvisionerError> {
        self.call_process(id, ProcessCall::Kill { pid })
            .await
            .and_then(into_process)
    }

    /// Sets the size of the process's terminal; the process sees `SIGWINCH`.
    pub async fn resize_process(
        &self,
        id: &SandboxId,
        pid: i32,
        size: TerminalSize,
    ) -> Result<(), ProvisionerError> {
        self.call_process(id, ProcessCall::Resize { pid, size })
            .await
            .map(drop)
    }

    /// Serves a call another replica forwarded here, for a runtime this node owns; never
    /// forwarded again: answers [`ProvisionerError::NotOwnerHere`] when this node does not
    /// own the runtime (any more), so the sender asks the store again.
    pub async fn process_call_as_owner(
        &self,
        id: &SandboxId,
        call: ProcessCall,
    ) -> Result<ProcessAnswer, ProvisionerError> {
        if let ProcessCall::Start { input, fence } = call {
            let token = fence.map(FenceToken::new).transpose()?;
            let permit = self.fence(id, token).await?;
            let started = self
                .start_process_routed(id, input, permit, Route::HereOnly)
                .await?;
            return Ok(ProcessAnswer::Process(started));
        }
        self.refuse_unless_owner(id)?;
        self.call_held(id, call).await
    }

    /// Follows a process this node holds, for a replica that forwarded the call; see
    /// [`Provisioner::follow_process`].
    pub fn follow_process_as_owner(
        &self,
        id: &SandboxId,
        pid: i32,
        from: u64,
    ) -> Result<BoxStream<'static, OutputEvent>, ProvisionerError> {
        self.refuse_unless_owner(id)?;
        self.follow_held(id, pid, from)
    }

    /// Writes to the stdin of a process this node holds, for a replica that forwarded the
    /// call; see [`Provisioner::write_stdin_stream`].
    pub async fn write_stdin_as_owner<B, E>(
        &self,
        id: &SandboxId,
        pid: i32,
        chunks: impl futures::Stream<Item = Result<B, E>>,
        close: bool,
    ) -> Result<u64, ProvisionerError>
    where
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        self.refuse_unless_owner(id)?;
        let process = self.held_process(id, pid)?;
        self.write_held_stdin(&process, chunks, close).await
    }

    /// A call by a client of this replica: at the owner when another node owns the
    /// runtime, else here.
    async fn call_process(
        &self,
        id: &SandboxId,
        call: ProcessCall,
    ) -> Result<ProcessAnswer, ProvisionerError> {
        self.sandbox(id).await?;
        let Some(owner) = self.owner_elsewhere(id).await? else {
            return self.call_held(id, call).await;
        };
        let link = self.forwarding_to(&owner, id)?;
        let answer = link.process_call(&owner, id, call.clone()).await;
        match self.after_forward(id, answer) {
            // The owner gave the runtime up meanwhile, and its processes ended with it:
            // whatever this node still holds of the sandbox answers.
            Err(error) if is_not_owner(&error) => self.call_held(id, call).await,
            other => other,
        }
    }

    /// A call on the processes this node holds.
    async fn call_held(
        &self,
        id: &SandboxId,
        call: ProcessCall,
    ) -> Result<ProcessAnswer, ProvisionerError> {
        let held = |pid| self.held_process(id, pid);
        Ok(match call {
            ProcessCall::Start { .. } => {
                return Err(ProvisionerError::BadRequest(
                    "a start is placed, not called on held processes",
                ))
            }
            ProcessCall::List => ProcessAnswer::Processes(self.held_processes(id)),
            ProcessCall::Info { pid } => ProcessAnswer::Process(held(pid)?.info()),
            ProcessCall::ByTag { tag } => {
                ProcessAnswer::Process(self.held_process_by_tag(id, &tag)?)
            }
            ProcessCall::Read { pid, from, wait_ms } => {
                let process = held(pid)?;
                let wait = Duration::from_millis(wait_ms).min(MAX_OUTPUT_WAIT);
                let read = process.read_waiting(from, wait).await;
                ProcessAnswer::Read(ProcessRead {
                    read,
                    process: process.info(),
                })
            }
            ProcessCall::Signal { pid, signal, group } => {
                held(pid)?.signal(signal, group).await?;
                ProcessAnswer::Done
            }
            ProcessCall::Resize { pid, size } => {
                held(pid)?.resize(size).await?;
                ProcessAnswer::Done
            }
            ProcessCall::CloseStdin { pid } => {
                let process = held(pid)?;
                process.closing_stdin();
                let nothing = futures::stream::empty::<Result<&[u8], std::io::Error>>();
                self.write_held_stdin(&process, nothing, true).await?;
                ProcessAnswer::Done
            }
            ProcessCall::Kill { pid } => ProcessAnswer::Process(held(pid)?.kill().await),
        })
    }

    /// The live node that owns the sandbox's runtime, when that is another one. Unlike a
    /// command's placement this claims nothing: a runtime nobody owns runs no process.
    async fn owner_elsewhere(&self, id: &SandboxId) -> Result<Option<PeerNode>, ProvisionerError> {
        if !self.is_clustered() || self.owner_fence(id).is_some() {
            return Ok(None);
        }
        if let Some(owner) = self.remembered_owner(id) {
            return Ok(Some(owner));
        }
        let Some(node_id) = self.store.runtime_owner(id).await?.and_then(|o| o.node_id) else {
            return Ok(None);
        };
        if node_id == self.config.node.node_id {
            return Ok(None);
        }
        let owner = self
            .store
            .list_nodes()
            .await?
            .into_iter()
            .find(|node| node.node_id == node_id && node.state == warren_store::NodeState::Live)
            .map(|node| PeerNode {
                node_id: node.node_id,
                advertise: node.advertise,
            });
        if let Some(owner) = &owner {
            self.ownership.remember_owner(id, owner);
        }
        Ok(owner)
    }

    /// Refuses a forwarded call for a runtime this node does not own (any more).
    fn refuse_unless_owner(&self, id: &SandboxId) -> Result<(), ProvisionerError> {
        if self.owner_fence(id).is_some() {
            Ok(())
        } else {
            Err(ProvisionerError::NotOwnerHere {
                sandbox: id.clone(),
            })
        }
    }

    /// Sends a start to the node that owns the runtime. Once, when the owner answers that
    /// it no longer owns the runtime (it gave it up meanwhile), the start is placed again:
    /// here, or at the owner the store names now.
    pub(crate) async fn forward_start(
        &self,
        owner: PeerNode,
        id: &SandboxId,
        input: StartProcess,
        fence: Option<FenceToken>,
    ) -> Result<ProcessInfo, ProvisionerError> {
        let link = self.forwarding_to(&owner, id)?;
        let call = ProcessCall::Start {
            input: input.clone(),
            fence: fence.map(FenceToken::get),
        };
        match self.after_forward(id, link.process_call(&owner, id, call.clone()).await) {
            Err(error) if is_not_owner(&error) => match self.place_runtime(id).await? {
                Placement::Elsewhere(now) if now != owner => self
                    .after_forward(id, link.process_call(&now, id, call).await)
                    .and_then(into_process),
                Placement::Elsewhere(_) => Err(ProvisionerError::PeerUnreachable {
                    node: owner.node_id,
                    reason: "it does not own the runtime the store says it owns".into(),
                }),
                Placement::Here(_) => {
                    let permit = self.fence(id, fence).await?;
                    Box::pin(self.start_process_routed(id, input, permit, Route::HereOnly)).await
                }
            },
            answer => answer.and_then(into_process),
        }
    }
}

fn is_not_owner(error: &ProvisionerError) -> bool {
    matches!(error, ProvisionerError::Forwarded { code, .. } if code == NOT_OWNER_CODE)
}

fn into_process(answer: ProcessAnswer) -> Result<ProcessInfo, ProvisionerError> {
    match answer {
        ProcessAnswer::Process(info) => Ok(info),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(answer: &ProcessAnswer) -> ProvisionerError {
    ProvisionerError::PeerUnreachable {
        node: "owner".into(),
        reason: format!("it answered a process call with {answer:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_call_crosses_the_link_as_json_and_back() {
        let calls = [
            ProcessCall::List,
            ProcessCall::Read {
                pid: 7,
                from: 42,
                wait_ms: 500,
            },
            ProcessCall::Resize {
                pid: 7,
                size: TerminalSize { cols: 80, rows: 24 },
            },
            ProcessCall::Start {
                input: StartProcess {
                    program: crate::ProgramSpec::Argv(vec!["python3".into(), "-i".into()]),
                    cwd: Some("/tmp".into()),
                    env: [("A".to_owned(), "b".to_owned())].into(),
                    pty: Some(TerminalSize { cols: 10, rows: 5 }),
                    stdin: true,
                    tag: Some("repl".into()),
                    timeout: Some(Duration::from_secs(30)),
                    requested_by: "alice".into(),
                    quiet: true,
                },
                fence: Some(3),
            },
        ];
        for call in calls {
            let json = serde_json::to_string(&call).unwrap();
            assert_eq!(serde_json::from_str::<ProcessCall>(&json).unwrap(), call);
        }
    }

    #[test]
    fn output_crosses_the_link_as_base64_and_back() {
        let read = OutputRead {
            lost: Some((0, 3)),
            pieces: vec![super::super::OutputPiece {
                stream: warren_backend::OutputStream::Stdout,
                offset: 3,
                bytes: vec![0, 255, b'\n'],
            }],
            next: 6,
        };
        let json = serde_json::to_string(&read).unwrap();
        assert!(json.contains("\"AP8K\""), "{json}");
        assert_eq!(serde_json::from_str::<OutputRead>(&json).unwrap(), read);
    }
}
