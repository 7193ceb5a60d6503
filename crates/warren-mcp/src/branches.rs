//! `branch_diff`: what this sandbox's branch changed against the workdir it branches
//! (I27), so an agent writing a branch sees what a merger will bring back. Every rule is
//! the provisioner's; this writes what a model reads.

use std::sync::Arc;

use serde_json::{json, Value};
use warren_core::SandboxId;
use warren_provisioner::Provisioner;

use crate::tools::{Definition, Outcome, ToolResult};

/// The branch tools, for `tools/list`.
pub(crate) const DEFINITIONS: &[Definition] = &[(
    "branch_diff",
    "List what your branch changed against the workdir it branches: each path added, \
     deleted or modified, relative to the workdir. Only for a sandbox bound to a branch \
     (parallel agents each write their own branch over a shared read-only workdir; a \
     merger brings the branches back).",
    || json!({"type": "object", "properties": {}, "additionalProperties": false}),
)];

/// Runs the tool `name`, or `None` when it is not this module's.
pub(crate) async fn run(
    provisioner: &Arc<Provisioner>,
    sandbox: &SandboxId,
    name: &str,
    arguments: Value,
) -> Option<ToolResult> {
    match name {
        "branch_diff" => Some(branch_diff(provisioner, sandbox, arguments).await),
        _ => None,
    }
}

async fn branch_diff(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    arguments: Value,
) -> ToolResult {
    if arguments.as_object().is_some_and(|args| !args.is_empty()) {
        return Err(Outcome::error("branch_diff takes no arguments"));
    }
    let record = provisioner.sandbox(sandbox).await.map_err(Outcome::from)?;
    let Some(branch) = &record.binding.branch else {
        return Err(Outcome::error(format!(
            "this sandbox writes its workdir {} itself, not a branch of it: there is nothing \
             to compare",
            record.binding.workdir
        )));
    };
    let changes = provisioner
        .branch_diff(&record.uid, &record.binding.workdir, branch)
        .await
        .map_err(Outcome::from)?;
    if changes.is_empty() {
        return Ok(Outcome::text(format!(
            "branch {branch} of {} changes nothing yet",
            record.binding.workdir
        )));
    }
    let mut text = format!(
        "branch {branch} of {} changes {} path(s):\n",
        record.binding.workdir,
        changes.len()
    );
    for change in &changes {
        text.push_str(&format!("{}\t{}\n", change.what(), change.path));
    }
    Ok(Outcome::text(text))
}
