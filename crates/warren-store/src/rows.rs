//! Reading records out of result rows, shared by the SQLite and PostgreSQL stores.
//!
//! Both stores keep the same columns with the same Rust types (times as unix milliseconds),
//! so one set of decoders serves both, reading through the driver's [`Record`], and
//! [`Columns`] reports any value that breaks its type as
//! [`StoreError::Corrupt`] at the offending column.

use chrono::{DateTime, Utc};

use warren_core::{NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use crate::sql::Record;
use crate::{
    Artifact, Checkpoint, RunRecord, RunStatus, RuntimeSnapshot, SandboxRecord, SandboxState,
    StoreError, WorkdirRecord,
};

/// A column's Rust type, read through the driver's [`Record`].
pub(crate) trait FromColumn: Sized {
    fn read(row: &impl Record, column: &str) -> Result<Self, String>;
}

/// A NOT NULL column read as a plain value.
fn required<T>(value: Result<Option<T>, sqlx::Error>) -> Result<T, String> {
    value
        .map_err(|error| error.to_string())?
        .ok_or_else(|| "unexpected NULL".to_owned())
}

impl FromColumn for i64 {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        required(row.int(column))
    }
}

impl FromColumn for Option<i64> {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        row.int(column).map_err(|error| error.to_string())
    }
}

impl FromColumn for Option<i32> {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        row.int(column)
            .map_err(|error| error.to_string())?
            .map(|value| i32::try_from(value).map_err(|error| error.to_string()))
            .transpose()
    }
}

impl FromColumn for String {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        required(row.text(column))
    }
}

impl FromColumn for Option<String> {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        row.text(column).map_err(|error| error.to_string())
    }
}

impl FromColumn for bool {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        required(row.boolean(column))
    }
}

impl FromColumn for Vec<u8> {
    fn read(row: &impl Record, column: &str) -> Result<Self, String> {
        required(row.bytes(column))
    }
}

/// Reads typed, validated values out of one row.
pub(crate) struct Columns<'r, R> {
    pub(crate) row: &'r R,
    pub(crate) table: &'static str,
}

impl<R: Record> Columns<'_, R> {
    pub(crate) fn corrupt(&self, column: &'static str, detail: impl ToString) -> StoreError {
        StoreError::Corrupt {
            table: self.table,
            column,
            detail: detail.to_string(),
        }
    }

    pub(crate) fn get<T: FromColumn>(&self, column: &'static str) -> Result<T, StoreError> {
        T::read(self.row, column).map_err(|error| self.corrupt(column, error))
    }

    /// A text column turned into a domain type by its validating constructor.
    pub(crate) fn parse<T, E: ToString>(
        &self,
        column: &'static str,
        constructor: impl FnOnce(String) -> Result<T, E>,
    ) -> Result<T, StoreError> {
        let text: String = self.get(column)?;
        constructor(text).map_err(|error| self.corrupt(column, error))
    }

    pub(crate) fn time(&self, column: &'static str) -> Result<DateTime<Utc>, StoreError> {
        let millis: i64 = self.get(column)?;
        DateTime::from_timestamp_millis(millis)
            .ok_or_else(|| self.corrupt(column, format!("{millis} ms is out of range")))
    }

    pub(crate) fn optional_time(
        &self,
        column: &'static str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let millis: Option<i64> = self.get(column)?;
        millis
            .map(|millis| {
                DateTime::from_timestamp_millis(millis)
                    .ok_or_else(|| self.corrupt(column, format!("{millis} ms is out of range")))
            })
            .transpose()
    }
}

/// A value of a JSON text column (a sandbox's network policy, its extra mounts), as both
/// stores write it.
pub(crate) fn json_column(
    table: &'static str,
    column: &'static str,
    value: &impl serde::Serialize,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt {
        table,
        column,
        detail: e.to_string(),
    })
}

/// A stored time that cannot be out of range (one this process wrote just now).
pub(crate) fn millis_to_time(millis: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(millis).unwrap_or_default()
}

pub(crate) fn workdir_from_row(row: &impl Record) -> Result<WorkdirRecord, StoreError> {
    let columns = Columns {
        row,
        table: "workdirs",
    };
    Ok(WorkdirRecord {
        uid: columns.parse("uid", Uid::new)?,
        workdir: columns.parse("workdir", Workdir::new)?,
        created_at: columns.time("created_at")?,
    })
}

pub(crate) fn sandbox_from_row(row: &impl Record) -> Result<SandboxRecord, StoreError> {
    let columns = Columns {
        row,
        table: "sandboxes",
    };
    Ok(SandboxRecord {
        id: columns.parse("id", |id| SandboxId::parse(&id))?,
        uid: columns.parse("uid", Uid::new)?,
        runtime_scope: columns.parse("runtime_scope", RuntimeScope::new)?,
        binding: warren_core::Binding {
            workdir: columns.parse("workdir", Workdir::new)?,
            network: columns.parse("network", |json: String| {
                serde_json::from_str::<NetworkPolicy>(&json)
            })?,
            backend: columns.parse("backend", |name: String| {
                warren_core::BackendKind::parse(&name)
                    .ok_or_else(|| format!("unknown backend {name:?}"))
            })?,
            image: columns.get("image")?,
            inherit_env: columns.get("inherit_env")?,
            ephemeral: columns.get("ephemeral")?,
            layout: columns.parse("layout", |name: String| {
                warren_core::LayoutName::parse(&name)
            })?,
            extra_mounts: columns.parse("extra_mounts", |json: String| {
                serde_json::from_str::<Vec<warren_core::ExtraMount>>(&json)
            })?,
            isolation: columns.parse("isolation", |name: String| {
                warren_core::IsolationTier::parse(&name)
                    .ok_or_else(|| format!("unknown isolation tier {name:?}"))
            })?,
            branch: columns
                .get::<Option<String>>("branch")?
                .map(|name| {
                    warren_core::BranchName::new(name)
                        .map_err(|error| columns.corrupt("branch", error))
                })
                .transpose()?,
        },
        seed_snapshot: columns.get("seed_snapshot")?,
        settings: crate::SandboxSettings {
            labels: columns.parse("labels", |json: String| {
                serde_json::from_str::<std::collections::BTreeMap<String, String>>(&json)
            })?,
            deadline: columns.optional_time("deadline_at")?,
            on_deadline: columns.parse("on_deadline", |action: String| {
                action.parse::<crate::DeadlineAction>()
            })?,
        },
        state: columns.parse("state", |state| state.parse::<SandboxState>())?,
        generation: columns.get("generation")?,
        created_at: columns.time("created_at")?,
        last_active_at: columns.time("last_active_at")?,
        updated_at: columns.time("updated_at")?,
    })
}

pub(crate) fn run_from_row(row: &impl Record) -> Result<RunRecord, StoreError> {
    let columns = Columns { row, table: "runs" };
    Ok(RunRecord {
        id: columns.get("id")?,
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        generation: columns.get("generation")?,
        command: columns.get("command")?,
        cwd: columns.get("cwd")?,
        requested_by: columns.get("requested_by")?,
        kind: columns.parse("kind", |kind| kind.parse::<crate::RunKind>())?,
        tag: columns.get("tag")?,
        pty: columns.get("pty")?,
        status: columns.parse("status", |status| status.parse::<RunStatus>())?,
        started_at: columns.time("started_at")?,
        finished_at: columns.optional_time("finished_at")?,
        exit_code: columns.get("exit_code")?,
        signal: columns.get("signal")?,
        timed_out: columns.get("timed_out")?,
        duration_ms: columns.get("duration_ms")?,
        cpu_user_ms: columns.get("cpu_user_ms")?,
        cpu_system_ms: columns.get("cpu_system_ms")?,
        peak_memory_bytes: columns.get("peak_memory_bytes")?,
        failure_reason: columns.get("failure_reason")?,
    })
}

pub(crate) fn artifact_from_row(row: &impl Record) -> Result<Artifact, StoreError> {
    let columns = Columns {
        row,
        table: "artifacts",
    };
    let size: i64 = columns.get("size")?;
    Ok(Artifact {
        id: columns.get("id")?,
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        uid: columns.parse("uid", Uid::new)?,
        path: columns.get("path")?,
        size: u64::try_from(size).map_err(|e| columns.corrupt("size", e))?,
        sha256: columns.get("sha256")?,
        media_type: columns.get("media_type")?,
        created_at: columns.time("created_at")?,
    })
}

pub(crate) fn checkpoint_from_row(row: &impl Record) -> Result<Checkpoint, StoreError> {
    let columns = Columns {
        row,
        table: "checkpoints",
    };
    let count = |column: &'static str| -> Result<u64, StoreError> {
        let value: i64 = columns.get(column)?;
        u64::try_from(value).map_err(|e| columns.corrupt(column, e))
    };
    Ok(Checkpoint {
        id: columns.get("id")?,
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        workdir: columns.parse("workdir", Workdir::new)?,
        manifest: columns.get("manifest")?,
        files: count("files")?,
        bytes: count("bytes")?,
        created_at: columns.time("created_at")?,
    })
}

pub(crate) fn runtime_snapshot_from_row(row: &impl Record) -> Result<RuntimeSnapshot, StoreError> {
    let columns = Columns {
        row,
        table: "runtime_snapshots",
    };
    let bytes: i64 = columns.get("bytes")?;
    Ok(RuntimeSnapshot {
        id: columns.get("id")?,
        sandbox_id: columns.parse("sandbox_id", |id| SandboxId::parse(&id))?,
        generation: columns.get("generation")?,
        cow_manifest: columns.get("cow_manifest")?,
        home_manifest: columns.get("home_manifest")?,
        bytes: u64::try_from(bytes).map_err(|e| columns.corrupt("bytes", e))?,
        reason: columns.get("reason")?,
        created_at: columns.time("created_at")?,
    })
}

/// A node row read when the store's clock said `now` (unix milliseconds).
pub(crate) fn node_from_row(row: &impl Record, now: i64) -> Result<crate::NodeRecord, StoreError> {
    let columns = Columns {
        row,
        table: "nodes",
    };
    let expires: i64 = columns.get("expires_at")?;
    let left: Option<i64> = columns.get("left_at")?;
    Ok(crate::NodeRecord {
        node_id: columns.get("node_id")?,
        advertise: columns.get("advertise")?,
        epoch: columns.get("epoch")?,
        registered_at: columns.time("registered_at")?,
        renewed_at: columns.time("renewed_at")?,
        expires_at: columns.time("expires_at")?,
        left_at: columns.optional_time("left_at")?,
        state: crate::NodeState::at(now, expires, left.is_some()),
    })
}
