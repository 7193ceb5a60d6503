//! The control protocol between the provisioner and a runtime's server, over the runtime's
//! Unix socket: length-prefixed JSON frames, with the command's stdin, stdout and stderr
//! passed as file descriptors (`SCM_RIGHTS`) alongside an exec request.
//!
//! The socket lives in the runtime's host directory (mode 0700 data dir, socket 0600), so
//! only the provisioner reaches it; nothing inside the runtime can see it (I12).

use std::collections::BTreeMap;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// Largest frame accepted, bytes: argv and environment of one command.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

/// A request to init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Run a command; stdin, stdout and stderr arrive as three descriptors.
    Exec(ExecSpec),
    /// Kill the process tree of the command started on this connection.
    Kill,
    /// Send `signal` to the command started on this connection: to its process group
    /// (`group`, what a terminal's Ctrl-C does) or to the process alone. Nothing answers;
    /// a command that already ended is not signalled.
    Signal {
        /// The signal number.
        signal: i32,
        /// The whole process group (the command's session leader's) rather than the
        /// process alone.
        #[serde(default)]
        group: bool,
    },
    /// Set the terminal size of the command started on this connection with a terminal
    /// ([`ExecSpec::pty`]): its foreground process group gets `SIGWINCH`. Nothing answers.
    Resize(PtySize),
    /// Kill what in the tree of the command started on this connection began after this
    /// moment of the runtime's clock (`/proc/uptime` in hundredths, and the last pid handed
    /// out by then): one command of a long-lived shell, the shell and its earlier jobs
    /// staying. The tree is the command's cgroup leaf, or its supervisor's subtree, so a
    /// double fork or `setsid` does not leave it. Nothing answers.
    KillStartedAfter {
        /// `/proc/uptime` then, in hundredths of a second.
        uptime_centis: u64,
        /// The last pid handed out then, when the runtime tells.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_pid: Option<i32>,
    },
    /// Who are you? Answered with [`Reply::Pong`].
    Ping,
    /// Who are you, and how many processes run besides init and the trees of `quiet`?
    /// Answered with [`Reply::Pong`]. The `quiet` processes are ones that wait for work
    /// between bursts (a code interpreter's kernel): idle, they and their descendants are
    /// no activity. An agent older than this request closes the connection unanswered;
    /// the caller then asks [`Request::Ping`].
    Activity {
        /// Pids (in the runtime's pid namespace) whose trees are not counted.
        quiet: Vec<i32>,
    },
    /// Make this connection the one init sends egress connections over
    /// ([`Reply::Connection`]), replacing any earlier one.
    Egress,
    /// Kill every process of the runtime but its own machinery (init; in a container, the
    /// agent): running commands and whatever they left running in the background. The
    /// runtime keeps serving. Answered with [`Reply::KilledAll`] once they are gone.
    KillAll,
    /// Send the runtime's home as a tar stream ([`crate::home`]), at most `limit` bytes of
    /// file data: over TCP as data frames, on the Unix socket into the one pipe attached;
    /// then [`Reply::Moved`]. Where the host has no path to the home: a pod, and a gVisor
    /// sandbox, whose descriptors live in the Sentry (issue 19).
    ArchiveHome {
        /// Most bytes of file data.
        limit: u64,
    },
    /// Receive a tar stream into the runtime's (empty) home before its first command (a
    /// resumed runtime, I30): data frames follow over TCP, on the Unix socket the stream
    /// comes through the one pipe attached; then [`Reply::Moved`].
    RestoreHome {
        /// Most bytes of file data.
        limit: u64,
    },
    /// Run one file operation anywhere in the runtime, as the sandbox user
    /// ([`crate::files`]), then answer [`Reply::File`]. On the Unix socket one pipe end is
    /// attached: a write's bytes come through it (the provisioner closes it after the last),
    /// a read's go into it after the answer. Over TCP they are data frames instead, after
    /// the request (a write) or after the answer (a read), ended by a data-end frame.
    File(warren_backend::FileOp),
    /// The provisioner's end of the proxy connection [`Reply::ConnectionWanted`] named is
    /// attached (one socket): the server relays between it and the connection it holds.
    Relay {
        /// The id the server gave the connection.
        id: u64,
    },
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments; a program without `/` is searched in `PATH` of `env`.
    pub argv: Vec<String>,
    /// Working directory inside the runtime.
    pub cwd: String,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    /// Run it on a terminal of this size, opened by the server: the command's stdin,
    /// stdout and stderr are the terminal, it is the session leader with the terminal as
    /// its controlling one, and the three descriptors attached carry the terminal's input
    /// (the first) and its output (the second; the third is closed at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl Request {
    /// The request that asks the runtime for `signal` on the command of a connection.
    pub fn control(signal: warren_backend::ProcessSignal) -> Self {
        use warren_backend::ProcessSignal;
        match signal {
            ProcessSignal::Signal { signal, group } => Self::Signal { signal, group },
            ProcessSignal::Resize(size) => Self::Resize(PtySize {
                cols: size.cols,
                rows: size.rows,
            }),
            ProcessSignal::Kill => Self::Kill,
            ProcessSignal::KillStartedAfter(instant) => Self::KillStartedAfter {
                uptime_centis: instant.uptime_centis,
                last_pid: instant.last_pid,
            },
        }
    }

    /// Whether this is a control of the command started on its connection (valid only
    /// there, after the exec).
    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Self::Kill | Self::Signal { .. } | Self::Resize(_) | Self::KillStartedAfter { .. }
        )
    }
}

/// An answer from init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The command runs.
    Started {
        /// Its pid inside the runtime.
        pid: i32,
        /// Over TCP (the gateway): how many stdin frames may be on their way before the
        /// gateway acknowledges one ([`crate::wire::Kind::StdinAck`]), so stdin has
        /// backpressure end to end. Absent from an agent that acknowledges nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdin_window: Option<u32>,
    },
    /// The command could not be started.
    Failed {
        /// Which step failed (`cwd`, `exec`, `credentials`, ...).
        stage: String,
        /// The errno.
        errno: i32,
    },
    /// The command ended.
    Exited {
        /// Exit status when it exited.
        exit_code: Option<i32>,
        /// The signal that killed it.
        signal: Option<i32>,
        /// User CPU time of the command and the children it waited for, microseconds.
        user_us: i64,
        /// System CPU time, microseconds.
        system_us: i64,
        /// Peak resident memory, KiB.
        max_rss_kib: i64,
    },
    /// Identity of the runtime.
    Pong {
        /// The sandbox id.
        sandbox: String,
        /// The generation.
        generation: i64,
        /// Processes running in the runtime besides init.
        #[serde(default)]
        processes: u64,
    },
    /// A process connected to the runtime's proxy port; its socket is attached.
    Connection,
    /// A process connected to the runtime's proxy port, but its socket cannot leave the
    /// runtime (gVisor's Sentry passes no descriptor to the host, issue 19): the
    /// provisioner sends [`Request::Relay`] with a socket of its own for it, on a new
    /// connection.
    ConnectionWanted {
        /// Which connection.
        id: u64,
    },
    /// Every process but the runtime's own is gone.
    KilledAll {
        /// How many processes were killed.
        processes: u64,
    },
    /// A home archived or restored.
    Moved {
        /// Entries moved.
        entries: u64,
        /// Bytes of file data.
        bytes: u64,
        /// Entries left out (unreadable, or kinds a snapshot does not keep).
        skipped: u64,
    },
    /// What a file operation returned, or why it failed (a read's bytes follow).
    File {
        /// The answer.
        answer: Result<warren_backend::FileAnswer, warren_backend::FileFailure>,
    },
    /// A control on an exec connection (signal, resize, kill what started after) was
    /// applied: the next thing the provisioner does comes after it. One per control, in
    /// order; `Kill` gets none (its answer is `Exited`).
    Applied,
    /// The request was not understood.
    Refused {
        /// Why.
        reason: String,
    },
}

/// What the TCP gateway sends the server with each connection it authenticated (the
/// connection is the one descriptor attached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff;

/// Sends one frame, with `fds` attached to its first bytes.
pub fn send_frame<T: Serialize>(
    socket: BorrowedFd<'_>,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one frame"));
    }
    let mut sent = rustix::net::sendmsg(
        socket,
        &[io::IoSlice::new(&frame)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )?;
    while sent < frame.len() {
        sent += rustix::net::send(socket, &frame[sent..], SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Receives one frame and the descriptors that came with it. `Ok(None)` on a clean EOF
/// before any byte.
pub fn recv_frame<T: for<'de> Deserialize<'de>>(
    socket: BorrowedFd<'_>,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut header = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(&mut header)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 {
        return Ok(None);
    }
    read_exact(socket, &mut header[received.bytes..])?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is larger than {MAX_FRAME}"),
        ));
    }
    let mut body = vec![0u8; len];
    read_exact(socket, &mut body)?;
    let message =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((message, fds)))
}

fn read_exact(socket: BorrowedFd<'_>, mut buffer: &mut [u8]) -> io::Result<()> {
    while !buffer.is_empty() {
        match rustix::io::read(socket, &mut *buffer) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buffer = &mut buffer[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Borrows a list of owned descriptors.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_messages_and_descriptors() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        let request = Request::Exec(ExecSpec {
            argv: vec!["echo".into(), "hi".into()],
            cwd: "/home/gem".into(),
            env: BTreeMap::from([("A".into(), "1".into())]),
            pty: None,
        });
        send_frame(a.as_fd(), &request, &[write_end.as_fd()]).unwrap();
        drop(write_end);
        let (got, fds): (Request, _) = recv_frame(b.as_fd()).unwrap().unwrap();
        assert_eq!(got, request);
        assert_eq!(fds.len(), 1);
        rustix::io::write(&fds[0], b"through").unwrap();
        drop(fds);
        let mut buffer = [0u8; 16];
        let n = rustix::io::read(&read_end, &mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"through");
        drop(a);
        assert!(recv_frame::<Request>(b.as_fd()).unwrap().is_none());
    }
}
