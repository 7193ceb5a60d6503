//! Commands on a terminal: the server opens the pair itself (`/dev/ptmx` of the runtime,
//! so no image needs util-linux), the command gets the terminal as its stdio and its
//! controlling terminal, and a relay process of the server's copies between the
//! provisioner's two pipes and the terminal's master side.
//!
//! The relay is a process rather than work in the server's loop: the server never blocks
//! on a command's bytes, and in a gVisor sandbox no descriptor leaves the Sentry, so the
//! master cannot be handed to the host; pipes can be, as for every command. The server
//! keeps its own copy of the master only to set the terminal's size.

use std::os::fd::OwnedFd;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use crate::protocol::PtySize;
use crate::sys;

/// A terminal pair.
pub(crate) struct Terminal {
    /// The side the relay reads and writes, and the server resizes.
    pub(crate) master: OwnedFd,
    /// The side the command gets as stdin, stdout and stderr.
    pub(crate) slave: OwnedFd,
}

/// Opens a terminal pair of `size`, its slave side owned by the sandbox user where the
/// server can give it away (programs that reopen their terminal by name expect to own it).
pub(crate) fn open(size: PtySize) -> std::io::Result<Terminal> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let _ = rustix::fs::fchown(
        &slave,
        Some(rustix::fs::Uid::from_raw(crate::environment::SANDBOX_UID)),
        Some(rustix::fs::Gid::from_raw(crate::environment::SANDBOX_GID)),
    );
    resize(&master, size)?;
    Ok(Terminal { master, slave })
}

/// Sets the terminal's size; the kernel sends `SIGWINCH` to its foreground process group.
pub(crate) fn resize(master: &OwnedFd, size: PtySize) -> std::io::Result<()> {
    rustix::termios::tcsetwinsize(
        master,
        rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// Bytes on their way from one descriptor to another.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    at: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// Writes what it can without blocking; `Err` when the writer is gone.
    fn flush(&mut self, to: &OwnedFd) -> Result<(), Errno> {
        while !self.is_empty() {
            match rustix::io::write(to, &self.bytes[self.at..]) {
                Ok(n) => self.at += n,
                Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads what there is into an empty buffer: `Ok(false)` at the end.
    fn fill(&mut self, from: &OwnedFd, buffer: &mut [u8]) -> Result<bool, Errno> {
        loop {
            match rustix::io::read(from, &mut *buffer) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.bytes.clear();
                    self.bytes.extend_from_slice(&buffer[..n]);
                    self.at = 0;
                    return Ok(true);
                }
                Err(Errno::AGAIN) => return Ok(true),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The relay, in the process the server forked for it; never returns. Copies `input`
/// (the provisioner's stdin pipe) to the terminal and the terminal to `output` until the
/// terminal's last holder inside closed it (reading the master then fails with `EIO`) and
/// everything read was passed on, or until the provisioner closed `output`.
///
/// Each direction holds at most one read's worth of bytes and reads no more until they
/// are written: a command that reads no input makes the provisioner's writes wait (the
/// pipe fills), and a provisioner that reads no output makes the command's writes wait.
pub(crate) fn relay(input: OwnedFd, output: OwnedFd, master: OwnedFd) -> ! {
    for fd in [&input, &output, &master] {
        let _ = rustix::io::ioctl_fionbio(fd, true);
    }
    let mut buffer = vec![0u8; 64 * 1024];
    let (mut to_terminal, mut to_output) = (Pending::default(), Pending::default());
    let (mut input_open, mut terminal_open) = (true, true);
    loop {
        if !terminal_open && to_output.is_empty() {
            sys::exit_immediately(0)
        }
        // Only what this side waits for is polled: a closed pipe reports its hang-up
        // whatever was asked, and must not spin the loop while the other side is full.
        let mut terminal_flags = PollFlags::empty();
        if terminal_open && to_output.is_empty() {
            terminal_flags |= PollFlags::IN;
        }
        if !to_terminal.is_empty() {
            terminal_flags |= PollFlags::OUT;
        }
        let mut watched: Vec<(Side, PollFd<'_>)> = Vec::with_capacity(3);
        if !terminal_flags.is_empty() {
            watched.push((Side::Terminal, PollFd::new(&master, terminal_flags)));
        }
        if input_open && to_terminal.is_empty() {
            watched.push((Side::Input, PollFd::new(&input, PollFlags::IN)));
        }
        if !to_output.is_empty() {
            watched.push((Side::Output, PollFd::new(&output, PollFlags::OUT)));
        }
        let mut fds: Vec<PollFd<'_>> = watched.iter().map(|(_, fd)| fd.clone()).collect();
        match rustix::event::poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => sys::exit_immediately(1),
        }
        let ready: Vec<Side> = watched
            .iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|((side, _), _)| *side)
            .collect();
        drop(fds);
        drop(watched);
        for side in ready {
            match side {
                Side::Output => {
                    // The provisioner closed the output: nobody reads the terminal any more.
                    if to_output.flush(&output).is_err() {
                        sys::exit_immediately(0)
                    }
                }
                Side::Input => match to_terminal.fill(&input, &mut buffer) {
                    Ok(true) => {}
                    // Stdin ended: the terminal stays, as one whose keyboard went quiet.
                    Ok(false) | Err(_) => input_open = false,
                },
                Side::Terminal => {
                    // Input for a terminal nobody holds any more is dropped.
                    if to_terminal.flush(&master).is_err() {
                        to_terminal = Pending::default();
                    }
                    if terminal_open && to_output.is_empty() {
                        match to_output.fill(&master, &mut buffer) {
                            Ok(true) => {}
                            // EIO: every holder of the slave side closed it.
                            Ok(false) | Err(_) => terminal_open = false,
                        }
                    }
                }
            }
        }
        // What was just read usually goes straight through, without another poll.
        if to_output.flush(&output).is_err() {
            sys::exit_immediately(0)
        }
        if to_terminal.flush(&master).is_err() {
            to_terminal = Pending::default();
        }
    }
}

/// Which descriptor a poll slot is.
#[derive(Clone, Copy)]
enum Side {
    Terminal,
    Input,
    Output,
}
