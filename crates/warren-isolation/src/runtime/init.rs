//! The launcher and the init process of a runtime.
//!
//! The launcher is `warren __runtime-init`, started by the provisioner with a
//! [`RuntimeConfig`] on stdin. It joins the sandbox's cgroup, opens the two persistent
//! directories without following links, binds the control socket, unshares every namespace
//! but the user namespace, and forks init. Init (PID 1 of the new pid namespace) assembles
//! the root filesystem and serves the control socket until it is killed. The launcher prints
//! one JSON line — `{"pid":N}` or `{"error":"…"}` — and exits.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use rustix::thread::UnshareFlags;
use warren_agent::server::{step, Credentials, Server, ServerConfig};
use warren_agent::sys::{self, Forked};

use crate::cgroup::{CgroupSupport, Limits, SandboxCgroup};
use crate::config::RuntimeConfig;
use crate::runtime::{rootfs, SetupError};

/// Entry point of `warren __runtime-init`. Never returns.
pub fn runtime_init_main() -> ! {
    // `warren __runtime-init gvisor-shim`: the reaper of a gVisor runtime (issue 19).
    if std::env::args_os().nth(2).as_deref() == Some(crate::runsc::shim::SHIM_ARG.as_ref()) {
        crate::runsc::shim::shim_main();
    }
    let code = match launch() {
        Ok(pid) => {
            println!("{{\"pid\":{pid}}}");
            0
        }
        Err(message) => {
            let line = serde_json::json!({ "error": message });
            println!("{line}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    sys::exit_immediately(code)
}

fn launch() -> Result<i32, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("read the runtime config: {e}"))?;
    let config: RuntimeConfig =
        serde_json::from_str(&input).map_err(|e| format!("parse the runtime config: {e}"))?;

    let cgroup = if config.cgroups {
        let support = CgroupSupport::detect().map_err(|e| format!("detect cgroups: {e}"))?;
        let limits = Limits {
            memory_bytes: config.limits.memory_bytes,
            pids_max: config.limits.pids_max,
            cpu_millis: config.limits.cpu_millis,
        };
        let (cgroup, _not_enforced) = SandboxCgroup::create(&support, &config.cgroup_name, &limits)
            .map_err(|e| format!("create the sandbox cgroup: {e}"))?;
        Some(cgroup)
    } else {
        None
    };

    // The OOM killer should pick a runaway command, never init: losing init loses the
    // runtime. Best effort: without CAP_SYS_RESOURCE the score cannot go below zero, and
    // init's few hundred KiB still make it the last candidate. Commands reset their own
    // score (see `child`).
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");

    let socket_path = config.runtime_dir.join("control.sock");
    let _ = std::fs::remove_file(&socket_path);
    let listener =
        UnixListener::bind(&socket_path).map_err(|e| format!("bind the control socket: {e}"))?;
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("restrict the control socket: {e}"))?;

    if let Some(map) = config.user_namespace {
        enter_user_namespace(map)?;
    }
    sys::unshare(
        UnshareFlags::NEWNS
            | UnshareFlags::NEWUTS
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWNET
            | UnshareFlags::NEWPID,
    )
    .map_err(|e| format!("create namespaces: {e}"))?;

    let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("create the ready pipe: {e}"))?;
    match sys::fork_single_threaded().map_err(|e| format!("fork init: {e}"))? {
        Forked::Child => {
            drop(ready_read);
            // Nothing of the provisioner's stdio is kept: the launcher's answer must reach
            // EOF when the launcher exits, and a provisioner that died cannot hurt init.
            if let Err(error) = detach_stdio() {
                let mut ready = std::fs::File::from(ready_write);
                let _ = write!(ready, "detach stdio: {error}");
                sys::exit_immediately(1);
            }
            let result = setup(config, cgroup, listener);
            let mut ready = std::fs::File::from(ready_write);
            match result {
                Ok(init) => {
                    let _ = ready.write_all(b"ok");
                    drop(ready);
                    init.serve()
                }
                Err(error) => {
                    let _ = ready.write_all(error.to_string().as_bytes());
                    sys::exit_immediately(1)
                }
            }
        }
        Forked::Parent(pid) => {
            drop(ready_write);
            // Moving a process into a v1 cgroup waits for an RCU grace period (~10 ms
            // here); done now, it overlaps with init assembling the root. Init starts no
            // command before it reports ready, and the launcher reports only after both.
            let joined = cgroup.as_ref().map_or(Ok(()), |c| c.add_init(pid));
            let mut answer = String::new();
            let _ = std::fs::File::from(ready_read).read_to_string(&mut answer);
            if let Err(error) = joined {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).ok_or("init has no pid")?,
                    rustix::process::Signal::KILL,
                );
                return Err(format!("move init into the sandbox cgroup: {error}"));
            }
            if answer == "ok" {
                Ok(pid)
            } else {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).ok_or("init has no pid")?,
                    rustix::process::Signal::KILL,
                );
                Err(if answer.is_empty() {
                    "init died during setup".to_owned()
                } else {
                    answer
                })
            }
        }
    }
}

/// Unprivileged mode: a user namespace where this process is the sandbox user 1000:1000
/// (its own ids outside) and holds the capabilities it needs to build the runtime. It
/// gains nothing outside: the namespace maps no other id.
fn enter_user_namespace(map: crate::config::IdMap) -> Result<(), String> {
    sys::unshare(UnshareFlags::NEWUSER).map_err(|e| format!("create a user namespace: {e}"))?;
    let write = |file: &str, content: String| {
        std::fs::write(format!("/proc/self/{file}"), content)
            .map_err(|e| format!("write /proc/self/{file}: {e}"))
    };
    // Required before an unprivileged gid_map; it also keeps anyone inside from dropping a
    // supplementary group to get past a "deny this group" permission.
    write("setgroups", "deny".into())?;
    write(
        "uid_map",
        format!("{} {} 1", crate::config::SANDBOX_UID, map.outside_uid),
    )?;
    write(
        "gid_map",
        format!("{} {} 1", crate::config::SANDBOX_GID, map.outside_gid),
    )?;
    Ok(())
}

fn detach_stdio() -> std::io::Result<()> {
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(())
}

/// What init does before it serves: build the root, drop the bounding set, bind the
/// proxy port, confine itself with Landlock, then become the server with the runtime's
/// cgroups.
fn setup(
    config: RuntimeConfig,
    cgroup: Option<SandboxCgroup>,
    listener: UnixListener,
) -> Result<Server, SetupError> {
    let hostname = "warren".to_owned();
    rootfs::assemble(&config, &hostname)?;
    // Init never execs, so emptying its bounding set costs it nothing, and every command
    // inherits the empty set: nothing it runs can regain a capability (file caps too).
    step("drop the capability bounding set", sys::drop_bounding_set())?;
    // Bound inside the runtime's network namespace, on its loopback only.
    let proxy = if config.egress {
        Some(step(
            "bind the proxy port",
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, crate::config::PROXY_PORT)),
        )?)
    } else {
        None
    };
    let cgroup_dirs = cgroup.iter().flat_map(SandboxCgroup::directories);
    let writable = crate::runtime::confine::writable(config.layout.layout(), &config.extra_mounts);
    crate::runtime::confine::confine(&writable, cgroup_dirs).map_err(|e| SetupError {
        stage: "apply Landlock",
        source: std::io::Error::other(e.to_string()),
    })?;
    let credentials = if config.user_namespace.is_some() {
        Credentials::UserNamespace
    } else {
        Credentials::Root
    };
    Server::new(ServerConfig {
        sandbox: config.sandbox,
        generation: config.generation,
        nofile: config.limits.nofile,
        credentials,
        listener: Some(listener),
        gateway: None,
        proxy,
        groups: cgroup.map(|c| Box::new(c) as Box<dyn warren_agent::server::CommandGroups>),
        keep: Vec::new(),
    })
}
