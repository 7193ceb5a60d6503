//! Branches of a workdir and their merger (I27): `warren branch create|list|diff|rm` and
//! `warren merge`. All of it is the server's branches API; the merge is made under the
//! target sandbox's execution guard (I33), which `warren merge` takes and gives back itself.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use warren_client::{ClientError, WarrenClient};
use warren_protocol::{CreateBranch, EntryVersion, MergeBranches, MergeConflictInfo, MergeResult};

use super::client::{print_json, report, working, Connection};

#[derive(Debug, Args)]
pub struct BranchArgs {
    #[command(subcommand)]
    command: BranchCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum BranchCommand {
    /// Make a branch of a workdir and print it: of the workdir as it is now (read-only from
    /// then on, while it has such a branch; refused while a running sandbox can write it),
    /// or of one of its checkpoints. Bind sandboxes to it with `warren sandbox create
    /// --branch`.
    Create {
        /// The workspace owner.
        uid: String,
        /// The workdir, relative to the user's workspace.
        workdir: String,
        /// The branch's name: 1 to 64 ASCII letters, digits, `.`, `_` or `-`.
        name: String,
        /// A checkpoint of the workdir (ckpt-…) to branch from instead.
        #[arg(long)]
        from_checkpoint: Option<String>,
    },
    /// List a user's branches (of one workdir with --workdir), oldest first.
    List {
        /// The workspace owner.
        uid: String,
        /// Only the branches of this workdir.
        #[arg(long)]
        workdir: Option<String>,
    },
    /// Show what a branch changed against its baseline: `+` added, `-` deleted, `~`
    /// modified, one path a line.
    Diff {
        /// The workspace owner.
        uid: String,
        /// The workdir.
        workdir: String,
        /// The branch.
        name: String,
    },
    /// Delete a branch and what it changed (refused, branch_in_use, while a sandbox that
    /// is not terminated is bound to it: `warren sandbox rm` it first).
    Rm {
        /// The workspace owner.
        uid: String,
        /// The workdir.
        workdir: String,
        /// The branch.
        name: String,
    },
}

/// `warren merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The sandbox whose workdir is the target (one bound to the workdir itself).
    sandbox: String,
    /// Branches of its workdir, merged in this order.
    #[arg(required = true)]
    branches: Vec<String>,
    /// List what would change and what conflicts, changing nothing (needs no guard).
    #[arg(long)]
    dry_run: bool,
    /// Who holds the sandbox's execution guard during the merge [default:
    /// warren-cli-<pid>]. Not taken when --fence / WARREN_FENCE gives a guard token.
    #[arg(long)]
    holder: Option<String>,
    /// Seconds the guard lives (1 to 3600); the server keeps it for a merge that takes
    /// longer, and the command releases it when done.
    #[arg(long = "ttl-s", alias = "ttl", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    ttl_s: u64,
    #[command(flatten)]
    connection: Connection,
}

pub async fn branch(args: BranchArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        BranchCommand::Create {
            uid,
            workdir,
            name,
            from_checkpoint,
        } => {
            let request = CreateBranch {
                workdir,
                name,
                from_checkpoint,
            };
            match working("making the branch", client.create_branch(&uid, &request)).await {
                Ok(info) => print_json(&info).map(|()| ExitCode::SUCCESS),
                Err(e) => report(e),
            }
        }
        BranchCommand::List { uid, workdir } => {
            match client.list_branches(&uid, workdir.as_deref()).await {
                Ok(list) => print_json(&list).map(|()| ExitCode::SUCCESS),
                Err(e) => report(e),
            }
        }
        BranchCommand::Diff { uid, workdir, name } => {
            match client.branch_diff(&uid, &workdir, &name).await {
                Ok(diff) => {
                    let mut out = String::new();
                    for change in &diff.changes {
                        let mark = match change.change.as_str() {
                            "added" => "+",
                            "deleted" => "-",
                            _ => "~",
                        };
                        writeln!(out, "{mark} {}", change.path)?;
                    }
                    super::output::bytes(out.as_bytes())?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => report(e),
            }
        }
        BranchCommand::Rm { uid, workdir, name } => {
            match client.delete_branch(&uid, &workdir, &name).await {
                Ok(()) => print_json(&serde_json::json!({ "removed": name, "workdir": workdir }))
                    .map(|()| ExitCode::SUCCESS),
                Err(e) => report(e),
            }
        }
    }
}

/// `warren merge`: takes the guard (unless a dry run, or a token was given), merges with
/// its token, and releases it whatever the merge answered. Exit 0 when the branches
/// merged (or would), 1 when a dry run finds conflicts, 2 when the server refused the
/// merge (`merge_conflict` included); the conflicts are listed on stderr.
pub async fn merge(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let request = MergeBranches {
        branches: args.branches,
        dry_run: args.dry_run,
    };
    let merged = if args.dry_run {
        client.merge_branches(&args.sandbox, &request, None).await
    } else if let Some(token) = args.connection.fence() {
        // The caller holds the guard: its token fences the merge, and it releases it.
        merge_with(&client, &args.sandbox, &request, token).await
    } else {
        let holder = args
            .holder
            .unwrap_or_else(|| format!("warren-cli-{}", std::process::id()));
        let guard = match client
            .acquire_guard(&args.sandbox, &holder, args.ttl_s)
            .await
        {
            Ok(guard) => guard,
            Err(e) => return report(e),
        };
        // Tokens are positive: the server issues them from 1 up.
        let token = u64::try_from(guard.token).unwrap_or_default();
        let merged = tokio::select! {
            merged = merge_with(&client, &args.sandbox, &request, token) => Some(merged),
            _ = tokio::signal::ctrl_c() => None,
        };
        if let Err(e) = client.release_guard(&args.sandbox, token).await {
            eprintln!(
                "warren: the execution guard (token {token}) was not released: {e}; it \
                 lapses by itself after {} s",
                args.ttl_s
            );
        }
        match merged {
            Some(merged) => merged,
            None => {
                eprintln!("warren: interrupted; the guard was released");
                return Ok(ExitCode::from(130));
            }
        }
    };
    match merged {
        Ok(result) => {
            eprintln!("{}", summary(&result, &args.sandbox, args.dry_run));
            if !result.conflicts.is_empty() {
                eprint!("{}", conflicts_text(&result.conflicts));
            }
            print_json(&result)?;
            Ok(if result.conflicts.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Err(e) => {
            let conflicts = conflicts_text(e.conflicts());
            let code = report(e);
            eprint!("{conflicts}");
            code
        }
    }
}

async fn merge_with(
    client: &WarrenClient,
    sandbox: &str,
    request: &MergeBranches,
    token: u64,
) -> Result<MergeResult, ClientError> {
    working(
        "merging the branches",
        client.merge_branches(sandbox, request, Some(token)),
    )
    .await
}

/// One line on what the merge did or would do.
fn summary(result: &MergeResult, sandbox: &str, dry_run: bool) -> String {
    let changes = match result.steps.len() {
        1 => "1 change".to_owned(),
        n => format!("{n} changes"),
    };
    if dry_run {
        format!(
            "dry run: {changes} would be made, {} conflicts",
            result.conflicts.len()
        )
    } else if !result.applied {
        "nothing to merge: the branches change nothing the workdir lacks".to_owned()
    } else {
        match &result.checkpoint_id {
            Some(checkpoint) => format!(
                "merged: {changes} made; `warren checkpoint restore {sandbox} {checkpoint}` \
                 undoes it"
            ),
            None => format!("merged: {changes} made"),
        }
    }
}

/// Each conflict with its three versions: text shown line by line, anything else
/// described (a binary file by its size and hash).
fn conflicts_text(conflicts: &[MergeConflictInfo]) -> String {
    let mut out = String::new();
    for conflict in conflicts {
        let _ = writeln!(
            out,
            "conflict: {} (branch {}): {}",
            conflict.path, conflict.branch, conflict.reason
        );
        for (side, version) in [
            ("base", &conflict.base),
            ("ours", &conflict.ours),
            ("theirs", &conflict.theirs),
        ] {
            version_text(&mut out, side, version);
        }
    }
    out
}

fn version_text(out: &mut String, side: &str, version: &EntryVersion) {
    let _ = match version {
        EntryVersion::Absent => writeln!(out, "  {side}: absent"),
        EntryVersion::Text { text, mode } if text.is_empty() => {
            writeln!(out, "  {side}: empty text file, mode {mode:o}")
        }
        EntryVersion::Text { text, mode } => {
            let _ = writeln!(out, "  {side}: text, mode {mode:o}");
            for line in text.lines() {
                let _ = writeln!(out, "    | {line}");
            }
            if text.ends_with('\n') {
                Ok(())
            } else {
                writeln!(out, "    (no newline at the end)")
            }
        }
        EntryVersion::Binary { size, hash, mode } => writeln!(
            out,
            "  {side}: binary, {size} bytes, blake3 {hash}, mode {mode:o}"
        ),
        EntryVersion::Symlink { target } => writeln!(out, "  {side}: symlink to {target}"),
        EntryVersion::Dir { mode } => writeln!(out, "  {side}: directory, mode {mode:o}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_show_text_whole_and_binaries_by_size_and_hash() {
        let text = conflicts_text(&[MergeConflictInfo {
            path: "a.txt".into(),
            branch: "b1".into(),
            reason: "both changed the same lines".into(),
            base: EntryVersion::Text {
                text: "one\ntwo\n".into(),
                mode: 0o644,
            },
            ours: EntryVersion::Binary {
                size: 3,
                hash: "abc".into(),
                mode: 0o600,
            },
            theirs: EntryVersion::Absent,
        }]);
        assert_eq!(
            text,
            "conflict: a.txt (branch b1): both changed the same lines\n  \
             base: text, mode 644\n    | one\n    | two\n  \
             ours: binary, 3 bytes, blake3 abc, mode 600\n  \
             theirs: absent\n"
        );
    }
}
