//! `run_code`: code in a kernel that keeps its state between calls, for agents whose
//! anchor is a code interpreter (E2B's, OpenAI's): text and tracebacks come back as text,
//! plots and images as MCP image content. Every rule is the provisioner's code
//! interpreter's; this parses arguments and writes what a model reads.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use rmcp::model::ContentBlock;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::SandboxId;
use warren_protocol::{strict, CodeEvent, CodeExecution, ExecutionStatus};
use warren_provisioner::{FencePermit, Provisioner, RunCode};

use crate::tools::{cut_middle, parse, Definition, Outcome, ToolResult};

/// The code tool, for `tools/list`.
pub(crate) const DEFINITIONS: &[Definition] = &[(
    "run_code",
    "Run Python code in a Jupyter kernel that keeps its state between calls: variables, \
     imports and loaded data stay for the next call, so build on earlier results instead of \
     re-running a whole script. Returns what the code printed, the value of its last \
     expression, any error with its traceback, and plots (matplotlib) and other images as \
     images. Name a `context` to keep separate state (each is created on first use); the \
     default context is shared by calls that name none. Use bash for shell commands.",
    || {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code."},
                "context": {"type": "string", "description": "A context to run it in (1 to 64 letters, digits, '-', '_', '.'); created when missing. Default: the shared default context."},
                "timeout_s": {"type": "integer", "minimum": 1, "description": "Interrupt it after this many seconds (default: the server's command timeout); the context's state stays."}
            },
            "required": ["code"],
            "additionalProperties": false
        })
    },
)];

/// The code tool changes the sandbox: it is fenced (I33).
pub(crate) const FENCED: [&str; 1] = ["run_code"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunCodeArgs {
    code: String,
    context: Option<String>,
    #[serde(default, deserialize_with = "strict::whole_number")]
    timeout_s: Option<u64>,
}

/// Runs the tool `name`, or `None` when it is not this module's.
pub(crate) async fn run(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    name: &str,
    arguments: Value,
    permit: FencePermit,
) -> Option<ToolResult> {
    match name {
        "run_code" => Some(run_code(provisioner, sandbox, parse(name, arguments), permit).await),
        _ => None,
    }
}

async fn run_code(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    args: Result<RunCodeArgs, Outcome>,
    permit: FencePermit,
) -> ToolResult {
    let args = args?;
    let max = provisioner.config().max_exec_timeout;
    let timeout = match args.timeout_s {
        Some(0) => return Err(Outcome::error("timeout_s must be at least 1")),
        Some(seconds) if seconds > max.as_secs() => {
            return Err(Outcome::error(format!(
                "timeout_s can be at most {}",
                max.as_secs()
            )))
        }
        Some(seconds) => Duration::from_secs(seconds),
        None => provisioner.config().default_exec_timeout,
    };
    // A named context that does not exist yet is made for the call: a model names one to
    // keep its state apart, and should not have to create it first.
    if let Some(context) = &args.context {
        provisioner
            .code_context_or_create(
                sandbox,
                warren_provisioner::NewContext {
                    id: Some(context.clone()),
                    requested_by: "mcp".to_owned(),
                    ..Default::default()
                },
                FencePermit::unfenced(),
            )
            .await?;
    }
    let input = RunCode {
        code: args.code,
        context: args.context,
        timeout: Some(timeout),
        requested_by: "mcp".to_owned(),
        ..Default::default()
    };
    let events: Vec<CodeEvent> = provisioner
        .run_code(sandbox, input, permit)
        .await?
        .collect()
        .await;
    Ok(answer(CodeExecution::gather(events)))
}

/// What a model reads of an execution: one text block, then each image.
fn answer(execution: CodeExecution) -> Outcome {
    let mut text = String::new();
    if execution.restarted {
        text.push_str("[the kernel had died and was restarted: earlier state is gone]\n");
    }
    if !execution.stdout.is_empty() {
        text.push_str(&execution.stdout);
        if !execution.stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if !execution.stderr.is_empty() {
        text.push_str("[stderr]\n");
        text.push_str(&execution.stderr);
        if !execution.stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    let mut images = Vec::new();
    for result in &execution.results {
        let image = ["image/png", "image/jpeg", "image/gif", "image/webp"]
            .iter()
            .find_map(|mime| Some((*mime, result.data.get(*mime)?.as_str()?)));
        match image {
            Some((mime, data)) => images.push(ContentBlock::image(data.to_owned(), mime)),
            None => {
                if let Some(plain) = result.data.get("text/plain").and_then(Value::as_str) {
                    let label = if result.is_main_result {
                        "[result]"
                    } else {
                        "[display]"
                    };
                    text.push_str(&format!("{label} {plain}\n"));
                }
            }
        }
    }
    if let Some(error) = &execution.error {
        text.push_str(&format!("[error] {}: {}\n", error.name, error.value));
        for line in &error.traceback {
            text.push_str(&strip_ansi(line));
            text.push('\n');
        }
    }
    let status = match execution.status {
        ExecutionStatus::Ok => "ok",
        ExecutionStatus::Error => "error",
        ExecutionStatus::Timeout => "timed out (the kernel was interrupted)",
    };
    match execution.execution_count {
        Some(count) => text.push_str(&format!("[execution {count}: {status}]")),
        None => text.push_str(&format!("[{status}]")),
    }
    let mut content = vec![ContentBlock::text(cut_middle(
        &text,
        "print less, or write it to a file and read that with read_file",
    ))];
    content.extend(images);
    Outcome::with_content(content, execution.status != ExecutionStatus::Ok)
}

/// `text` without the terminal colours kernels put in tracebacks (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use warren_protocol::{CodeError, CodeResult};

    #[test]
    fn colours_are_taken_out_of_tracebacks() {
        assert_eq!(
            strip_ansi("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: x"),
            "ZeroDivisionError: x"
        );
    }

    #[test]
    fn a_plot_is_an_image_and_text_results_and_errors_are_text() {
        let execution = CodeExecution {
            context_id: "default".into(),
            status: ExecutionStatus::Error,
            execution_count: Some(3),
            stdout: "hi\n".into(),
            stderr: String::new(),
            results: vec![
                CodeResult {
                    data: BTreeMap::from([
                        ("text/plain".into(), json!("<Figure>")),
                        ("image/png".into(), json!("iVBOR")),
                    ]),
                    is_main_result: false,
                },
                CodeResult {
                    data: BTreeMap::from([("text/plain".into(), json!("42"))]),
                    is_main_result: true,
                },
            ],
            error: Some(CodeError {
                name: "ValueError".into(),
                value: "bad".into(),
                traceback: vec!["\u{1b}[0;31mValueError\u{1b}[0m".into()],
            }),
            restarted: false,
        };
        let result = crate::tools::finish(answer(execution), &Default::default());
        assert_eq!(result.is_error, Some(true));
        let text = result.content[0]
            .as_text()
            .expect("text first")
            .text
            .clone();
        assert_eq!(
            text,
            "hi\n[result] 42\n[error] ValueError: bad\nValueError\n[execution 3: error]"
        );
        let image = result.content[1].as_image().expect("then the plot");
        assert_eq!(
            (image.data.as_str(), image.mime_type.as_str()),
            ("iVBOR", "image/png")
        );
    }
}
