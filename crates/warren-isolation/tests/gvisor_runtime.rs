//! The local backend's gVisor tier against this machine's runsc (issue 19).
//!
//! Runs as root with runsc installed (scripts/test and CI do both), and fails saying so
//! otherwise: a skipped tier would pass silently. The test binary is its own warren: it
//! dispatches `__runtime-init` (the gVisor shim) and `__container-agent` (the agent run
//! inside the sandbox from the agent bundle) as `warren` does, so what runs in the sandbox
//! is always this build's. Hence `harness = false`: `main` dispatches first, then runs the
//! tests one after another (each starts sandboxes; two cores are enough for one at a time).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};

use warren_backend::{Backend, BackendKind, ExecRequest, RuntimeSpec};
use warren_core::{
    IsolationTier, LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir,
};
use warren_isolation::config::RuntimeLimits;
use warren_isolation::{GvisorHost, LocalBackend, LocalBackendConfig};

const THREAD: &str = "threads/t1/user-data";

type Test = fn(GvisorHost) -> Pin<Box<dyn Future<Output = ()>>>;

fn main() {
    let mut args = std::env::args_os().skip(1);
    match args.next() {
        Some(arg) if arg == warren_isolation::RUNTIME_INIT_ARG => {
            warren_isolation::runtime_init_main()
        }
        Some(arg) if arg == warren_agent::CONTAINER_AGENT_ARG => {
            let config = args.next().unwrap_or_default();
            warren_agent::container_agent_main(&config.to_string_lossy())
        }
        _ => {}
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: &[(&str, Test)] = &[
        (
            "without_a_probe_the_tier_is_unavailable_and_says_why",
            |h| Box::pin(unprobed(h)),
        ),
        (
            "a_gvisor_runtime_starts_answers_shows_its_view_and_destroy_leaves_nothing",
            |h| Box::pin(lifecycle(h)),
        ),
        (
            "a_restarted_backend_adopts_the_runtime_and_sweeps_an_unclaimed_one",
            |h| Box::pin(restart(h)),
        ),
        ("a_workdir_swapped_for_a_link_to_etc_is_refused", |h| {
            Box::pin(swapped_workdir(h))
        }),
        (
            "the_home_goes_out_through_the_agent_and_comes_back_in_a_resumed_runtime",
            |h| Box::pin(seeded(h)),
        ),
        (
            "a_sandbox_moving_between_tiers_gets_a_new_runtime_of_its_tier",
            |h| Box::pin(switch_tiers(h)),
        ),
    ];
    let selected: Vec<_> = tests
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("running {} tests", selected.len());
    if selected.is_empty() {
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "the gVisor runtime tests run as root (scripts/test does)"
    );
    let host = warren_isolation::gvisor::probe(None);
    assert!(
        host.available,
        "the gVisor tier must be available here: {host:?}"
    );
    let mut failed = Vec::new();
    for (name, test) in selected {
        let started = Instant::now();
        let host = host.clone();
        let result = std::panic::catch_unwind(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(test(host))
        });
        let verdict = if result.is_ok() { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        if result.is_err() {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        println!("failures: {failed:?}");
        std::process::exit(101);
    }
    println!("test result: ok");
}

/// A data directory with a DeerFlow-layout sandbox's trees (the workdir and the personal
/// skills lie beneath the workspace: both are staged), removed with everything the tests
/// left in it.
struct Fixture {
    dir: tempfile::TempDir,
}

/// Whatever a failed test left running or mounted goes with its data directory: runsc's
/// containers under its root (by runsc) and this instance's cgroups.
impl Drop for Fixture {
    fn drop(&mut self) {
        let root = format!("--root={}", self.data().join("runsc").display());
        let listed = std::process::Command::new("runsc")
            .args([root.as_str(), "list", "-quiet"])
            .output();
        for id in listed
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .split_whitespace()
        {
            let _ = std::process::Command::new("runsc")
                .args([root.as_str(), "delete", "--force", id])
                .status();
        }
        let instance = self.instance();
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let warren = hierarchy.path().join("warren");
            for entry in std::fs::read_dir(&warren).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&instance) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    }
}

impl Fixture {
    /// The backend's instance: the first 8 hex digits of its data directory's hash, as
    /// its cgroups are named (`warren/<instance>-<sandbox>`).
    fn instance(&self) -> String {
        blake3::hash(self.data().as_os_str().as_encoded_bytes()).to_hex()[..8].to_owned()
    }

    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fixture = Self { dir };
        std::fs::create_dir_all(fixture.workspace().join(THREAD)).unwrap();
        std::fs::create_dir_all(fixture.workspace().join("agents/skills")).unwrap();
        std::fs::create_dir_all(fixture.projection()).unwrap();
        std::fs::write(
            fixture.workspace().join(THREAD).join("hello"),
            "from the host",
        )
        .unwrap();
        std::fs::write(fixture.projection().join("SKILL.md"), "a skill").unwrap();
        // The sandbox user's tree, as warren-fs hands it over (I11).
        let workdir = fixture.workspace().join(THREAD);
        std::os::unix::fs::chown(&workdir, Some(1000), Some(1000)).unwrap();
        fixture
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    fn projection(&self) -> PathBuf {
        self.dir.path().join("projection")
    }

    fn backend(&self, host: &GvisorHost) -> LocalBackend {
        LocalBackend::new(LocalBackendConfig {
            data_dir: self.data(),
            init_program: std::env::current_exe().unwrap(),
            limits: RuntimeLimits::default(),
            rootfs: None,
        })
        .expect("the local backend starts")
        .with_gvisor(host)
    }

    fn spec(&self, name: &str) -> RuntimeSpec {
        let uid = Uid::new(name).unwrap();
        let runtime_scope = RuntimeScope::new("t").unwrap();
        RuntimeSpec {
            sandbox: SandboxId::derive(&uid, &runtime_scope),
            generation: 1,
            uid,
            runtime_scope,
            user_workspace: self.workspace(),
            skill_projection: self.projection(),
            env: BTreeMap::new(),
            seed: None,
            branch: None,
            frozen: Vec::new(),
            binding: warren_core::Binding {
                workdir: Workdir::new(THREAD).unwrap(),
                network: NetworkPolicy::None,
                backend: BackendKind::Local,
                image: None,
                inherit_env: true,
                ephemeral: false,
                layout: LayoutName::Deerflow,
                extra_mounts: Vec::new(),
                isolation: IsolationTier::Gvisor,
                branch: None,
            },
        }
    }

    /// Nothing of warren's runtimes is left: no process naming the data directory (runsc's
    /// gofer and sandbox name their state root and bundle), no shim, no mount under it, no
    /// container in runsc's root, no cgroup of the sandbox.
    async fn assert_nothing_left(&self, sandbox: &SandboxId) {
        let data = self.data();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let processes = processes_naming(data.as_os_str().as_encoded_bytes());
            // This process's shims only (it is their parent, or their subreaper once
            // orphaned): other servers on the machine run shims of their own.
            let own = std::process::id() as i32;
            let shims: Vec<i32> = processes_naming(b"warren-gvisor-shim")
                .into_iter()
                .filter(|&pid| parent_of(pid) == Some(own))
                .collect();
            if processes.is_empty() && shims.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "processes left: {processes:?}, shims: {shims:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts: Vec<_> = mountinfo
            .lines()
            .filter(|l| l.contains(data.to_str().unwrap()))
            .collect();
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        let listed = std::process::Command::new("runsc")
            .arg(format!("--root={}", data.join("runsc").display()))
            .args(["list", "-quiet"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
            "runsc still lists {:?}",
            String::from_utf8_lossy(&listed.stdout)
        );
        // This backend's cgroup of the sandbox: another instance's (a run killed before
        // its cleanup, on a host whose cgroupfs outlives it) is not this test's to judge.
        let own = format!("{}-{sandbox}", self.instance());
        let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .flat_map(|h| {
                std::fs::read_dir(h.path().join("warren"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name() == Some(own.as_ref()))
            .collect();
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
        assert!(!data.join("runtimes").join(sandbox.as_str()).exists());
        assert!(!data.join("runsc-binds").join(sandbox.as_str()).exists());
    }
}

/// Pids of processes whose command line contains `needle`, this process's aside.
fn processes_naming(needle: &[u8]) -> Vec<i32> {
    let own = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// The parent pid of `pid`, from `/proc/<pid>/stat` (after the command name, which may
/// hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn sh(backend: &LocalBackend, sandbox: &SandboxId, command: &str) -> (Option<i32>, String) {
    let request = ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), command.into()],
        cwd: "/mnt/user-data".into(),
        env: BTreeMap::new(),
        stdin: Vec::new(),
        timeout: Duration::from_secs(60),
        output_cap: 1 << 20,
    };
    let outcome = backend.exec(sandbox, &request, None).await.expect("exec");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr)
    );
    (outcome.exit_code, text)
}

async fn unprobed(_host: GvisorHost) {
    let fixture = Fixture::new();
    let backend = LocalBackend::new(LocalBackendConfig {
        data_dir: fixture.data(),
        init_program: std::env::current_exe().unwrap(),
        limits: RuntimeLimits::default(),
        rootfs: None,
    })
    .unwrap();
    assert!(!backend.capabilities().gvisor);
    assert_eq!(
        backend.gvisor_unavailable(BackendKind::Local).as_deref(),
        Some("gVisor was not probed")
    );
    let spec = fixture.spec("unprobed");
    let error = backend.create(&spec).await.unwrap_err();
    let chain = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(chain.contains("gVisor was not probed"), "{chain}");
    fixture.assert_nothing_left(&spec.sandbox).await;
}

async fn lifecycle(host: GvisorHost) {
    let fixture = Fixture::new();
    let backend = fixture.backend(&host);
    assert!(backend.capabilities().gvisor);
    assert_eq!(backend.gvisor_unavailable(BackendKind::Local), None);
    let spec = fixture.spec("lifecycle");
    let started = Instant::now();
    backend
        .create(&spec)
        .await
        .expect("the gVisor runtime starts");
    eprintln!("created in {:?}", started.elapsed());
    let sandbox = &spec.sandbox;

    // Staging is detached as soon as the sandbox runs; the sandbox keeps its view.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(fixture.data().to_str().unwrap()),
        "a staging mount is still attached"
    );
    // gVisor's own kernel answers, not the host's.
    let (code, version) = sh(&backend, sandbox, "cat /proc/version").await;
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    assert_eq!(code, Some(0), "{version}");
    assert_ne!(version.trim(), host_version.trim());
    let (_, dmesg) = sh(&backend, sandbox, "dmesg 2>&1 | head -3").await;
    eprintln!("inside: {version}{dmesg}");

    let (code, out) = sh(
        &backend,
        sandbox,
        "id -u; cat /mnt/user-data/hello; echo; \
        echo inside > /mnt/user-data/written; cat /mnt/skills/public/SKILL.md; echo; \
        grep -c '^gem:' /etc/passwd; test -x /opt/warren-agent/warren && echo agent-ok; \
        echo x > /home/gem/h && echo home-ok; echo t > /tmp/t && echo tmp-ok",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    for expected in [
        "1000\n",
        "from the host\n",
        "a skill\n",
        "1\n",
        "agent-ok\n",
        "home-ok\n",
        "tmp-ok\n",
    ] {
        assert!(out.contains(expected), "{expected:?} not in {out}");
    }
    assert_eq!(
        std::fs::read_to_string(fixture.workspace().join(THREAD).join("written")).unwrap(),
        "inside\n"
    );
    // Read-only where the view says so; nothing of warren's paths shows (I1).
    let (_, out) = sh(
        &backend,
        sandbox,
        "touch /usr/x /etc/x /x /mnt/skills/public/x \
        /mnt/skills/custom/x /opt/warren-agent/x 2>&1; cat /proc/mounts",
    )
    .await;
    assert_eq!(out.matches("cannot touch").count(), 6, "{out}");
    for target in [
        "/",
        "/usr",
        "/etc",
        "/mnt/skills/public",
        "/mnt/skills/custom",
        "/opt/warren-agent",
    ] {
        let line = out
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(target))
            .unwrap_or_else(|| panic!("{target} is not mounted: {out}"));
        assert!(line.split(' ').nth(3).unwrap().starts_with("ro,"), "{line}");
    }
    let line = out
        .lines()
        .find(|l| l.contains(" /mnt/user-data "))
        .unwrap();
    assert!(line.split(' ').nth(3).unwrap().starts_with("rw,"), "{line}");
    assert!(!out.contains(fixture.dir.path().to_str().unwrap()), "{out}");
    // The control socket's directory is root's: the sandbox user neither reaches nor
    // replaces the socket (its host side is warren's, 0700).
    let (_, out) = sh(
        &backend,
        sandbox,
        "ls /run/warren/ 2>&1; \
        rm -f /run/warren/control.sock 2>&1; ls / 2>&1 | head -3; stat -c %F /tmp 2>&1",
    )
    .await;
    eprintln!("{out}");
    assert!(!out.contains("control.sock\n"), "{out}");

    // Identity: the same spec is served by the same runtime; another tier is not.
    backend.create(&spec).await.unwrap();
    let discovered = backend.discover().await.unwrap();
    assert_eq!(discovered.len(), 1);
    assert_eq!(discovered[0].spec.binding.isolation, IsolationTier::Gvisor);
    // The host cgroup runsc made holds the whole sandbox (I22): the Sentry's memory and
    // CPU are what the runtime costs; its memory limit is the backend's (I23).
    let usage = backend.usage(sandbox).await.unwrap().expect("usage");
    assert!(
        usage.memory_current > 0 && usage.cpu_usage_usec > 0,
        "{usage:?}"
    );
    assert_eq!(usage.memory_max, RuntimeLimits::default().memory_bytes);
    // Its process count is the Sentry's tasks, not the runtime's processes: no pressure.
    assert_eq!(backend.process_pressure(sandbox).await.unwrap(), None);

    backend.destroy(sandbox).await.expect("destroy");
    backend.destroy(sandbox).await.expect("destroy again");
    fixture.assert_nothing_left(sandbox).await;
    // The workspace is the user's: destroy never touches it (I15).
    assert!(fixture.workspace().join(THREAD).join("written").exists());
}

async fn restart(host: GvisorHost) {
    let fixture = Fixture::new();
    let kept = fixture.spec("kept");
    let leaked = fixture.spec("leaked");
    {
        let backend = fixture.backend(&host);
        backend.create(&kept).await.unwrap();
        backend.create(&leaked).await.unwrap();
    }
    // A crash that lost the leaked runtime's record and directory: its container is
    // under warren's runsc root, claimed by nothing.
    std::fs::remove_dir_all(
        fixture
            .data()
            .join("runtimes")
            .join(leaked.sandbox.as_str()),
    )
    .unwrap();
    let backend = fixture.backend(&host);
    let found = backend.discover().await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].spec, kept);
    let (code, out) = sh(&backend, &kept.sandbox, "cat /mnt/user-data/hello").await;
    assert_eq!((code, out.as_str()), (Some(0), "from the host"));
    let listed = std::process::Command::new("runsc")
        .arg(format!("--root={}", fixture.data().join("runsc").display()))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(!listed.contains(leaked.sandbox.as_str()), "{listed}");
    assert!(listed.contains(kept.sandbox.as_str()), "{listed}");
    // A spec of the other tier is not served by this runtime: it is replaced.
    backend.destroy(&kept.sandbox).await.unwrap();
    fixture.assert_nothing_left(&kept.sandbox).await;
    fixture.assert_nothing_left(&leaked.sandbox).await;
}

async fn swapped_workdir(host: GvisorHost) {
    let fixture = Fixture::new();
    let backend = fixture.backend(&host);
    let spec = fixture.spec("swapped");
    // What a sandbox of the same uid could do from its own runtime.
    let workdir = fixture.workspace().join(THREAD);
    std::fs::rename(&workdir, workdir.with_file_name("user-data.real")).unwrap();
    std::os::unix::fs::symlink("/etc", &workdir).unwrap();
    let error = backend.create(&spec).await.unwrap_err();
    let chain = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(chain.contains("/mnt/user-data"), "{chain}");
    fixture.assert_nothing_left(&spec.sandbox).await;
    // A parent component swapped instead: refused the same way.
    std::fs::remove_file(&workdir).unwrap();
    std::fs::rename(workdir.with_file_name("user-data.real"), &workdir).unwrap();
    let threads = fixture.workspace().join("threads");
    std::fs::rename(&threads, threads.with_file_name("threads.real")).unwrap();
    std::os::unix::fs::symlink("/etc", &threads).unwrap();
    assert!(backend.create(&spec).await.is_err());
    fixture.assert_nothing_left(&spec.sandbox).await;
}

async fn seeded(host: GvisorHost) {
    let fixture = Fixture::new();
    let backend = fixture.backend(&host);
    let spec = fixture.spec("seeded");
    backend
        .create(&spec)
        .await
        .expect("a gVisor runtime starts");
    let (code, out) = sh(
        &backend,
        &spec.sandbox,
        "echo kept > /home/gem/note; mkdir -p /home/gem/.cache; ln -s /etc/shadow /home/gem/.cache/link",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    // Out: the agent sends the home, unpacked by descriptor into warren's staging.
    let roots = backend
        .ephemeral_roots(&spec.sandbox)
        .await
        .unwrap()
        .expect("a running gVisor runtime has ephemeral roots");
    let home = roots.home.expect("the layout's home is ephemeral");
    assert_eq!(
        std::fs::read_to_string(home.join("note")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_link(home.join(".cache/link")).unwrap(),
        std::path::Path::new("/etc/shadow"),
        "a link stays a link, never followed on the host"
    );
    assert_eq!(std::fs::read_dir(&roots.cow).unwrap().count(), 0);
    let seed = fixture.dir.path().join("seed");
    std::fs::create_dir_all(&seed).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&home)
        .arg(seed.join("home"))
        .status()
        .unwrap();
    assert!(copied.success());
    backend.destroy(&spec.sandbox).await.expect("destroy");
    // In: a new generation from the seed finds the home, owned by the sandbox user.
    let resumed = RuntimeSpec {
        generation: spec.generation + 1,
        seed: Some(seed),
        ..spec.clone()
    };
    backend
        .create(&resumed)
        .await
        .expect("a seeded runtime starts");
    let (code, out) = sh(
        &backend,
        &resumed.sandbox,
        "cat /home/gem/note; readlink /home/gem/.cache/link; python3 -c \"import os; print(os.stat('/home/gem/note').st_uid)\"",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "kept\n/etc/shadow\n1000\n"));
    backend.destroy(&resumed.sandbox).await.expect("destroy");
    fixture.assert_nothing_left(&resumed.sandbox).await;
}

async fn switch_tiers(host: GvisorHost) {
    let fixture = Fixture::new();
    let backend = fixture.backend(&host);
    let gvisor = fixture.spec("switch");
    let kernel = RuntimeSpec {
        binding: warren_core::Binding {
            isolation: IsolationTier::Kernel,
            ..gvisor.clone().binding
        },
        ..gvisor.clone()
    };
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    backend
        .create(&kernel)
        .await
        .expect("a kernel-tier runtime starts");
    let (_, version) = sh(&backend, &kernel.sandbox, "cat /proc/version").await;
    assert_eq!(version.trim(), host_version.trim());
    // The tier is part of the identity (I16): the kernel runtime does not serve a gVisor
    // spec, it is replaced, and back.
    backend.create(&gvisor).await.unwrap();
    let (_, version) = sh(&backend, &gvisor.sandbox, "cat /proc/version").await;
    assert_ne!(version.trim(), host_version.trim());
    backend.create(&kernel).await.unwrap();
    let (_, version) = sh(&backend, &kernel.sandbox, "cat /proc/version").await;
    assert_eq!(version.trim(), host_version.trim());
    // Home moves through the control socket are the gVisor agent's: the kernel tier's init
    // (root of its runtime) refuses them; its host reads the home by descriptor.
    let runtime_dir = fixture
        .data()
        .join("runtimes")
        .join(kernel.sandbox.as_str());
    let into = fixture.dir.path().join("moved-home");
    std::fs::create_dir(&into).unwrap();
    let refused = warren_agent::client::archive_home(&runtime_dir, &into, 1 << 20)
        .expect_err("the kernel tier's init moves no home");
    let refused = match refused {
        warren_agent::client::RunError::Io(e) | warren_agent::client::RunError::Gone(e) => e,
    };
    assert!(
        refused.to_string().contains("read by descriptor"),
        "{refused}"
    );
    assert_eq!(std::fs::read_dir(&into).unwrap().count(), 0);
    let listed = std::process::Command::new("runsc")
        .arg(format!("--root={}", fixture.data().join("runsc").display()))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).trim().is_empty());
    backend.destroy(&kernel.sandbox).await.unwrap();
    fixture.assert_nothing_left(&kernel.sandbox).await;
}
