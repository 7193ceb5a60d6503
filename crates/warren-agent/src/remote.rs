//! The provisioner's side of an agent reached over TCP (a pod): the same operations as
//! [`crate::client`] on a Unix socket (who are you, kill everything, run one command with
//! its output streamed and capped and its tree killed on timeout or when the client goes
//! away), over the authenticated, sealed transport of [`crate::wire`].

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use warren_backend::{OutputStream, ResourceUsage};

use crate::client::{within_start, RunError};
use crate::protocol::{ExecSpec, Reply, Request};
use crate::wire::{self, AgentKey, Kind, Opener, Sealer};

/// How long connecting and the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `KillAll` may take (the server bounds each of its steps).
const KILL_ALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One runtime's agent on the network.
#[derive(Debug, Clone)]
pub struct RemoteAgent {
    /// Where its gateway listens.
    pub address: SocketAddr,
    /// Its key.
    pub key: AgentKey,
}

/// An authenticated connection.
struct Session {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    sealer: Sealer,
    opener: Opener,
}

impl Session {
    async fn send(&mut self, kind: Kind, payload: &[u8]) -> std::io::Result<()> {
        let frame = self.sealer.seal(kind, payload)?;
        self.writer.write_all(&frame).await
    }

    async fn request(&mut self, request: &Request) -> std::io::Result<()> {
        let body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        self.send(Kind::Request, &body).await
    }

    async fn reply(&mut self) -> std::io::Result<Reply> {
        match wire::read_frame_async(&mut self.reader, &mut self.opener).await? {
            Some((Kind::Reply, body)) => {
                serde_json::from_slice(&body).map_err(std::io::Error::other)
            }
            Some((kind, _)) => Err(std::io::Error::other(format!(
                "expected a reply, got {kind:?}"
            ))),
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

impl RemoteAgent {
    async fn connect(&self) -> Result<Session, RunError> {
        let connecting = async {
            let mut stream = TcpStream::connect(self.address).await.map_err(|error| {
                match error.kind() {
                    // Nothing listens (the agent died) or nothing is there (the pod is gone).
                    std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable => RunError::Gone(error),
                    _ => RunError::Io(error),
                }
            })?;
            stream.set_nodelay(true).map_err(RunError::Io)?;
            let (sealer, opener) = wire::connect(&mut stream, &self.key)
                .await
                .map_err(RunError::Io)?;
            let (reader, writer) = stream.into_split();
            Ok(Session {
                reader,
                writer,
                sealer,
                opener,
            })
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| {
                RunError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the agent at {} did not answer", self.address),
                ))
            })?
    }

    /// Who the runtime is and how many processes it runs besides its own; None when
    /// nothing (or not this sandbox's agent) answers.
    pub async fn ping(&self) -> Option<(String, i64, u64)> {
        self.ask_pong(&Request::Ping).await
    }

    /// Who the runtime is and how many processes it runs besides its own and the trees of
    /// `quiet` ([`Request::Activity`]); an agent that does not know that request is asked
    /// [`Request::Ping`], which counts every process.
    pub async fn activity(&self, quiet: &[i32]) -> Option<(String, i64, u64)> {
        if quiet.is_empty() {
            return self.ping().await;
        }
        let quiet = quiet.to_vec();
        match self.ask_pong(&Request::Activity { quiet }).await {
            Some(answer) => Some(answer),
            None => self.ping().await,
        }
    }

    async fn ask_pong(&self, request: &Request) -> Option<(String, i64, u64)> {
        let asking = async {
            let mut session = self.connect().await.ok()?;
            session.request(request).await.ok()?;
            match session.reply().await.ok()? {
                Reply::Pong {
                    sandbox,
                    generation,
                    processes,
                } => Some((sandbox, generation, processes)),
                _ => None,
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, asking)
            .await
            .ok()
            .flatten()
    }

    /// Kills every process of the runtime but its own machinery; how many were killed.
    pub async fn kill_all(&self) -> Result<u64, RunError> {
        let mut session = self.connect().await?;
        session.request(&Request::KillAll).await?;
        let reply = tokio::time::timeout(KILL_ALL_TIMEOUT, session.reply())
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "kill-all"))??;
        match reply {
            Reply::KilledAll { processes } => Ok(processes),
            other => Err(std::io::Error::other(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// Receives the runtime's home (a runtime snapshot's `/home/gem`, I30) into `into`, an
    /// empty directory of warren's, at most `limit` bytes of file data. The stream comes
    /// from inside the sandbox: it is unpacked only by descriptor ([`crate::home::restore`]:
    /// no entry lands outside `into` or goes through a link).
    pub async fn archive_home(
        &self,
        into: std::path::PathBuf,
        limit: u64,
    ) -> Result<crate::home::Moved, RunError> {
        let mut session = self.connect().await?;
        session.request(&Request::ArchiveHome { limit }).await?;
        let (data, received) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
        let unpacking = tokio::task::spawn_blocking(move || {
            let dir = crate::home::open_dir(&into)?;
            let reader = ChannelReader {
                received,
                pending: Vec::new(),
                at: 0,
            };
            crate::home::restore(std::os::fd::AsFd::as_fd(&dir), reader, limit)
        });
        let mut data = Some(data);
        let failed = loop {
            match wire::read_frame_async(&mut session.reader, &mut session.opener).await? {
                Some((Kind::Data, bytes)) => {
                    let gone = match &data {
                        Some(data) => data.send(bytes).await.is_err(),
                        None => false,
                    };
                    // The unpacking stopped (its error is the answer): read on to the end.
                    if gone {
                        data = None;
                    }
                }
                Some((Kind::DataEnd, _)) => break None,
                Some((Kind::Reply, body)) => break Some(body),
                other => return Err(std::io::Error::other(format!("unexpected {other:?}")).into()),
            }
        };
        drop(data);
        let unpacked = unpacking.await.map_err(std::io::Error::other)?;
        let reply = match failed {
            Some(body) => serde_json::from_slice(&body).map_err(std::io::Error::other)?,
            None => session.reply().await?,
        };
        match (reply, unpacked) {
            // The agent's count: what it sent, and what it left out.
            (
                Reply::Moved {
                    entries,
                    bytes,
                    skipped,
                },
                Ok(_),
            ) => Ok(crate::home::Moved {
                entries,
                bytes,
                skipped,
            }),
            (Reply::Refused { reason }, _) => Err(std::io::Error::other(format!(
                "the agent could not archive the home: {reason}"
            ))
            .into()),
            (_, Err(error)) => Err(error.into()),
            (other, _) => Err(std::io::Error::other(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// Sends the directory `from` (warren's own: a restored snapshot's home) into the
    /// runtime's home before its first command, at most `limit` bytes of file data.
    pub async fn restore_home(
        &self,
        from: std::path::PathBuf,
        limit: u64,
    ) -> Result<crate::home::Moved, RunError> {
        let mut session = self.connect().await?;
        session.request(&Request::RestoreHome { limit }).await?;
        let (data, mut received) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
        let packing = tokio::task::spawn_blocking(move || {
            let dir = crate::home::open_dir(&from)?;
            let writer = ChannelWriter {
                data,
                buffer: Vec::with_capacity(wire::DATA_CHUNK),
            };
            crate::home::archive(std::os::fd::AsFd::as_fd(&dir), writer, limit)
        });
        while let Some(chunk) = received.recv().await {
            session.send(Kind::Data, &chunk).await?;
        }
        let packed = packing.await.map_err(std::io::Error::other)?;
        session.send(Kind::DataEnd, &[]).await?;
        let packed = packed?;
        match session.reply().await? {
            // The agent's count: what it restored.
            Reply::Moved {
                entries,
                bytes,
                skipped,
            } => Ok(crate::home::Moved {
                entries,
                bytes,
                skipped: skipped + packed.skipped,
            }),
            Reply::Refused { reason } => Err(std::io::Error::other(format!(
                "the agent could not restore the home: {reason}"
            ))
            .into()),
            other => Err(std::io::Error::other(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// Runs one file operation inside the runtime ([`Request::File`]), `data` being what
    /// a write sends (as data frames); the answer, and a read's bytes (data frames after
    /// it).
    pub async fn file(
        &self,
        op: &warren_backend::FileOp,
        data: &[u8],
    ) -> Result<warren_backend::FileReply, RunError> {
        let mut session = self.connect().await?;
        session.request(&Request::File(op.clone())).await?;
        if op.sends_data() {
            for chunk in data.chunks(wire::DATA_CHUNK) {
                session.send(Kind::Data, chunk).await?;
            }
            session.send(Kind::DataEnd, &[]).await?;
        }
        let answer = match session.reply().await? {
            Reply::File { answer } => answer,
            Reply::Refused { reason } => {
                return Err(std::io::Error::other(format!(
                    "the agent could not serve the file operation: {reason}"
                ))
                .into())
            }
            other => {
                return Err(std::io::Error::other(format!("unexpected reply {other:?}")).into())
            }
        };
        let mut bytes = Vec::new();
        if let Ok(warren_backend::FileAnswer::Read { length, .. }) = &answer {
            loop {
                match wire::read_frame_async(&mut session.reader, &mut session.opener).await? {
                    Some((Kind::Data, chunk)) if (bytes.len() + chunk.len()) as u64 <= *length => {
                        bytes.extend_from_slice(&chunk)
                    }
                    Some((Kind::DataEnd, _)) if bytes.len() as u64 == *length => break,
                    other => {
                        return Err(std::io::Error::other(format!(
                            "a read of {length} bytes ended with {} and {:?}",
                            bytes.len(),
                            other.map(|(kind, _)| kind)
                        ))
                        .into())
                    }
                }
            }
        }
        Ok(warren_backend::FileReply {
            answer,
            data: bytes,
        })
    }

    /// Starts a long-running process and hands it over ([`warren_backend::ProcessHandle`]),
    /// as [`crate::client::start_process`] does on a Unix socket: stdin goes over as
    /// frames as the handle's writer fills it, output frames fill the handle's readers (a
    /// reader that does not read stops the frames, and so the agent), controls go as
    /// requests. Once the handle's controls and its exit are all dropped the connection
    /// closes, and the agent kills the process's tree (I24).
    pub async fn start_process(
        &self,
        spec: ExecSpec,
        sandbox: &warren_core::SandboxId,
    ) -> Result<warren_backend::ProcessStart, RunError> {
        use warren_backend::{ProcessControl, ProcessHandle, ProcessStart};
        let pty = spec.pty.is_some();
        let Session {
            mut reader,
            writer,
            sealer,
            mut opener,
        } = self.connect().await?;
        let mut outbound = Outbound { writer, sealer };
        let exec = serde_json::to_vec(&Request::Exec(spec)).map_err(std::io::Error::other)?;
        outbound.send(Kind::Request, &exec).await?;
        let first = within_start(read(&mut reader, &mut opener)).await?;
        let (pid, window) = match first {
            Frame::Reply(Reply::Started { pid, stdin_window }) => (pid, stdin_window),
            Frame::Reply(Reply::Failed { stage, errno }) => {
                return Ok(ProcessStart::Failed { stage, errno })
            }
            other => {
                return Err(std::io::Error::other(format!("unexpected frame {other:?}")).into())
            }
        };
        let (stdin_read, stdin_write) = tokio::io::simplex(wire::DATA_CHUNK);
        let (stdout_read, stdout_write) = tokio::io::simplex(wire::DATA_CHUNK);
        let (stderr_read, stderr_write) = tokio::io::simplex(wire::DATA_CHUNK);
        let (control, requests) = ProcessControl::channel();
        let (exit_sender, exit) = tokio::sync::oneshot::channel();
        let (ended_sender, ended) = tokio::sync::oneshot::channel::<()>();
        let (alive, held) = tokio::sync::oneshot::channel::<()>();
        // An agent that acknowledges stdin frames gets no more than its window unacknowledged;
        // one that does not (an older agent) gets them as they come.
        let credit = window.map(|w| std::sync::Arc::new(tokio::sync::Semaphore::new(w as usize)));
        // The controls sent and not yet applied: the outbound side adds, the inbound side
        // answers them as the agent's `Applied` frames come.
        let pending = Pending::default();
        tokio::spawn(inbound(
            reader,
            opener,
            stdout_write,
            stderr_write,
            exit_sender,
            ended_sender,
            credit.clone(),
            pending.clone(),
        ));
        tokio::spawn(outbound_process(
            outbound, stdin_read, requests, ended, held, credit, pending,
        ));
        let failed = {
            let sandbox = sandbox.clone();
            move |source: std::io::Error| warren_backend::BackendError::Exec { sandbox, source }
        };
        Ok(ProcessStart::Started(ProcessHandle {
            pid,
            stdin: Box::pin(stdin_write),
            stdout: Box::pin(stdout_read),
            stderr: (!pty).then(|| Box::pin(stderr_read) as warren_backend::ProcessOutput),
            control,
            exit: Box::pin(async move {
                // Held while anyone waits for the end: see `outbound_process`.
                let _alive = alive;
                match exit.await {
                    Ok(result) => result.map_err(failed),
                    Err(_) => Err(failed(std::io::Error::other(
                        "the process's connection task ended without an answer",
                    ))),
                }
            }),
        }))
    }
}

/// The controls of one process sent and not yet applied, shared by its two halves.
type Pending = std::sync::Arc<std::sync::Mutex<crate::client::AppliedQueue>>;

fn lock(pending: &Pending) -> std::sync::MutexGuard<'_, crate::client::AppliedQueue> {
    pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads one process's frames: output into the handle's readers, each applied control's
/// answer, then its `Exited`.
#[allow(clippy::too_many_arguments)]
async fn inbound(
    mut reader: OwnedReadHalf,
    mut opener: Opener,
    mut stdout: tokio::io::WriteHalf<tokio::io::SimplexStream>,
    mut stderr: tokio::io::WriteHalf<tokio::io::SimplexStream>,
    exit: tokio::sync::oneshot::Sender<std::io::Result<warren_backend::ProcessExit>>,
    ended: tokio::sync::oneshot::Sender<()>,
    credit: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    pending: Pending,
) {
    let result = loop {
        match read_any(&mut reader, &mut opener).await {
            Ok(Frame::Reply(Reply::Applied)) => lock(&pending).applied(),
            Ok(Frame::StdinAck) => {
                if let Some(credit) = &credit {
                    credit.add_permits(1);
                }
            }
            // A reader that went away takes no more; the frames are still read to the end.
            Ok(Frame::Output(OutputStream::Stdout, bytes)) => {
                let _ = stdout.write_all(&bytes).await;
            }
            Ok(Frame::Output(_, bytes)) => {
                let _ = stderr.write_all(&bytes).await;
            }
            Ok(Frame::Reply(Reply::Exited {
                exit_code,
                signal,
                user_us,
                system_us,
                max_rss_kib,
            })) => {
                break Ok(warren_backend::ProcessExit {
                    exit_code,
                    signal,
                    usage: ResourceUsage {
                        cpu_user_ms: Some(user_us / 1000),
                        cpu_system_ms: Some(system_us / 1000),
                        peak_memory_bytes: Some(max_rss_kib * 1024),
                    },
                })
            }
            Ok(Frame::Reply(other)) => {
                break Err(std::io::Error::other(format!("unexpected reply {other:?}")))
            }
            Err(error) => break Err(error),
        }
    };
    // Readers see the end of the output now: a simplex stream's reader reaches its end
    // only when the writer shuts it down, never when the writer is merely dropped (the
    // caller would wait out its output grace after every command).
    let _ = stdout.shutdown().await;
    let _ = stderr.shutdown().await;
    drop((stdout, stderr));
    let _ = ended.send(());
    let _ = exit.send(result);
}

/// Sends one process's stdin and controls until it ended, or until nobody holds it any
/// more (its controls and its exit all dropped): then the connection closes and the agent
/// kills its tree.
async fn outbound_process(
    mut outbound: Outbound,
    mut stdin: tokio::io::ReadHalf<tokio::io::SimplexStream>,
    mut requests: tokio::sync::mpsc::Receiver<warren_backend::Control>,
    mut ended: tokio::sync::oneshot::Receiver<()>,
    mut held: tokio::sync::oneshot::Receiver<()>,
    credit: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    pending: Pending,
) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; wire::DATA_CHUNK];
    let (mut stdin_open, mut controls, mut waited_for) = (true, true, true);
    // Whether the next stdin frame may go: always without a window, else once a credit
    // was taken (and given up for it when the frame goes).
    let mut may_send = credit.is_none();
    loop {
        let taking = async {
            match &credit {
                Some(credit) if !may_send && stdin_open => {
                    credit.acquire().await.map(|permit| permit.forget()).is_ok()
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut ended => return,
            taken = taking => may_send = taken,
            read = stdin.read(&mut buffer), if stdin_open && may_send => match read {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    if outbound.send(Kind::StdinEnd, &[]).await.is_err() {
                        return;
                    }
                }
                Ok(n) => {
                    may_send = credit.is_none();
                    if outbound.send(Kind::Stdin, &buffer[..n]).await.is_err() {
                        return;
                    }
                }
            },
            request = requests.recv(), if controls => match request {
                Some(warren_backend::Control { signal, applied }) => {
                    let request = Request::control(signal);
                    let Ok(body) = serde_json::to_vec(&request) else { continue };
                    // Queued before it goes: its answer may come back before `send` returns.
                    lock(&pending).sent(&request, applied);
                    let _ = outbound.send(Kind::Request, &body).await;
                }
                None => controls = false,
            },
            _ = &mut held, if waited_for => waited_for = false,
            else => return,
        }
        if !controls && !waited_for {
            // Nobody holds the process: closing the connection kills its tree (I24).
            return;
        }
    }
}

/// The writing half of an exec's connection.
struct Outbound {
    writer: OwnedWriteHalf,
    sealer: Sealer,
}

impl Outbound {
    async fn send(&mut self, kind: Kind, payload: &[u8]) -> std::io::Result<()> {
        let frame = self.sealer.seal(kind, payload)?;
        self.writer.write_all(&frame).await
    }
}

/// One frame of an exec, as read.
#[derive(Debug)]
enum Frame {
    Reply(Reply),
    Output(OutputStream, Vec<u8>),
    /// The agent wrote one stdin frame into the command's stdin.
    StdinAck,
}

async fn read(reader: &mut OwnedReadHalf, opener: &mut Opener) -> std::io::Result<Frame> {
    loop {
        let frame = read_any(reader, opener).await?;
        // An exec's stdin goes whole before its output is read: its acknowledgements tell
        // it nothing.
        if !matches!(frame, Frame::StdinAck) {
            return Ok(frame);
        }
    }
}

async fn read_any(reader: &mut OwnedReadHalf, opener: &mut Opener) -> std::io::Result<Frame> {
    match wire::read_frame_async(reader, opener).await? {
        Some((Kind::StdinAck, _)) => Ok(Frame::StdinAck),
        Some((Kind::Reply, body)) => serde_json::from_slice(&body)
            .map(Frame::Reply)
            .map_err(std::io::Error::other),
        Some((Kind::Stdout, bytes)) => Ok(Frame::Output(OutputStream::Stdout, bytes)),
        Some((Kind::Stderr, bytes)) => Ok(Frame::Output(OutputStream::Stderr, bytes)),
        Some((kind, _)) => Err(std::io::Error::other(format!(
            "unexpected {kind:?} from the agent"
        ))),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the agent closed the connection before the command ended",
        )),
    }
}

/// The blocking side of a tar stream arriving in chunks.
struct ChannelReader {
    received: tokio::sync::mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    at: usize,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.pending.len() {
            match self.received.blocking_recv() {
                Some(bytes) => {
                    self.pending = bytes;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The blocking side of a tar stream leaving in chunks of at most a frame's data.
struct ChannelWriter {
    data: tokio::sync::mpsc::Sender<Vec<u8>>,
    buffer: Vec<u8>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = wire::DATA_CHUNK - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == wire::DATA_CHUNK {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(wire::DATA_CHUNK));
        self.data
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use tokio::io::AsyncReadExt as _;

    /// Serves one connection as an agent would: the handshake, then `frames`.
    fn agent(key: wire::AgentKey, frames: Vec<(Kind, Vec<u8>)>) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let (mut sealer, _opener) = wire::accept(&mut stream, &key).unwrap();
            for (kind, payload) in frames {
                stream
                    .write_all(&sealer.seal(kind, &payload).unwrap())
                    .unwrap();
            }
            // The connection stays open, as the gateway's does until warren closes it.
            std::thread::sleep(Duration::from_secs(30));
        });
        address
    }

    #[tokio::test]
    async fn the_output_ends_as_the_exit_arrives_while_the_connection_stays_open() {
        let key = wire::AgentKey::from_bytes([7; 32]);
        let exited = serde_json::to_vec(&Reply::Exited {
            exit_code: Some(0),
            signal: None,
            user_us: 0,
            system_us: 0,
            max_rss_kib: 0,
        })
        .unwrap();
        let address = agent(
            wire::AgentKey::from_bytes([7; 32]),
            vec![(Kind::Stdout, b"hi\n".to_vec()), (Kind::Reply, exited)],
        );
        let mut stream = TcpStream::connect(address).await.unwrap();
        let (_sealer, opener) = wire::connect(&mut stream, &key).await.unwrap();
        let (reader, _writer) = stream.into_split();
        let (mut stdout, stdout_write) = tokio::io::simplex(wire::DATA_CHUNK);
        let (mut stderr, stderr_write) = tokio::io::simplex(wire::DATA_CHUNK);
        let (exit_sender, exit) = tokio::sync::oneshot::channel();
        let (ended_sender, _ended) = tokio::sync::oneshot::channel();
        tokio::spawn(inbound(
            reader,
            opener,
            stdout_write,
            stderr_write,
            exit_sender,
            ended_sender,
            None,
            Pending::default(),
        ));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let read = async {
            stdout.read_to_end(&mut out).await.unwrap();
            stderr.read_to_end(&mut err).await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the output ends with the exit, not with the connection");
        assert_eq!((out.as_slice(), err.as_slice()), (&b"hi\n"[..], &b""[..]));
        assert_eq!(exit.await.unwrap().unwrap().exit_code, Some(0));
    }
}
