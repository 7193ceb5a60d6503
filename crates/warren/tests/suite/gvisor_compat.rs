//! The gVisor compatibility corpus (issue 19): the same workloads, each checking its own
//! result, run on the local backend's two isolation tiers, `kernel` and `gvisor`. Every
//! workload must pass on the kernel tier; on the gVisor tier the set that passes must be
//! exactly the one written here, so a regression and a fix both fail the test, with the
//! table in the message. The table is printed (`--nocapture`) and written as JSON to
//! `target/gvisor-compat.json`.
//!
//! The runtimes see the host's `/usr` read-only: the tools are the host's (python3, pip,
//! git, node, cc, sqlite3, procps, findutils, tar). Nothing here uses the network.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use warren_test_support::TestServer;

use super::conformance::Host;

/// One workload: its commands, one exec each in order, in the same sandbox (so a later
/// step sees what an earlier one left running), and what their stdout must hold.
struct Workload {
    name: &'static str,
    steps: &'static [&'static str],
    /// Strings the stdout of all the steps together must contain.
    expect: &'static [&'static str],
    /// Whether it passes on the gVisor tier (Debian's runsc 0.0~20221219, ptrace).
    on_gvisor: bool,
}

/// The wheel the pip workload installs, planted in the workdir by the test.
const WHEEL: &str = "warrencompat-0.1-py3-none-any.whl";

const CORPUS: &[Workload] = &[
    Workload {
        name: "python3 script (multiprocessing, threads, json)",
        steps: &[r#"cat > compat.py <<'EOF'
import json, multiprocessing, subprocess, threading

def square(x):
    return x * x

if __name__ == "__main__":
    with multiprocessing.Pool(4) as pool:
        total = sum(pool.map(square, range(100)))
    seen = []
    lock = threading.Lock()
    def work(i):
        with lock:
            seen.append(i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    child = subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"pool": total, "threads": sorted(seen), "child": child}))
EOF
python3 compat.py"#],
        expect: &[r#"{"pool": 328350, "threads": [0, 1, 2, 3, 4, 5, 6, 7], "child": "sub"}"#],
        on_gvisor: true,
    },
    Workload {
        name: "pip install of a local wheel",
        steps: &[r#"set -e
python3 -m pip --version >/dev/null
# Debian's python3 is externally managed (PEP 668): a --user install needs the override.
python3 -m pip install --quiet --user --break-system-packages --no-index \
  --no-warn-script-location ./warrencompat-0.1-py3-none-any.whl
cd /tmp
python3 -c 'import warrencompat; print("answer", warrencompat.answer())'
python3 -m pip show warrencompat | grep '^Version'"#],
        expect: &["answer 42\n", "Version: 0.1\n"],
        on_gvisor: true,
    },
    Workload {
        name: "git init/add/commit/clone",
        steps: &[r#"set -e
rm -rf git-src git-clone
git init -q git-src
cd git-src
git config user.name Compat
git config user.email compat@example.com
echo hello > README
git add README
git commit -qm 'first commit'
echo more >> README
git commit -qam 'second commit'
cd ..
git clone -q git-src git-clone
git -C git-clone log --format='log: %s'
echo "dirty: $(git -C git-clone status --porcelain | wc -l)"
cat git-clone/README"#],
        expect: &[
            "log: second commit\nlog: first commit\n",
            "dirty: 0\n",
            "hello\nmore\n",
        ],
        on_gvisor: true,
    },
    Workload {
        name: "node (fs, child_process)",
        steps: &[r#"node -e '
const fs = require("fs"), cp = require("child_process");
fs.writeFileSync("/tmp/compat-node.json", JSON.stringify({ n: [1, 2, 3] }));
const n = JSON.parse(fs.readFileSync("/tmp/compat-node.json", "utf8")).n;
const child = cp.execFileSync("sh", ["-c", "echo $((6 * 7))"]).toString().trim();
cp.exec("echo async", (err, out) => {
  if (err) throw err;
  console.log(`sum=${n.reduce((a, b) => a + b)} child=${child} ${out.trim()}`);
});
'"#],
        expect: &["sum=6 child=42 async\n"],
        on_gvisor: true,
    },
    Workload {
        name: "cc compile and run",
        steps: &[r#"set -e
cat > /tmp/primes.c <<'EOF'
#include <stdio.h>
static char composite[100000];
int main(void) {
    unsigned long sum = 0;
    int count = 0;
    for (long i = 2; i < 100000; i++) {
        if (composite[i]) continue;
        count++;
        sum += i;
        for (long j = i * i; j < 100000; j += i) composite[j] = 1;
    }
    printf("primes below 100000: %d, sum %lu\n", count, sum);
    return 0;
}
EOF
cc -O2 -Wall -o /tmp/primes /tmp/primes.c
/tmp/primes"#],
        expect: &["primes below 100000: 9592, sum 454396537\n"],
        on_gvisor: true,
    },
    Workload {
        name: "sqlite3 create/insert/select",
        steps: &[r#"set -e
rm -f compat.db
sqlite3 compat.db <<'EOF'
CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT);
INSERT INTO t (v) VALUES ('alpha'), ('beta'), ('gamma');
EOF
sqlite3 compat.db "SELECT k, v FROM t WHERE v = 'beta'; SELECT count(*) FROM t;""#],
        expect: &["2|beta\n3\n"],
        on_gvisor: true,
    },
    Workload {
        name: "background process across execs",
        steps: &[
            "rm -f /tmp/compat-bg.pid; nohup sleep 300 >/dev/null 2>&1 & echo $! > /tmp/compat-bg.pid; echo started",
            r#"p=$(cat /tmp/compat-bg.pid)
kill -0 "$p" && echo alive
echo "cmdline: $(tr '\0' ' ' < /proc/$p/cmdline)"
kill "$p"
for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
kill -0 "$p" 2>/dev/null && echo still-there || echo gone"#,
        ],
        expect: &["started\n", "alive\ncmdline: sleep 300 \ngone\n"],
        on_gvisor: true,
    },
    Workload {
        name: "signals (trap, SIGKILL 137, SIGTERM 143)",
        // The children first: a TERM that reached a forked child before it reset the
        // parent's traps would run the trap instead of terminating it.
        steps: &[r#"sh -c 'kill -KILL $$'
echo "killed child: $?"
sleep 30 &
p=$!
kill -TERM "$p"
wait "$p"
echo "terminated child: $?"
trap 'echo got-USR1' USR1
trap 'echo got-TERM' TERM
kill -USR1 $$
kill -TERM $$
python3 -c 'import os, signal; signal.signal(signal.SIGUSR2, lambda *_: print("python USR2")); os.kill(os.getpid(), signal.SIGUSR2)'"#],
        expect: &[
            "killed child: 137\nterminated child: 143\ngot-USR1\ngot-TERM\npython USR2\n",
        ],
        on_gvisor: true,
    },
    Workload {
        name: "large file I/O (2 x 256 MiB)",
        // The digests are of 256 MiB of zeros and of bytes 0..=255 repeated 1 Mi times.
        steps: &[r#"set -e
dd if=/dev/zero of=big-zero.bin bs=1M count=256 status=none
sync
sha256sum big-zero.bin
python3 - <<'EOF'
import hashlib
block = bytes(range(256)) * 4096
with open("big-pattern.bin", "wb") as f:
    for _ in range(256):
        f.write(block)
digest = hashlib.sha256()
size = 0
with open("big-pattern.bin", "rb") as f:
    while chunk := f.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
print(size, digest.hexdigest())
EOF
rm -f big-zero.bin big-pattern.bin"#],
        expect: &[
            "a6d72ac7690f53be6ae46ba88506bd97302a093f7108472bd9efc3cefda06484  big-zero.bin\n",
            "268435456 486cc817b95d853d3c357ff283b204c0144bd255e73fe2deb1389493b257e3c0\n",
        ],
        on_gvisor: true,
    },
    Workload {
        // coreutils 9's ls calls statx(2), which this runsc refuses with EINVAL.
        name: "ls -la",
        steps: &[r#"set -e
rm -rf ls-dir
mkdir ls-dir
printf hello > ls-dir/listed.txt
ls -la ls-dir > /tmp/ls.out
awk '$NF == "listed.txt" { print $1, $3, $4, $5, $NF }' /tmp/ls.out"#],
        expect: &["-rw-r--r-- gem gem 5 listed.txt\n"],
        on_gvisor: false,
    },
    Workload {
        // As `ls -la`: coreutils 9's stat calls statx(2).
        name: "stat",
        steps: &["set -e; printf hello > stat.txt; stat -c '%s %U %F' stat.txt"],
        expect: &["5 gem regular file\n"],
        on_gvisor: false,
    },
    Workload {
        name: "ps",
        steps: &[r#"sleep 30 &
p=$!
ps -eo pid=,user=,comm= | awk -v p="$p" '$1 == p { print "found", $2, $3 }'
echo "self: $(ps -o comm= -p $$)"
kill "$p""#],
        expect: &["found gem sleep\n", "self: sh\n"],
        on_gvisor: true,
    },
    Workload {
        name: "find",
        steps: &[r#"set -e
rm -rf /tmp/find-tree
mkdir -p /tmp/find-tree/a/b
touch /tmp/find-tree/a/b/x.txt /tmp/find-tree/a/y.txt /tmp/find-tree/z.log
find /tmp/find-tree -name '*.txt' -type f | sort
echo "dirs: $(find /tmp/find-tree -type d | wc -l)""#],
        expect: &["/tmp/find-tree/a/b/x.txt\n/tmp/find-tree/a/y.txt\ndirs: 3\n"],
        on_gvisor: true,
    },
    Workload {
        name: "pipeline (sort | uniq -c)",
        steps: &[r#"printf 'b\na\nb\nc\nb\na\n' | sort | uniq -c | sort -rn | awk '{ print $2 "=" $1 }'"#],
        expect: &["b=3\na=2\nc=1\n"],
        on_gvisor: true,
    },
    Workload {
        name: "tar czf/xzf",
        steps: &[r#"set -e
cd /tmp
rm -rf tar-src tar-out tar.tgz
mkdir -p tar-src/d tar-out
echo payload > tar-src/d/f
seq 1 10000 > tar-src/numbers
tar czf tar.tgz tar-src
tar xzf tar.tgz -C tar-out
cat tar-out/tar-src/d/f
cmp tar-src/numbers tar-out/tar-src/numbers && echo same"#],
        expect: &["payload\nsame\n"],
        on_gvisor: true,
    },
    Workload {
        name: "file operations (cp -a, ln -s, mv, flock)",
        steps: &[r#"set -e
rm -rf files-a files-b files-c
mkdir -p files-a/d
echo content > files-a/d/f
ln -s d/f files-a/link
cp -a files-a files-b
mv files-b files-c
echo "link: $(readlink files-c/link) -> $(cat files-c/link)"
flock files-c/lock -c 'echo locked'"#],
        expect: &["link: d/f -> content\nlocked\n"],
        on_gvisor: true,
    },
    Workload {
        name: "loopback TCP (python3 asyncio)",
        steps: &[r#"python3 - <<'EOF'
import asyncio

async def main():
    async def serve(reader, writer):
        writer.write(b"pong " + await reader.readline())
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping\n")
    print((await reader.read()).decode().strip())
    server.close()

asyncio.run(main())
EOF"#],
        expect: &["pong ping\n"],
        on_gvisor: true,
    },
];

/// How one workload did on one tier.
struct Outcome {
    pass: bool,
    /// For a failure: the first stderr line, else what stdout lacked.
    note: String,
    took: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_passes_on_the_kernel_tier_and_the_expected_set_on_gvisor() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    assert!(
        std::env::split_paths(&path).any(|dir| dir.join("runsc").is_file()),
        "the gVisor tier needs runsc on PATH: install Debian's runsc (scripts/test does)"
    );
    let started = Instant::now();
    let kernel = run_tier(Host::Local).await;
    let gvisor = run_tier(Host::LocalGvisor).await;
    let elapsed = started.elapsed();

    let table = table(&kernel, &gvisor);
    println!(
        "gVisor compatibility corpus ({:.1} s):\n{table}",
        elapsed.as_secs_f64()
    );
    write_json(&kernel, &gvisor);

    let kernel_failures: Vec<&str> = CORPUS
        .iter()
        .zip(&kernel)
        .filter(|(_, o)| !o.pass)
        .map(|(w, _)| w.name)
        .collect();
    assert!(
        kernel_failures.is_empty(),
        "workloads fail on the kernel tier: {kernel_failures:?}\n{table}"
    );
    let changed: Vec<String> = CORPUS
        .iter()
        .zip(&gvisor)
        .filter(|(w, o)| w.on_gvisor != o.pass)
        .map(|(w, o)| {
            let now = if o.pass { "passes" } else { "fails" };
            format!("{} now {now} on gvisor", w.name)
        })
        .collect();
    assert!(
        changed.is_empty(),
        "the gVisor tier's passing set changed (update `on_gvisor` for a fix): {changed:?}\n{table}"
    );
}

/// Starts a server on `host`, checks the tier is the one asked for, and runs the corpus.
async fn run_tier(host: Host) -> Vec<Outcome> {
    let server = host.start();
    let id = server.sandbox("alice", "compat", "compat").await;
    let workdir = server.workspace_of("alice").join("compat");
    plant_wheel(&workdir.join(WHEEL));

    // runsc's Sentry reports a kernel of its own: the tier is really gVisor, or really not.
    let version = server.exec(&id, "cat /proc/version").await;
    let inside = version["stdout"].as_str().unwrap_or_default();
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    assert_eq!(
        inside == host_version,
        !host.gvisor(),
        "{host:?}: /proc/version inside is {inside:?}, the host's {host_version:?}"
    );

    let mut outcomes = Vec::new();
    for workload in CORPUS {
        outcomes.push(run_workload(&server, &id, workload).await);
    }
    outcomes
}

async fn run_workload(server: &TestServer, id: &str, workload: &Workload) -> Outcome {
    let started = Instant::now();
    let outcome = |note: Option<String>| Outcome {
        pass: note.is_none(),
        note: note.unwrap_or_default(),
        took: started.elapsed(),
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    for step in workload.steps {
        let (status, result) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&json!({"command": step, "timeout_s": 120})),
            )
            .await;
        if status != 200 {
            return outcome(Some(format!("exec answered {status}: {result}")));
        }
        let step_stderr = result["stderr"].as_str().unwrap_or_default();
        stdout.push_str(result["stdout"].as_str().unwrap_or_default());
        stderr.push_str(step_stderr);
        if result["exit_code"] != 0 {
            return outcome(Some(first_line(step_stderr).unwrap_or_else(|| {
                format!(
                    "exit {} signal {} (no stderr)",
                    result["exit_code"], result["signal"]
                )
            })));
        }
    }
    let missing = workload.expect.iter().find(|e| !stdout.contains(*e));
    outcome(missing.map(|missing| {
        let stderr = first_line(&stderr).unwrap_or_default();
        format!("stdout lacks {missing:?} (stdout {stdout:?}, stderr {stderr:?})")
    }))
}

fn first_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}

/// A markdown table: workload, kernel, gvisor, and the first stderr line of a failure.
fn table(kernel: &[Outcome], gvisor: &[Outcome]) -> String {
    let verdict = |o: &Outcome| {
        let verdict = if o.pass { "pass" } else { "**fail**" };
        format!("{verdict} ({:.1} s)", o.took.as_secs_f64())
    };
    let mut text = String::from(
        "| workload | kernel | gvisor | first stderr line of a failure |\n|---|---|---|---|\n",
    );
    for ((w, k), g) in CORPUS.iter().zip(kernel).zip(gvisor) {
        let note = [("kernel", k), ("gvisor", g)]
            .iter()
            .filter(|(_, o)| !o.pass)
            .map(|(tier, o)| format!("{tier}: `{}`", o.note.replace('|', "\\|")))
            .collect::<Vec<_>>()
            .join("; ");
        text.push_str(&format!(
            "| {} | {} | {} | {note} |\n",
            w.name.replace('|', "\\|"),
            verdict(k),
            verdict(g)
        ));
    }
    text
}

/// Writes the results to `target/gvisor-compat.json` (next to the build's profile dirs).
fn write_json(kernel: &[Outcome], gvisor: &[Outcome]) {
    let rows: Vec<Value> = CORPUS
        .iter()
        .zip(kernel)
        .zip(gvisor)
        .map(|((w, k), g)| {
            json!({
                "workload": w.name,
                "kernel": {"pass": k.pass, "note": k.note, "seconds": k.took.as_secs_f64()},
                "gvisor": {
                    "pass": g.pass, "note": g.note, "seconds": g.took.as_secs_f64(),
                    "expected_pass": w.on_gvisor,
                },
            })
        })
        .collect();
    // The test binary is target/<profile>/deps/all-<hash>.
    let exe = std::env::current_exe().unwrap();
    if let Some(target) = exe.ancestors().nth(3) {
        let path = target.join("gvisor-compat.json");
        let text = serde_json::to_string_pretty(&json!({ "workloads": rows })).unwrap();
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("cannot write {}: {e}", path.display());
        }
    }
}

/// Writes a minimal pure-Python wheel to `path`, owned by the sandbox user (I11): a zip
/// (stored, not deflated) of the package and its `.dist-info`.
fn plant_wheel(path: &std::path::Path) {
    let mut files: Vec<(&str, String)> = vec![
        (
            "warrencompat/__init__.py",
            "def answer():\n    return 6 * 7\n".into(),
        ),
        (
            "warrencompat-0.1.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: warrencompat\nVersion: 0.1\n".into(),
        ),
        (
            "warrencompat-0.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: warren-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .into(),
        ),
    ];
    let mut record: String = files
        .iter()
        .map(|(name, _)| format!("{name},,\n"))
        .collect();
    record.push_str("warrencompat-0.1.dist-info/RECORD,,\n");
    files.push(("warrencompat-0.1.dist-info/RECORD", record));
    std::fs::write(path, zip_stored(&files)).unwrap();
    if super::running_as_root() {
        std::os::unix::fs::chown(path, Some(1000), Some(1000)).unwrap();
    }
}

/// A zip archive of `files`, each stored uncompressed.
fn zip_stored(files: &[(&str, String)]) -> Vec<u8> {
    // 1980-01-01 00:00 in DOS time.
    const DATE: u16 = (1 << 5) | 1;
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let mut crc = flate2::Crc::new();
        crc.update(data.as_bytes());
        let (crc, size, offset) = (crc.sum(), data.len() as u32, out.len() as u32);
        let common = |buf: &mut Vec<u8>| {
            for half in [20u16, 0, 0, 0, DATE] {
                buf.extend_from_slice(&half.to_le_bytes());
            }
            for word in [crc, size, size] {
                buf.extend_from_slice(&word.to_le_bytes());
            }
            buf.extend_from_slice(&(name.len() as u16).to_le_bytes());
            buf.extend_from_slice(&0u16.to_le_bytes());
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data.as_bytes());

        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes());
        common(&mut central);
        // Comment length, disk number, internal attributes; then -rw-r--r--.
        for half in [0u16, 0, 0] {
            central.extend_from_slice(&half.to_le_bytes());
        }
        central.extend_from_slice(&(0o100644u32 << 16).to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (central_offset, central_size) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    let count = files.len() as u16;
    for half in [0u16, 0, count, count] {
        out.extend_from_slice(&half.to_le_bytes());
    }
    out.extend_from_slice(&central_size.to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}
