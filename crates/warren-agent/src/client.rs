//! The provisioner's side of the control protocol (`control`): connecting to a runtime's
//! socket without following links, asking who it is, and starting a process over it (a
//! command run to completion is one, followed by warren-backend's `run_to_completion`).
//!
//! Shared by every backend whose runtimes speak the protocol: the local runtime's init and
//! the agent inside a Docker container.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_backend::{
    Control, ProcessControl, ProcessExit, ProcessHandle, ProcessRequest, ProcessStart,
    ResourceUsage,
};

use crate::protocol::{self, ExecSpec, PtySize, Reply, Request};

/// How long a runtime may take to say it started a command.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The socket's name in a runtime's socket directory.
pub const SOCKET_NAME: &str = "control.sock";

/// Opens the socket `name` in `dir` as an `O_PATH` descriptor, refusing anything that is
/// not a socket (a symlink planted by whoever can write `dir`, a FIFO, a file).
///
/// A Docker agent's socket directory is writable from inside its container; a symlink
/// there named like the socket must never make the provisioner connect to a host socket
/// (the Docker socket, say). Connecting through `/proc/self/fd/N` of this descriptor
/// reaches exactly the inode that was checked.
fn open_socket(dir: &Path, name: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{FileType, Mode, OFlags};
    let dir = rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::PATH,
        Mode::empty(),
    )?;
    let socket = rustix::fs::openat(
        &dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&socket)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("{name} is not a socket"),
        ));
    }
    Ok(socket)
}

fn descriptor_path(fd: &OwnedFd) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Connects to the runtime socket in `dir` (see [`open_socket`]), blocking.
pub fn connect(dir: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let socket = open_socket(dir, SOCKET_NAME)?;
    std::os::unix::net::UnixStream::connect(descriptor_path(&socket))
}

/// Connects to the runtime socket in `dir` (see [`open_socket`]).
pub async fn connect_async(dir: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let socket = open_socket(dir, SOCKET_NAME)?;
    tokio::net::UnixStream::connect(descriptor_path(&socket)).await
}

/// What a runtime of `layout` is asked to run for a process: its argv and cwd, the
/// complete environment ([`command_environment`]), and a terminal when the request asks
/// for one.
pub fn process_spec(
    request: &ProcessRequest,
    layout: &warren_core::Layout,
    network: &warren_core::NetworkPolicy,
    runtime_env: &std::collections::BTreeMap<String, String>,
) -> ExecSpec {
    ExecSpec {
        argv: request.argv.clone(),
        cwd: request.cwd.clone(),
        env: command_environment(layout, network, runtime_env, &request.env),
        pty: request.pty.map(|size| PtySize {
            cols: size.cols,
            rows: size.rows,
        }),
    }
}

/// The complete environment of a command: the clean base (naming the layout's user and
/// home), the proxy variables when the runtime has egress, the runtime's environment, then
/// the call's own (each layer wins over the ones before, I14).
fn command_environment(
    layout: &warren_core::Layout,
    network: &warren_core::NetworkPolicy,
    runtime_env: &std::collections::BTreeMap<String, String>,
    call_env: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let mut env = crate::environment::base_environment(layout);
    if network.has_egress() {
        env.extend(proxy_environment());
    }
    env.extend(runtime_env.clone());
    env.extend(call_env.clone());
    env
}

/// What tells programs inside a runtime with egress to use its proxy port.
fn proxy_environment() -> Vec<(String, String)> {
    proxy_environment_at(&format!(
        "http://127.0.0.1:{}",
        crate::environment::PROXY_PORT
    ))
}

/// What tells programs to use the proxy at `proxy` (a URL): where the runtime's egress goes
/// through warren's proxy over the network (a pod) rather than through its own loopback.
pub fn proxy_environment_at(proxy: &str) -> Vec<(String, String)> {
    let proxy = proxy.to_owned();
    let mut env = Vec::new();
    for name in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
    ] {
        env.push((name.to_owned(), proxy.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    }
    env
}

/// Asks the runtime in `dir` who it is; None when nothing answers.
pub fn ping(dir: &Path) -> Option<(String, i64)> {
    ping_full(dir).map(|(sandbox, generation, _)| (sandbox, generation))
}

/// Asks the runtime who it is and how many processes it runs besides init.
pub fn ping_full(dir: &Path) -> Option<(String, i64, u64)> {
    ask_pong(dir, &Request::Ping)
}

/// Asks the runtime who it is and how many processes it runs besides init and the trees
/// of `quiet` ([`Request::Activity`]); an agent that does not know that request is asked
/// [`Request::Ping`], which counts every process.
pub fn activity(dir: &Path, quiet: &[i32]) -> Option<(String, i64, u64)> {
    if quiet.is_empty() {
        return ping_full(dir);
    }
    let quiet = quiet.to_vec();
    ask_pong(dir, &Request::Activity { quiet }).or_else(|| ping_full(dir))
}

fn ask_pong(dir: &Path, request: &Request) -> Option<(String, i64, u64)> {
    let stream = connect(dir).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    protocol::send_frame(stream.as_fd(), request, &[]).ok()?;
    match protocol::recv_frame::<Reply>(stream.as_fd()).ok()?? {
        (
            Reply::Pong {
                sandbox,
                generation,
                processes,
            },
            _,
        ) => Some((sandbox, generation, processes)),
        _ => None,
    }
}

/// Asks the runtime to kill every process but its own machinery ([`Request::KillAll`]) and
/// waits until they are gone; returns how many were killed. Blocks: call it off the async
/// threads.
pub fn kill_all(dir: &Path) -> Result<u64, RunError> {
    let stream = connect(dir).map_err(|error| match error.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
            RunError::Gone(error)
        }
        _ => RunError::Io(error),
    })?;
    // Each cgroup kill and the /proc sweep are bounded (10 s each); a runtime that says
    // nothing for longer than that is wedged.
    stream.set_read_timeout(Some(KILL_ALL_TIMEOUT))?;
    protocol::send_frame(stream.as_fd(), &Request::KillAll, &[])?;
    match protocol::recv_frame::<Reply>(stream.as_fd())? {
        Some((Reply::KilledAll { processes }, _)) => Ok(processes),
        Some((other, _)) => {
            Err(std::io::Error::other(format!("unexpected reply {other:?}")).into())
        }
        None => Err(RunError::Gone(std::io::Error::from(
            std::io::ErrorKind::UnexpectedEof,
        ))),
    }
}

/// Receives the runtime's home (a runtime snapshot's `/home/gem`, I30) into `into`, an
/// empty directory of warren's, at most `limit` bytes of file data, through a pipe the
/// agent writes a tar stream into ([`Request::ArchiveHome`]). For runtimes whose home the
/// host cannot reach by descriptor (gVisor, issue 19). The stream comes from inside the
/// sandbox: it is unpacked only by descriptor ([`crate::home::restore`]: no entry lands
/// outside `into` or goes through a link). Blocks: call it off the async threads.
pub fn archive_home(dir: &Path, into: &Path, limit: u64) -> Result<crate::home::Moved, RunError> {
    let target = crate::home::open_dir(into)?;
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let stream = request_with_pipe(dir, &Request::ArchiveHome { limit }, write)?;
    let unpacked = crate::home::restore(target.as_fd(), std::fs::File::from(read), limit);
    let reply = home_reply(&stream, "archive")?;
    unpacked?;
    Ok(reply)
}

/// Sends the directory `from` (warren's own: a restored snapshot's home) into the
/// runtime's home before its first command, at most `limit` bytes of file data, through a
/// pipe ([`Request::RestoreHome`]). Blocks: call it off the async threads.
pub fn restore_home(dir: &Path, from: &Path, limit: u64) -> Result<crate::home::Moved, RunError> {
    let source = crate::home::open_dir(from)?;
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let stream = request_with_pipe(dir, &Request::RestoreHome { limit }, read)?;
    let packed = crate::home::archive(source.as_fd(), std::fs::File::from(write), limit);
    let reply = home_reply(&stream, "restore")?;
    let packed = packed?;
    Ok(crate::home::Moved {
        skipped: reply.skipped + packed.skipped,
        ..reply
    })
}

/// Sends a request with its one pipe end (a home move, a file operation); the agent's
/// copy is the only one left after this.
fn request_with_pipe(
    dir: &Path,
    request: &Request,
    pipe: OwnedFd,
) -> Result<std::os::unix::net::UnixStream, RunError> {
    let stream = connect(dir).map_err(|error| match error.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
            RunError::Gone(error)
        }
        _ => RunError::Io(error),
    })?;
    protocol::send_frame(stream.as_fd(), request, &[pipe.as_fd()])?;
    drop(pipe);
    Ok(stream)
}

/// The agent's count of a home move, or why it refused.
fn home_reply(
    stream: &std::os::unix::net::UnixStream,
    what: &str,
) -> Result<crate::home::Moved, RunError> {
    stream.set_read_timeout(Some(HOME_MOVE_TIMEOUT))?;
    match protocol::recv_frame::<Reply>(stream.as_fd())? {
        Some((
            Reply::Moved {
                entries,
                bytes,
                skipped,
            },
            _,
        )) => Ok(crate::home::Moved {
            entries,
            bytes,
            skipped,
        }),
        Some((Reply::Refused { reason }, _)) => Err(std::io::Error::other(format!(
            "the agent could not {what} the home: {reason}"
        ))
        .into()),
        Some((other, _)) => {
            Err(std::io::Error::other(format!("unexpected reply {other:?}")).into())
        }
        None => Err(RunError::Gone(std::io::Error::from(
            std::io::ErrorKind::UnexpectedEof,
        ))),
    }
}

/// Runs one file operation inside the runtime ([`Request::File`]), `data` being what a
/// write sends; the answer, and a read's bytes. Blocks: call it off the async threads
/// ([`runtime_file`]).
pub fn file(
    dir: &Path,
    op: &warren_backend::FileOp,
    data: &[u8],
) -> Result<warren_backend::FileReply, RunError> {
    use std::io::{Read, Write};
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (theirs, ours) = if op.sends_data() {
        (read, write)
    } else {
        (write, read)
    };
    let stream = request_with_pipe(dir, &Request::File(op.clone()), theirs)?;
    stream.set_read_timeout(Some(FILE_TIMEOUT))?;
    let mut ours = std::fs::File::from(ours);
    if op.sends_data() {
        // A refusal stops the agent reading: its answer tells why, not the broken pipe.
        match ours.write_all(data) {
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
        drop(ours);
        return file_reply(&stream).map(|answer| warren_backend::FileReply {
            answer,
            data: Vec::new(),
        });
    }
    let answer = file_reply(&stream)?;
    let mut bytes = Vec::new();
    if let Ok(warren_backend::FileAnswer::Read { length, .. }) = &answer {
        ours.take(length.saturating_add(1))
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 != *length {
            return Err(std::io::Error::other(format!(
                "the runtime sent {} bytes of a read of {length}",
                bytes.len()
            ))
            .into());
        }
    }
    Ok(warren_backend::FileReply {
        answer,
        data: bytes,
    })
}

fn file_reply(
    stream: &std::os::unix::net::UnixStream,
) -> Result<Result<warren_backend::FileAnswer, warren_backend::FileFailure>, RunError> {
    match protocol::recv_frame::<Reply>(stream.as_fd())? {
        Some((Reply::File { answer }, _)) => Ok(answer),
        Some((Reply::Refused { reason }, _)) => Err(std::io::Error::other(format!(
            "the agent could not serve the file operation: {reason}"
        ))
        .into()),
        Some((other, _)) => {
            Err(std::io::Error::other(format!("unexpected reply {other:?}")).into())
        }
        // The runtime answered the connection, so it is there: the process serving the
        // operation ended without a word (killed with every other process, say), or an
        // agent older than file operations closed on a request it does not know.
        None => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the runtime ended the file operation without an answer (a runtime started \
             by a warren without runtime files gets them at its next start)",
        )
        .into()),
    }
}

/// [`file`] for a backend, off the async threads: [`warren_backend::BackendError::RuntimeNotFound`]
/// when no runtime answers.
pub async fn runtime_file(
    dir: std::path::PathBuf,
    sandbox: &warren_core::SandboxId,
    op: &warren_backend::FileOp,
    data: Vec<u8>,
) -> Result<warren_backend::FileReply, warren_backend::BackendError> {
    let op = op.clone();
    tokio::task::spawn_blocking(move || file(&dir, &op, &data))
        .await
        .map_err(|e| RunError::Io(std::io::Error::other(e)))
        .and_then(|done| done)
        .map_err(|error| error.into_backend(sandbox))
}

/// How long a file operation may take inside the runtime once its bytes are sent.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a home move waits for the agent's count once the stream has ended.
const HOME_MOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`kill_all`] waits for the runtime's answer.
const KILL_ALL_TIMEOUT: Duration = Duration::from_secs(60);

/// [`kill_all`] for a backend, off the async threads: how many processes were killed, or
/// `None` when the runtime is gone (nothing of it runs any more), the other failures as
/// the backend's.
pub async fn kill_all_processes(
    dir: std::path::PathBuf,
    sandbox: &warren_core::SandboxId,
) -> Result<Option<u64>, warren_backend::BackendError> {
    let failed = |source| warren_backend::BackendError::Kill {
        sandbox: sandbox.clone(),
        source,
    };
    match tokio::task::spawn_blocking(move || kill_all(&dir))
        .await
        .map_err(|e| failed(std::io::Error::other(e)))?
    {
        Ok(processes) => Ok(Some(processes)),
        Err(RunError::Gone(_)) => Ok(None),
        Err(RunError::Io(source)) => Err(failed(source)),
    }
}

/// `<boot id>:<start time in clock ticks>` of a live process: unique across reboots and
/// pid reuse.
pub fn process_birth(pid: i32) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); the command name (field 2) may hold spaces, so count from ')'.
    let after_name = stat.rsplit_once(')')?.1;
    let start = after_name.split_whitespace().nth(19)?;
    Some(format!("{}:{start}", boot.trim()))
}

/// Why a command could not be run: no runtime answering, or a failure while talking to it.
/// The crate's one error type.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No runtime is there any more: no socket, not a socket, or nobody listening (init or
    /// the agent died). The caller forgets it, so the next use starts a fresh one.
    #[error("the runtime is gone")]
    Gone(#[source] std::io::Error),
    /// Talking to the runtime failed.
    #[error("talking to the runtime failed")]
    Io(#[source] std::io::Error),
}

impl RunError {
    /// Whether no runtime answers any more: its backend forgets it, so the next use starts
    /// a fresh one.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone(_))
    }

    /// The backend's error for a command or process in `sandbox` that failed so.
    pub fn into_backend(self, sandbox: &warren_core::SandboxId) -> warren_backend::BackendError {
        match self {
            Self::Gone(_) => warren_backend::BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            },
            Self::Io(source) => warren_backend::BackendError::Exec {
                sandbox: sandbox.clone(),
                source,
            },
        }
    }
}

impl From<std::io::Error> for RunError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl From<rustix::io::Errno> for RunError {
    fn from(error: rustix::io::Errno) -> Self {
        Self::Io(error.into())
    }
}

/// The runtime's first answer to an exec (`Started` or `Failed`), which comes as soon as
/// it forked: a runtime that does not give it within [`START_TIMEOUT`] is wedged (or not a
/// runtime at all) and must not hold the caller forever.
pub(crate) async fn within_start<T>(
    reading: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(START_TIMEOUT, reading)
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the runtime did not start the command",
            )
        })?
}

/// A command handed to a runtime: the control connection it was asked on, and the
/// provisioner's ends of its three pipes.
struct Launched {
    control: tokio::net::UnixStream,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Connects to the runtime socket in `dir` and asks it to run `spec` with three fresh
/// pipes; the runtime's first answer is still to be read.
async fn launch(dir: &Path, spec: ExecSpec) -> Result<Launched, RunError> {
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let stream = connect_async(dir)
        .await
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
                RunError::Gone(error)
            }
            _ => RunError::Io(error),
        })?
        .into_std()?;
    // The request (argv and environment, up to 4 MiB) goes out with a blocking send, off
    // the async threads: a busy init must not stall the whole API.
    let stream = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        stream.set_nonblocking(false)?;
        protocol::send_frame(
            stream.as_fd(),
            &Request::Exec(spec),
            &[
                stdin_read.as_fd(),
                stdout_write.as_fd(),
                stderr_write.as_fd(),
            ],
        )?;
        drop((stdin_read, stdout_write, stderr_write));
        stream.set_nonblocking(true)?;
        Ok(stream)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(Launched {
        control: tokio::net::UnixStream::from_std(stream)?,
        stdin: stdin_write,
        stdout: stdout_read,
        stderr: stderr_read,
    })
}

/// Starts a long-running process through the runtime socket in `dir` and hands it over
/// ([`ProcessHandle`]): its pipes become the handle's streams, and one task owns the
/// control connection, passing signals, resizes and kills to the runtime and reading the
/// process's `Exited`. Once the handle's controls and its exit are all dropped, the task
/// drops the connection and the runtime kills the process's tree (I24).
pub async fn start_process(
    dir: &Path,
    spec: ExecSpec,
    sandbox: &warren_core::SandboxId,
) -> Result<ProcessStart, RunError> {
    let pty = spec.pty.is_some();
    let Launched {
        mut control,
        stdin,
        stdout,
        stderr,
    } = launch(dir, spec).await?;
    let first = within_start(read_reply(&mut control)).await?;
    let pid = match first {
        Reply::Started { pid, .. } => pid,
        Reply::Failed { stage, errno } => return Ok(ProcessStart::Failed { stage, errno }),
        other => return Err(std::io::Error::other(format!("unexpected reply {other:?}")).into()),
    };
    let (handle_control, requests) = ProcessControl::channel();
    let (exit_sender, exit) = tokio::sync::oneshot::channel();
    tokio::spawn(follow_process(control, requests, exit_sender));
    let failed = {
        let sandbox = sandbox.clone();
        move |source: std::io::Error| warren_backend::BackendError::Exec { sandbox, source }
    };
    let stderr = if pty {
        // On a terminal everything comes through the terminal: the third pipe carries
        // nothing, and the runtime closed its end at once.
        None
    } else {
        Some(
            Box::pin(tokio::net::unix::pipe::Receiver::from_owned_fd(stderr)?)
                as warren_backend::ProcessOutput,
        )
    };
    Ok(ProcessStart::Started(ProcessHandle {
        pid,
        stdin: Box::pin(tokio::net::unix::pipe::Sender::from_owned_fd(stdin)?),
        stdout: Box::pin(tokio::net::unix::pipe::Receiver::from_owned_fd(stdout)?),
        stderr,
        control: handle_control,
        exit: Box::pin(async move {
            match exit.await {
                Ok(result) => result.map_err(failed),
                Err(_) => Err(failed(std::io::Error::other(
                    "the process's connection task ended without an answer",
                ))),
            }
        }),
    }))
}

/// Owns one process's control connection: passes requests on, answers each applied one
/// ([`Reply::Applied`], in order), and reads its `Exited`.
async fn follow_process(
    control: tokio::net::UnixStream,
    mut requests: tokio::sync::mpsc::Receiver<Control>,
    mut exit: tokio::sync::oneshot::Sender<std::io::Result<ProcessExit>>,
) {
    let (reader, mut writer) = control.into_split();
    // One read at a time, pinned outside the loop and replaced only once it finished: a
    // frame half read when a request arrives must not be lost.
    let mut reading = Box::pin(read_owned(reader));
    let mut pending = AppliedQueue::default();
    let mut controls = true;
    let ended = loop {
        tokio::select! {
            (reader, reply) = &mut reading => match reply {
                Ok(Reply::Applied) => {
                    pending.applied();
                    reading = Box::pin(read_owned(reader));
                }
                Ok(Reply::Exited { exit_code, signal, user_us, system_us, max_rss_kib }) => {
                    break Some(Ok(ProcessExit {
                        exit_code,
                        signal,
                        usage: ResourceUsage {
                            cpu_user_ms: Some(user_us / 1000),
                            cpu_system_ms: Some(system_us / 1000),
                            peak_memory_bytes: Some(max_rss_kib * 1024),
                        },
                    }))
                }
                Ok(other) => break Some(Err(std::io::Error::other(format!("unexpected reply {other:?}")))),
                Err(error) => break Some(Err(error)),
            },
            request = requests.recv(), if controls => match request {
                Some(Control { signal, applied }) => {
                    let request = Request::control(signal);
                    // A runtime that stopped reading has ended the process: its `Exited`
                    // (or the connection's end) comes through `reading`.
                    if send_request(&mut writer, &request).await.is_ok() {
                        pending.sent(&request, applied);
                    }
                }
                None => controls = false,
            },
            () = exit.closed(), if !controls => break None,
        }
    };
    // Dropping the connection here, with nobody left holding the process, kills its tree.
    if let Some(ended) = ended {
        let _ = exit.send(ended);
    }
}

/// One reply read from `reader`, handed back with it.
async fn read_owned(
    mut reader: tokio::net::unix::OwnedReadHalf,
) -> (tokio::net::unix::OwnedReadHalf, std::io::Result<Reply>) {
    let reply = read_reply(&mut reader).await;
    (reader, reply)
}

/// The controls sent on one exec connection that the agent will answer `Applied`, in the
/// order sent, each with whoever waits for it.
#[derive(Default)]
pub(crate) struct AppliedQueue(
    std::collections::VecDeque<Option<tokio::sync::oneshot::Sender<()>>>,
);

impl AppliedQueue {
    /// `request` went out; the agent answers it unless it is `Kill` (answered by `Exited`).
    pub(crate) fn sent(
        &mut self,
        request: &Request,
        applied: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        if !matches!(request, Request::Kill) {
            self.0.push_back(applied);
        }
    }

    /// The oldest control was applied: its waiter, if any, is told.
    pub(crate) fn applied(&mut self) {
        if let Some(Some(waiter)) = self.0.pop_front() {
            let _ = waiter.send(());
        }
    }
}

async fn read_reply<R: tokio::io::AsyncRead + Unpin>(control: &mut R) -> std::io::Result<Reply> {
    let mut header = [0u8; 4];
    control.read_exact(&mut header).await?;
    let len = u32::from_le_bytes(header) as usize;
    if len > protocol::MAX_FRAME {
        return Err(std::io::Error::other("oversized reply"));
    }
    let mut body = vec![0u8; len];
    control.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

async fn send_request<W: tokio::io::AsyncWrite + Unpin>(
    control: &mut W,
    request: &Request,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    control.write_all(&frame).await
}
