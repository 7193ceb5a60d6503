//! Standard output of the client subcommands. A reader that closes the pipe early
//! (`warren openapi | head`) is normal use, not a failure: writes report it as an error the
//! caller passes up, and `main` ends quietly with the status a shell gives a process that
//! SIGPIPE ended (see [`closed_stdout`]), instead of the panic `println!` raises.

use std::io::Write;

/// Writes `text` and a newline to stdout.
pub fn line(text: impl std::fmt::Display) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Writes `bytes` to stdout as they are.
pub fn bytes(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

/// The exit status of a command whose reader went away: 128 + SIGPIPE, what a shell shows
/// for `yes | head -1`'s `yes`.
pub const CLOSED_STDOUT_STATUS: u8 = 128 + 13;

/// Whether `error` is stdout's reader having gone away (EPIPE).
pub fn closed_stdout(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` for report-style commands: a closed stdout is passed up with `?` (see the
/// module documentation) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cmd::output::line(format_args!($($arg)*))?
    };
}
pub(crate) use outln;
