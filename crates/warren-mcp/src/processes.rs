//! Background processes for agents that start servers, watchers or long builds and come
//! back to them (the anchor: Claude Code's background bash tools): start, read the output
//! from an offset, write to stdin, kill, list. Every rule is the provisioner's; these
//! only parse arguments and write text for a model.

use std::time::Duration;
use warren_protocol::strict;

use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::SandboxId;
use warren_provisioner::{
    FencePermit, ProcessInfo, ProcessRead, ProcessState, ProgramSpec, Provisioner, StartProcess,
    MAX_OUTPUT_WAIT,
};

use crate::tools::{cut_middle, parse, Definition, Outcome, ToolResult};

/// Longest `wait_s` of `process_output`.
const MAX_WAIT_S: u64 = MAX_OUTPUT_WAIT.as_secs();

/// The process tools, for `tools/list`.
pub(crate) const DEFINITIONS: &[Definition] = &[
    (
        "start_process",
        "Start a command in the background and return at once with its pid: a dev server, a \
         watcher, a long build or test run. It keeps running after this call (until it ends, \
         is killed, or the sandbox stops); read what it prints with process_output, send it \
         input with write_stdin (start it with `stdin: true`), stop it with kill_process. Use \
         bash instead for commands that finish quickly.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line, run with bash -c."},
                    "cwd": {"type": "string", "description": "Working directory: relative to the project directory, or absolute under /home/gem/user-data or /home/gem/skills."},
                    "tag": {"type": "string", "description": "A name to recognise it by in list_processes."},
                    "stdin": {"type": "boolean", "description": "Keep its stdin open for write_stdin (default false: it reads end-of-file)."},
                    "timeout_s": {"type": "integer", "minimum": 1, "description": "Kill it and everything it started after this many seconds (default: no limit)."}
                },
                "required": ["command"],
                "additionalProperties": false
            })
        },
    ),
    (
        "process_output",
        "Read what a background process printed (stdout and stderr, interleaved as they \
         came) from byte offset `from` (default 0), and whether it still runs or how it \
         ended. The result ends with the offset to pass as `from` next time, so each call \
         returns only what is new. `wait_s` waits up to that many seconds for new output or \
         the end when there is none yet.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "pid": {"type": "integer", "minimum": 1, "description": "The pid start_process returned."},
                    "from": {"type": "integer", "minimum": 0, "description": "Byte offset to read from (default 0)."},
                    "wait_s": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S, "description": "Seconds to wait for new output or the end (default 0)."}
                },
                "required": ["pid"],
                "additionalProperties": false
            })
        },
    ),
    (
        "write_stdin",
        "Send text to the stdin of a background process started with `stdin: true` (add \
         \\n to end a line); `close: true` then closes its stdin (end-of-file).",
        || {
            json!({
                "type": "object",
                "properties": {
                    "pid": {"type": "integer", "minimum": 1, "description": "The process."},
                    "input": {"type": "string", "description": "The text to send."},
                    "close": {"type": "boolean", "description": "Close stdin after the text (default false)."}
                },
                "required": ["pid", "input"],
                "additionalProperties": false
            })
        },
    ),
    (
        "kill_process",
        "Stop a background process and everything it started, and report how it ended.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "pid": {"type": "integer", "minimum": 1, "description": "The process."}
                },
                "required": ["pid"],
                "additionalProperties": false
            })
        },
    ),
    (
        "list_processes",
        "List the background processes of this sandbox: running ones and those that ended \
         in the last ten minutes, with their pid, tag, state and command.",
        || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    ),
];

/// The process tools that change the sandbox, fenced by `X-Warren-Fence` (I33).
pub(crate) const FENCED: [&str; 3] = ["start_process", "write_stdin", "kill_process"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartArgs {
    command: String,
    cwd: Option<String>,
    tag: Option<String>,
    #[serde(default)]
    stdin: bool,
    #[serde(default, deserialize_with = "strict::whole_number")]
    timeout_s: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputArgs {
    pid: i32,
    #[serde(default, deserialize_with = "strict::required_whole_number")]
    from: u64,
    #[serde(default, deserialize_with = "strict::required_whole_number")]
    wait_s: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StdinArgs {
    pid: i32,
    input: String,
    #[serde(default)]
    close: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PidArgs {
    pid: i32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// Runs the process tool `name`; `None` when `name` is not one of them.
pub(crate) async fn run(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    name: &str,
    arguments: Value,
    permit: FencePermit,
) -> Option<ToolResult> {
    Some(match name {
        "start_process" => start(provisioner, sandbox, parse(name, arguments), permit).await,
        "process_output" => output(provisioner, sandbox, parse(name, arguments)).await,
        "write_stdin" => write(provisioner, sandbox, parse(name, arguments)).await,
        "kill_process" => kill(provisioner, sandbox, parse(name, arguments)).await,
        "list_processes" => list(provisioner, sandbox, parse(name, arguments)).await,
        _ => return None,
    })
}

async fn start(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<StartArgs, Outcome>,
    permit: FencePermit,
) -> ToolResult {
    let args = args?;
    if args.timeout_s == Some(0) {
        return Err(Outcome::error("timeout_s must be at least 1"));
    }
    let info = provisioner
        .start_process(
            sandbox,
            StartProcess {
                program: ProgramSpec::Bash(args.command),
                cwd: args.cwd,
                env: Default::default(),
                pty: None,
                stdin: args.stdin,
                tag: args.tag,
                timeout: args.timeout_s.map(Duration::from_secs),
                requested_by: "mcp".to_owned(),
                quiet: false,
            },
            permit,
        )
        .await?;
    Ok(Outcome::text(format!(
        "Started process {pid}{tag}. Read its output with process_output {{\"pid\": {pid}}}; \
         stop it with kill_process {{\"pid\": {pid}}}.",
        pid = info.pid,
        tag = info
            .tag
            .as_deref()
            .map(|t| format!(" (tag {t:?})"))
            .unwrap_or_default(),
    )))
}

async fn output(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<OutputArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    if args.wait_s > MAX_WAIT_S {
        return Err(Outcome::error(format!(
            "wait_s can be at most {MAX_WAIT_S}"
        )));
    }
    // Something new, or the end: whichever comes first within the wait.
    let ProcessRead {
        read,
        process: info,
    } = provisioner
        .read_process_output(
            sandbox,
            args.pid,
            args.from,
            Duration::from_secs(args.wait_s),
        )
        .await?;
    let mut text = String::new();
    if let Some((from, to)) = read.lost {
        text.push_str(&format!(
            "[{} bytes from offset {from} were dropped before this read: the process keeps its newest 1 MiB of output]\n",
            to - from
        ));
    }
    let bytes: Vec<u8> = read.pieces.iter().flat_map(|p| p.bytes.clone()).collect();
    text.push_str(&cut_middle(
        &String::from_utf8_lossy(&bytes),
        "read again with a later `from`",
    ));
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("[{}; next offset: {}]", state(&info), read.next));
    Ok(Outcome::text(text))
}

async fn write(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<StdinArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let written = provisioner
        .write_stdin(sandbox, args.pid, args.input.as_bytes(), args.close)
        .await?;
    Ok(Outcome::text(format!(
        "Wrote {written} bytes to process {}{}.",
        args.pid,
        if args.close {
            " and closed its stdin"
        } else {
            ""
        }
    )))
}

async fn kill(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<PidArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let info = provisioner.kill_process(sandbox, args.pid).await?;
    Ok(Outcome::text(format!(
        "Process {}: {}.",
        args.pid,
        state(&info)
    )))
}

async fn list(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<NoArgs, Outcome>,
) -> ToolResult {
    args?;
    let processes = provisioner.list_processes(sandbox).await?;
    if processes.is_empty() {
        return Ok(Outcome::text("No background processes."));
    }
    let lines: Vec<String> = processes
        .iter()
        .map(|p| {
            format!(
                "{}\t{}\t{}\t{}",
                p.pid,
                p.tag.as_deref().unwrap_or("-"),
                state(p),
                p.command
            )
        })
        .collect();
    Ok(Outcome::text(format!(
        "pid\ttag\tstate\tcommand\n{}",
        lines.join("\n")
    )))
}

/// How a process is doing, in words.
fn state(info: &ProcessInfo) -> String {
    match info.state {
        ProcessState::Running => "running".to_owned(),
        ProcessState::Ended {
            timed_out: true, ..
        } => "killed by its timeout".to_owned(),
        ProcessState::Ended {
            exit_code: Some(code),
            ..
        } => format!("exited with code {code}"),
        ProcessState::Ended {
            signal: Some(signal),
            ..
        } => format!("killed by signal {signal}"),
        ProcessState::Ended { .. } => "ended".to_owned(),
        ProcessState::Lost { .. } => "ended with its runtime (no exit status)".to_owned(),
    }
}
