//! The tools: their definitions (names, descriptions written for models, JSON Schemas), the
//! checking of their arguments, and what each does through the provisioner.

use std::sync::Arc;
use std::time::Duration;
use warren_protocol::strict;

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};
use rmcp::ErrorData;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::{Layout, LayoutName, SandboxId, SecretMasker, VirtualPath, SKILLS_MOUNT};
use warren_fs::{ByteRange, FsError, GrepOptions, Kind, WriteOptions};
use warren_provisioner::{
    ExecInput, FencePermit, FenceToken, ProgramSpec, Provisioner, ProvisionerError,
};

/// The longest text a tool returns; longer output is cut with a note saying how to get the
/// rest. About 8,000 tokens: enough to be useful, small enough not to drown a context.
pub const MAX_TOOL_TEXT_CHARS: usize = 30_000;
/// Most bytes `read_file` reads of a file to number its lines.
const READ_WINDOW_BYTES: u64 = 16 * 1024 * 1024;
/// Longest line `read_file` shows whole.
const MAX_LINE_CHARS: usize = 2_000;
/// Largest image `view_image` returns.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
/// Most entries `ls` and `glob` return, and matches `grep` returns.
const MAX_ENTRIES: usize = 1_000;
const MAX_MATCHES: usize = 500;

pub(crate) type Definition = (&'static str, &'static str, fn() -> Value);

const DEFINITIONS: &[Definition] = &[
    (
        "bash",
        "Run a bash command in the sandbox and return its stdout, its stderr (after a \
         [stderr] line) and its exit code. The runtime persists between calls: files, \
         installed packages, /tmp and background processes stay. The working directory is the \
         project directory unless `cwd` says otherwise. A command that exits non-zero, is \
         killed or times out is reported as an error. Long output is cut in the middle; \
         redirect it to a file and read that with read_file to see everything.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line, run with bash -c."},
                    "timeout_s": {"type": "integer", "minimum": 1, "description": "Seconds before the command and everything it started are killed (default 60)."},
                    "cwd": {"type": "string", "description": "Working directory: relative to the project directory, or absolute under /home/gem/user-data or /home/gem/skills."}
                },
                "required": ["command"],
                "additionalProperties": false
            })
        },
    ),
    (
        "ls",
        "List a directory. Entries are relative to the listed directory, one per line; \
         directories end with '/', symbolic links with '@'. `depth` descends into \
         subdirectories (1 = direct children only).",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The directory (default: the project directory)."},
                    "depth": {"type": "integer", "minimum": 1, "maximum": 5, "description": "Levels to list (default 1)."}
                },
                "additionalProperties": false
            })
        },
    ),
    (
        "read_file",
        "Read a text file with line numbers (number, tab, line). Reads `limit` lines from \
         line `offset` (1-based); when more lines follow, the result ends with the offset \
         to continue from. Binary files are refused; use view_image for images.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file: relative to the project directory, or absolute. Under /home/gem/user-data or /home/gem/skills it is persistent; anywhere else (/tmp) it is the sandbox's own and goes with it."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return, 1-based (default 1)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "Most lines to return (default 2000)."}
                },
                "required": ["path"],
                "additionalProperties": false
            })
        },
    ),
    (
        "write_file",
        "Create or overwrite a file with `content` (or add it at the end with `append`). \
         Missing parent directories are created. Files under /home/gem/skills are read-only.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file to write."},
                    "content": {"type": "string", "description": "The text to write."},
                    "append": {"type": "boolean", "description": "Add to the end instead of replacing (default false)."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            })
        },
    ),
    (
        "edit_file",
        "Replace an exact piece of text in a file. `old_string` must occur exactly once \
         (copy it from read_file output without the line-number prefix, whitespace \
         included) unless `replace_all` is true, which replaces every occurrence.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file to edit."},
                    "old_string": {"type": "string", "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put in its place."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            })
        },
    ),
    (
        "glob",
        "Find files by name pattern (`*` within a name, `**` across directories, e.g. \
         `**/*.py`). Paths are relative to the search root, one per line.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The glob pattern."},
                    "path": {"type": "string", "description": "Where to search (default: the project directory)."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            })
        },
    ),
    (
        "grep",
        "Search file contents with a regular expression. Each match is one line: \
         path:line_number:text, paths relative to the search root. Binary and very large \
         files are skipped.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax)."},
                    "path": {"type": "string", "description": "Where to search (default: the project directory)."},
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. *.rs."},
                    "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            })
        },
    ),
    (
        "present_files",
        "Hand files over to the user as artifacts. Only files under outputs/ in the project \
         directory can be presented; write or move them there first. Returns each artifact's \
         id.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 100, "description": "Files under outputs/, e.g. outputs/report.md."}
                },
                "required": ["paths"],
                "additionalProperties": false
            })
        },
    ),
    (
        "view_image",
        "Look at an image file (PNG, JPEG, GIF or WebP, at most 10 MiB).",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The image file."}
                },
                "required": ["path"],
                "additionalProperties": false
            })
        },
    ),
];

/// Every tool, for `tools/list`, in the terms of the sandbox's layout: the descriptions
/// above are written for the default layout and name its mounts, which another layout
/// replaces with its own (a model must be told the paths that work, I7).
pub(crate) fn definitions(layout: &Layout) -> Vec<Tool> {
    let in_layout = |text: &str| -> String {
        if layout.name == LayoutName::Ars {
            return text.to_owned();
        }
        let read_only: Vec<&str> = layout
            .mounts
            .iter()
            .filter(|mount| !mount.writable)
            .map(|mount| mount.target)
            .collect();
        text.replace(Layout::ARS.roots, layout.roots)
            .replace(SKILLS_MOUNT, &read_only.join(" and "))
    };
    all_definitions()
        .map(|(name, description, schema)| {
            let schema = in_layout(&schema().to_string());
            let schema: JsonObject = match serde_json::from_str(&schema) {
                Ok(Value::Object(object)) => object,
                _ => unreachable!("every schema above is an object"),
            };
            Tool::new(*name, in_layout(description), Arc::new(schema))
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BashArgs {
    command: String,
    #[serde(default, deserialize_with = "strict::whole_number")]
    timeout_s: Option<u64>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LsArgs {
    path: Option<String>,
    #[serde(default, deserialize_with = "strict::whole_number")]
    depth: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default, deserialize_with = "strict::whole_count")]
    offset: Option<usize>,
    #[serde(default, deserialize_with = "strict::whole_count")]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
    #[serde(default)]
    append: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    path: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresentArgs {
    paths: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewImageArgs {
    path: String,
}

/// What a tool produced before masking: content, and whether it is an error.
pub(crate) struct Outcome {
    content: Vec<ContentBlock>,
    is_error: bool,
}

impl Outcome {
    pub(crate) fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            is_error: false,
        }
    }

    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            is_error: true,
        }
    }

    pub(crate) fn with_content(content: Vec<ContentBlock>, is_error: bool) -> Self {
        Self { content, is_error }
    }
}

/// Every tool's definition: the file and shell tools, then each module's.
fn all_definitions() -> impl Iterator<Item = &'static Definition> {
    DEFINITIONS
        .iter()
        .chain(crate::processes::DEFINITIONS)
        .chain(crate::lifecycle::DEFINITIONS)
        .chain(crate::code::DEFINITIONS)
        .chain(crate::branches::DEFINITIONS)
}

impl From<ProvisionerError> for Outcome {
    fn from(error: ProvisionerError) -> Self {
        if matches!(
            error,
            ProvisionerError::Store(_)
                | ProvisionerError::Backend(_)
                | ProvisionerError::Interrupted(_)
        ) {
            tracing::error!(error = %warren_provisioner::error_chain(&error), "a tool call failed on the server");
        }
        Outcome::error(error.public_message())
    }
}

/// Runs one tool. Only an unknown tool name is a protocol error; everything else, bad
/// arguments included, is a tool result.
pub(crate) async fn call(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    name: &str,
    arguments: JsonObject,
    fence: Result<Option<FenceToken>, ProvisionerError>,
) -> Result<CallToolResult, ErrorData> {
    if !all_definitions().any(|(known, _, _)| *known == name) {
        return Err(ErrorData::invalid_params(
            format!("unknown tool {name:?}; tools/list names the tools"),
            None,
        ));
    }
    let outcome = run(provisioner, sandbox, name, Value::Object(arguments), fence).await;
    // Whatever a tool returns passes the secret masker (I13): a file or a listing can hold
    // an injected value as well as a command's output can.
    let masker = match provisioner.secret_masker(sandbox).await {
        Ok(masker) => masker,
        Err(error) => return Ok(finish(Outcome::from(error), &SecretMasker::default())),
    };
    Ok(finish(outcome, &masker))
}

pub(crate) fn finish(outcome: Outcome, masker: &SecretMasker) -> CallToolResult {
    let content = outcome
        .content
        .into_iter()
        .map(|block| match block {
            ContentBlock::Text(text) if !masker.is_empty() => ContentBlock::text(
                String::from_utf8_lossy(&masker.mask(text.text.as_bytes())).into_owned(),
            ),
            other => other,
        })
        .collect();
    if outcome.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    name: &str,
    arguments: Value,
) -> Result<T, Outcome> {
    serde_json::from_value(arguments).map_err(|error| {
        Outcome::error(format!(
            "invalid arguments for {name}: {error}; see the tool's input schema"
        ))
    })
}

/// The tools that change the sandbox, and so are fenced by `X-Warren-Fence` (I33).
const FENCED_TOOLS: [&str; 4] = ["bash", "write_file", "edit_file", "present_files"];

async fn run(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    name: &str,
    arguments: Value,
    fence: Result<Option<FenceToken>, ProvisionerError>,
) -> Outcome {
    // A fenced tool runs under the permit, as the HTTP routes do; a stale token is a tool
    // error saying so, and nothing is changed. Reading tools ignore the header.
    let fenced = FENCED_TOOLS.contains(&name)
        || crate::processes::FENCED.contains(&name)
        || crate::lifecycle::FENCED.contains(&name)
        || crate::code::FENCED.contains(&name);
    let mut permit = Some(if fenced {
        let admitted = match fence {
            Ok(token) => provisioner.fence(sandbox, token).await,
            Err(error) => Err(error),
        };
        match admitted {
            Ok(permit) => permit,
            Err(error) => return Outcome::from(error),
        }
    } else {
        FencePermit::unfenced()
    });
    let result = match name {
        // An exec lets its permit go once the command started (`exec_fenced`); the other
        // tools hold it until this function returns.
        "bash" => {
            let permit = permit.take().unwrap_or_else(FencePermit::unfenced);
            bash(provisioner, sandbox, parse(name, arguments), permit).await
        }
        "ls" => ls(provisioner, sandbox, parse(name, arguments)).await,
        "read_file" => read_file(provisioner, sandbox, parse(name, arguments)).await,
        "write_file" => write_file(provisioner, sandbox, parse(name, arguments)).await,
        "edit_file" => edit_file(provisioner, sandbox, parse(name, arguments)).await,
        "glob" => glob(provisioner, sandbox, parse(name, arguments)).await,
        "grep" => grep(provisioner, sandbox, parse(name, arguments)).await,
        "present_files" => present_files(provisioner, sandbox, parse(name, arguments)).await,
        "view_image" => view_image(provisioner, sandbox, parse(name, arguments)).await,
        "branch_diff" => crate::branches::run(provisioner, sandbox, name, arguments)
            .await
            .unwrap_or_else(|| Err(Outcome::error(format!("unknown tool {name:?}")))),
        "sandbox_status" | "set_deadline" | "pause_sandbox" | "resume_sandbox" | "watch_files" => {
            crate::lifecycle::run(provisioner, sandbox, name, arguments)
                .await
                .unwrap_or_else(|| Err(Outcome::error(format!("unknown tool {name:?}"))))
        }
        // An execution's start is its acceptance point, as an exec's is.
        "run_code" => {
            let permit = permit.take().unwrap_or_else(FencePermit::unfenced);
            crate::code::run(provisioner, sandbox, name, arguments, permit)
                .await
                .unwrap_or_else(|| Err(Outcome::error(format!("unknown tool {name:?}"))))
        }
        // A process's start is its acceptance point, as an exec's is.
        _ => {
            let permit = permit.take().unwrap_or_else(FencePermit::unfenced);
            crate::processes::run(provisioner, sandbox, name, arguments, permit)
                .await
                .unwrap_or_else(|| Err(Outcome::error(format!("unknown tool {name:?}"))))
        }
    };
    drop(permit);
    result.unwrap_or_else(|outcome| outcome)
}

pub(crate) type ToolResult = Result<Outcome, Outcome>;

async fn bash(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<BashArgs, Outcome>,
    permit: FencePermit,
) -> ToolResult {
    let args = args?;
    let max = provisioner.config().max_exec_timeout.as_secs();
    let timeout = match args.timeout_s {
        Some(0) => return Err(Outcome::error("timeout_s must be at least 1")),
        Some(seconds) if seconds > max => {
            return Err(Outcome::error(format!("timeout_s can be at most {max}")))
        }
        other => other.map(Duration::from_secs),
    };
    let report = provisioner
        .exec_fenced(
            sandbox,
            ExecInput {
                program: ProgramSpec::Bash(args.command),
                cwd: args.cwd,
                env: Default::default(),
                timeout,
                stdin: Vec::new(),
                requested_by: "mcp".to_owned(),
            },
            None,
            permit,
        )
        .await?;
    let outcome = report.outcome;
    let mut text = String::from_utf8_lossy(&outcome.stdout).into_owned();
    if !outcome.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&String::from_utf8_lossy(&outcome.stderr));
    }
    let mut text = cut_middle(
        &text,
        "redirect the output to a file and read it with read_file",
    );
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if outcome.truncated {
        text.push_str("[output beyond the server's cap was dropped]\n");
    }
    let failed = if outcome.timed_out {
        let seconds = timeout
            .unwrap_or(provisioner.config().default_exec_timeout)
            .as_secs();
        text.push_str(&format!(
            "[timed out after {seconds} s; the command and everything it started were killed]"
        ));
        true
    } else {
        match (outcome.exit_code, outcome.signal) {
            (Some(code), _) => {
                text.push_str(&format!("[exit code: {code}]"));
                code != 0
            }
            (None, Some(signal)) => {
                text.push_str(&format!("[killed by signal {signal}]"));
                true
            }
            (None, None) => {
                text.push_str("[the command ended without a status]");
                true
            }
        }
    };
    Ok(if failed {
        Outcome::error(text)
    } else {
        Outcome::text(text)
    })
}

/// `entry_path` (relative to a mount root) relative to `base` (a virtual path on the
/// same mount), for listings.
fn relative_to(base: &VirtualPath, entry_path: &str) -> String {
    let base = base.relative();
    if base.is_empty() {
        return entry_path.to_owned();
    }
    entry_path
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(entry_path)
        .to_owned()
}

async fn ls(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<LsArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let depth = match args.depth.unwrap_or(1) {
        depth @ 1..=5 => depth as u32,
        _ => return Err(Outcome::error("depth must be between 1 and 5")),
    };
    let path = args.path.unwrap_or_else(|| ".".to_owned());
    let listing = provisioner.list(sandbox, &path, depth, MAX_ENTRIES).await?;
    let mut lines: Vec<String> = listing
        .value
        .entries
        .iter()
        .map(|entry| {
            let name = relative_to(&listing.path, &entry.path);
            match entry.kind {
                Kind::Dir => format!("{name}/"),
                Kind::Symlink => format!("{name}@"),
                _ => name,
            }
        })
        .collect();
    if lines.is_empty() {
        lines.push(format!("({} is empty)", listing.path));
    }
    if listing.value.truncated {
        lines.push(format!(
            "[listing cut at {MAX_ENTRIES} entries; list a subdirectory or use glob]"
        ));
    }
    Ok(Outcome::text(cut_end(&lines.join("\n"))))
}

async fn read_file(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<ReadArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let offset = args.offset.unwrap_or(1);
    let limit = args.limit.unwrap_or(2000);
    if offset == 0 {
        return Err(Outcome::error("offset is 1-based: the first line is 1"));
    }
    if !(1..=10_000).contains(&limit) {
        return Err(Outcome::error("limit must be between 1 and 10000 lines"));
    }
    let read = provisioner
        .read(
            sandbox,
            &args.path,
            ByteRange::Span {
                start: 0,
                end_inclusive: Some(READ_WINDOW_BYTES - 1),
            },
        )
        .await?;
    let path = read.path;
    let bytes = read.value.bytes;
    if bytes.iter().take(8192).any(|b| *b == 0) {
        return Err(Outcome::error(format!(
            "{path} is a binary file; use view_image for images, or bash (xxd, file) to inspect it"
        )));
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return Ok(Outcome::text(format!("({path} is empty)")));
    }
    if offset > lines.len() {
        return Err(Outcome::error(format!(
            "{path} has {} lines; offset {offset} is past the end",
            lines.len()
        )));
    }
    let mut out = String::new();
    let mut next = offset;
    for (index, line) in lines.iter().enumerate().skip(offset - 1).take(limit) {
        let line = if line.chars().count() > MAX_LINE_CHARS {
            let cut: String = line.chars().take(MAX_LINE_CHARS).collect();
            format!("{cut}… [line cut at {MAX_LINE_CHARS} characters]")
        } else {
            (*line).to_owned()
        };
        let numbered = format!("{:>6}\t{line}\n", index + 1);
        if out.len() + numbered.len() > MAX_TOOL_TEXT_CHARS && next > offset {
            break;
        }
        out.push_str(&numbered);
        next = index + 2;
    }
    if next <= lines.len() {
        out.push_str(&format!(
            "[{} more lines; continue with offset={next}]",
            lines.len() + 1 - next
        ));
    } else if read.value.total_size > bytes.len() as u64 {
        out.push_str(&format!(
            "[the file has {} bytes; only the first {} MiB can be read by line, use bash (tail, sed -n) for the rest]",
            read.value.total_size,
            READ_WINDOW_BYTES / (1024 * 1024)
        ));
    }
    Ok(Outcome::text(out))
}

async fn write_file(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<WriteArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let length = args.content.len();
    let written = provisioner
        .write(
            sandbox,
            &args.path,
            args.content.into_bytes(),
            WriteOptions {
                create_parents: true,
                ..WriteOptions::default()
            },
            args.append,
        )
        .await?;
    let verb = if args.append { "appended" } else { "wrote" };
    Ok(Outcome::text(format!(
        "{verb} {length} bytes to {}",
        written.path
    )))
}

async fn edit_file(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<EditArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let path = provisioner.resolve_path(sandbox, &args.path).await?;
    match provisioner
        .edit(
            sandbox,
            &args.path,
            args.old_string,
            args.new_string,
            args.replace_all,
            None,
        )
        .await
    {
        Ok(edited) => Ok(Outcome::text(format!(
            "replaced {} occurrence{} in {}",
            edited.value.replacements,
            if edited.value.replacements == 1 { "" } else { "s" },
            edited.path
        ))),
        Err(ProvisionerError::File {
            source: FsError::EditNoMatch { .. },
            ..
        }) => Err(Outcome::error(format!(
            "{path}: old_string was not found in the file; read the file and copy the text exactly, whitespace included"
        ))),
        Err(ProvisionerError::File {
            source: FsError::EditAmbiguous { count, .. },
            ..
        }) => Err(Outcome::error(format!(
            "{path}: old_string occurs {count} times; include more surrounding text to make it unique, or set replace_all to true"
        ))),
        Err(error) => Err(error.into()),
    }
}

async fn glob(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<GlobArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let base = args.path.unwrap_or_else(|| ".".to_owned());
    let found = provisioner
        .glob(sandbox, &base, args.pattern, MAX_ENTRIES)
        .await?;
    let mut lines: Vec<String> = found
        .value
        .entries
        .iter()
        .map(|entry| relative_to(&found.path, &entry.path))
        .collect();
    if lines.is_empty() {
        lines.push(format!("no match under {}", found.path));
    }
    if found.value.truncated {
        lines.push(format!(
            "[cut at {MAX_ENTRIES} matches; narrow the pattern]"
        ));
    }
    Ok(Outcome::text(cut_end(&lines.join("\n"))))
}

async fn grep(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<GrepArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let base = args.path.unwrap_or_else(|| ".".to_owned());
    let found = provisioner
        .grep(
            sandbox,
            &base,
            args.pattern,
            GrepOptions {
                glob: args.glob,
                case_insensitive: args.case_insensitive,
                max_matches: MAX_MATCHES,
                ..GrepOptions::default()
            },
        )
        .await?;
    let mut lines: Vec<String> = found
        .value
        .matches
        .iter()
        .map(|m| {
            format!(
                "{}:{}:{}",
                relative_to(&found.path, &m.path),
                m.line_number,
                m.line
            )
        })
        .collect();
    if lines.is_empty() {
        lines.push(format!(
            "no match in {} files under {}",
            found.value.files_scanned, found.path
        ));
    }
    if found.value.truncated {
        lines.push(format!(
            "[cut at {MAX_MATCHES} matches; narrow the pattern, the path or the glob]"
        ));
    }
    Ok(Outcome::text(cut_end(&lines.join("\n"))))
}

async fn present_files(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<PresentArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let artifacts = provisioner.present_files(sandbox, &args.paths).await?;
    let lines: Vec<String> = artifacts
        .iter()
        .map(|artifact| {
            format!(
                "{}  {}  ({} bytes, {})",
                artifact.id, artifact.path, artifact.size, artifact.media_type
            )
        })
        .collect();
    Ok(Outcome::text(format!(
        "presented {} file{}:\n{}",
        artifacts.len(),
        if artifacts.len() == 1 { "" } else { "s" },
        lines.join("\n")
    )))
}

async fn view_image(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<ViewImageArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let read = provisioner
        .read(
            sandbox,
            &args.path,
            ByteRange::Span {
                start: 0,
                end_inclusive: Some(MAX_IMAGE_BYTES),
            },
        )
        .await?;
    if read.value.total_size > MAX_IMAGE_BYTES {
        return Err(Outcome::error(format!(
            "{} has {} bytes; images are shown up to {} MiB, scale it down first",
            read.path,
            read.value.total_size,
            MAX_IMAGE_BYTES / (1024 * 1024)
        )));
    }
    let Some(media_type) = image_type(&read.value.bytes) else {
        return Err(Outcome::error(format!(
            "{} is not a PNG, JPEG, GIF or WebP image",
            read.path
        )));
    };
    let data = base64::engine::general_purpose::STANDARD.encode(&read.value.bytes);
    Ok(Outcome {
        content: vec![ContentBlock::image(data, media_type)],
        is_error: false,
    })
}

/// The image type by its magic bytes, never by its name.
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// `text` cut to [`MAX_TOOL_TEXT_CHARS`] by dropping its middle (a command's first and last
/// lines say the most), with a note saying how much went and how to see it.
pub(crate) fn cut_middle(text: &str, how_to_see_all: &str) -> String {
    let total = text.chars().count();
    if total <= MAX_TOOL_TEXT_CHARS {
        return text.to_owned();
    }
    let keep = MAX_TOOL_TEXT_CHARS / 2;
    let head: String = text.chars().take(keep).collect();
    let tail: String = text.chars().skip(total - keep).collect();
    format!(
        "{head}\n[... {} characters cut; {how_to_see_all} ...]\n{tail}",
        total - 2 * keep
    )
}

/// `text` cut to [`MAX_TOOL_TEXT_CHARS`] at a line end, with a note.
fn cut_end(text: &str) -> String {
    if text.chars().count() <= MAX_TOOL_TEXT_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(MAX_TOOL_TEXT_CHARS).collect();
    let head = head
        .rsplit_once('\n')
        .map_or(head.as_str(), |(kept, _)| kept);
    format!("{head}\n[... output cut at {MAX_TOOL_TEXT_CHARS} characters; narrow the request]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_and_a_description() {
        let tools = definitions(&Layout::ARS);
        // Nine file and command tools, five for background processes, five for the
        // sandbox's own life, one for code in a kernel, one for a branch's changes.
        assert_eq!(tools.len(), 21);
        for tool in &tools {
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                tool.name
            );
            assert!(
                tool.description.as_ref().is_some_and(|d| d.len() > 40),
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn tool_descriptions_name_the_mounts_of_the_sandbox_layout() {
        let text = |layout: &Layout| -> String {
            definitions(layout)
                .iter()
                .map(|tool| format!("{:?} {:?}", tool.description, tool.input_schema))
                .collect()
        };
        let ars = text(&Layout::ARS);
        assert!(ars.contains("/home/gem/user-data") && ars.contains("/home/gem/skills"));
        let deerflow = text(&Layout::DEERFLOW);
        assert!(!deerflow.contains("/home/gem"), "{deerflow}");
        for mount in ["/mnt/user-data", "/mnt/skills/public", "/mnt/skills/custom"] {
            assert!(deerflow.contains(mount), "{mount}");
        }
        assert_eq!(definitions(&Layout::DEERFLOW).len(), 21);
    }

    #[test]
    fn whole_numbers_are_read_as_the_api_reads_them() {
        fn parse<T: serde::de::DeserializeOwned>(name: &str, arguments: Value) -> Result<T, ()> {
            super::parse(name, arguments).map_err(|_| ())
        }
        // `3.0` is the integer 3 in JSON Schema, which the tools' schemas are written in,
        // and what models often send; fractions, negatives and strings are refused.
        let bash: BashArgs = parse("bash", json!({"command": "true", "timeout_s": 30.0})).unwrap();
        assert_eq!(bash.timeout_s, Some(30));
        let read: ReadArgs = parse("read_file", json!({"path": "a", "offset": 2.0})).unwrap();
        assert_eq!((read.offset, read.limit), (Some(2), None));
        for bad in [json!(1.5), json!(-1), json!("30")] {
            let refused = parse::<BashArgs>("bash", json!({"command": "true", "timeout_s": bad}));
            assert!(refused.is_err(), "{bad}");
        }
        let cleared: crate::lifecycle::DeadlineArgs =
            parse("set_deadline", json!({"timeout_s": null})).unwrap();
        assert_eq!(cleared.timeout_s, Some(None));
        let absent: crate::lifecycle::DeadlineArgs = parse("set_deadline", json!({})).unwrap();
        assert_eq!(absent.timeout_s, None);
    }

    #[test]
    fn images_are_recognised_by_content_not_name() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\n...."), Some("image/png"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(image_type(b"<svg xmlns=..."), None);
        assert_eq!(image_type(b""), None);
    }

    #[test]
    fn long_output_loses_its_middle_and_says_so() {
        let text = "a".repeat(MAX_TOOL_TEXT_CHARS) + &"b".repeat(100);
        let cut = cut_middle(&text, "read it");
        assert!(cut.starts_with('a') && cut.ends_with('b'));
        assert!(cut.contains("100 characters cut; read it"));
        assert_eq!(cut_middle("short", "x"), "short");
    }

    #[test]
    fn listing_paths_are_relative_to_the_listed_directory() {
        let wd = warren_core::Workdir::new("projects/a").unwrap();
        let base = VirtualPath::parse(".", &warren_core::Layout::ARS, &[], &wd).unwrap();
        assert_eq!(relative_to(&base, "projects/a/notes/x.md"), "notes/x.md");
        let root =
            VirtualPath::parse("/home/gem/user-data", &warren_core::Layout::ARS, &[], &wd).unwrap();
        assert_eq!(relative_to(&root, "projects/a"), "projects/a");
    }
}
