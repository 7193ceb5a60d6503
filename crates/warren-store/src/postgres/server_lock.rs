//! One warren server per PostgreSQL database, until cluster mode (issue 14) teaches
//! several to share one: a second server's start-up recovery would close the first one's
//! running runs as failed and reap its sandboxes' records.
//!
//! The lock is a session-level advisory lock on a connection of its own: exactly the
//! semantics wanted here (unlike for guards): it belongs to the server process and ends
//! with its connection, so a server that dies, however it dies, frees the database.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use crate::StoreError;

/// The advisory lock key: "warren:serve" in ASCII, as a big-endian i64.
const SERVE_LOCK_KEY: i64 = 0x7761_7272_656e_3a73;

/// How often the holder checks that its connection, and so the lock, is still there.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The database's one-server lock, held until dropped.
pub struct ServerLock {
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for ServerLock {
    fn drop(&mut self) {
        // The connection goes with the task, and the lock with the connection.
        self.keeper.abort();
    }
}

impl std::fmt::Debug for ServerLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerLock")
    }
}

async fn try_lock(options: &PgConnectOptions) -> Result<Option<PgConnection>, StoreError> {
    let mut connection = options
        .connect()
        .await
        .map_err(StoreError::query("take the server lock"))?;
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(SERVE_LOCK_KEY)
        .fetch_one(&mut connection)
        .await
        .map_err(StoreError::query("take the server lock"))?;
    Ok(taken.then_some(connection))
}

/// Takes the lock, or fails with [`StoreError::DatabaseInUse`] when another server holds
/// it. While held, a task checks the connection; should it break (the database
/// restarted), the task takes the lock again on a new one, and logs an error if another
/// server took it in between.
pub(super) async fn hold(url: &str) -> Result<ServerLock, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(StoreError::Open)?;
    let options = options.application_name("warren (server lock)");
    let Some(mut connection) = try_lock(&options).await? else {
        return Err(StoreError::DatabaseInUse);
    };
    let keeper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if connection.ping().await.is_ok() {
                continue;
            }
            tracing::warn!(
                "the server lock's connection to PostgreSQL broke; taking the lock again"
            );
            loop {
                match try_lock(&options).await {
                    Ok(Some(again)) => {
                        connection = again;
                        tracing::info!("the server lock is held again");
                        break;
                    }
                    Ok(None) => {
                        tracing::error!(
                            "ANOTHER WARREN SERVER TOOK THIS DATABASE while the connection was \
                             down: two servers on one database fail each other's runs; stop one"
                        );
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(CHECK_EVERY).await;
            }
        }
    });
    Ok(ServerLock { keeper })
}
