//! A command's tree held in a cgroup of gVisor's Sentry, where nothing else can hold it.
//!
//! Inside a gVisor sandbox (issue 19) the container agent's usual tool, a subreaper
//! supervisor per command, does not exist: runsc's Sentry (as of Debian's 20221219)
//! refuses `PR_SET_CHILD_SUBREAPER` to any process but PID 1, so a `setsid` double fork
//! would leave its command's tree, and a timeout could not reach it. The Sentry does
//! implement cgroupfs, and a cgroup is what holds a tree on any kernel: membership passes
//! to every child at fork and no process can leave it on its own. So the agent, the
//! sandbox's root (the Sentry's, not the host's), mounts the Sentry's `pids` hierarchy,
//! keeps only a descriptor of it (the mount is detached at once, so no command ever sees
//! it), and gives each command a group of its own there.
//!
//! The Sentry has neither `cgroup.kill` nor a freezer, so a kill is the sweep every
//! cgroup-less kill is: each round stops, then kills, every process the group lists (a
//! stopped process cannot fork; one forked during the round is in the group and in the
//! next listing) until the listing is empty.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, Signal};

use crate::server::{CommandGroup, CommandGroups};

/// How long a kill keeps sweeping before it gives up on processes that will not die.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// The Sentry's `pids` hierarchy, by descriptor only.
pub struct SentryGroups {
    root: Arc<OwnedFd>,
}

impl SentryGroups {
    /// Mounts the Sentry's cgroupfs (`pids`) on a fresh directory under `scratch` (a tmpfs
    /// of the sandbox's), keeps a descriptor of it and detaches the mount: from then on only
    /// this process reaches it. Needs `CAP_SYS_ADMIN` in the sandbox.
    pub fn mount(scratch: &std::path::Path) -> io::Result<Self> {
        let point = scratch.join(format!(".warren-cgroup-{}", std::process::id()));
        rustix::fs::mkdir(&point, Mode::from_raw_mode(0o700))?;
        let opened = (|| {
            rustix::mount::mount(
                "warren",
                &point,
                "cgroup",
                rustix::mount::MountFlags::NOSUID
                    | rustix::mount::MountFlags::NODEV
                    | rustix::mount::MountFlags::NOEXEC,
                Some(c"pids"),
            )?;
            let root = rustix::fs::open(
                &point,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            );
            rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH)?;
            root
        })();
        let _ = rustix::fs::rmdir(&point);
        Ok(Self {
            root: Arc::new(opened?),
        })
    }
}

impl CommandGroups for SentryGroups {
    fn group(&self, n: u64) -> io::Result<Box<dyn CommandGroup>> {
        let name = format!("exec-{n}");
        match rustix::fs::mkdirat(&*self.root, name.as_str(), Mode::from_raw_mode(0o700)) {
            // A group the previous owner of this number left empty is as good as new.
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(error.into()),
        }
        let dir = rustix::fs::openat(
            &*self.root,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Box::new(SentryGroup {
            root: Arc::clone(&self.root),
            dir,
            name,
        }))
    }
}

/// One command's group.
struct SentryGroup {
    root: Arc<OwnedFd>,
    dir: OwnedFd,
    name: String,
}

impl SentryGroup {
    /// The processes the group lists now.
    fn members(&self) -> io::Result<Vec<Pid>> {
        let procs = rustix::fs::openat(
            &self.dir,
            "cgroup.procs",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut text = String::new();
        std::fs::File::from(procs).read_to_string(&mut text)?;
        Ok(text
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .filter_map(Pid::from_raw)
            .collect())
    }
}

impl CommandGroup for SentryGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn spawn_target(&self) -> Option<BorrowedFd<'_>> {
        // No clone3 in the Sentry: the child joins itself (`add_self`).
        None
    }

    fn add_self(&self) -> Result<(), rustix::io::Errno> {
        let procs = rustix::fs::openat(
            &self.dir,
            "cgroup.procs",
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let me = rustix::process::getpid().as_raw_nonzero().get().to_string();
        std::fs::File::from(procs)
            .write_all(me.as_bytes())
            .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))
    }

    fn kill(&self) -> io::Result<u64> {
        let started = Instant::now();
        let mut killed = std::collections::BTreeSet::new();
        loop {
            let members = self.members()?;
            if members.is_empty() {
                return Ok(killed.len() as u64);
            }
            if started.elapsed() > KILL_TIMEOUT {
                return Err(io::Error::other(format!(
                    "{} processes of {} outlived {KILL_TIMEOUT:?} of killing",
                    members.len(),
                    self.name
                )));
            }
            // Killed, never stopped first: membership finds whatever forked meanwhile, and
            // under gVisor a stopped member of the command's orphaned process group makes
            // the Sentry send the group SIGHUP when another member exits, so the command
            // would end by SIGHUP rather than the kill. ESRCH only means it is gone already.
            for &pid in &members {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            killed.extend(members.iter().map(|p| p.as_raw_nonzero().get()));
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn is_empty(&self) -> bool {
        self.members().is_ok_and(|members| members.is_empty())
    }

    fn remove(self: Box<Self>) -> io::Result<()> {
        let Self { root, dir, name } = *self;
        drop(dir);
        rustix::fs::unlinkat(root.as_fd(), name.as_str(), rustix::fs::AtFlags::REMOVEDIR)?;
        Ok(())
    }
}
