//! A real S3-compatible server (`s3s-fs`) for snapshot stores.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A real S3-compatible server (`s3s-fs`, from crates.io; scripts/test installs it) on a
/// free loopback port, serving one empty bucket from a temporary directory. Killed on drop.
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bucket, already created.
    pub bucket: String,
    /// The access key the server accepts.
    pub access_key: String,
    /// The secret key the server accepts.
    pub secret_key: String,
    _root: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server; fails with what to install when `s3s-fs` is missing.
    pub fn start() -> Self {
        let binary = std::env::var_os("WARREN_S3S_FS")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("PATH").and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|dir| dir.join("s3s-fs"))
                        .find(|candidate| candidate.is_file())
                })
            })
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|home| PathBuf::from(home).join(".cargo/bin/s3s-fs"))
                    .filter(|candidate| candidate.is_file())
            })
            .expect(
                "the S3 server s3s-fs is missing: cargo install s3s-fs --version 0.14.1 --locked \
                 --features binary (scripts/test does), or point WARREN_S3S_FS at it",
            );
        let root = tempfile::tempdir().expect("a temporary dir for the S3 server");
        let bucket = "warren-test".to_owned();
        std::fs::create_dir(root.path().join(&bucket)).expect("create the bucket");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let (access_key, secret_key) = (
            "warren-test-access".to_owned(),
            "warren-test-secret-0123456789".to_owned(),
        );
        let child = Command::new(&binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", &access_key, "--secret-key", &secret_key])
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "s3s-fs did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
            access_key,
            secret_key,
            _root: root,
        }
    }
}

impl S3Server {
    /// `[snapshots]` tables that put a server's snapshot store on this S3 server.
    pub fn snapshots_config(&self) -> String {
        format!(
            "[snapshots]\nstore = \"s3\"\n[snapshots.s3]\nendpoint = \"{}\"\nbucket = \"{}\"\n\
             access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            self.endpoint, self.bucket, self.access_key, self.secret_key
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
