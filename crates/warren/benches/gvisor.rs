//! The gVisor tier's cost (issue 19), measured in one run on both isolation tiers of the
//! local and the Docker backend, beside `runsc do` and `docker run` (runsc and runc) of the
//! same commands. Not a test: it asserts nothing about speed, it prints; it fails loudly
//! when something it measures cannot run (no dockerd, no runsc, a tier refused).
//!
//! Run as root with dockerd running, runsc registered with dockerd as `runsc` and the test
//! image built (`scripts/test` does all three):
//! `cargo bench -p warren --bench gvisor` (`-- --iterations N`, default 30).
//!
//! Per backend, with one server and both tiers chosen per sandbox (`"isolation"`), the
//! kernel and gVisor sandboxes interleaved so that the machine's load falls on both alike:
//!
//! - create + first exec: `POST /v1/sandboxes` then the first exec of `true`, N times per
//!   tier (each a new sandbox; all destroyed after the timing);
//! - memory per idle runtime, of each of those N runtimes after a few seconds idle, the
//!   median: the host cgroup's charge (v1 `memory.usage_in_bytes`, v2 `memory.current`),
//!   and the summed PSS of the cgroup's processes (cgroup v1 leaves what a process touched
//!   before it joined charged to where it came from: the kernel tier's init);
//! - warm exec: `true` through the API, in one running sandbox per tier;
//! - 200 fork+exec: `for i in $(seq 200); do /bin/true; done`, timed inside the sandbox
//!   with `date +%s%N` (so the anchors, which pay a container start, are timed alike);
//! - a small build: 10 C files written into the workspace, compiled one by one with `cc
//!   -O1 -c` and linked, timed through the API. The Docker test image has no compiler: the
//!   Docker build sandboxes run a derived image with the host's Debian gcc packages copied
//!   in (`warren-bench-cc:bookworm-2`, made once from the test image).
//!
//! The anchors: `runsc --network=none --platform=ptrace do <cmd>` (state in a fresh 0711
//! TMPDIR) and `docker run --rm --network=none <image> <cmd>` with `--runtime=runsc` and
//! with runc, for `true` and for the fork loop; and the idle memory of `docker run -d ...
//! sleep infinity` containers on both runtimes.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::latency::percentile;
use warren_test_support::{require_docker, TestServer, DOCKER_TEST_IMAGE};

/// The two tiers, in the order every table shows them.
const TIERS: [&str; 2] = ["kernel", "gvisor"];
/// The image of the Docker build sandboxes: the test image plus the host's C toolchain.
const CC_IMAGE: &str = "warren-bench-cc:bookworm-2";
/// Untimed rounds before each timed series.
const WARM_UP: usize = 3;
/// How long the runtimes sit idle before their memory is read.
const IDLE: Duration = Duration::from_secs(5);
/// The syscall-heavy loop, printing its own duration in microseconds.
const FORK_LOOP: &str = "s=$(date +%s%N); for i in $(seq 200); do /bin/true; done; \
                         e=$(date +%s%N); echo $(( (e - s) / 1000 ))";
/// The small build, run in its directory of the workdir.
const BUILD: &str = "rm -f *.o app && for f in *.c; do cc -O1 -c \"$f\" || exit 1; done \
                     && cc -o app *.o && ./app";
/// How many C files the build compiles (one of them `main.c`).
const BUILD_FILES: usize = 10;

/// The runsc flags of the local tier and of dockerd's registered runtime.
const RUNSC_FLAGS: [&str; 2] = ["--network=none", "--platform=ptrace"];

/// What one backend measured on one tier.
#[derive(Default)]
struct TierFigures {
    create: Vec<Duration>,
    warm: Vec<Duration>,
    forks: Vec<Duration>,
    /// The fork loop's exec through the API, for the console's detail.
    forks_api: Vec<Duration>,
    build: Vec<Duration>,
    /// Bytes charged to each idle runtime's cgroup, with its anonymous and file parts.
    idle: Vec<Memory>,
}

/// What the anchors measured.
#[derive(Default)]
struct Anchor {
    create: Vec<Duration>,
    forks: Vec<Duration>,
    idle: Vec<Memory>,
}

/// One idle runtime's memory on the host.
#[derive(Debug, Clone, Copy)]
struct Memory {
    /// The cgroup's charge (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    total: u64,
    /// Its anonymous and page-cache parts (`memory.stat`).
    anon: u64,
    file: u64,
    /// The proportional set size of the processes in the cgroup, summed: it also counts
    /// what they touched before they joined it, which cgroup v1 leaves charged to the
    /// cgroup they came from (the kernel tier's init), and shares what the runtimes map
    /// alike (runsc's text) among them.
    pss: u64,
}

#[tokio::main]
async fn main() {
    let iterations: usize = warren_test_support::latency::iterations(30);
    let warm_n = 100;
    let fork_n = 10;
    let build_n = 5;
    let started = Instant::now();

    // Everything this run needs, checked before anything is timed.
    require_docker();
    let runtimes = warren_test_support::docker(&["info", "--format", "{{json .Runtimes}}"]);
    assert!(
        runtimes.contains("\"runsc\""),
        "dockerd has no runtime `runsc` registered ({runtimes}): scripts/test registers it"
    );
    let runsc_version = command_output("runsc", &["--version"]);
    let runsc_version = runsc_version.lines().next().unwrap_or_default().to_owned();
    let engine = warren_test_support::docker(&["version", "--format", "{{.Server.Version}}"]);
    let kernel = command_output("uname", &["-r"]);
    ensure_cc_image();
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));

    println!(
        "warren gVisor tier vs kernel tier (issue 19), one run on this machine: {} cores, \
         Linux {}, {runsc_version} (ptrace platform), Docker {engine}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    );
    println!(
        "N = {iterations} creates per tier, {warm_n} warm execs, {fork_n} fork loops, \
         {build_n} builds ({BUILD_FILES} C files), memory after {} s idle\n",
        IDLE.as_secs()
    );

    let local = {
        let server = TestServer::start_local(bin);
        let figures =
            measure_backend(&server, "local", None, iterations, warm_n, fork_n, build_n).await;
        drop(server);
        figures
    };
    let docker = {
        let server = TestServer::start_docker(bin);
        let figures = measure_backend(
            &server,
            "docker",
            Some(CC_IMAGE),
            iterations,
            warm_n,
            fork_n,
            build_n,
        )
        .await;
        drop(server);
        figures
    };

    println!("anchors");
    let runsc_do = runsc_do_anchor(iterations, fork_n);
    let docker_runsc = docker_anchor(Some("runsc"), iterations, fork_n).await;
    let docker_runc = docker_anchor(None, iterations, fork_n).await;
    for (name, anchor) in [
        ("runsc do", &runsc_do),
        ("docker run --runtime=runsc", &docker_runsc),
        ("docker run (runc)", &docker_runc),
    ] {
        let mut create = anchor.create.clone();
        let mut forks = anchor.forks.clone();
        println!(
            "  {name:<28} true: p50 {:>9}  p99 {:>9}   200 fork+exec p50 {:>9}   idle memory {}",
            ms(percentile(&mut create, 0.5)),
            ms(percentile(&mut create, 0.99)),
            ms(percentile(&mut forks, 0.5)),
            memory_detail(&anchor.idle),
        );
    }
    for (backend, figures) in [("local", &local), ("docker", &docker)] {
        let mut gvisor = figures[1].create.clone();
        let gvisor_p50 = percentile(&mut gvisor, 0.5);
        let mut forks = figures[1].forks.clone();
        let forks_p50 = percentile(&mut forks, 0.5);
        for (name, anchor) in [
            ("runsc do", &runsc_do),
            ("docker run --runtime=runsc", &docker_runsc),
        ] {
            let mut create = anchor.create.clone();
            let mut anchor_forks = anchor.forks.clone();
            println!(
                "  {backend} gvisor / {name}: create + first exec p50 {:.2}x, 200 fork+exec p50 {:.2}x",
                ratio(gvisor_p50, percentile(&mut create, 0.5)),
                ratio(forks_p50, percentile(&mut anchor_forks, 0.5)),
            );
        }
    }

    println!(
        "\nsummary (p50 unless named; N = {iterations} creates per tier; total run {:.0} s)\n",
        started.elapsed().as_secs_f64()
    );
    print!(
        "{}",
        summary(
            &[("local", &local), ("docker", &docker)],
            [&runsc_do, &docker_runsc, &docker_runc],
            iterations
        )
    );
}

/// One server, both tiers: every figure but the anchors'.
async fn measure_backend(
    server: &TestServer,
    backend: &str,
    build_image: Option<&str>,
    iterations: usize,
    warm_n: usize,
    fork_n: usize,
    build_n: usize,
) -> [TierFigures; 2] {
    let mut figures: [TierFigures; 2] = Default::default();
    server.workdir("bench", "projects/p").await;
    println!("{backend} backend");

    // Create + first exec, interleaved; every sandbox stays up for the memory reading.
    let mut cold: [Vec<String>; 2] = Default::default();
    for i in 0..WARM_UP + iterations {
        for (t, tier) in TIERS.iter().enumerate() {
            let began = Instant::now();
            let id = create(server, &format!("cold-{tier}-{i}"), tier, None).await;
            exec_ok(server, &id, json!({"argv": ["true"]})).await;
            if i >= WARM_UP {
                figures[t].create.push(began.elapsed());
            }
            cold[t].push(id);
        }
    }
    tokio::time::sleep(IDLE).await;
    for (t, ids) in cold.iter().enumerate() {
        for id in &ids[WARM_UP..] {
            figures[t].idle.push(sandbox_memory(server, backend, id));
        }
    }
    for id in cold.iter().flatten() {
        server
            .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
            .await;
    }
    // The destroyed runtimes' teardown finishes asynchronously: not inside the next timing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    pair_row("create + first exec", &mut figures, |f| &mut f.create, true);
    for (name, select) in [
        ("idle memory: cgroup charge", charge as fn(&Memory) -> u64),
        (
            "idle memory: PSS of its processes",
            pss as fn(&Memory) -> u64,
        ),
    ] {
        let (k, g) = (
            median_memory(&figures[0].idle, select),
            median_memory(&figures[1].idle, select),
        );
        println!(
            "  {name:<34} kernel {:>9}   gvisor {:>9}   ratio {:.1}x",
            mib(k),
            mib(g),
            g as f64 / k.max(1) as f64
        );
    }
    println!(
        "    median runtime: kernel {}; gvisor {}",
        memory_detail(&figures[0].idle),
        memory_detail(&figures[1].idle),
    );

    // Warm exec and the fork loop, in one running sandbox per tier.
    let mut warm_ids = Vec::new();
    for tier in TIERS {
        let id = create(server, &format!("warm-{tier}"), tier, None).await;
        exec_ok(server, &id, json!({"argv": ["true"]})).await;
        warm_ids.push(id);
    }
    for i in 0..WARM_UP + warm_n {
        for (t, id) in warm_ids.iter().enumerate() {
            let (elapsed, _) = exec_ok(server, id, json!({"argv": ["true"]})).await;
            if i >= WARM_UP {
                figures[t].warm.push(elapsed);
            }
        }
    }
    pair_row("warm exec", &mut figures, |f| &mut f.warm, false);
    for i in 0..1 + fork_n {
        for (t, id) in warm_ids.iter().enumerate() {
            let (elapsed, result) =
                exec_ok(server, id, json!({"command": FORK_LOOP, "timeout_s": 600})).await;
            if i >= 1 {
                figures[t].forks.push(inner_time(&result));
                figures[t].forks_api.push(elapsed);
            }
        }
    }
    pair_row(
        "200 fork+exec (timed inside)",
        &mut figures,
        |f| &mut f.forks,
        false,
    );
    pair_row(
        "200 fork+exec (exec through API)",
        &mut figures,
        |f| &mut f.forks_api,
        false,
    );

    // The small build, in its own sandbox per tier (the Docker ones on the compiler image).
    let mut build_ids = Vec::new();
    for tier in TIERS {
        let dir = format!("build-{tier}");
        write_sources(&server.workspace_of("bench").join("projects/p").join(&dir));
        let id = create(server, &format!("build-{tier}"), tier, build_image).await;
        build_ids.push((id, dir));
    }
    for i in 0..1 + build_n {
        for (t, (id, dir)) in build_ids.iter().enumerate() {
            let (elapsed, result) = exec_ok(
                server,
                id,
                json!({"command": format!("cd {dir} && {BUILD}"), "timeout_s": 600}),
            )
            .await;
            assert!(
                result["stdout"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("sum "),
                "the build's program printed no sum: {result}"
            );
            if i >= 1 {
                figures[t].build.push(elapsed);
            }
        }
    }
    pair_row(
        &format!("small build ({BUILD_FILES} C files)"),
        &mut figures,
        |f| &mut f.build,
        false,
    );
    for id in warm_ids.iter().chain(build_ids.iter().map(|(id, _)| id)) {
        server
            .send_json(server.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
            .await;
    }
    println!();
    figures
}

/// `POST /v1/sandboxes` on `tier`, asserting 201; the sandbox id.
async fn create(server: &TestServer, scope: &str, tier: &str, image: Option<&str>) -> String {
    let mut body = json!({
        "uid": "bench", "runtime_scope_id": scope, "workdir": "projects/p", "isolation": tier,
    });
    if let Some(image) = image {
        body["image"] = json!(image);
    }
    let (status, answer) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
        .await;
    assert_eq!(status, 201, "create a {tier} sandbox: {answer}");
    answer["sandbox_id"].as_str().unwrap().to_owned()
}

/// One exec, asserting exit 0; its wall time through the API and its result.
async fn exec_ok(server: &TestServer, id: &str, body: Value) -> (Duration, Value) {
    let began = Instant::now();
    let result = server.exec_with(id, body.clone()).await;
    let elapsed = began.elapsed();
    assert_eq!(result["exit_code"], 0, "exec {body}: {result}");
    (elapsed, result)
}

/// The microseconds the fork loop printed.
fn inner_time(result: &Value) -> Duration {
    let stdout = result["stdout"].as_str().unwrap_or_default();
    parse_micros(stdout).unwrap_or_else(|| panic!("the fork loop printed no time: {result}"))
}

fn parse_micros(stdout: &str) -> Option<Duration> {
    stdout
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .map(Duration::from_micros)
}

/// The cgroup charge of a sandbox's runtime: the local backend's `warren/<instance>-<id>`,
/// the Docker container's own cgroup.
fn sandbox_memory(server: &TestServer, backend: &str, id: &str) -> Memory {
    if backend == "local" {
        let name = format!(
            "{}-{id}",
            warren_test_support::docker_instance(&server.data_dir())
        );
        return cgroup_memory(&format!("/warren/{name}"))
            .unwrap_or_else(|| panic!("no memory cgroup warren/{name} for sandbox {id}"));
    }
    let filter = format!("label=dev.warren.sandbox={id}");
    let container = warren_test_support::docker(&["ps", "-q", "--no-trunc", "--filter", &filter]);
    assert!(!container.is_empty(), "no container for sandbox {id}");
    container_memory(container.lines().next().unwrap())
}

/// A container's cgroup charge, found through its main process's `/proc/<pid>/cgroup`.
fn container_memory(container: &str) -> Memory {
    let pid = warren_test_support::docker(&["inspect", "--format", "{{.State.Pid}}", container]);
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_else(|e| panic!("container {container} (pid {pid}): {e}"));
    let path = cgroups
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        })
        .or_else(|| {
            cgroups
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_else(|| panic!("container {container}: no memory cgroup in {cgroups}"));
    cgroup_memory(&path)
        .unwrap_or_else(|| panic!("container {container}: cannot read the cgroup {path}"))
}

/// The charge of the cgroup at `path` (relative to the hierarchy's root): v1's memory
/// hierarchy first, then v2's.
fn cgroup_memory(path: &str) -> Option<Memory> {
    let path = path.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory").join(path);
    if let Some(total) = read_u64(&v1.join("memory.usage_in_bytes")) {
        let stat = std::fs::read_to_string(v1.join("memory.stat")).unwrap_or_default();
        return Some(Memory {
            total,
            anon: stat_field(&stat, "total_rss"),
            file: stat_field(&stat, "total_cache"),
            pss: pss_of(&v1),
        });
    }
    let v2 = Path::new("/sys/fs/cgroup").join(path);
    let total = read_u64(&v2.join("memory.current"))?;
    let stat = std::fs::read_to_string(v2.join("memory.stat")).unwrap_or_default();
    Some(Memory {
        total,
        anon: stat_field(&stat, "anon"),
        file: stat_field(&stat, "file"),
        pss: pss_of(&v2),
    })
}

/// The summed `Pss` of the processes of the cgroup at `dir` and of its descendants.
fn pss_of(dir: &Path) -> u64 {
    let mut total = 0;
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.split_whitespace() {
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        total += stat_field(&rollup.replace(':', ""), "Pss") * 1024;
    }
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            total += pss_of(&child.path());
        }
    }
    total
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The number after `field` on its line of a `memory.stat` (or of a colon-less
/// `smaps_rollup`: `Pss  123 kB`).
fn stat_field(stat: &str, field: &str) -> u64 {
    stat.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?;
            rest.starts_with(' ')
                .then(|| rest.split_whitespace().next()?.parse().ok())
                .flatten()
        })
        .unwrap_or(0)
}

/// `runsc do` of `true` and of the fork loop, its state under a fresh 0711 TMPDIR.
fn runsc_do_anchor(iterations: usize, fork_n: usize) -> Anchor {
    let dir = tempfile::Builder::new()
        .prefix("warren-bench-runsc-")
        .tempdir()
        .expect("a temporary dir for runsc do");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let root = dir.path().join("root");
    let runsc = |program: &[&str]| {
        let mut command = Command::new("runsc");
        command
            .env("TMPDIR", dir.path())
            .arg(format!("--root={}", root.display()))
            .args(RUNSC_FLAGS)
            .arg("do")
            .args(program)
            .stdin(Stdio::null());
        command
    };
    let mut anchor = Anchor::default();
    for i in 0..WARM_UP + iterations {
        let (elapsed, _) = timed(runsc(&["true"]));
        if i >= WARM_UP {
            anchor.create.push(elapsed);
        }
    }
    for i in 0..1 + fork_n {
        let (_, stdout) = timed(runsc(&["sh", "-c", FORK_LOOP]));
        if i >= 1 {
            anchor.forks.push(
                parse_micros(&stdout)
                    .unwrap_or_else(|| panic!("runsc do: the fork loop printed {stdout:?}")),
            );
        }
    }
    anchor
}

/// `docker run --rm` of `true` and of the fork loop on `runtime` (runc by default), and
/// the idle memory of `sleep infinity` containers.
async fn docker_anchor(runtime: Option<&str>, iterations: usize, fork_n: usize) -> Anchor {
    let docker = |extra: &[&str], program: &[&str]| {
        let mut command = Command::new("docker");
        command.args(["run", "--network=none"]).args(extra);
        if let Some(runtime) = runtime {
            command.arg(format!("--runtime={runtime}"));
        }
        command
            .arg(DOCKER_TEST_IMAGE)
            .args(program)
            .stdin(Stdio::null());
        command
    };
    let mut anchor = Anchor::default();
    for i in 0..WARM_UP + iterations {
        let (elapsed, _) = timed(docker(&["--rm"], &["true"]));
        if i >= WARM_UP {
            anchor.create.push(elapsed);
        }
    }
    for i in 0..1 + fork_n {
        let (_, stdout) = timed(docker(&["--rm"], &["sh", "-c", FORK_LOOP]));
        if i >= 1 {
            anchor.forks.push(
                parse_micros(&stdout)
                    .unwrap_or_else(|| panic!("docker run: the fork loop printed {stdout:?}")),
            );
        }
    }
    let containers: Vec<String> = (0..3)
        .map(|_| {
            let (_, id) = timed(docker(&["-d"], &["sleep", "infinity"]));
            id.trim().to_owned()
        })
        .collect();
    tokio::time::sleep(IDLE).await;
    anchor.idle = containers.iter().map(|c| container_memory(c)).collect();
    for container in &containers {
        warren_test_support::docker(&["rm", "-f", container]);
    }
    anchor
}

/// Runs `command` to exit 0; its wall time and stdout.
fn timed(mut command: Command) -> (Duration, String) {
    let began = Instant::now();
    let output = command.output().expect("run an anchor");
    let elapsed = began.elapsed();
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        elapsed,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

fn command_output(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(output.status.success(), "{program} {args:?} failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The small build's sources, owned by the sandbox user: `main.c` calling nine modules,
/// each a little arithmetic and a header of libc's.
fn write_sources(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let modules = BUILD_FILES - 1;
    let mut header = String::from("#include <stdint.h>\n#include <stdlib.h>\n");
    let mut main = String::from(
        "#include <stdio.h>\n#include \"mods.h\"\nint main(void) {\n  uint64_t sum = 0;\n",
    );
    for m in 0..modules {
        writeln!(header, "uint64_t mod{m}(uint64_t seed);").unwrap();
        writeln!(main, "  sum += mod{m}({m});").unwrap();
        let source = format!(
            "#include <stdio.h>\n#include <string.h>\n#include \"mods.h\"\n\
             struct item {{ uint64_t key; char name[16]; }};\n\
             static int compare(const void *a, const void *b) {{\n\
             \x20 const struct item *x = a, *y = b;\n\
             \x20 return (x->key > y->key) - (x->key < y->key);\n}}\n\
             uint64_t mod{m}(uint64_t seed) {{\n\
             \x20 struct item items[64];\n\
             \x20 for (int i = 0; i < 64; i++) {{\n\
             \x20   seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;\n\
             \x20   items[i].key = seed >> 33;\n\
             \x20   snprintf(items[i].name, sizeof items[i].name, \"m{m}-%d\", i);\n\
             \x20 }}\n\
             \x20 qsort(items, 64, sizeof items[0], compare);\n\
             \x20 uint64_t h = 0;\n\
             \x20 for (int i = 0; i < 64; i++) h = h * 31 + items[i].key + strlen(items[i].name);\n\
             \x20 return h;\n}}\n"
        );
        std::fs::write(dir.join(format!("mod{m}.c")), source).unwrap();
    }
    main.push_str("  printf(\"sum %llu\\n\", (unsigned long long)sum);\n  return 0;\n}\n");
    std::fs::write(dir.join("mods.h"), header).unwrap();
    std::fs::write(dir.join("main.c"), main).unwrap();
    for path in std::iter::once(dir.to_owned())
        .chain(std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()))
    {
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    }
}

/// Makes [`CC_IMAGE`] once: the test image plus the files of the host's (Debian bookworm,
/// like the image) gcc packages, copied into a created container and committed.
fn ensure_cc_image() {
    if Command::new("docker")
        .args(["image", "inspect", CC_IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return;
    }
    let packages = [
        "binutils",
        "binutils-common",
        "binutils-x86-64-linux-gnu",
        "cpp",
        "cpp-12",
        "gcc",
        "gcc-12",
        "libbinutils",
        "libc-dev-bin",
        "libc6-dev",
        "libcc1-0",
        "libcrypt-dev",
        "libctf-nobfd0",
        "libctf0",
        "libgcc-12-dev",
        "libisl23",
        "libjansson4",
        "libmpc3",
        "libmpfr6",
        "libnsl-dev",
        "libtirpc-dev",
        "linux-libc-dev",
        "rpcsvc-proto",
    ];
    println!("building {CC_IMAGE} (once): {DOCKER_TEST_IMAGE} + the host's gcc packages");
    let listed = command_output("dpkg", &[&["-L"][..], &packages[..]].concat());
    let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
    for line in listed.lines().filter(|l| l.starts_with('/')) {
        let host = Path::new(line);
        if [
            "/usr/share/doc",
            "/usr/share/man",
            "/usr/share/info",
            "/usr/share/locale",
        ]
        .iter()
        .any(|skip| host.starts_with(skip))
        {
            continue;
        }
        // Directories, and links to them (`/lib` of merged /usr), are the image's own.
        if std::fs::symlink_metadata(host).is_err() || host.is_dir() {
            continue;
        }
        // Merged /usr: `/lib/...` is `/usr/lib/...` in the image too, where `/lib` is a
        // link the archive must not replace.
        let (Some(parent), Some(name)) = (host.parent(), host.file_name()) else {
            continue;
        };
        let inside = parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_owned())
            .join(name);
        files.push((host.to_owned(), inside));
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    files.dedup_by(|a, b| a.1 == b.1);
    let name = format!("warren-bench-cc-{}", std::process::id());
    command_output(
        "docker",
        &["create", "--name", &name, DOCKER_TEST_IMAGE, "true"],
    );
    let mut copy = Command::new("docker")
        .args(["cp", "-", &format!("{name}:/")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("docker cp");
    {
        let mut archive = tar::Builder::new(copy.stdin.take().unwrap());
        archive.follow_symlinks(false);
        for (host, inside) in &files {
            archive
                .append_path_with_name(host, inside.strip_prefix("/").unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", host.display()));
        }
        // `cc` is an alternative (update-alternatives), not a file of any package.
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_mode(0o777);
        archive.append_link(&mut link, "usr/bin/cc", "gcc").unwrap();
        archive.into_inner().unwrap().flush().unwrap();
    }
    assert!(
        copy.wait().unwrap().success(),
        "docker cp into {name} failed"
    );
    command_output("docker", &["commit", &name, CC_IMAGE]);
    command_output("docker", &["rm", &name]);
}

/// One console row: both tiers' p50 (and p99 when asked) and their ratio.
fn pair_row(
    name: &str,
    figures: &mut [TierFigures; 2],
    field: impl Fn(&mut TierFigures) -> &mut Vec<Duration>,
    p99: bool,
) {
    let [kernel, gvisor] = figures;
    let (k, g) = (field(kernel), field(gvisor));
    let (k50, g50) = (percentile(k, 0.5), percentile(g, 0.5));
    let mut line = format!(
        "  {name:<34} kernel p50 {:>9}   gvisor p50 {:>9}   ratio {:.1}x",
        ms(k50),
        ms(g50),
        ratio(g50, k50)
    );
    if p99 {
        let (k99, g99) = (percentile(k, 0.99), percentile(g, 0.99));
        write!(
            line,
            "   (p99 kernel {} gvisor {}, ratio {:.1}x)",
            ms(k99),
            ms(g99),
            ratio(g99, k99)
        )
        .unwrap();
    }
    println!("{line}");
}

/// The markdown table of the README.
fn summary(
    backends: &[(&str, &[TierFigures; 2])],
    anchors: [&Anchor; 3],
    iterations: usize,
) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "| backend | figure | kernel | gvisor | gvisor / kernel | `runsc do` | `docker run --runtime=runsc` | `docker run` (runc) |"
    )
    .unwrap();
    writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|").unwrap();
    let anchor_time = |select: fn(&Anchor) -> &Vec<Duration>, p: f64| -> [String; 3] {
        anchors.map(|anchor| {
            let mut samples = select(anchor).clone();
            if samples.is_empty() {
                "–".to_owned()
            } else {
                ms(percentile(&mut samples, p))
            }
        })
    };
    let none = || ["–".to_owned(), "–".to_owned(), "–".to_owned()];
    let mut undercharged = false;
    for (backend, figures) in backends {
        let time_row = |out: &mut String,
                        name: &str,
                        select: fn(&TierFigures) -> &Vec<Duration>,
                        p: f64,
                        anchor: [String; 3]| {
            let k = percentile(&mut select(&figures[0]).clone(), p);
            let g = percentile(&mut select(&figures[1]).clone(), p);
            writeln!(
                out,
                "| {backend} | {name} | {} | {} | {:.1}x | {} | {} | {} |",
                ms(k),
                ms(g),
                ratio(g, k),
                anchor[0],
                anchor[1],
                anchor[2]
            )
            .unwrap();
        };
        time_row(
            &mut out,
            &format!("create + first exec p50 (N = {iterations})"),
            |f| &f.create,
            0.5,
            anchor_time(|a| &a.create, 0.5),
        );
        time_row(
            &mut out,
            &format!("create + first exec p99 (N = {iterations})"),
            |f| &f.create,
            0.99,
            anchor_time(|a| &a.create, 0.99),
        );
        time_row(&mut out, "warm exec p50", |f| &f.warm, 0.5, none());
        time_row(
            &mut out,
            "200 fork+exec",
            |f| &f.forks,
            0.5,
            anchor_time(|a| &a.forks, 0.5),
        );
        time_row(
            &mut out,
            &format!("small build ({BUILD_FILES} C files)"),
            |f| &f.build,
            0.5,
            none(),
        );
        for (name, select, is_charge) in [
            (
                "memory per idle runtime: cgroup charge",
                charge as fn(&Memory) -> u64,
                true,
            ),
            (
                "memory per idle runtime: PSS of its processes",
                pss as fn(&Memory) -> u64,
                false,
            ),
        ] {
            let (k, g) = (
                median_memory(&figures[0].idle, select),
                median_memory(&figures[1].idle, select),
            );
            // A charge below half the PSS is mostly elsewhere (see the note).
            let marks = figures.each_ref().map(|tier| {
                is_charge && median_memory(&tier.idle, charge) * 2 < median_memory(&tier.idle, pss)
            });
            undercharged |= marks.contains(&true);
            let mark = |tier: usize| if marks[tier] { "¹" } else { "" };
            let memory_ratio = if marks.contains(&true) {
                "n/a¹".to_owned()
            } else {
                format!("{:.1}x", g as f64 / k.max(1) as f64)
            };
            let anchor_memory = anchors.map(|anchor| {
                if anchor.idle.is_empty() {
                    "–".to_owned()
                } else {
                    mib(median_memory(&anchor.idle, select))
                }
            });
            writeln!(
                out,
                "| {backend} | {name} | {}{} | {}{} | {memory_ratio} | {} | {} | {} |",
                mib(k),
                mark(0),
                mib(g),
                mark(1),
                anchor_memory[0],
                anchor_memory[1],
                anchor_memory[2]
            )
            .unwrap();
        }
    }
    if undercharged {
        writeln!(
            out,
            "\n¹ Not the runtime's cost: cgroup v1 charges a page to the cgroup of the process \
             that first touched it, and the kernel tier's init is forked by warren and joins \
             its cgroup after, so most of its pages stay charged to warren's. The PSS row is \
             the comparable figure."
        )
        .unwrap();
    }
    out
}

fn charge(memory: &Memory) -> u64 {
    memory.total
}

fn pss(memory: &Memory) -> u64 {
    memory.pss
}

/// The median of one figure of `samples`.
fn median_memory(samples: &[Memory], select: fn(&Memory) -> u64) -> u64 {
    let mut values: Vec<u64> = samples.iter().map(select).collect();
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// The runtime of the median charge: its charge, anonymous and file parts, and PSS.
fn memory_detail(samples: &[Memory]) -> String {
    let median = median_memory(samples, charge);
    let Some(m) = samples.iter().find(|m| m.total == median) else {
        return "–".to_owned();
    };
    format!(
        "charge {} (anon {}, file {}), PSS {}",
        mib(m.total),
        mib(m.anon),
        mib(m.file),
        mib(m.pss)
    )
}

fn ratio(ours: Duration, base: Duration) -> f64 {
    ours.as_secs_f64() / base.as_secs_f64().max(1e-9)
}

/// Milliseconds, or seconds from 10 s up.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// MiB, with two decimals below 10.
fn mib(bytes: u64) -> String {
    let mib = bytes as f64 / 1048576.0;
    if mib >= 10.0 {
        format!("{mib:.1} MiB")
    } else {
        format!("{mib:.2} MiB")
    }
}
