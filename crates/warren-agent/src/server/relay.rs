//! Proxy connections relayed inside the runtime, where their sockets cannot leave it.
//!
//! A runtime's proxy port hands each accepted socket to the provisioner with `SCM_RIGHTS`
//! (`Reply::Connection`). gVisor's Sentry (issue 19) passes descriptors into a sandbox but
//! refuses to pass one out (EINVAL), so there the direction is turned round: the server
//! keeps the accepted socket under an id and asks for a socket
//! (`Reply::ConnectionWanted`); the provisioner makes a socket pair, keeps one end for the
//! same proxying and policy checks every connection gets, and sends the other in
//! (`Request::Relay`); a child of the server copies bytes between the two until the
//! connection is done. The relay only moves bytes: the request is parsed, checked against
//! the sandbox's policy and connected on the host, exactly as before.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};

use rustix::event::{PollFd, PollFlags};
use rustix::net::Shutdown;

/// Most accepted connections waiting for the provisioner's socket: the provisioner's own
/// cap on one runtime's connections (`egress`); older ones beyond it are closed.
pub(crate) const MAX_WAITING: usize = 128;

/// Accepted proxy connections waiting for the provisioner's end, oldest first.
#[derive(Default)]
pub(crate) struct Waiting {
    next: u64,
    held: VecDeque<(u64, OwnedFd)>,
}

impl Waiting {
    /// Holds `stream` under a new id; the oldest connection goes when too many wait.
    pub(crate) fn hold(&mut self, stream: OwnedFd) -> u64 {
        self.next += 1;
        if self.held.len() >= MAX_WAITING {
            self.held.pop_front();
        }
        self.held.push_back((self.next, stream));
        self.next
    }

    /// The connection held under `id`, taken out.
    pub(crate) fn take(&mut self, id: u64) -> Option<OwnedFd> {
        let at = self.held.iter().position(|(held, _)| *held == id)?;
        self.held.remove(at).map(|(_, stream)| stream)
    }

    /// Closes every waiting connection (the provisioner went away).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
    }
}

/// Copies between the sandbox's connection and the provisioner's end until the
/// connection is done, in the forked child; never returns. When the sandbox's side stops
/// sending, the provisioner's is told (its write side shut) and the relay reads on; when
/// the provisioner's side ends, the connection is over (it closes its end when the
/// destination is done, refused, or idle too long).
pub(crate) fn relay(sandbox: OwnedFd, provisioner: OwnedFd) -> ! {
    relay_until_done(&sandbox, &provisioner);
    crate::sys::exit_immediately(0)
}

/// The copying of [`relay`], returning when the connection is done.
fn relay_until_done(sandbox: &OwnedFd, provisioner: &OwnedFd) {
    let _ = rustix::io::ioctl_fionbio(sandbox, false);
    let _ = rustix::io::ioctl_fionbio(provisioner, false);
    let mut buffer = vec![0u8; 64 * 1024];
    let mut sandbox_open = true;
    loop {
        let mut fds = vec![PollFd::new(provisioner, PollFlags::IN)];
        if sandbox_open {
            fds.push(PollFd::new(sandbox, PollFlags::IN));
        }
        if rustix::event::poll(&mut fds, None).is_err() {
            continue;
        }
        let provisioner_ready = !fds[0].revents().is_empty();
        let sandbox_ready = fds.get(1).is_some_and(|fd| !fd.revents().is_empty());
        drop(fds);
        if provisioner_ready && !copy_once(provisioner, sandbox, &mut buffer) {
            return;
        }
        if sandbox_ready && !copy_once(sandbox, provisioner, &mut buffer) {
            sandbox_open = false;
            let _ = rustix::net::shutdown(provisioner, Shutdown::Write);
        }
    }
}

/// Moves what `from` has to `to`; false when `from` has ended (or either side failed).
fn copy_once(from: &OwnedFd, to: &OwnedFd, buffer: &mut [u8]) -> bool {
    let read = match rustix::io::read(from, &mut *buffer) {
        Ok(0) | Err(_) => return false,
        Ok(read) => read,
    };
    let mut written = 0;
    while written < read {
        match rustix::io::write(to.as_fd(), &buffer[written..read]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => written += n,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_waiting_connection_goes_when_too_many_wait() {
        let mut waiting = Waiting::default();
        let first = waiting.hold(rustix::io::dup(std::io::stdin()).unwrap());
        for _ in 0..MAX_WAITING {
            waiting.hold(rustix::io::dup(std::io::stdin()).unwrap());
        }
        assert!(waiting.take(first).is_none());
        assert!(waiting.take(first + 1).is_some());
        assert!(waiting.take(first + 1).is_none(), "taken once");
    }

    #[test]
    fn a_relay_carries_both_ways_and_ends_with_the_provisioners_side() {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixStream;
        let (mut client, sandbox_end) = UnixStream::pair().unwrap();
        let (provisioner_end, mut host) = UnixStream::pair().unwrap();
        let relaying = std::thread::spawn(move || {
            let (sandbox_end, provisioner_end) =
                (OwnedFd::from(sandbox_end), OwnedFd::from(provisioner_end));
            relay_until_done(&sandbox_end, &provisioner_end);
        });
        client.write_all(b"CONNECT x:1 HTTP/1.1\r\n\r\n").unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let mut request = Vec::new();
        host.read_to_end(&mut request).unwrap();
        assert_eq!(request, b"CONNECT x:1 HTTP/1.1\r\n\r\n");
        host.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").unwrap();
        drop(host);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"HTTP/1.1 403 Forbidden\r\n\r\n");
        relaying.join().unwrap();
    }
}
