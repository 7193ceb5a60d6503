//! The agent's TCP gateway: the process in a pod that warren reaches over the network.
//!
//! The server ([`crate::server`]) never starts a thread (it forks commands), so the network
//! side lives in a process of its own, forked from the agent before anything else runs:
//!
//! ```text
//! warren ══TCP (authenticated, sealed: wire)══▶ gateway ──socketpair──▶ server ─fork▶ command
//!                                               │  pipes: stdin, stdout, stderr ▲
//!                                               └───────────────────────────────┘
//! ```
//!
//! For each connection the gateway runs the handshake ([`crate::wire::accept`]), then
//! makes a socketpair, hands one end to the server over their channel (the server treats
//! it exactly like a connection to its Unix socket) and speaks the Unix protocol on the
//! other: an exec gets three pipes it relays to and from sealed frames. When warren's
//! connection ends, the gateway closes the server's end, and the server kills the
//! command's tree (I24), as on a Unix socket.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once, and an unauthenticated one
//! gets [`HANDSHAKE_TIMEOUT`] to prove itself.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::{self, Handoff, Reply, Request};
use crate::wire::{self, AgentKey, Kind, Opener, Sealer};

/// Most connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a new connection may take to authenticate.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long output is still relayed after the command exited, for pipes held open by
/// background processes it started (those keep running, I6); the Unix client's grace.
const OUTPUT_GRACE: Duration = Duration::from_millis(150);
/// How long `KillAll` may take (the server bounds each of its steps).
const KILL_ALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server may take to say it started a command (warren's own bound).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Stdin frames warren may have on their way to one command before an acknowledgement:
/// with frames of at most 64 KiB, a megabyte.
const STDIN_WINDOW: u32 = 16;

/// Threads started with the gateway that serve a connection no new thread can be made for:
/// a fork bomb takes every pid the runtime's pids limit allows, and the connection that
/// would kill it (`KillAll`) must still be served.
pub const RESERVE_WORKERS: usize = 2;

/// Serves `listener` until the channel to the server fails; never returns.
pub fn serve(listener: TcpListener, key: AgentKey, channel: OwnedFd) -> ! {
    let channel = Arc::new(Mutex::new(channel));
    let open = Arc::new(AtomicUsize::new(0));
    let key = Arc::new(key);
    // A rendezvous channel: a connection goes to a reserve worker only if one is idle.
    let (reserve, idle) = std::sync::mpsc::sync_channel::<TcpStream>(0);
    let idle = Arc::new(Mutex::new(idle));
    for _ in 0..RESERVE_WORKERS {
        let (idle, channel, counted, key) =
            (idle.clone(), channel.clone(), open.clone(), key.clone());
        let _ = std::thread::Builder::new()
            .name("agent-reserve".into())
            .spawn(move || loop {
                let next = idle.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(stream) = next else { return };
                serve_connection(stream, &key, &channel, &counted);
            });
    }
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            // Out of descriptors or memory for a moment: no busy loop meanwhile.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        // The stream is handed over through a slot, so that it is still here when no
        // thread can be made.
        let slot = Arc::new(Mutex::new(Some(stream)));
        let (taken, channel_of, counted, key_of) =
            (slot.clone(), channel.clone(), open.clone(), key.clone());
        let spawned = std::thread::Builder::new()
            .name("agent-connection".into())
            .spawn(move || {
                let stream = taken.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(stream) = stream {
                    serve_connection(stream, &key_of, &channel_of, &counted);
                }
            });
        if spawned.is_err() {
            // No thread (the pids limit): an idle reserve worker serves it, or it is
            // dropped and its slot is free.
            let stream = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(stream) = stream {
                if reserve.try_send(stream).is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }
}

/// Serves one connection, then frees its slot; the agent exits when the server is gone.
fn serve_connection(
    stream: TcpStream,
    key: &AgentKey,
    channel: &Mutex<OwnedFd>,
    counted: &AtomicUsize,
) {
    if let Err(error) = connection(stream, key, channel) {
        if error.kind() == io::ErrorKind::BrokenPipe && channel_gone(channel) {
            eprintln!("warren-agent: the server is gone");
            crate::sys::exit_immediately(1);
        }
    }
    counted.fetch_sub(1, Ordering::SeqCst);
}

/// Whether the server's end of the channel is closed.
fn channel_gone(channel: &Mutex<OwnedFd>) -> bool {
    let channel = channel.lock().unwrap_or_else(|e| e.into_inner());
    let mut fds = [rustix::event::PollFd::new(
        &*channel,
        rustix::event::PollFlags::empty(),
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|_| {
        fds[0]
            .revents()
            .intersects(rustix::event::PollFlags::HUP | rustix::event::PollFlags::ERR)
    })
}

/// One connection: authenticate, read the request, relay it.
fn connection(mut stream: TcpStream, key: &AgentKey, channel: &Mutex<OwnedFd>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The handshake and the request together get HANDSHAKE_TIMEOUT, however slowly a peer
    // trickles its bytes; then the connection may idle as long as its command runs.
    let mut bounded = Deadline {
        stream: &stream,
        deadline: Instant::now() + HANDSHAKE_TIMEOUT,
    };
    let (mut sealer, mut opener) = wire::accept(&mut bounded, key)?;
    let Some((kind, payload)) = wire::read_frame(&mut bounded, &mut opener)? else {
        return Ok(());
    };
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    if kind != Kind::Request {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "expected a request",
        ));
    }
    let request: Request = serde_json::from_slice(&payload)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    match request {
        Request::Ping | Request::Activity { .. } | Request::KillAll => {
            let server = hand_over(channel)?;
            let timeout = if request == Request::KillAll {
                KILL_ALL_TIMEOUT
            } else {
                HANDSHAKE_TIMEOUT
            };
            rustix::net::sockopt::set_socket_timeout(
                &server,
                rustix::net::sockopt::Timeout::Recv,
                Some(timeout),
            )?;
            protocol::send_frame(server.as_fd(), &request, &[])?;
            let reply = match protocol::recv_frame::<Reply>(server.as_fd())? {
                Some((reply, _)) => reply,
                None => return Err(io::ErrorKind::UnexpectedEof.into()),
            };
            send_reply(&mut stream, &mut sealer, &reply)
        }
        Request::Exec(spec) => exec(stream, sealer, opener, channel, spec),
        Request::ArchiveHome { limit } => {
            let home = home_fd()?;
            let archived = {
                let mut frames = DataWriter::new(&mut stream, &mut sealer);
                let archived = crate::home::archive(home.as_fd(), &mut frames, limit);
                frames.finish().and(archived)
            };
            send_reply(&mut stream, &mut sealer, &moved_or_refused(archived))
        }
        Request::RestoreHome { limit } => {
            let home = home_fd()?;
            let restored = {
                let mut frames = DataReader::new(&mut stream, &mut opener);
                let restored = crate::home::restore(home.as_fd(), &mut frames, limit);
                // What the archive did not read (tar's trailing blocks) is drained first,
                // so the reply comes after the last data frame.
                frames.drain().and(restored)
            };
            send_reply(&mut stream, &mut sealer, &moved_or_refused(restored))
        }
        Request::File(op) => file(stream, sealer, opener, &op),
        Request::Kill
        | Request::Signal { .. }
        | Request::Resize(_)
        | Request::KillStartedAfter { .. }
        | Request::Egress
        | Request::Relay { .. } => send_reply(
            &mut stream,
            &mut sealer,
            &Reply::Refused {
                reason:
                    "not served over TCP: a pod's egress goes to warren's proxy, and kill, \
                         signal, resize and kill_started_after are only valid on an exec connection"
                        .into(),
            },
        ),
    }
}

/// One file operation ([`crate::files`]), served here: the gateway is the pod's agent, the
/// sandbox user already (a pod runs as 1000:1000), in the pod's own root. A write's bytes
/// come as data frames after the request; a read's go as data frames after the answer,
/// ended by a data-end frame.
fn file(
    mut stream: TcpStream,
    mut sealer: Sealer,
    mut opener: Opener,
    op: &warren_backend::FileOp,
) -> io::Result<()> {
    use crate::environment::{SANDBOX_GID, SANDBOX_UID};
    if rustix::process::geteuid().as_raw() != SANDBOX_UID
        || rustix::process::getegid().as_raw() != SANDBOX_GID
    {
        let reason = "this runtime's gateway is not the sandbox user: it serves no files".into();
        return send_reply(&mut stream, &mut sealer, &Reply::Refused { reason });
    }
    let (answer, data) = if op.sends_data() {
        let mut frames = DataReader::new(&mut stream, &mut opener);
        let served = crate::files::serve(op, &mut frames);
        // What the operation did not read (a refused write) is drained first, so the
        // answer comes after the last data frame.
        frames.drain()?;
        served
    } else {
        crate::files::serve(op, io::empty())
    };
    let reading = matches!(answer, Ok(warren_backend::FileAnswer::Read { .. }));
    send_reply(&mut stream, &mut sealer, &Reply::File { answer })?;
    if reading {
        let mut frames = DataWriter::new(&mut stream, &mut sealer);
        frames.write_all(&data)?;
        frames.finish()?;
    }
    Ok(())
}

/// The runtime's home: the directory the agent opened at its start and keeps at
/// [`crate::environment::HOME_FD`] (inherited by the gateway), opened again through it, so
/// no path of the home's is resolved now.
fn home_fd() -> io::Result<OwnedFd> {
    crate::home::open_kept_home()
}

fn moved_or_refused(result: io::Result<crate::home::Moved>) -> Reply {
    match result {
        Ok(moved) => Reply::Moved {
            entries: moved.entries,
            bytes: moved.bytes,
            skipped: moved.skipped,
        },
        Err(error) => Reply::Refused {
            reason: error.to_string(),
        },
    }
}

/// Writes a tar stream as data frames of at most [`wire::DATA_CHUNK`] bytes.
struct DataWriter<'a> {
    stream: &'a mut TcpStream,
    sealer: &'a mut Sealer,
    buffer: Vec<u8>,
}

impl<'a> DataWriter<'a> {
    fn new(stream: &'a mut TcpStream, sealer: &'a mut Sealer) -> Self {
        Self {
            stream,
            sealer,
            buffer: Vec::with_capacity(wire::DATA_CHUNK),
        }
    }

    fn flush_buffer(&mut self) -> io::Result<()> {
        if !self.buffer.is_empty() {
            let frame = self.sealer.seal(Kind::Data, &self.buffer)?;
            self.stream.write_all(&frame)?;
            self.buffer.clear();
        }
        Ok(())
    }

    /// Sends what is left and the end of the stream (also after a failed archive, so the
    /// reader stops where the writer did).
    fn finish(mut self) -> io::Result<()> {
        self.flush_buffer()?;
        let frame = self.sealer.seal(Kind::DataEnd, &[])?;
        self.stream.write_all(&frame)
    }
}

impl Write for DataWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = wire::DATA_CHUNK - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == wire::DATA_CHUNK {
            self.flush_buffer()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads a tar stream from data frames until the end frame.
struct DataReader<'a> {
    stream: &'a mut TcpStream,
    opener: &'a mut Opener,
    pending: Vec<u8>,
    at: usize,
    ended: bool,
}

impl<'a> DataReader<'a> {
    fn new(stream: &'a mut TcpStream, opener: &'a mut Opener) -> Self {
        Self {
            stream,
            opener,
            pending: Vec::new(),
            at: 0,
            ended: false,
        }
    }

    fn drain(mut self) -> io::Result<()> {
        let mut sink = [0u8; 8192];
        while self.read(&mut sink)? > 0 {}
        Ok(())
    }
}

impl Read for DataReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.pending.len() {
            if self.ended {
                return Ok(0);
            }
            match wire::read_frame(self.stream, self.opener)? {
                Some((Kind::Data, bytes)) => {
                    self.pending = bytes;
                    self.at = 0;
                }
                Some((Kind::DataEnd, _)) => self.ended = true,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "expected data frames",
                    ))
                }
            }
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A stream whose reads and writes all end by one deadline.
struct Deadline<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Deadline<'_> {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer did not authenticate in time",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        (&*self.stream).read(buffer)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        (&*self.stream).write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.stream).flush()
    }
}

/// A new connection to the server: one end of a socketpair, the other handed over.
fn hand_over(channel: &Mutex<OwnedFd>) -> io::Result<OwnedFd> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let channel = channel.lock().unwrap_or_else(|e| e.into_inner());
    protocol::send_frame(channel.as_fd(), &Handoff, &[theirs.as_fd()])?;
    Ok(ours)
}

fn send_reply(stream: &mut TcpStream, sealer: &mut Sealer, reply: &Reply) -> io::Result<()> {
    let body = serde_json::to_vec(reply).map_err(io::Error::other)?;
    stream.write_all(&sealer.seal(Kind::Reply, &body)?)
}

/// What sends frames to warren, shared by the threads of one exec.
type Outbound = Arc<Mutex<(TcpStream, Sealer)>>;

fn send(outbound: &Outbound, kind: Kind, payload: &[u8]) -> io::Result<()> {
    let mut guard = outbound.lock().unwrap_or_else(|e| e.into_inner());
    let (stream, sealer) = &mut *guard;
    let frame = sealer.seal(kind, payload)?;
    stream.write_all(&frame)
}

/// Relays one command: its stdio between pipes and frames, `Kill` from warren to the
/// server, the server's replies back, and warren's departure as the connection's close.
fn exec(
    stream: TcpStream,
    sealer: Sealer,
    mut opener: Opener,
    channel: &Mutex<OwnedFd>,
    spec: protocol::ExecSpec,
) -> io::Result<()> {
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let server = Arc::new(hand_over(channel)?);
    protocol::send_frame(
        server.as_fd(),
        &Request::Exec(spec),
        &[
            stdin_read.as_fd(),
            stdout_write.as_fd(),
            stderr_write.as_fd(),
        ],
    )?;
    drop((stdin_read, stdout_write, stderr_write));
    let mut reader = stream.try_clone()?;
    let outbound: Outbound = Arc::new(Mutex::new((stream, sealer)));

    // The server answers as soon as it forked; one that does not is wedged, and this
    // thread must not wait for it for ever (warren gives up after the same time).
    rustix::net::sockopt::set_socket_timeout(
        &*server,
        rustix::net::sockopt::Timeout::Recv,
        Some(START_TIMEOUT),
    )?;
    let first = match protocol::recv_frame::<Reply>(server.as_fd())? {
        Some((reply, _)) => reply,
        None => return Err(io::ErrorKind::UnexpectedEof.into()),
    };
    rustix::net::sockopt::set_socket_timeout(&*server, rustix::net::sockopt::Timeout::Recv, None)?;
    // Warren learns how many stdin frames may be in flight: each is acknowledged once it
    // is in the pipe, so a command that reads slowly slows warren's sender, and the queue
    // below never holds more than the window.
    let first = match first {
        Reply::Started { pid, .. } => Reply::Started {
            pid,
            stdin_window: Some(STDIN_WINDOW),
        },
        other => other,
    };
    let started = matches!(first, Reply::Started { .. });
    send(
        &outbound,
        Kind::Reply,
        &serde_json::to_vec(&first).map_err(io::Error::other)?,
    )?;
    if !started {
        return Ok(());
    }

    // stdin: frames go into a queue its own thread writes to the pipe, so a command that
    // never reads its stdin cannot keep warren's `Kill` from being read.
    let (stdin_queue, stdin_items) = std::sync::mpsc::channel::<Vec<u8>>();
    // The pipe is non-blocking, so the writer also ends when the exec does: a background
    // process may hold the pipe's other end without ever reading it.
    let _ = rustix::io::ioctl_fionbio(&stdin_write, true);
    let exec_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer_done = exec_done.clone();
    let acknowledging = outbound.clone();
    let stdin_writer = std::thread::spawn(move || {
        for bytes in stdin_items {
            // Taken off the queue and on its way into the pipe: warren may send one more.
            let _ = send(&acknowledging, Kind::StdinAck, &[]);
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                match rustix::io::write(&stdin_write, rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(rustix::io::Errno::AGAIN) => {
                        if writer_done.load(Ordering::SeqCst) {
                            return;
                        }
                        let mut fds = [rustix::event::PollFd::new(
                            &stdin_write,
                            rustix::event::PollFlags::OUT,
                        )];
                        let tick = rustix::event::Timespec {
                            tv_sec: 0,
                            tv_nsec: 20_000_000,
                        };
                        let _ = rustix::event::poll(&mut fds, Some(&tick));
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    // The command closed its stdin, or ended.
                    Err(_) => return,
                }
            }
        }
    });
    let inbound_server = server.clone();
    let inbound = std::thread::spawn(move || {
        let mut stdin_queue = Some(stdin_queue);
        loop {
            match wire::read_frame(&mut reader, &mut opener) {
                Ok(Some((Kind::Stdin, bytes))) => {
                    if let Some(queue) = &stdin_queue {
                        let _ = queue.send(bytes);
                    }
                }
                Ok(Some((Kind::StdinEnd, _))) => stdin_queue = None,
                Ok(Some((Kind::Request, body))) => match serde_json::from_slice::<Request>(&body) {
                    Ok(request) if request.is_control() => {
                        let _ = protocol::send_frame(inbound_server.as_fd(), &request, &[]);
                    }
                    _ => {
                        let _ =
                            rustix::net::shutdown(&*inbound_server, rustix::net::Shutdown::Both);
                        return;
                    }
                },
                // Warren went away, or sent what it must not: the command's tree is
                // killed, as when a Unix connection closes (I24).
                _ => {
                    let _ = rustix::net::shutdown(&*inbound_server, rustix::net::Shutdown::Both);
                    return;
                }
            }
        }
    });

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relays = [(stdout_read, Kind::Stdout), (stderr_read, Kind::Stderr)].map(|(fd, kind)| {
        let (outbound, stop) = (outbound.clone(), stop.clone());
        std::thread::spawn(move || relay_output(fd, kind, &outbound, &stop))
    });

    let exited = loop {
        match protocol::recv_frame::<Reply>(server.as_fd()) {
            Ok(Some((reply @ Reply::Exited { .. }, _))) => break Some(reply),
            // A control was applied: warren waits for that before what comes next.
            Ok(Some((reply @ Reply::Applied, _))) => {
                let body = serde_json::to_vec(&reply).map_err(io::Error::other)?;
                if send(&outbound, Kind::Reply, &body).is_err() {
                    break None;
                }
            }
            Ok(Some(_)) => {}
            // Killed because warren left: nobody to tell.
            Ok(None) | Err(_) => break None,
        }
    };
    // Output written before the exit is relayed whole; pipes a background process keeps
    // open are given up after the grace.
    let grace_end = Instant::now() + OUTPUT_GRACE;
    while relays.iter().any(|relay| !relay.is_finished()) && Instant::now() < grace_end {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::SeqCst);
    for relay in relays {
        let _ = relay.join();
    }
    if let Some(exited) = exited {
        send(
            &outbound,
            Kind::Reply,
            &serde_json::to_vec(&exited).map_err(io::Error::other)?,
        )?;
    }
    // Only this side's half closes: stdin warren is still sending (a command that exited
    // before reading it all) is read to its end and dropped, so the close is a FIN, never
    // a reset that could discard the `Exited` on warren's side before it is read. Warren
    // closes once it has the `Exited`; one that does not is given up after a while.
    let guard = outbound.lock().unwrap_or_else(|e| e.into_inner());
    let _ = guard.0.shutdown(std::net::Shutdown::Write);
    let _ = guard.0.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    drop(guard);
    let _ = inbound.join();
    exec_done.store(true, Ordering::SeqCst);
    let _ = stdin_writer.join();
    Ok(())
}

/// Most bytes taken from a pipe once `stop` is set: the most a pipe holds by default.
const DRAIN_LIMIT: usize = 1 << 20;

/// Relays one output pipe to warren until it ends, or until `stop` (then what is already
/// in the pipe, up to [`DRAIN_LIMIT`], still goes).
fn relay_output(
    fd: OwnedFd,
    kind: Kind,
    outbound: &Outbound,
    stop: &std::sync::atomic::AtomicBool,
) {
    let _ = rustix::io::ioctl_fionbio(&fd, true);
    let mut pipe = std::fs::File::from(fd);
    let mut buffer = vec![0u8; wire::DATA_CHUNK];
    let mut drained = 0;
    loop {
        match pipe.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                if stop.load(Ordering::SeqCst) {
                    drained += n;
                }
                if send(outbound, kind, &buffer[..n]).is_err() || drained >= DRAIN_LIMIT {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let mut fds = [rustix::event::PollFd::new(
                    &pipe,
                    rustix::event::PollFlags::IN,
                )];
                let tick = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 10_000_000,
                };
                let _ = rustix::event::poll(&mut fds, Some(&tick));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
