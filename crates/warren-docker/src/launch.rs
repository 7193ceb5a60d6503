//! Starting a sandbox's container: its body (image, user, limits, mounts, network, labels),
//! the host side it needs (its socket directory, a seeded home, the environment file), and
//! the wait for its agent to answer.

use super::*;

impl DockerBackend {
    pub(crate) async fn launch(&self, spec: &RuntimeSpec) -> Result<Identity, DockerError> {
        let image = spec.binding.image.clone().unwrap_or_default();
        if let Err(error) = self.docker.inspect_image(&image).await {
            return Err(if is_not_found(&error) {
                DockerError::ImageMissing { image }
            } else {
                engine("inspect the image")(error)
            });
        }
        self.teardown(&spec.sandbox).await?;
        let socket_dir = self.socket_dir(&spec.sandbox);
        let agent_uid = match spec.binding.isolation {
            IsolationTier::Kernel => warren_core::SANDBOX_UID,
            IsolationTier::Gvisor => 0,
        };
        make_socket_dir(&socket_dir, agent_uid).map_err(|source| DockerError::HostDir {
            what: "the sandbox's socket directory",
            source,
        })?;
        write_env(&self.state_file(&spec.sandbox), &spec.env).map_err(|source| {
            DockerError::HostDir {
                what: "the sandbox's state file",
                source,
            }
        })?;
        // A gVisor container has the Sentry's loopback only (runsc `--network=none`): its
        // agent relays the proxy port's connections to the provisioner (issue 19).
        let network_mode = if spec.binding.network.has_egress()
            && spec.binding.isolation == IsolationTier::Kernel
        {
            let name = self.container_name(&spec.sandbox);
            self.docker
                .create_network(NetworkCreateRequest {
                    name: name.clone(),
                    driver: Some("bridge".into()),
                    // No route off the bridge: egress goes through the agent's proxy, where
                    // the provisioner applies the policy. The host gets no address on it,
                    // so the container cannot reach the host's services either.
                    internal: Some(true),
                    options: Some(HashMap::from([(
                        "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                        "true".to_owned(),
                    )])),
                    labels: Some(identity::network_labels(&self.instance, &spec.sandbox)),
                    ..Default::default()
                })
                .await
                .map_err(engine("create the sandbox's network"))?;
            name
        } else {
            "none".to_owned()
        };
        let agent = AgentConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            nofile: self.config.limits.nofile,
            egress: spec.binding.network.has_egress(),
            socket_dir: Some(PathBuf::from(SOCKET_MOUNT)),
            listen: None,
            // Only an ephemeral home is kept open for snapshots (I30).
            home: spec
                .binding
                .layout
                .layout()
                .home_is_ephemeral()
                .then(|| PathBuf::from(spec.binding.layout.layout().home)),
            gvisor: spec.binding.isolation == IsolationTier::Gvisor,
            max_processes: (spec.binding.isolation == IsolationTier::Gvisor)
                .then_some(self.config.limits.pids_max)
                .flatten()
                .map(sentry_limits::sandbox_processes),
            max_address_space: (spec.binding.isolation == IsolationTier::Gvisor)
                .then_some(self.config.limits.memory_bytes)
                .flatten()
                .map(sentry_limits::address_space),
        };
        let agent = serde_json::to_string(&agent).expect("the agent config serialises");
        let mounts = spec.mounts();
        let name = self.container_name(&spec.sandbox);
        // Dropped (staging mounts detached, directories removed) once the container runs,
        // and on every way out before that.
        let staged = match StagedBinds::stage(&self.binds_dir, &spec.sandbox, &mounts) {
            Ok(staged) => staged,
            Err(error) => {
                let _ = self.teardown(&spec.sandbox).await;
                return Err(DockerError::from_staging(error));
            }
        };
        let body = self.container_body(spec, &mounts, &staged, &image, &network_mode, agent);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(engine("create the container"))?;
        let started = self.docker.start_container(&name, None).await;
        // The container holds its own mounts now (or never will): the staging goes.
        drop(staged);
        if let Err(error) = started {
            let _ = self.teardown(&spec.sandbox).await;
            return Err(engine("start the container")(error));
        }
        if let Err(error) = self.wait_for_agent(spec, &socket_dir).await {
            let _ = self.teardown(&spec.sandbox).await;
            return Err(error);
        }
        // A gVisor container's PID 1 on the host is runsc's sandbox process, not the agent:
        // there is no agent process to check mounts through or to reach the home by (its
        // home moves through the agent instead: `archive_gvisor_home`, and the seed below).
        let agent = match spec.binding.isolation {
            IsolationTier::Kernel => self.agent_process(&name).await,
            IsolationTier::Gvisor => None,
        };
        if let Some((pid, _)) = agent {
            let check = tokio::task::spawn_blocking(move || verify_mounts(pid, &mounts))
                .await
                .map_err(|e| DockerError::AgentDidNotStart(e.to_string()))
                .and_then(|result| result);
            if let Err(error) = check {
                let _ = self.teardown(&spec.sandbox).await;
                return Err(error);
            }
        }
        let ephemeral_home = spec.binding.layout.layout().home_is_ephemeral();
        if let (Some(seed), IsolationTier::Gvisor, true) =
            (&spec.seed, spec.binding.isolation, ephemeral_home)
        {
            // The Sentry's home is reached through the agent, as a tar stream (I30).
            let (home, dir) = (seed.join("home"), socket_dir.clone());
            let limit = self.config.limits.home_bytes;
            let seeded = tokio::task::spawn_blocking(move || {
                client::restore_home(&dir, &home, limit).map_err(|e| match e {
                    RunError::Gone(e) | RunError::Io(e) => e,
                })
            })
            .await;
            if let Ok(Err(error)) | Err(error) = seeded.map_err(std::io::Error::other) {
                tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore /home/gem from the snapshot; it starts empty");
            }
        }
        if let (Some(seed), Some((pid, _)), true) = (&spec.seed, &agent, ephemeral_home) {
            // Resuming a reaped runtime (I30): its /home/gem comes back before the first
            // command. A seed that cannot be copied leaves a fresh /home/gem, never a
            // failed start.
            let (home, pid) = (seed.join("home"), *pid);
            let layout = spec.binding.layout.layout();
            let seeded = tokio::task::spawn_blocking(move || seed_home(&home, pid, layout)).await;
            if let Ok(Err(error)) | Err(error) = seeded.map_err(std::io::Error::other) {
                tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore /home/gem from the snapshot; it starts empty");
            }
        }
        Ok(Identity {
            spec: RuntimeSpec {
                seed: None,
                ..spec.clone()
            },
            running: true,
            agent,
        })
    }

    pub(crate) fn container_body(
        &self,
        spec: &RuntimeSpec,
        mounts: &[warren_backend::HostMount],
        staged: &StagedBinds,
        image: &str,
        network_mode: &str,
        agent: String,
    ) -> ContainerCreateBody {
        let layout = spec.binding.layout.layout();
        let limits = &self.config.limits;
        let bind = |source: &Path, target: &str, read_only: bool| Mount {
            target: Some(target.to_owned()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(read_only),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                non_recursive: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mib = |bytes: u64| format!("{}m", bytes.div_ceil(1024 * 1024).max(1));
        let mut tmpfs = HashMap::from([
            (
                "/tmp".to_owned(),
                format!("size={},mode=1777,exec,nosuid,nodev", mib(limits.tmp_bytes)),
            ),
            (
                "/var/tmp".to_owned(),
                format!("size={},mode=1777,exec,nosuid,nodev", mib(limits.tmp_bytes)),
            ),
        ]);
        // An ephemeral home is a tmpfs; a home that is the workdir (E2B's) is its bind.
        if layout.home_is_ephemeral() {
            tmpfs.insert(
                layout.home.to_owned(),
                format!(
                    "size={},uid=1000,gid=1000,mode=0755,exec,nosuid,nodev",
                    mib(limits.home_bytes)
                ),
            );
        }
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let nofile = to_i64(limits.nofile);
        // The layout's persistent mounts, in its order: a tree of warren's by its path, a
        // directory beneath one by its staging mount (I2).
        let mut binds: Vec<Mount> = mounts
            .iter()
            .enumerate()
            .map(|(index, mount)| bind(staged.source(index), &mount.target, !mount.writable))
            .collect();
        binds.push(bind(self.bundle.dir(), AGENT_MOUNT, true));
        for (source, target) in accounts::binds(&self.accounts_dir, spec.binding.layout) {
            binds.push(bind(&source, target, true));
        }
        binds.push(bind(&self.socket_dir(&spec.sandbox), SOCKET_MOUNT, false));
        let host_config = HostConfig {
            mounts: Some(binds),
            tmpfs: Some(tmpfs),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            // Inside the Sentry only: the gVisor agent's root (see `gvisor`).
            cap_add: (spec.binding.isolation == IsolationTier::Gvisor).then(|| {
                gvisor::AGENT_CAPABILITIES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect()
            }),
            runtime: (spec.binding.isolation == IsolationTier::Gvisor)
                .then(|| self.gvisor_runtime.clone()),
            // Docker's default seccomp profile stays on (no `seccomp=` option); the agent
            // adds warren's own to each command.
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            privileged: Some(false),
            network_mode: Some(network_mode.to_owned()),
            publish_all_ports: Some(false),
            ipc_mode: Some("private".into()),
            memory: limits.memory_bytes.map(to_i64),
            // Memory plus swap equal to memory: no swap.
            memory_swap: limits.memory_bytes.map(to_i64),
            pids_limit: limits
                .pids_max
                .map(|max| match spec.binding.isolation {
                    IsolationTier::Kernel => max,
                    IsolationTier::Gvisor => sentry_limits::host_tasks(max),
                })
                .map(to_i64),
            nano_cpus: limits.cpu_millis.map(|m| to_i64(m) * 1_000_000),
            shm_size: Some(to_i64(limits.shm_bytes)),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(nofile),
                hard: Some(nofile),
            }]),
            init: Some(false),
            auto_remove: Some(false),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(image.to_owned()),
            // The gVisor agent starts as the Sentry's root and makes each command 1000:1000.
            user: Some(
                match spec.binding.isolation {
                    IsolationTier::Kernel => "1000:1000",
                    IsolationTier::Gvisor => "0:0",
                }
                .into(),
            ),
            hostname: Some("warren".into()),
            working_dir: Some(layout.home.into()),
            env: Some(Vec::new()),
            // The loader runs warren's executable with its own libraries, whatever libc
            // the image has (or none); `--argv0` is what `ps` shows inside.
            entrypoint: Some(vec![
                format!("{AGENT_MOUNT}/{}", bundle::LOADER),
                "--argv0".into(),
                "warren-agent".into(),
                "--library-path".into(),
                format!("{AGENT_MOUNT}/lib"),
                format!("{AGENT_MOUNT}/{}", bundle::PROGRAM),
                warren_agent::CONTAINER_AGENT_ARG.into(),
                agent,
            ]),
            cmd: Some(Vec::new()),
            network_disabled: Some(network_mode == "none"),
            labels: Some(identity::container_labels(&self.instance, spec)),
            host_config: Some(host_config),
            ..Default::default()
        }
    }

    /// The host pid and birth of a running container's agent (its PID 1).
    pub(crate) async fn agent_process(&self, name: &str) -> Option<(i32, String)> {
        let inspected = self.docker.inspect_container(name, None).await.ok()?;
        let pid = i32::try_from(inspected.state?.pid?)
            .ok()
            .filter(|p| *p > 0)?;
        Some((pid, client::process_birth(pid)?))
    }

    pub(crate) async fn wait_for_agent(
        &self,
        spec: &RuntimeSpec,
        socket_dir: &Path,
    ) -> Result<(), DockerError> {
        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        let name = self.container_name(&spec.sandbox);
        loop {
            let dir = socket_dir.to_owned();
            let answer = tokio::task::spawn_blocking(move || client::ping(&dir))
                .await
                .ok()
                .flatten();
            if answer.is_some_and(|(s, g)| s == spec.sandbox.as_str() && g == spec.generation) {
                return Ok(());
            }
            let state = self
                .docker
                .inspect_container(&name, None)
                .await
                .map_err(engine("inspect the container"))?
                .state;
            if !state.as_ref().and_then(|s| s.running).unwrap_or(false) {
                let code = state.and_then(|s| s.exit_code).unwrap_or_default();
                return Err(DockerError::AgentDidNotStart(format!(
                    "the container exited with status {code} before its agent answered (docker logs {name})"
                )));
            }
            if Instant::now() > deadline {
                return Err(DockerError::AgentDidNotStart(format!(
                    "no answer within {}s",
                    AGENT_START_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The sandbox's socket directory, owned by the sandbox user (its agent binds there), 0700.
///
/// The container can write into it, and it is on the host: as root it is a tmpfs of its
/// own, 64 KiB and 16 inodes, so a sandbox cannot fill the host's disk through it (its
/// other writable places are size-capped tmpfs inside the container). Without root the
/// engine's socket is root-equivalent anyway, but the directory is then not capped.
/// `owner` is the agent's uid: 1000 on the kernel tier, the Sentry's root on gVisor's,
/// where nothing of the sandbox user's may reach or replace the socket.
pub(crate) fn make_socket_dir(dir: &Path, owner: u32) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    if rustix::process::geteuid().is_root() {
        use rustix::mount::{mount, MountFlags};
        mount(
            "warren-agent-socket",
            dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            std::ffi::CString::new(format!(
                "size=64k,nr_inodes=16,mode=0700,uid={owner},gid={owner}"
            ))
            .expect("no NUL in the options")
            .as_c_str(),
        )?;
        return Ok(());
    }
    set_mode(dir, 0o700)
}

/// Removes a socket directory made by [`make_socket_dir`] (its tmpfs first), if any.
pub(crate) fn remove_socket_dir(dir: &Path) -> std::io::Result<()> {
    use rustix::io::Errno;
    match rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH) {
        // Not a mount point (made unprivileged, or already unmounted), or gone.
        Ok(()) | Err(Errno::INVAL) | Err(Errno::NOENT) | Err(Errno::PERM) => {}
        Err(error) => return Err(error.into()),
    }
    std::fs::remove_dir_all(dir)
}

/// Copies a snapshot's home (`seed`) into the running container's, reached through its
/// agent's descriptor. Both sides are walked and written by descriptor without following
/// anything (`warren-fs`); entries are the sandbox user's; the layout's persistent mount
/// points inside the home are never touched.
pub(crate) fn seed_home(
    seed: &Path,
    agent: i32,
    layout: &warren_core::Layout,
) -> std::io::Result<()> {
    use warren_fs::{Kind, WorkspaceRoot};
    let io = |e: warren_fs::FsError| std::io::Error::other(e.to_string());
    if !seed.is_dir() {
        return Ok(());
    }
    let source = WorkspaceRoot::open(seed).map_err(io)?.read_only();
    let home = PathBuf::from(format!(
        "/proc/{agent}/fd/{}/.",
        warren_agent::environment::HOME_FD
    ));
    let target = WorkspaceRoot::open(&home).map_err(io)?;
    let top = source.list("", 1, 100_000).map_err(io)?;
    let mount_points: Vec<&str> = layout
        .mounts_in_home()
        .into_iter()
        .filter_map(|name| name.split('/').next())
        .collect();
    for entry in top.entries {
        // By the exact bytes: a snapshot keeps names that are not UTF-8, so a resume must.
        let name = entry.os_path.as_os_str();
        if mount_points.iter().any(|m| name == *m) {
            continue;
        }
        match entry.kind {
            Kind::Dir => {
                target.copy_tree_from(&source, name, name).map_err(io)?;
            }
            Kind::File => {
                let mut input = source.open_file(name).map_err(io)?;
                let mut output = target.create_file(name, 0o600).map_err(io)?;
                std::io::copy(&mut input, &mut output)?;
                target
                    .set_attributes(name, Some(entry.mode & 0o777), entry.modified_unix_ms)
                    .map_err(io)?;
            }
            Kind::Symlink => target
                .create_symlink(name, entry.os_symlink_target.as_deref().unwrap_or_default())
                .map_err(io)?,
            Kind::Other => {}
        }
    }
    Ok(())
}

/// Checks that each staged mount of a started container is the directory warren opened
/// for it: the same device and inode at the mount's target, resolved in the container's
/// root without following its links. This is what proves a staged bind took effect; it
/// fails when dockerd runs in a mount namespace that does not see warren's staging
/// mounts (it would then have bound the empty staging directory). Direct binds of
/// warren's own trees are not checked: a skill sync may swap the projection's directory
/// in the meantime (`RENAME_EXCHANGE`), which is no fault.
pub(crate) fn verify_mounts(
    agent: i32,
    mounts: &[warren_backend::HostMount],
) -> Result<(), DockerError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    if !mounts.iter().any(is_staged) {
        return Ok(());
    }
    let root = rustix::fs::open(
        format!("/proc/{agent}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| DockerError::AgentDidNotStart(format!("cannot reach its root: {e}")))?;
    for mount in mounts.iter().filter(|m| is_staged(m)) {
        let refused = |reason: String| DockerError::Mount {
            target: mount.target.clone(),
            reason,
        };
        let source = mount.open().map_err(|e| refused(e.to_string()))?;
        let expected = rustix::fs::fstat(&source).map_err(|e| refused(e.to_string()))?;
        let inside = match rustix::fs::openat2(
            &root,
            mount.target.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            // A kernel before openat2 (Linux 5.6): the staging alone has to do.
            Err(rustix::io::Errno::NOSYS) => return Ok(()),
            Err(e) => return Err(refused(format!("cannot find it in the container: {e}"))),
        };
        let actual = rustix::fs::fstat(&inside).map_err(|e| refused(e.to_string()))?;
        if (actual.st_dev, actual.st_ino) != (expected.st_dev, expected.st_ino) {
            return Err(refused(
                "the container shows another directory there than warren bound (does dockerd run in another mount namespace?)".into(),
            ));
        }
    }
    Ok(())
}

pub(crate) fn write_env(path: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_vec(env).map_err(std::io::Error::other)?;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(&json)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

pub(crate) fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}
