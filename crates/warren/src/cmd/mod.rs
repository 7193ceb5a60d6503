//! Subcommands: one short file each.

mod branches;
mod client;
pub(crate) mod config;
mod data_dir_lock;
mod doctor;
mod drain;
mod e2b;
mod image;
mod kubernetes;
mod migrate;
pub mod output;
mod processes;
mod secrets;
mod serve;
mod serve_backends;
#[cfg(test)]
pub(crate) mod settings_reference;
#[cfg(test)]
mod specification;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sandboxes and workspaces for AI agents.
#[derive(Debug, Parser)]
#[command(name = "warren", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the provisioner: the HTTP API on embedded defaults.
    Serve(serve::ServeArgs),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
    /// Show which isolation features this host supports.
    Doctor,
    /// Drain the server of this node's data directory and stop it, as SIGTERM does: in
    /// cluster mode its runtimes are snapshotted and handed back to the other replicas.
    Drain(drain::DrainArgs),
    /// Import root filesystems for runtimes (offline; works on the data directory).
    Image(image::ImageArgs),
    /// Run warren on Kubernetes: print the manifests (offline).
    K8s(kubernetes::K8sArgs),
    /// E2B's API: create the API keys E2B clients use (offline; works on the state store).
    E2b(e2b::E2bArgs),
    /// Import an old deployment's files into warren's workspaces, once and crash-safe
    /// (offline: refuses while a server runs on the data directory).
    Migrate(migrate::MigrateArgs),
    /// Manage workdirs of a user (client of a running server).
    Workdir(client::WorkdirArgs),
    /// Manage sandboxes (client of a running server).
    Sandbox(client::SandboxArgs),
    /// Record, compare and restore a sandbox's workdir (client of a running server).
    Checkpoint(client::CheckpointArgs),
    /// Branch a workdir: writable views over it for parallel executors, merged back with
    /// `warren merge` (client of a running server).
    Branch(branches::BranchArgs),
    /// Merge branches of a sandbox's workdir into it, three-way per file, all or nothing,
    /// under the sandbox's execution guard (client of a running server).
    Merge(branches::MergeArgs),
    /// Record a sandbox's runtime (installed packages, /home/gem) for resume (client of a
    /// running server).
    Snapshot(client::SnapshotArgs),
    /// Hold a sandbox's execution guard: one executor at a time, its changes fenced by the
    /// guard's token (client of a running server).
    Guard(client::GuardArgs),
    /// Manage a user's agent environment (client of a running server).
    Env(client::EnvArgs),
    /// Manage egress secrets: credentials a sandbox never holds, presented by warren's
    /// proxy only to the destinations they are bound to (client of a running server).
    Secret(secrets::SecretArgs),
    /// Show every connection a sandbox made or was refused (client of a running server).
    Egress(secrets::EgressArgs),
    /// Run a command in a sandbox (client of a running server); `-it` for a terminal.
    Exec(client::ExecArgs),
    /// List a sandbox's processes (client of a running server).
    Ps(processes::PsArgs),
    /// Attach this terminal to a sandbox's process (client of a running server).
    Attach(processes::AttachArgs),
    /// List run records of a sandbox or a uid, newest first (client of a running server).
    Runs(processes::RunsArgs),
    /// Serve a sandbox's MCP tools over stdio (client of a running server, for MCP clients
    /// that launch tools as processes).
    Mcp(client::McpArgs),
    /// Print a file of a sandbox to stdout (client of a running server).
    Cat(client::CatArgs),
    /// Write stdin or a local file to a sandbox file (client of a running server).
    Put(client::PutArgs),
    /// List a directory of a sandbox (client of a running server).
    Ls(client::LsArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Openapi => {
            output::line(serde_json::to_string_pretty(
                &warren_api::openapi_document(),
            )?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => doctor::run(),
        Command::Drain(args) => drain::run(args),
        Command::Image(args) => image::run(args),
        Command::K8s(args) => kubernetes::run(args),
        Command::E2b(args) => e2b::run(args).await,
        Command::Migrate(args) => migrate::run(args).await,
        Command::Workdir(args) => client::workdir(args).await,
        Command::Sandbox(args) => client::sandbox(args).await,
        Command::Checkpoint(args) => client::checkpoint(args).await,
        Command::Branch(args) => branches::branch(args).await,
        Command::Merge(args) => branches::merge(args).await,
        Command::Snapshot(args) => client::snapshot(args).await,
        Command::Guard(args) => client::guard(args).await,
        Command::Env(args) => client::env(args).await,
        Command::Secret(args) => secrets::secret(args).await,
        Command::Egress(args) => secrets::egress(args).await,
        Command::Exec(args) => client::exec(args).await,
        Command::Ps(args) => processes::ps(args).await,
        Command::Attach(args) => processes::attach(args).await,
        Command::Runs(args) => processes::runs(args).await,
        Command::Mcp(args) => client::mcp(args).await,
        Command::Cat(args) => client::cat(args).await,
        Command::Put(args) => client::put(args).await,
        Command::Ls(args) => client::ls(args).await,
    }
}
