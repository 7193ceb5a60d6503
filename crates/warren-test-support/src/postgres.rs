//! A real PostgreSQL server for the tests that need one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A real PostgreSQL server of its own (Debian's `postgresql`; scripts/test installs it):
/// a fresh cluster in a temporary directory, on a free loopback port, run as the
/// `postgres` user when the tests run as root. Stopped (and its directory removed) on drop;
/// should the test process die first, the server stops too: it is started by a shell that
/// waits on a pipe from this process and shuts the server down when the pipe closes.
pub struct PostgresServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    account: Option<(u32, u32)>,
    keeper: Option<(Child, std::process::ChildStdin)>,
    durable: bool,
    databases: std::sync::atomic::AtomicUsize,
}

impl PostgresServer {
    /// A cluster for tests: no fsync (a crash of the test machine loses nothing anyone
    /// keeps).
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// A cluster with PostgreSQL's durable defaults (fsync on), for benchmarks.
    pub fn start_durable() -> Self {
        Self::start_with(true)
    }

    fn start_with(durable: bool) -> Self {
        let bin = postgres_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("warren-pg-")
            .tempdir()
            .expect("a temporary directory for the cluster");
        let account = postgres_account();
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("hand the cluster directory to the postgres user");
        }
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ])
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_account(&mut initdb, account);
        let out = initdb
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb ({e}): {POSTGRES_MISSING}"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut server = Self {
            dir,
            bin,
            port,
            account,
            keeper: None,
            durable,
            databases: std::sync::atomic::AtomicUsize::new(0),
        };
        server.resume();
        server
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new, empty database and returns its URL: each test gets its own.
    pub fn fresh_database(&self) -> String {
        let n = self
            .databases
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("warren_test_{}_{n}", std::process::id());
        self.psql(&format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// Runs one SQL statement as the superuser with `psql` in the `postgres` database and
    /// returns what it printed.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// Runs one SQL statement as the superuser in `database` (a name, or a URL from
    /// [`PostgresServer::fresh_database`]) and returns what it printed.
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let database = database.rsplit('/').next().unwrap_or(database);
        let out = Command::new("psql")
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", database, "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e}): {POSTGRES_MISSING}"));
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stops the server (fast shutdown: connections are cut) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some((mut child, mut stdin)) = self.keeper.take() {
            // The line tells the keeper shell to shut the server down and keep its data.
            let _ = std::io::Write::write_all(&mut stdin, b"stop\n");
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data, and waits until it answers.
    pub fn resume(&mut self) {
        assert!(self.keeper.is_none(), "the server is already running");
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("postgres.log");
        let mut settings = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c max_connections=400 -c shared_buffers=64MB",
            self.port
        );
        if !self.durable {
            settings.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        // The keeper: runs the server, and stops it when a line or end of file arrives on
        // its stdin (this process stopped it, or died).
        // `stop` writes a line first; end of file without one means this process died
        // without dropping the server, so the keeper also removes the cluster's directory.
        let script = format!(
            "{postgres} -D '{data}' {settings} >>'{log}' 2>&1 & pid=$!; \
             read -r command; kill -INT $pid; wait $pid; \
             [ \"$command\" = stop ] || rm -rf '{dir}'",
            postgres = self.bin.join("postgres").display(),
            data = data.display(),
            log = log.display(),
            dir = self.dir.path().display(),
        );
        let mut keeper = Command::new("sh");
        keeper
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_account(&mut keeper, self.account);
        let mut child = keeper
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start postgres ({e}): {POSTGRES_MISSING}"));
        let stdin = child.stdin.take().expect("the keeper's stdin");
        self.keeper = Some((child, stdin));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "postgres did not accept connections on port {} within 30 s; its log: {}",
                self.port,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

const POSTGRES_MISSING: &str =
    "the PostgreSQL tests need Debian's postgresql (apt-get install postgresql; scripts/test does)";

/// The directory of the newest installed PostgreSQL server's programs.
fn postgres_bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("no /usr/lib/postgresql ({e}): {POSTGRES_MISSING}"))
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("no PostgreSQL server under /usr/lib/postgresql: {POSTGRES_MISSING}")
    })
}

/// The `postgres` account's uid and gid when running as root (the server refuses to run as
/// root); `None` when already unprivileged.
fn postgres_account() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|line| line.starts_with("postgres:"))
        .unwrap_or_else(|| panic!("no postgres user: {POSTGRES_MISSING}"));
    let fields: Vec<&str> = line.split(':').collect();
    Some((
        fields[2].parse().expect("the postgres uid"),
        fields[3].parse().expect("the postgres gid"),
    ))
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
        .unwrap_or(false)
}

fn as_account(command: &mut Command, account: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = account {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}
