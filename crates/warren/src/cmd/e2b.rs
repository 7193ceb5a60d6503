//! `warren e2b key create`: an E2B API key for a uid, kept in the state store as a digest
//! (offline: works on the data directory's store, or the PostgreSQL store warren.toml
//! names, with or without a server running).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::config::{ConfigFile, StateChoice};
use super::output;

#[derive(Debug, Args)]
pub struct E2bArgs {
    #[command(subcommand)]
    command: E2bCommand,
}

#[derive(Debug, Subcommand)]
enum E2bCommand {
    /// Manage the API keys E2B clients send as `X-API-Key` (`E2B_API_KEY`).
    Key(KeyArgs),
}

#[derive(Debug, Args)]
struct KeyArgs {
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Create a key whose sandboxes live in this uid's workspace; it is printed once.
    Create {
        /// The uid the key acts for.
        #[arg(long)]
        uid: String,
        /// The server's warren.toml (for its data directory and state store).
        #[arg(long, env = "WARREN_CONFIG")]
        config: Option<PathBuf>,
        /// The server's data directory [default: as `warren serve`].
        #[arg(long, env = "WARREN_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The server's state store, when it is PostgreSQL (`postgres://…`).
        #[arg(long, env = "WARREN_STATE")]
        state: Option<String>,
    },
}

pub async fn run(args: E2bArgs) -> anyhow::Result<ExitCode> {
    let E2bCommand::Key(KeyArgs {
        command:
            KeyCommand::Create {
                uid,
                config,
                data_dir,
                state,
            },
    }) = args.command;
    let uid = warren_core::Uid::new(uid).context("--uid is not a usable uid")?;
    let file = match &config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let store: std::sync::Arc<dyn warren_store::StateStore> =
        match state.as_deref().or(file.state.url.as_deref()) {
            Some(url) => match StateChoice::parse(url)? {
                StateChoice::Postgres(url) => std::sync::Arc::new(
                    warren_store::PostgresStore::connect(&url, &Default::default())
                        .await
                        .context("cannot open the PostgreSQL state store")?,
                ),
                StateChoice::Sqlite(path) => open_sqlite(path, data_dir, &file).await?,
            },
            None => open_sqlite(None, data_dir, &file).await?,
        };
    let key = warren_e2b::create_key(&*store, &uid)
        .await
        .context("cannot record the key in the state store")?;
    output::line(key)?;
    eprintln!(
        "Give it to E2B clients as E2B_API_KEY; it is shown only now. Sandboxes it creates live in uid {uid}'s workspace."
    );
    Ok(ExitCode::SUCCESS)
}

async fn open_sqlite(
    path: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    file: &ConfigFile,
) -> anyhow::Result<std::sync::Arc<dyn warren_store::StateStore>> {
    let path = match path {
        Some(path) => path,
        None => {
            let data_dir = match data_dir.or(file.data_dir.clone()) {
                Some(dir) => dir,
                None => super::serve::default_data_dir()?,
            };
            // As `serve` would make it: a key may be created before the first start.
            let data_dir = super::serve::make_data_dir(&data_dir)?;
            warren_core::DataLayout::new(&data_dir).state_db()
        }
    };
    Ok(std::sync::Arc::new(
        warren_store::SqliteStore::open(&path)
            .await
            .with_context(|| format!("cannot open the state store {}", path.display()))?,
    ))
}
