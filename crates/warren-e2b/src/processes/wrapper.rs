//! The `/bin/sh` scripts a process and its helpers run in the runtime, and the argv
//! around them.
//!
//! Every script is constant text: the caller's command, its arguments, sizes and paths
//! reach the scripts only as positional parameters (`"$@"`), never spliced into a
//! script, so no argument can inject shell syntax. The one `eval` (rebuilding the
//! argument list inside a PTY, [`PTY_INNER`]) evaluates constant text holding a number
//! the script counted itself.

/// How a process's stdin and output are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// stdin is `/dev/null`, stdout and stderr are the exec's: the wrapper `exec`s the
    /// command, so the exit status is the command's own, signal included.
    Plain,
    /// stdin is a FIFO fed by short execs (`SendInput`); closing it (`CloseStdin`) gives
    /// the command its end of file.
    Stdin,
    /// A pseudo-terminal of this size, whose input is the FIFO and whose output (stdout and
    /// stderr alike) is the exec's stdout.
    Pty {
        /// Rows.
        rows: u32,
        /// Columns.
        cols: u32,
    },
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Stdin => "stdin",
            Self::Pty { .. } => "pty",
        }
    }

    /// Whether the process has a FIFO and a private directory.
    pub(crate) fn has_fifo(self) -> bool {
        !matches!(self, Self::Plain)
    }
}

/// The first bytes of the marker line the wrapper prints before the command runs.
pub(crate) const MARKER_TAG: &str = "\u{1e}WARREN-E2B ";

/// The exit status a wrapper answers when a PTY cannot be made in this image.
pub(crate) const EXIT_NO_PTY: i32 = 126;

/// The wrapper every process runs in: `$1` mode, `$2` nonce, `$3` rows, `$4` cols, `$5`
/// the PTY's inner script, then the command and its arguments.
///
/// It prints the marker line `\x1eWARREN-E2B <nonce> <pid> <keeper>` on stdout first
/// (the engine strips it before anything reaches a subscriber): `<pid>` is the wrapper's
/// own pid, which the command keeps (plain mode `exec`s it) or whose process group it
/// runs in (the agent makes every exec a session leader), so signals go to `-<pid>`.
///
/// With a FIFO, a keeper (`sleep`) holds its write end so the command never sees an end
/// of file between two inputs; killing the keeper closes stdin. The keeper leaves the
/// process group (`setsid`, which `exec`s in a background job: `$!` stays its pid), so a
/// SIGTERM the command survives does not close its stdin. A `TERM` the wrapper
/// receives (SendSignal) is re-raised on itself after the cleanup, so the exit reads
/// `signal: terminated` as the command's death by it would. The wrapper's own stderr is
/// `/dev/null` while the command runs (the command keeps the exec's), so the shell's
/// job report (`Terminated`) never shows in the command's output.
pub(crate) const WRAPPER: &str = r#"m=$1 n=$2 r=$3 c=$4 inner=$5
shift 5
if [ "$m" = plain ]; then
  printf '\036WARREN-E2B %s %s -\n' "$n" "$$"
  exec "$@" </dev/null
fi
if [ "$m" = pty ]; then
  case $(script -V 2>/dev/null) in
    *util-linux*) ;;
    *) echo "this sandbox image has no util-linux script(1)" >&2; exit 126;;
  esac
fi
d=/tmp/.warren-e2b-$n
mkdir -m 700 "$d" || exit 125
mkfifo -m 600 "$d/stdin" || { rmdir "$d"; exit 125; }
if command -v setsid >/dev/null 2>&1; then
  setsid sleep 2147483647 >"$d/stdin" 2>/dev/null &
else
  sleep 2147483647 >"$d/stdin" 2>/dev/null &
fi
k=$!
s=
trap 's=1' TERM
exec 4>&2 2>/dev/null
if [ "$m" = pty ]; then
  export WARREN_E2B_DIR="$d" WARREN_E2B_ROWS="$r" WARREN_E2B_COLS="$c"
  if [ -n "${SHELL+x}" ]; then export WARREN_E2B_SHELL="$SHELL"; fi
  i=0
  for a in "$@"; do export "WARREN_E2B_A$i=$a"; i=$((i+1)); done
  export WARREN_E2B_ARGC=$i
  printf '\036WARREN-E2B %s %s %s\n' "$n" "$$" "$k"
  SHELL=/bin/sh script -q -f -e -c "$inner" /dev/null <"$d/stdin" 2>&4 4>&-
else
  printf '\036WARREN-E2B %s %s %s\n' "$n" "$$" "$k"
  "$@" <"$d/stdin" 2>&4 4>&-
fi
rc=$?
kill "$k" 2>/dev/null
rm -rf -- "$d"
if [ -n "$s" ] && [ "$rc" -gt 128 ]; then trap - TERM; kill -s TERM $$; fi
exit "$rc"
"#;

/// What `script(1)` runs inside the PTY (as `/bin/sh -c`): records the terminal's name
/// for resizes, sets its size, puts back `SHELL`, rebuilds the command's arguments from
/// the variables the wrapper exported them in (constant `eval` text: only the index
/// varies) and becomes the command.
pub(crate) const PTY_INNER: &str = r#"tty >"$WARREN_E2B_DIR/tty" 2>/dev/null
stty rows "$WARREN_E2B_ROWS" cols "$WARREN_E2B_COLS" 2>/dev/null
if [ -n "${WARREN_E2B_SHELL+x}" ]; then export SHELL="$WARREN_E2B_SHELL"; else unset SHELL; fi
n=$WARREN_E2B_ARGC
i=0
set --
while [ "$i" -lt "$n" ]; do
  eval "set -- \"\$@\" \"\$WARREN_E2B_A$i\""
  unset "WARREN_E2B_A$i"
  i=$((i+1))
done
unset WARREN_E2B_ARGC WARREN_E2B_DIR WARREN_E2B_ROWS WARREN_E2B_COLS WARREN_E2B_SHELL
exec "$@"
"#;

/// Feeds a process's FIFO (`$1`) from this exec's stdin. The FIFO is opened read-write,
/// which never blocks, so input sent before the command opened its stdin (or after it
/// stopped reading) waits in the pipe instead of hanging the call. Exit 3: no FIFO (the
/// process ended).
pub(crate) const WRITE_INPUT: &str = r#"[ -p "$1" ] || exit 3
exec 3<>"$1" || exit 3
exec cat >&3
"#;

/// Closes a process's stdin: kills the keeper `$1`.
pub(crate) const CLOSE_STDIN: &str = r#"kill "$1" 2>/dev/null
exit 0
"#;

/// Sends signal `$1` to the process group `$2` (the wrapper's), or to the process alone
/// when it left its group.
pub(crate) const SIGNAL: &str = r#"kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2"
"#;

/// Resizes the PTY whose name the inner script recorded in `$1/tty` to `$2` rows and `$3`
/// columns; the kernel then sends `SIGWINCH` to its foreground process group. Waits up to
/// 5 s for the name (a resize right after the start). Exit 3: no PTY (any more).
pub(crate) const RESIZE: &str = r#"i=0
while [ ! -s "$1/tty" ]; do
  [ -d "$1" ] && [ "$i" -lt 50 ] || exit 3
  sleep 0.1
  i=$((i+1))
done
t=$(cat "$1/tty") || exit 3
case $t in /dev/*) ;; *) exit 3;; esac
exec stty -F "$t" rows "$2" cols "$3"
"#;

/// Removes a killed process's private directory `$1` (its wrapper had no chance to).
pub(crate) const CLEANUP: &str = r#"rm -rf -- "$1"
"#;

/// `$0` of every script: what `ps` shows and what the shell names in its messages.
const NAME: &str = "warren-e2b";

/// The private directory of the process with this nonce (only hex digits: the path
/// needs no quoting anywhere and cannot leave `/tmp`).
pub(crate) fn private_dir(nonce: &str) -> String {
    format!("/tmp/.warren-e2b-{nonce}")
}

/// The FIFO of the process with this nonce.
pub(crate) fn fifo(nonce: &str) -> String {
    format!("{}/stdin", private_dir(nonce))
}

/// The argv of a process: the wrapper, then the command and its arguments, each one
/// argument of its own.
pub(crate) fn process_argv(mode: Mode, nonce: &str, cmd: &str, args: &[String]) -> Vec<String> {
    let (rows, cols) = match mode {
        Mode::Pty { rows, cols } => (rows, cols),
        _ => (0, 0),
    };
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        WRAPPER.to_owned(),
        NAME.to_owned(),
        mode.as_str().to_owned(),
        nonce.to_owned(),
        rows.to_string(),
        cols.to_string(),
        PTY_INNER.to_owned(),
        cmd.to_owned(),
    ];
    argv.extend(args.iter().cloned());
    argv
}

/// The argv of a helper: `script` with `args` as its positional parameters.
pub(crate) fn helper_argv(script: &str, args: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        NAME.to_owned(),
    ];
    argv.extend(args.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a shell is here to run the scripts against (the test host's `/bin/sh`).
    fn sh() -> bool {
        std::path::Path::new("/bin/sh").exists()
    }

    fn run(argv: &[String], stdin: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn /bin/sh");
        // A wrapper that gives its command no stdin may be gone (or have closed the pipe)
        // before the bytes arrive: that broken pipe is the point, not a failure.
        match child.stdin.take().expect("stdin").write_all(stdin) {
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
            written => written.expect("write stdin"),
        }
        child.wait_with_output().expect("wait")
    }

    /// Arguments that would break out of any script they were spliced into.
    fn nasty() -> Vec<String> {
        [
            "a b",
            "it's",
            "\"quoted\"",
            "$(touch /tmp/warren-e2b-injected)",
            "`id`",
            "x; exit 7",
            "line\nbreak",
            "trailing newline\n",
            "",
            "*",
            "-n",
            "$HOME ${PATH} \\",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// The arguments as `printf '<%s>\n'` prints them.
    fn expected(args: &[String]) -> Vec<u8> {
        args.iter()
            .flat_map(|a| format!("<{a}>\n").into_bytes())
            .collect()
    }

    #[test]
    fn the_argv_keeps_every_argument_apart_from_the_script() {
        let args = nasty();
        let argv = process_argv(Mode::Plain, "00ff", "printf", &args);
        assert_eq!(&argv[..3], &["/bin/sh", "-c", WRAPPER]);
        assert_eq!(argv[9], "printf");
        assert_eq!(&argv[10..], &args[..]);
        // No script text depends on the arguments.
        assert!(!WRAPPER.contains("touch") && !PTY_INNER.contains("touch"));
    }

    #[test]
    fn plain_mode_prints_the_marker_then_runs_the_argv_verbatim() {
        if !sh() {
            return;
        }
        let mut args = vec!["<%s>\\n".to_owned()];
        args.extend(nasty());
        let out = run(&process_argv(Mode::Plain, "abc123", "printf", &args), b"");
        assert!(out.status.success(), "{out:?}");
        let text = out.stdout;
        let marker_end = text.iter().position(|&b| b == b'\n').expect("marker") + 1;
        let marker = String::from_utf8_lossy(&text[..marker_end]).into_owned();
        assert!(marker.starts_with("\u{1e}WARREN-E2B abc123 "), "{marker:?}");
        assert!(marker.ends_with(" -\n"), "{marker:?}");
        assert_eq!(&text[marker_end..], &expected(&nasty())[..]);
        assert!(!std::path::Path::new("/tmp/warren-e2b-injected").exists());
    }

    #[test]
    fn plain_mode_keeps_the_commands_exit_status_and_gives_it_no_stdin() {
        if !sh() {
            return;
        }
        let argv = process_argv(
            Mode::Plain,
            "abc124",
            "/bin/sh",
            &["-c".into(), "cat; exit 3".into()],
        );
        let out = run(&argv, b"not for the command");
        assert_eq!(out.status.code(), Some(3));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("not for the command"), "{text:?}");
    }

    #[test]
    fn stdin_mode_reads_the_fifo_until_the_keeper_dies_and_cleans_up() {
        if !sh() || !std::path::Path::new("/usr/bin/mkfifo").exists() {
            return;
        }
        let nonce = format!("t{}", std::process::id());
        let argv = process_argv(
            Mode::Stdin,
            &nonce,
            "/bin/sh",
            &["-c".into(), "cat; echo done; exit 4".into()],
        );
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // The marker comes before the command runs; read it to learn the keeper.
        let mut stdout = child.stdout.take().expect("stdout");
        let mut marker = Vec::new();
        let mut byte = [0u8; 1];
        use std::io::Read;
        while byte[0] != b'\n' {
            stdout.read_exact(&mut byte).expect("marker");
            marker.push(byte[0]);
        }
        let marker = String::from_utf8(marker).expect("utf-8");
        let keeper = marker
            .trim_end()
            .rsplit(' ')
            .next()
            .expect("keeper")
            .to_owned();
        // Two inputs, as two SendInput helpers would deliver them.
        for input in [&b"first "[..], b"second\n"] {
            let out = run(&helper_argv(WRITE_INPUT, &[fifo(&nonce)]), input);
            assert!(out.status.success(), "{out:?}");
        }
        let out = run(&helper_argv(CLOSE_STDIN, &[keeper]), b"");
        assert!(out.status.success(), "{out:?}");
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).expect("output");
        assert_eq!(rest, "first second\ndone\n");
        assert_eq!(child.wait().expect("wait").code(), Some(4));
        // The private directory is gone with the process.
        for _ in 0..50 {
            if !std::path::Path::new(&private_dir(&nonce)).exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("{} was not removed", private_dir(&nonce));
    }

    #[test]
    fn the_pty_inner_script_rebuilds_the_arguments_verbatim() {
        if !sh() {
            return;
        }
        // What the wrapper exports, then the inner script with `printf` as the command.
        let mut args = vec!["printf".to_owned(), "<%s>\\n".to_owned()];
        args.extend(nasty());
        let mut command = std::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(PTY_INNER)
            .env("WARREN_E2B_DIR", "/nonexistent")
            .env("WARREN_E2B_ROWS", "24")
            .env("WARREN_E2B_COLS", "80")
            .env("WARREN_E2B_ARGC", args.len().to_string())
            .env("WARREN_E2B_SHELL", "/bin/bash")
            .stdin(std::process::Stdio::null());
        for (i, arg) in args.iter().enumerate() {
            command.env(format!("WARREN_E2B_A{i}"), arg);
        }
        let out = command.output().expect("run");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, expected(&nasty()));
        assert!(!std::path::Path::new("/tmp/warren-e2b-injected").exists());
    }

    #[test]
    fn paths_are_under_tmp() {
        assert_eq!(private_dir("ab12"), "/tmp/.warren-e2b-ab12");
        assert_eq!(fifo("ab12"), "/tmp/.warren-e2b-ab12/stdin");
        assert_eq!(
            helper_argv(SIGNAL, &["TERM".into(), "42".into()])[4..],
            ["TERM", "42"]
        );
    }
}
