//! Files anywhere in the runtime (issue 42): a write and a read back through `/v1` of a
//! file under `/tmp`, which the runtime's agent serves as the sandbox user, beside the same
//! through the persistent mount's host route (warren-fs on the host, no runtime involved)
//! and beside the floor, `cat` copying the same bytes inside the runtime (one exec). Not a
//! test: it prints p50 and p99 and the ratios, measured in one run.
//!
//! Run as root (`scripts/test` prepares the machine): `cargo bench -p warren --bench files`
//! (`-- --iterations N` for the 1 MiB size, default 20; the 100 MiB size runs N/5 times,
//! at least 3). A body is at most the read cap (64 MiB): 100 MiB goes as four appends and
//! comes back as four ranges, the same requests on both routes.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use warren_test_support::latency::{iterations, row};
use warren_test_support::TestServer;

const MIB: usize = 1024 * 1024;
/// The most bytes one request carries here.
const PIECE: usize = 25 * MIB;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = Path::new(env!("CARGO_BIN_EXE_warren"));
    let small = iterations(20);
    let large = (small / 5).max(3);
    let server = TestServer::start_local(bin);
    let id = server.sandbox("alice", "bench", "projects/bench").await;
    // Incompressible bytes, made once.
    let mut data = vec![0u8; 100 * MIB];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in data.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    println!("a write and a read back through /v1, local backend, release build\n");
    for (size, runs) in [(MIB, small), (100 * MIB, large)] {
        let bytes = &data[..size];
        let label = format!("{} MiB", size / MIB);
        let mut runtime = Vec::new();
        let mut persistent = Vec::new();
        let mut cat = Vec::new();
        // The source of `cat`'s copy, put there once.
        put_whole(&server, &id, "/tmp/bench.src", bytes).await;
        for _ in 0..runs {
            runtime.push(round_trip(&server, &id, "/tmp/bench.bin", bytes).await);
            persistent.push(round_trip(&server, &id, "bench.bin", bytes).await);
            cat.push(cat_copy(&server, &id).await);
        }
        row(
            &format!("{label} under /tmp (the runtime's agent)"),
            &mut runtime,
            &mut cat.clone(),
            "cat inside",
        );
        row(
            &format!("{label} on the workdir (host route)"),
            &mut persistent,
            &mut cat,
            "cat inside",
        );
        row(
            &format!("{label} /tmp vs the host route"),
            &mut runtime,
            &mut persistent,
            "host route",
        );
    }
}

/// Writes `bytes` to `path`, in pieces, untimed.
async fn put_whole(server: &TestServer, id: &str, path: &str, bytes: &[u8]) {
    for (index, piece) in bytes.chunks(PIECE).enumerate() {
        let append = if index == 0 { "false" } else { "true" };
        let response = server
            .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path), ("append", append)])
            .body(piece.to_vec())
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
    }
}

/// Writes `bytes` to `path` (in pieces of at most [`PIECE`]) and reads it back whole (in
/// as many ranges); checks what came back; how long both took.
async fn round_trip(server: &TestServer, id: &str, path: &str, bytes: &[u8]) -> Duration {
    let started = Instant::now();
    put_whole(server, id, path, bytes).await;
    let mut back = Vec::with_capacity(bytes.len());
    for start in (0..bytes.len()).step_by(PIECE) {
        let end = (start + PIECE).min(bytes.len()) - 1;
        let response = server
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .header("range", format!("bytes={start}-{end}"))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        back.extend_from_slice(&response.bytes().await.unwrap());
    }
    let took = started.elapsed();
    assert!(back == bytes, "{path}: the bytes that came back differ");
    // Room for the next size: the runtime's /tmp is a 256 MiB tmpfs.
    let response = server
        .request(Method::DELETE, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", path)])
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    took
}

/// The floor: the same bytes written and read inside the runtime by `cat`, one exec.
async fn cat_copy(server: &TestServer, id: &str) -> Duration {
    let started = Instant::now();
    let done = server
        .exec(
            id,
            "cat /tmp/bench.src > /tmp/bench.cat && cat /tmp/bench.cat > /dev/null && \
             rm /tmp/bench.cat",
        )
        .await;
    assert_eq!(done["exit_code"], 0, "{done}");
    started.elapsed()
}
