use super::*;

fn scan_all(chunks: &[&[u8]], begin: &[u8], end: &[u8]) -> Vec<Event> {
    let mut scan = Scan::default();
    scan.expect();
    let mut events = Vec::new();
    for chunk in chunks {
        scan.feed(chunk, begin, end, &mut events);
    }
    events
}

fn output_of(events: &[Event]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Output(bytes) => Some(bytes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn only_the_bytes_between_the_markers_are_the_commands_output() {
    let begin = b"\x1eBabc";
    let end = b"\x1eEabc";
    let stream = b"late output\x1eBabc\x1f12.34\0hello\nno newline\x1eEabc\x1f0\x1f/tmp\0after";
    let events = scan_all(&[stream], begin, end);
    assert_eq!(output_of(&events), b"hello\nno newline");
    assert!(events.contains(&Event::Begun(b"\x1f12.34".to_vec())));
    assert!(events.contains(&Event::Ended(b"\x1f0\x1f/tmp".to_vec())));
}

#[test]
fn a_marker_split_across_chunks_at_every_byte_is_still_found() {
    let begin = b"\x1eBnonce";
    let end = b"\x1eEnonce";
    let stream = b"x\x1eBnonce\x1f1.00\0out\x1e not a marker\x1eEnonce\x1f3\x1f/a b\0";
    for cut in 0..stream.len() {
        for second in cut..stream.len() {
            let events = scan_all(
                &[&stream[..cut], &stream[cut..second], &stream[second..]],
                begin,
                end,
            );
            assert_eq!(
                output_of(&events),
                b"out\x1e not a marker",
                "cuts at {cut} and {second}"
            );
            assert_eq!(
                events.last(),
                Some(&Event::Ended(b"\x1f3\x1f/a b".to_vec()))
            );
        }
    }
}

#[test]
fn a_capture_keeps_the_head_and_the_tail_of_a_long_output() {
    let mut capture = Capture::new(8, &SecretMasker::default());
    capture.push(b"0123");
    capture.push(b"456789ab");
    capture.push(b"cdef");
    capture.finish();
    assert!(capture.truncated());
    assert_eq!(
        capture.text(),
        "0123\n[warren: 8 bytes of output left out]\ncdef"
    );
    let mut short = Capture::new(8, &SecretMasker::default());
    short.push(b"abc");
    short.finish();
    assert!(!short.truncated());
    assert_eq!(short.text(), "abc");
}

#[test]
fn a_capture_masks_a_secret_split_between_chunks() {
    let masker = SecretMasker::new([("KEY", "s3cr3t")]);
    let mut capture = Capture::new(1024, &masker);
    capture.push(b"a s3c");
    capture.push(b"r3t b");
    capture.finish();
    assert_eq!(capture.text(), "a [masked:KEY] b");
}

#[test]
fn the_nonce_is_never_whole_in_the_wrapper_text() {
    let nonce = nonce();
    let mut command = ShellCommand::new("echo $(date) 'quoted'", "test");
    command.env.insert("A".into(), Some("x'y".into()));
    command.env.insert("B".into(), None);
    for flavor in [Flavor::Bash, Flavor::Sh] {
        for kind in [SessionKind::Shell, SessionKind::Bash] {
            let text = wrap(flavor, kind, &nonce, &command, Some("/mnt/user-data"));
            assert!(!text.contains(&nonce), "{text}");
            assert!(text.contains(&quote("echo $(date) 'quoted'")));
        }
    }
}

#[test]
fn session_ids_are_short_and_plain() {
    assert!(check_session_id("0b6c5a52-2c1e-4c5e-9d3e-1f2a3b4c5d6e").is_ok());
    assert!(check_session_id("a.b_c-D9").is_ok());
    for bad in ["", "a/b", "a b", "ä", &"x".repeat(129)] {
        assert!(check_session_id(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_begin_mark_holds_the_runtime_clock_in_hundredths_and_its_last_pid() {
    assert_eq!(
        parse_begin(b"\x1f12345.67\x1f4242"),
        Some(BeginMark {
            centis: 1_234_567,
            last_pid: Some(4242)
        })
    );
    assert_eq!(
        parse_begin(b"\x1f3.5\x1f"),
        Some(BeginMark {
            centis: 350,
            last_pid: None
        })
    );
    // gVisor's `/proc/loadavg` names pid 0: no last pid at all.
    assert_eq!(
        parse_begin(b"\x1f3.5\x1f0"),
        Some(BeginMark {
            centis: 350,
            last_pid: None
        })
    );
    assert_eq!(parse_begin(b"\x1f"), None);
}

/// A session shell run by the host itself (no backend): the bootstrap started with
/// `PATH`, its script written to its stdin (a socket, as the local agent hands it over)
/// and its output read the way the driver does.
struct HostShell {
    child: std::process::Child,
    stdin: std::os::unix::net::UnixStream,
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    flavor: Flavor,
}

impl HostShell {
    fn start(path: &str, start_dir: &str) -> Self {
        use std::io::{Read, Write};
        let nonce = nonce();
        let (a, b) = nonce.split_at(16);
        let (mut stdin, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", BOOTSTRAP, "warren-shell", a, b, "merged"])
            .current_dir("/")
            .env("PATH", path)
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                theirs,
            )))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (sender, chunks) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buffer) {
                if n == 0 || sender.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let token = format!("\x1eR{nonce}").into_bytes();
        let mut early = Vec::new();
        let flavor = loop {
            early.extend(
                chunks
                    .recv_timeout(Duration::from_secs(10))
                    .expect("the shell says it is ready"),
            );
            if let Some(flavor) = parse_ready(&early, &token) {
                break flavor;
            }
        };
        stdin
            .write_all(prelude(flavor, start_dir).as_bytes())
            .unwrap();
        Self {
            child,
            stdin,
            chunks,
            flavor,
        }
    }

    /// Hands `text` to the shell; returns the command's begin and end tokens.
    fn send(&mut self, text: &str) -> (Vec<u8>, Vec<u8>) {
        use std::io::Write;
        let nonce = nonce();
        let command = ShellCommand::new(text, "test");
        let script = wrap(self.flavor, SessionKind::Shell, &nonce, &command, None);
        self.stdin.write_all(script.as_bytes()).unwrap();
        let (x, y) = nonce.split_at(16);
        (
            [&[MARK, b'B'][..], x.as_bytes(), y.as_bytes()].concat(),
            [&[MARK, b'E'][..], x.as_bytes(), y.as_bytes()].concat(),
        )
    }

    /// Runs `text`: its output, and its end trailer (`None`: the shell ended).
    fn run(&mut self, text: &str) -> (String, Option<String>) {
        let (begin, end) = self.send(text);
        let mut scan = Scan::default();
        scan.expect();
        let mut output = Vec::new();
        loop {
            let Ok(chunk) = self.chunks.recv_timeout(Duration::from_secs(10)) else {
                return (String::from_utf8_lossy(&output).into_owned(), None);
            };
            let mut events = Vec::new();
            scan.feed(&chunk, &begin, &end, &mut events);
            for event in events {
                match event {
                    Event::Output(bytes) => output.extend(bytes),
                    Event::Ended(trailer) => {
                        return (
                            String::from_utf8_lossy(&output).into_owned(),
                            Some(String::from_utf8_lossy(&trailer).into_owned()),
                        )
                    }
                    Event::Begun(_) => {}
                }
            }
        }
    }
}

impl Drop for HostShell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bootstrap, the prelude and the wrapper, run by the host's own shells (bash, and
/// `sh` with no bash on its PATH).
#[test]
fn both_shell_flavors_keep_their_state_and_give_exact_output() {
    let tools = tempfile_dir();
    for tool in ["sh", "cat"] {
        let path = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let path = String::from_utf8(path.stdout).unwrap();
        std::os::unix::fs::symlink(path.trim(), tools.join(tool)).unwrap();
    }
    for (flavor, path) in [
        (Flavor::Bash, std::env::var("PATH").unwrap()),
        (Flavor::Sh, tools.display().to_string()),
    ] {
        let mut shell = HostShell::start(&path, "/");
        assert_eq!(shell.flavor, flavor);
        let (pid, _) = shell.run("echo $PWD; cd /tmp && X=1 && f() { echo \"fn $1\"; } && echo $$");
        let (first, pid) = pid.split_once('\n').unwrap();
        assert_eq!(first, "/", "{flavor:?}: the prelude moved it");
        let (out, end) = shell
            .run("echo $$ $X $PWD; f a; nope_not_a_command; echo err >&2; printf 'no newline'");
        // The shell's own message names the shell, not a path of the runtime.
        let (name, nope) = match flavor {
            Flavor::Bash => ("bash: ", ": nope_not_a_command: command not found\n"),
            Flavor::Sh => ("sh: ", ": nope_not_a_command: not found\n"),
        };
        let lines: Vec<&str> = out.split_inclusive('\n').collect();
        assert_eq!(lines.len(), 5, "{flavor:?}: {out}");
        assert!(
            lines[2].starts_with(name) && lines[2].ends_with(nope),
            "{flavor:?}: {out}"
        );
        assert_eq!(
            [lines[0], lines[1], lines[3], lines[4]].concat(),
            format!("{} 1 /tmp\nfn a\nerr\nno newline", pid.trim()),
            "{flavor:?}"
        );
        assert_eq!(end.as_deref(), Some("\x1f0\x1f/tmp"), "{flavor:?}");
        let (out, end) = shell.run("echo 'unterminated");
        assert!(
            out.contains("nterminated") || out.contains("EOF"),
            "{flavor:?}: {out}"
        );
        assert_ne!(end.as_deref(), Some("\x1f0\x1f/tmp"), "{flavor:?}");
        assert_eq!(
            shell.run("cat; echo $X").0,
            "1\n",
            "{flavor:?}: stdin is at its end"
        );
        assert_eq!(
            shell.run("exec </dev/null; echo $X").0,
            "1\n",
            "{flavor:?}: the script is not stdin"
        );
        assert_eq!(shell.run("echo still $X").0, "still 1\n", "{flavor:?}");
        let (out, end) = shell.run("echo bye; exit 3");
        assert_eq!((out.as_str(), end), ("bye\n", None), "{flavor:?}");
        assert_eq!(shell.child.wait().unwrap().code(), Some(3), "{flavor:?}");
    }
    let _ = std::fs::remove_dir_all(&tools);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("warren-shell-test-{}", nonce()));
    std::fs::create_dir(&dir).unwrap();
    dir
}
