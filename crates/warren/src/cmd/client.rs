//! Client subcommands: talk to a running server through `WARREN_URL` and `WARREN_TOKEN`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use warren_client::{ClientError, WarrenClient};
use warren_protocol::{CreateSandbox, ExecCommand, NetworkSpec, SetAgentEnvVar};

/// Where the server is and how to authenticate.
#[derive(Debug, Args)]
pub struct Connection {
    /// The server's base URL.
    #[arg(long, env = "WARREN_URL", default_value = "http://127.0.0.1:7878")]
    url: String,
    /// The provisioner token.
    #[arg(long, env = "WARREN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The execution guard token (from `warren guard acquire`) to fence changes with: sent
    /// as X-Warren-Fence by every command that changes a sandbox, which the server refuses
    /// once a newer holder took the guard over.
    #[arg(long, env = "WARREN_FENCE", global = true)]
    fence: Option<u64>,
}

impl Connection {
    pub(super) fn client(&self) -> anyhow::Result<WarrenClient> {
        let token = self.token.as_deref().context(
            "no token: set WARREN_TOKEN (the server generated one into <data-dir>/token)",
        )?;
        Ok(WarrenClient::new(&self.url, token)?.with_fence(self.fence))
    }

    /// The execution guard token given with --fence or WARREN_FENCE, if any.
    pub(super) fn fence(&self) -> Option<u64> {
        self.fence
    }
}

#[derive(Debug, Args)]
pub struct GuardArgs {
    #[command(subcommand)]
    command: GuardCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum GuardCommand {
    /// Take a sandbox's execution guard and print it; fails (exit 2, guard_held) while
    /// another holder has it. Renew it at a third of the TTL and pass its token to the
    /// commands that change the sandbox with --fence or WARREN_FENCE.
    Acquire {
        /// Sandbox id.
        sandbox: String,
        /// Who holds it: a run, worker or replica id (shown to other holders).
        #[arg(long)]
        holder: String,
        /// Seconds until it lapses unless renewed (1 to 3600).
        #[arg(long, default_value_t = 30)]
        ttl: u64,
        /// Print only the token (for `export WARREN_FENCE=$(warren guard acquire ...)`).
        #[arg(long)]
        token_only: bool,
    },
    /// Extend the guard to --ttl seconds from now; fails (exit 2, guard_not_found) once it
    /// lapsed or another holder took it.
    Renew {
        /// Sandbox id.
        sandbox: String,
        /// The guard's token; default: --fence / WARREN_FENCE.
        #[arg(long)]
        token: Option<u64>,
        /// New lifetime in seconds from now (1 to 3600) [default: the lifetime it was
        /// acquired or last renewed with].
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Release the guard now, so the next holder need not wait for it to lapse.
    Release {
        /// Sandbox id.
        sandbox: String,
        /// The guard's token; default: --fence / WARREN_FENCE.
        #[arg(long)]
        token: Option<u64>,
    },
    /// Show who holds the guard and until when (exit 2, guard_not_found, when nobody does).
    Show {
        /// Sandbox id.
        sandbox: String,
    },
}

#[derive(Debug, Args)]
pub struct WorkdirArgs {
    #[command(subcommand)]
    command: WorkdirCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum WorkdirCommand {
    /// Create a workdir (default `projects/<uuid>`).
    Create {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
        /// Relative path inside the user's workspace.
        #[arg(long)]
        path: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct SandboxArgs {
    #[command(subcommand)]
    command: SandboxCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum SandboxCommand {
    /// Find or create a sandbox: named by --uid and --runtime-scope, or derived from who
    /// shares it (--scope with the ids it needs).
    Create(Box<SandboxCreateArgs>),
    /// List sandboxes.
    List {
        /// Only this user's.
        #[arg(long)]
        uid: Option<String>,
        /// Only those in this state (created, running, stopped, paused, ...).
        #[arg(long)]
        state: Option<String>,
        /// Only those carrying this label, as key=value (repeatable: all of them).
        #[arg(long = "label")]
        labels: Vec<String>,
    },
    /// Pause a sandbox: its runtime is snapshotted and stopped (running processes end,
    /// files and installed packages stay); nothing runs until it is resumed.
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Fork a sandbox: new sandboxes of the same uid starting from its runtime state (a
    /// snapshot taken now) and its files, each writing its own branch of its workdir.
    /// Memory and running processes are not forked: a running source is paused and
    /// resumed for it.
    Fork {
        /// Sandbox id.
        id: String,
        /// How many forks (1 to 20).
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Each fork's deadline, seconds from now.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Resume a paused sandbox: its runtime starts again from the pause's snapshot.
    Resume {
        /// Sandbox id.
        id: String,
        /// A new deadline, seconds from now.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Change a sandbox's deadline or labels.
    Set {
        /// Sandbox id.
        id: String,
        /// Its deadline, seconds from now.
        #[arg(long, conflicts_with = "no_deadline")]
        timeout: Option<u64>,
        /// Remove its deadline.
        #[arg(long)]
        no_deadline: bool,
        /// What the deadline does: terminate or pause.
        #[arg(long, value_parser = ["terminate", "pause"])]
        on_deadline: Option<String>,
        /// Replace its labels with these, key=value (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Remove every label.
        #[arg(long, conflicts_with = "labels")]
        no_labels: bool,
    },
    /// Print what changes under a directory of a sandbox as it happens, one JSON event per
    /// line, until interrupted.
    Watch {
        /// Sandbox id.
        id: String,
        /// The directory (default: the workdir).
        #[arg(default_value = ".")]
        path: String,
        /// Include the directories beneath it.
        #[arg(long, short)]
        recursive: bool,
    },
    /// Reclaim a sandbox's runtime; workspace files stay.
    Rm {
        /// Sandbox id.
        id: String,
    },
    /// Kill every process in a sandbox (a runaway or fork bomb left in the background)
    /// without ending it: its runtime and files stay, and the next exec runs there.
    Kill {
        /// Sandbox id.
        id: String,
    },
}

/// `warren sandbox create`: the sandbox's identity, in one of the API's two forms, and
/// how it runs.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("identity")
        .required(true)
        .args(["runtime_scope", "scope"])
))]
struct SandboxCreateArgs {
    /// The workspace owner (with --runtime-scope).
    #[arg(long, requires = "runtime_scope", conflicts_with = "scope")]
    uid: Option<String>,
    /// The runtime scope, e.g. the root conversation's thread id (with --uid).
    #[arg(long, requires = "uid", conflicts_with = "scope")]
    runtime_scope: Option<String>,
    /// Instead of --uid and --runtime-scope: who shares the sandbox (the API's `scope`).
    /// user (every session of --user-id; without one, as session), session
    /// (--session-id), agent (--agent-id) or global. The old spelling `--isolation`
    /// still works; the isolation tier is --tier.
    #[arg(long, alias = "isolation", value_parser = ["user", "session", "agent", "global"])]
    scope: Option<String>,
    /// The end user's id, for --scope user.
    #[arg(long, requires = "scope")]
    user_id: Option<String>,
    /// The conversation's id, for --scope session (or user without --user-id).
    #[arg(long, requires = "scope")]
    session_id: Option<String>,
    /// The agent's id, for --scope agent.
    #[arg(long, requires = "scope")]
    agent_id: Option<String>,
    /// Relative workdir; default: a fresh projects/<uuid>.
    #[arg(long)]
    workdir: Option<String>,
    /// A branch of the workdir (`warren branch create`) for the sandbox to write instead of
    /// the workdir itself: its commands and file operations see the branch there.
    #[arg(long)]
    branch: Option<String>,
    /// Network: none (loopback only), open, or allowlist (with --allow); default: the
    /// server's (`[network] default`).
    #[arg(long)]
    network: Option<String>,
    /// An allowed destination for `--network allowlist` (repeatable).
    #[arg(long = "allow", requires = "network")]
    allow: Vec<String>,
    /// A refused destination for `--network open` or `allowlist` (repeatable): refused
    /// whatever else allows it.
    #[arg(long = "deny", requires = "network")]
    deny: Vec<String>,
    /// Give commands neither the global sandbox environment nor the uid's agent
    /// environment.
    #[arg(long)]
    no_inherit_env: bool,
    /// A temporary scope: scratch mounts instead of the uid's persistent workspace,
    /// removed with the sandbox.
    #[arg(long)]
    ephemeral: bool,
    /// The backend: local or docker (when the server enables it); default: the
    /// server's.
    #[arg(long)]
    backend: Option<String>,
    /// For the docker backend: the image (on the Docker host); default: the server's.
    #[arg(long)]
    image: Option<String>,
    /// The isolation tier: kernel, or gvisor (the API's `isolation`); default: the
    /// server's (`warren serve --tier`).
    #[arg(long, value_parser = ["kernel", "gvisor"])]
    tier: Option<String>,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    command: CheckpointCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum CheckpointCommand {
    /// Record the sandbox's workdir and print what it took.
    Create {
        /// Sandbox id.
        sandbox: String,
    },
    /// List the sandbox's checkpoints.
    List {
        /// Sandbox id.
        sandbox: String,
    },
    /// Show what changed in the workdir since a checkpoint.
    Diff {
        /// Sandbox id.
        sandbox: String,
        /// Checkpoint id.
        checkpoint: String,
    },
    /// Put the workdir back as a checkpoint recorded it (not while commands run). What
    /// commands did outside the workdir is not undone.
    Restore {
        /// Sandbox id.
        sandbox: String,
        /// Checkpoint id.
        checkpoint: String,
    },
    /// Remove what no checkpoint of a user needs from that user's snapshot store.
    Gc {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
    },
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Record a running runtime's installed packages and /home/gem.
    Create {
        /// Sandbox id.
        sandbox: String,
    },
    /// List a sandbox's runtime snapshots.
    List {
        /// Sandbox id.
        sandbox: String,
    },
    /// Remove what no snapshot or checkpoint of a user needs from that user's store.
    Gc {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
    },
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The sandbox whose tools to serve.
    #[arg(long)]
    sandbox: String,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    #[command(subcommand)]
    command: EnvCommand,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Subcommand)]
enum EnvCommand {
    /// Show a user's agent environment: names, lengths and hints, never values.
    List {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
    },
    /// Set one variable; the value is read from stdin (so it stays out of the shell
    /// history and the process list), one trailing newline removed.
    Set {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
        /// The variable's name.
        name: String,
        /// Not a secret: not masked in command output.
        #[arg(long)]
        plain: bool,
    },
    /// Remove one variable.
    Rm {
        /// The workspace owner.
        #[arg(long)]
        uid: String,
        /// The variable's name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Keep stdin open and pass it to the command as it comes (the command runs as a
    /// process of the sandbox, attached here).
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Run the command on a terminal of this terminal's size, in raw mode, following its
    /// resizes (`-it` for a shell).
    #[arg(short = 't', long)]
    tty: bool,
    /// Sandbox id.
    id: String,
    /// Working directory (virtual path); default: the workdir.
    #[arg(long)]
    cwd: Option<String>,
    /// Timeout in seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// Extra environment, as NAME=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// One argument: a shell line, run with /bin/sh -c (`warren exec ID 'ls | wc -l'`).
    /// Several: a program and its arguments, run without a shell
    /// (`warren exec ID -- python3 -c 'print(42)'`).
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<String>,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    /// Sandbox id.
    id: String,
    /// Virtual path.
    path: String,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    /// Sandbox id.
    id: String,
    /// Virtual path to write.
    path: String,
    /// Local file to upload; default: stdin.
    #[arg(long)]
    from: Option<PathBuf>,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Sandbox id.
    id: String,
    /// Virtual path; default: the workdir.
    #[arg(default_value = ".")]
    path: String,
    /// Levels to descend.
    #[arg(long, default_value_t = 1)]
    depth: u32,
    #[command(flatten)]
    connection: Connection,
}

fn parse_env(raw: &str) -> Result<(String, String), String> {
    raw.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{raw:?} is not NAME=VALUE"))
}

pub(super) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    super::output::line(serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// What the server's messages tell an API client to do, and the CLI command or flag that
/// does it: a person at a terminal should be told what to type.
const CLI_EQUIVALENTS: [(&str, &str); 5] = [
    (
        "send it with \"secret\": false",
        "set it with `warren env set --plain`",
    ),
    (
        "create it with POST /v1/users/{uid}/workdirs",
        "create it with `warren workdir create --uid <uid> --path <workdir>`",
    ),
    // Before the next entry, which is a prefix of it.
    (
        "with POST /v1/sandboxes/{id}/guard",
        "with `warren guard acquire <sandbox> --holder <name>`",
    ),
    (
        "again with POST /v1/sandboxes",
        "again with `warren sandbox create`",
    ),
    ("the X-Warren-Fence header", "--fence (WARREN_FENCE)"),
];

/// The server's message with its API advice turned into CLI advice.
fn for_the_cli(message: &str) -> String {
    CLI_EQUIVALENTS
        .iter()
        .fold(message.to_owned(), |text, (api, cli)| {
            text.replace(api, cli)
        })
}

/// Turns an API failure into a message a person can act on, and exit code 1 (2 for usage
/// errors the server reported as 4xx).
pub(super) fn report(error: ClientError) -> anyhow::Result<ExitCode> {
    eprintln!("warren: {}", for_the_cli(&error.to_string()));
    if let ClientError::Connect { .. } = error {
        eprintln!("hint: is `warren serve` running, and does WARREN_URL point at it?");
    }
    if error.status().is_some_and(|s| s.as_u16() == 401) {
        eprintln!("hint: WARREN_TOKEN must be the server's token (see <data-dir>/token)");
    }
    let code = match error.status() {
        Some(s) if s.is_client_error() => 2,
        _ => 1,
    };
    Ok(ExitCode::from(code))
}

pub async fn guard(args: GuardArgs) -> anyhow::Result<ExitCode> {
    let fence = args.connection.fence;
    let client = args.connection.client()?;
    let token_of = |token: Option<u64>| {
        token.or(fence).context(
            "no guard token: give --token, or --fence / WARREN_FENCE (the token `warren guard acquire` printed)",
        )
    };
    let result = match args.command {
        GuardCommand::Acquire {
            sandbox,
            holder,
            ttl,
            token_only,
        } => match client.acquire_guard(&sandbox, &holder, ttl).await {
            Ok(guard) if token_only => {
                super::output::line(guard.token)?;
                return Ok(ExitCode::SUCCESS);
            }
            other => other.map(|guard| serde_json::to_value(guard).unwrap_or_default()),
        },
        GuardCommand::Renew {
            sandbox,
            token,
            ttl,
        } => client
            .renew_guard(&sandbox, token_of(token)?, ttl)
            .await
            .map(|guard| serde_json::to_value(guard).unwrap_or_default()),
        GuardCommand::Release { sandbox, token } => {
            let token = token_of(token)?;
            client
                .release_guard(&sandbox, token)
                .await
                .map(|()| serde_json::json!({ "released": token }))
        }
        GuardCommand::Show { sandbox } => client
            .current_guard(&sandbox)
            .await
            .map(|guard| serde_json::to_value(guard).unwrap_or_default()),
    };
    match result {
        Ok(value) => print_json(&value).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

pub async fn workdir(args: WorkdirArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        WorkdirCommand::Create { uid, path } => {
            match client.create_workdir(&uid, path.as_deref()).await {
                Ok(info) => print_json(&info).map(|()| ExitCode::SUCCESS),
                Err(e) => report(e),
            }
        }
    }
}

pub async fn sandbox(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let result = match args.command {
        SandboxCommand::Create(create) => {
            let SandboxCreateArgs {
                uid,
                runtime_scope,
                scope,
                user_id,
                session_id,
                agent_id,
                workdir,
                branch,
                network,
                allow,
                deny,
                no_inherit_env,
                ephemeral,
                backend,
                image,
                tier,
            } = *create;
            client
                .create_sandbox(&CreateSandbox {
                    uid,
                    runtime_scope_id: runtime_scope,
                    scope,
                    user_id,
                    session_id,
                    agent_id,
                    workdir,
                    branch,
                    network: network.map(|mode| NetworkSpec { mode, allow, deny }),
                    inherit_env: no_inherit_env.then_some(false),
                    ephemeral,
                    backend,
                    image,
                    isolation: tier.map(|tier| match tier.as_str() {
                        "gvisor" => warren_protocol::SandboxIsolation::Gvisor,
                        _ => warren_protocol::SandboxIsolation::Kernel,
                    }),
                    ..CreateSandbox::default()
                })
                .await
                .map(|info| serde_json::to_value(info).unwrap_or_default())
        }
        SandboxCommand::List { uid, state, labels } => client
            .list_sandboxes(uid.as_deref(), state.as_deref(), &labels)
            .await
            .map(|list| serde_json::to_value(list).unwrap_or_default()),
        SandboxCommand::Pause { id } => client
            .pause_sandbox(&id)
            .await
            .map(|paused| serde_json::to_value(paused).unwrap_or_default()),
        SandboxCommand::Fork { id, count, timeout } => client
            .fork_sandbox(
                &id,
                &warren_protocol::ForkSandbox {
                    count: Some(count),
                    timeout_s: timeout,
                    labels: None,
                },
            )
            .await
            .map(|forked| serde_json::to_value(forked).unwrap_or_default()),
        SandboxCommand::Resume { id, timeout } => client
            .resume_sandbox(&id, timeout)
            .await
            .map(|info| serde_json::to_value(info).unwrap_or_default()),
        SandboxCommand::Set {
            id,
            timeout,
            no_deadline,
            on_deadline,
            labels,
            no_labels,
        } => {
            let labels = if no_labels {
                Some(Default::default())
            } else if labels.is_empty() {
                None
            } else {
                match parse_labels(&labels) {
                    Ok(labels) => Some(labels),
                    Err(message) => {
                        eprintln!("warren: {message}");
                        return Ok(ExitCode::from(2));
                    }
                }
            };
            let update = warren_protocol::UpdateSandbox {
                timeout_s: if no_deadline {
                    Some(None)
                } else {
                    timeout.map(Some)
                },
                on_deadline: on_deadline.map(|action| match action.as_str() {
                    "pause" => warren_protocol::OnDeadline::Pause,
                    _ => warren_protocol::OnDeadline::Terminate,
                }),
                labels,
            };
            client
                .update_sandbox(&id, &update)
                .await
                .map(|info| serde_json::to_value(info).unwrap_or_default())
        }
        SandboxCommand::Watch {
            id,
            path,
            recursive,
        } => return watch(&client, &id, &path, recursive).await,
        SandboxCommand::Rm { id } => client
            .remove_sandbox(&id)
            .await
            .map(|info| serde_json::to_value(info).unwrap_or_default()),
        SandboxCommand::Kill { id } => client
            .kill_processes(&id)
            .await
            .map(|killed| serde_json::to_value(killed).unwrap_or_default()),
    };
    match result {
        Ok(value) => print_json(&value).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

/// `key=value` pairs as labels.
fn parse_labels(pairs: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    pairs
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .ok_or_else(|| format!("--label {pair:?} is not key=value"))
        })
        .collect()
}

/// `warren sandbox watch`: the watch's events, one JSON line each, as they come.
async fn watch(
    client: &WarrenClient,
    id: &str,
    path: &str,
    recursive: bool,
) -> anyhow::Result<ExitCode> {
    use futures::StreamExt;
    let response = match client.watch(id, path, recursive).await {
        Ok(response) => response,
        Err(error) => return report(error),
    };
    let mut body = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut failed = false;
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk?);
        // Each event is one line, which a chunk may cut anywhere; the server ends the
        // stream after an `error` event.
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            failed |= line.starts_with(r#"{"type":"error""#);
            super::output::line(line)?;
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub async fn checkpoint(args: CheckpointArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        CheckpointCommand::Create { sandbox } => {
            match working("recording the workdir", client.create_checkpoint(&sandbox)).await {
                Ok(created) => {
                    let s = &created.summary;
                    eprintln!(
                        "checkpoint {}: {} files, {} dirs, {} links; read {}, stored {} new \
                     ({} of {} chunks new, ratio {:.1}) in {} ms",
                        created.checkpoint.checkpoint_id,
                        s.files,
                        s.dirs,
                        s.symlinks,
                        human_bytes(s.bytes_read),
                        human_bytes(s.bytes_stored),
                        s.chunks_new,
                        s.chunks,
                        s.dedup_ratio,
                        s.elapsed_ms
                    );
                    print_json(&created).map(|()| ExitCode::SUCCESS)
                }
                Err(e) => report(e),
            }
        }
        CheckpointCommand::List { sandbox } => match client.list_checkpoints(&sandbox).await {
            Ok(list) => print_json(&list).map(|()| ExitCode::SUCCESS),
            Err(e) => report(e),
        },
        CheckpointCommand::Diff {
            sandbox,
            checkpoint,
        } => match client.checkpoint_diff(&sandbox, &checkpoint).await {
            Ok(diff) => {
                let mut out = std::io::stdout().lock();
                for (mark, paths) in [
                    ("+", &diff.added),
                    ("-", &diff.removed),
                    ("~", &diff.changed),
                ] {
                    for path in paths {
                        writeln!(out, "{mark} {path}")?;
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => report(e),
        },
        CheckpointCommand::Restore {
            sandbox,
            checkpoint,
        } => match working(
            "restoring the workdir",
            client.restore_checkpoint(&sandbox, &checkpoint),
        )
        .await
        {
            Ok(info) => print_json(&info).map(|()| ExitCode::SUCCESS),
            Err(e) => report(e),
        },
        CheckpointCommand::Gc { uid } => match client.collect_snapshot_garbage(&uid).await {
            Ok(stats) => print_json(&stats).map(|()| ExitCode::SUCCESS),
            Err(e) => report(e),
        },
    }
}

pub async fn snapshot(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let result = match args.command {
        SnapshotCommand::Create { sandbox } => {
            let started = std::time::Instant::now();
            let created = working("recording the runtime", client.create_snapshot(&sandbox)).await;
            if let Ok(snapshot) = &created {
                eprintln!(
                    "snapshot {}: read {} in {} ms",
                    snapshot["snapshot_id"].as_str().unwrap_or("?"),
                    human_bytes(snapshot["bytes"].as_u64().unwrap_or(0)),
                    started.elapsed().as_millis()
                );
            }
            created
        }
        SnapshotCommand::List { sandbox } => client.list_snapshots(&sandbox).await,
        SnapshotCommand::Gc { uid } => client.collect_snapshot_garbage(&uid).await,
    };
    match result {
        Ok(value) => print_json(&value).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

/// Runs `work` behind a spinner with the elapsed time on stderr (nothing when stderr is not
/// a terminal), so a long checkpoint or restore visibly progresses.
pub(super) async fn working<T>(
    what: &'static str,
    work: impl std::future::Future<Output = T>,
) -> T {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.set_message(what);
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let result = work.await;
    spinner.finish_and_clear();
    result
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Serves a sandbox's MCP tools on stdin/stdout, for clients that launch tools as processes.
/// Nothing but MCP messages may go to stdout; diagnostics go to stderr.
pub async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match client.mcp_stdio_bridge(&args.sandbox).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

/// A value given on stdin, as `printf %s "$V" |` or `echo "$V" |` give it: one final
/// newline is not part of it.
pub(crate) fn value_from_stdin() -> anyhow::Result<String> {
    let mut value = String::new();
    std::io::stdin()
        .read_to_string(&mut value)
        .context("cannot read the value from stdin")?;
    if value.ends_with('\n') {
        value.pop();
    }
    Ok(value)
}

pub async fn env(args: EnvArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let result = match args.command {
        EnvCommand::List { uid } => client
            .agent_env(&uid)
            .await
            .map(|env| serde_json::to_value(env).unwrap_or_default()),
        EnvCommand::Set { uid, name, plain } => {
            let value = SetAgentEnvVar {
                value: value_from_stdin()?,
                secret: Some(!plain),
            };
            client
                .set_agent_env_var(&uid, &name, &value)
                .await
                .map(|entry| serde_json::to_value(entry).unwrap_or_default())
        }
        EnvCommand::Rm { uid, name } => client
            .remove_agent_env_var(&uid, &name)
            .await
            .map(|()| serde_json::json!({ "removed": name })),
    };
    match result {
        Ok(value) => print_json(&value).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let (command, argv) = match <[String; 1]>::try_from(args.command) {
        Ok([line]) => (Some(line), None),
        Err(argv) => (None, Some(argv)),
    };
    if args.interactive || args.tty {
        let request = warren_protocol::StartProcess {
            command,
            argv,
            cwd: args.cwd,
            env: args.env.into_iter().collect::<BTreeMap<_, _>>(),
            timeout_s: args.timeout,
            ..warren_protocol::StartProcess::default()
        };
        return super::processes::exec_interactive(client, &args.id, request, args.tty).await;
    }
    let command = ExecCommand {
        command,
        argv,
        shell: None,
        cwd: args.cwd,
        env: args.env.into_iter().collect::<BTreeMap<_, _>>(),
        timeout_s: args.timeout,
        stdin: None,
    };
    match client.exec(&args.id, &command).await {
        Ok(result) => {
            super::output::bytes(result.stdout.as_bytes())?;
            std::io::stderr().write_all(result.stderr.as_bytes())?;
            if result.timed_out {
                eprintln!("warren: the command timed out and was killed");
                return Ok(ExitCode::from(124));
            }
            // Shell convention: the command's own status, or 128 + signal.
            let code = match (result.exit_code, result.signal) {
                (Some(code), _) => code,
                (None, Some(signal)) => 128 + signal,
                (None, None) => 1,
            };
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        Err(e) => report(e),
    }
}

pub async fn cat(args: CatArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match client.read_file(&args.id, &args.path).await {
        Ok(bytes) => {
            super::output::bytes(&bytes)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => report(e),
    }
}

pub async fn put(args: PutArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let bytes = match &args.from {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        None => {
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes)?;
            bytes
        }
    };
    match client.write_file(&args.id, &args.path, bytes).await {
        Ok(result) => print_json(&result).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

pub async fn ls(args: LsArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match client.list_files(&args.id, &args.path, args.depth).await {
        Ok(list) => {
            for entry in &list.entries {
                let marker = match entry.kind.as_str() {
                    "dir" => "/",
                    "symlink" => "@",
                    _ => "",
                };
                super::output::line(format_args!("{:>10}  {}{marker}", entry.size, entry.path))?;
            }
            if list.truncated {
                eprintln!("warren: listing truncated; narrow the path or lower --depth");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => report(e),
    }
}
