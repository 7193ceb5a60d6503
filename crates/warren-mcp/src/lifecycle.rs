//! The sandbox's own life, for agents that manage it: what state it is in, its deadline
//! and labels, pausing and resuming it, and waiting for files to change. Every rule is the
//! provisioner's (the transition table, the settings' bounds, the descriptor-based watch);
//! these only parse arguments and write text for a model.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use warren_protocol::strict;

use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::SandboxId;
use warren_provisioner::{
    DeadlineAction, Provisioner, SettingsChange, WatchKind, MAX_SANDBOX_TIMEOUT,
};
use warren_store::SandboxRecord;

use crate::tools::{parse, Definition, Outcome, ToolResult};

/// Longest `timeout_s` of `watch_files`.
const MAX_WATCH_S: u64 = 60;
/// Most changes `watch_files` reports.
const MAX_CHANGES: usize = 500;

/// The lifecycle tools, for `tools/list`.
pub(crate) const DEFINITIONS: &[Definition] = &[
    (
        "sandbox_status",
        "Show this sandbox's state (running, stopped, paused, ...), its deadline and what \
         happens then, and its labels.",
        || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    ),
    (
        "set_deadline",
        "Set when this sandbox ends: `timeout_s` seconds from now, or null for no deadline; \
         `on_deadline` says whether it is then terminated (files kept, runtime gone) or \
         paused (resumable). Labels, when given, replace the sandbox's labels.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "timeout_s": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_SANDBOX_TIMEOUT.as_secs(), "description": "Seconds from now; null removes the deadline."},
                    "on_deadline": {"type": "string", "enum": ["terminate", "pause"], "description": "What happens when it passes (default: as before)."},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Replace the labels with these."}
                },
                "additionalProperties": false
            })
        },
    ),
    (
        "pause_sandbox",
        "Pause this sandbox: its runtime is snapshotted and stopped. Files and installed \
         packages are kept; running processes end and memory is not kept. Nothing runs until \
         resume_sandbox.",
        || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    ),
    (
        "resume_sandbox",
        "Resume this paused sandbox: its runtime starts again from the pause's snapshot.",
        || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    ),
    (
        "watch_files",
        "Wait up to `timeout_s` seconds for something under a directory to change, and list \
         what changed (created, written, removed, renamed) relative to it. Returns as soon \
         as changes came, or when the time is up with none.",
        || {
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The directory (default: the project directory)."},
                    "recursive": {"type": "boolean", "description": "Include the directories beneath it (default true)."},
                    "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_WATCH_S, "description": "Seconds to wait (default 30)."}
                },
                "additionalProperties": false
            })
        },
    ),
];

/// The lifecycle tools that change the sandbox, and so are fenced (I33).
pub(crate) const FENCED: [&str; 3] = ["set_deadline", "pause_sandbox", "resume_sandbox"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadlineArgs {
    #[serde(default, deserialize_with = "strict::nullable_whole_number")]
    pub(crate) timeout_s: Option<Option<u64>>,
    on_deadline: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default, deserialize_with = "strict::whole_number")]
    timeout_s: Option<u64>,
}

/// Runs the lifecycle tool `name`; `None` when `name` is not one of them.
pub(crate) async fn run(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    name: &str,
    arguments: Value,
) -> Option<ToolResult> {
    Some(match name {
        "sandbox_status" => status(provisioner, sandbox, parse(name, arguments)).await,
        "set_deadline" => set_deadline(provisioner, sandbox, parse(name, arguments)).await,
        "pause_sandbox" => pause(provisioner, sandbox, parse(name, arguments)).await,
        "resume_sandbox" => resume(provisioner, sandbox, parse(name, arguments)).await,
        "watch_files" => watch(provisioner, sandbox, parse(name, arguments)).await,
        _ => return None,
    })
}

/// A sandbox as a model reads it.
fn describe(record: &SandboxRecord) -> String {
    let deadline = match record.settings.deadline {
        Some(at) => format!(
            "deadline {} (then {})",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            match record.settings.on_deadline {
                DeadlineAction::Terminate => "terminated",
                DeadlineAction::Pause => "paused",
            }
        ),
        None => "no deadline".to_owned(),
    };
    let labels = if record.settings.labels.is_empty() {
        "no labels".to_owned()
    } else {
        let pairs: Vec<String> = record
            .settings
            .labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        format!("labels {}", pairs.join(", "))
    };
    format!(
        "Sandbox {} is {}; {deadline}; {labels}.",
        record.id, record.state
    )
}

async fn status(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<NoArgs, Outcome>,
) -> ToolResult {
    args?;
    Ok(Outcome::text(describe(
        &provisioner.sandbox(sandbox).await?,
    )))
}

async fn set_deadline(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<DeadlineArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let on_deadline = match args.on_deadline.as_deref() {
        None => None,
        Some("terminate") => Some(DeadlineAction::Terminate),
        Some("pause") => Some(DeadlineAction::Pause),
        Some(other) => {
            return Err(Outcome::error(format!(
                "on_deadline is terminate or pause, not {other:?}"
            )))
        }
    };
    if args.timeout_s == Some(Some(0)) {
        return Err(Outcome::error("timeout_s must be at least 1"));
    }
    let change = SettingsChange {
        labels: args.labels,
        timeout: args
            .timeout_s
            .map(|seconds| seconds.map(Duration::from_secs)),
        on_deadline,
    };
    let record = provisioner.update_settings(sandbox, change).await?;
    Ok(Outcome::text(describe(&record)))
}

async fn pause(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<NoArgs, Outcome>,
) -> ToolResult {
    args?;
    let paused = provisioner.pause_sandbox(sandbox).await?;
    let mut text = describe(&paused.record);
    if paused.runtime_ended {
        text.push_str(
            " Its runtime was stopped: running processes ended; files and installed packages are kept.",
        );
    }
    if let Some(error) = paused.snapshot_error {
        text.push_str(&format!(
            " The runtime could not be snapshotted ({error}): what changed outside the workspace since its last snapshot is lost."
        ));
    }
    Ok(Outcome::text(text))
}

async fn resume(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    args: Result<NoArgs, Outcome>,
) -> ToolResult {
    args?;
    let record = provisioner
        .resume_sandbox(sandbox, SettingsChange::default())
        .await?;
    Ok(Outcome::text(describe(&record)))
}

async fn watch(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    args: Result<WatchArgs, Outcome>,
) -> ToolResult {
    let args = args?;
    let timeout = Duration::from_secs(args.timeout_s.unwrap_or(30));
    if timeout.is_zero() || timeout.as_secs() > MAX_WATCH_S {
        return Err(Outcome::error(format!(
            "timeout_s must be between 1 and {MAX_WATCH_S}"
        )));
    }
    let path = args.path.unwrap_or_else(|| ".".to_owned());
    let recursive = args.recursive.unwrap_or(true);
    let (base, changes) = provisioner
        .wait_for_changes(sandbox, &path, recursive, timeout, MAX_CHANGES)
        .await?;
    if changes.is_empty() {
        return Ok(Outcome::text(format!(
            "Nothing changed under {base} in {} s.",
            timeout.as_secs()
        )));
    }
    let lines: Vec<String> = changes
        .iter()
        .map(|change| {
            let what = match change.kind {
                WatchKind::Create => "created",
                WatchKind::Write => "written",
                WatchKind::Remove => "removed",
                WatchKind::Rename => "renamed away",
                WatchKind::Chmod => "permissions changed",
            };
            format!("{what}\t{}", change.name)
        })
        .collect();
    Ok(Outcome::text(format!(
        "Changes under {base}:\n{}",
        lines.join("\n")
    )))
}
