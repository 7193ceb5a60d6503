//! The dialect layer: the store's SQL is written once and run here on SQLite or PostgreSQL.
//!
//! Every statement uses `$n` parameters, which both drivers accept, and is built as a
//! [`Query`] of engine-neutral [`Arg`]s; rows come back as the driver's own row type, read
//! through [`Record`]. What the engines really do differently is a [`Dialect`]'s business
//! and nothing else's:
//!
//! - how a writing transaction keeps other writers out ([`Dialect::begin`],
//!   [`Dialect::lock`], [`Dialect::FOR_UPDATE`]): SQLite takes the whole file's write lock
//!   up front, PostgreSQL locks a row or a transaction-scoped advisory key;
//! - which clock judges expiry (guards, leases, nodes, owners): warren's own process clock
//!   on SQLite, the database's clock on PostgreSQL, so every replica agrees. A statement
//!   names it `:now` ([`Query::clock`]);
//! - the fence hold, which only a database shared by several processes needs.

use std::borrow::Cow;

use crate::StoreError;

/// One parameter of a statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    Int(Option<i64>),
    Int32(Option<i32>),
    Text(Option<Cow<'a, str>>),
    Bool(bool),
    Bytes(&'a [u8]),
}

/// What may be bound to a statement.
pub(crate) trait IntoArg<'a> {
    fn into_arg(self) -> Arg<'a>;
}

impl<'a> IntoArg<'a> for i64 {
    fn into_arg(self) -> Arg<'a> {
        Arg::Int(Some(self))
    }
}

impl<'a> IntoArg<'a> for Option<i64> {
    fn into_arg(self) -> Arg<'a> {
        Arg::Int(self)
    }
}

impl<'a> IntoArg<'a> for Option<i32> {
    fn into_arg(self) -> Arg<'a> {
        Arg::Int32(self)
    }
}

impl<'a> IntoArg<'a> for bool {
    fn into_arg(self) -> Arg<'a> {
        Arg::Bool(self)
    }
}

impl<'a> IntoArg<'a> for &'a str {
    fn into_arg(self) -> Arg<'a> {
        Arg::Text(Some(Cow::Borrowed(self)))
    }
}

impl<'a> IntoArg<'a> for &'a String {
    fn into_arg(self) -> Arg<'a> {
        Arg::Text(Some(Cow::Borrowed(self)))
    }
}

impl<'a> IntoArg<'a> for String {
    fn into_arg(self) -> Arg<'a> {
        Arg::Text(Some(Cow::Owned(self)))
    }
}

impl<'a> IntoArg<'a> for Option<&'a str> {
    fn into_arg(self) -> Arg<'a> {
        Arg::Text(self.map(Cow::Borrowed))
    }
}

impl<'a> IntoArg<'a> for &'a Option<String> {
    fn into_arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref().map(Cow::Borrowed))
    }
}

impl<'a> IntoArg<'a> for &'a [u8] {
    fn into_arg(self) -> Arg<'a> {
        Arg::Bytes(self)
    }
}

/// The marker a statement writes where it means "now, by the clock expiry is judged by".
const CLOCK: &str = ":now";

/// Where "now" comes from when a statement judges expiry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    /// warren's own clock read now: unix milliseconds, bound as a parameter.
    Process(i64),
    /// The database's clock, as SQL.
    Database(&'static str),
}

/// A statement and its parameters, in the order of their `$n`.
#[derive(Debug, Clone)]
pub(crate) struct Query<'a> {
    pub(crate) sql: Cow<'a, str>,
    pub(crate) args: Vec<Arg<'a>>,
}

impl<'a> Query<'a> {
    pub(crate) fn new(sql: impl Into<Cow<'a, str>>) -> Self {
        Self {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    pub(crate) fn bind(mut self, value: impl IntoArg<'a>) -> Self {
        self.args.push(value.into_arg());
        self
    }

    /// Puts the dialect's clock where the statement says `:now`; call it after the last
    /// [`Query::bind`], since a clock read by warren takes the next parameter.
    pub(crate) fn clock(mut self, dialect: &impl Dialect) -> Self {
        debug_assert!(self.sql.contains(CLOCK), "no {CLOCK} in {}", self.sql);
        let now = match dialect.clock() {
            Clock::Process(now) => {
                self.args.push(Arg::Int(Some(now)));
                format!("${}", self.args.len())
            }
            Clock::Database(sql) => sql.to_owned(),
        };
        self.sql = Cow::Owned(self.sql.replace(CLOCK, &now));
        self
    }

    /// Runs the statement on the pool; how many rows it changed.
    pub(crate) async fn execute<D: Dialect>(self, db: &D) -> Result<u64, sqlx::Error> {
        db.execute(&self).await
    }

    pub(crate) async fn fetch_optional<D: Dialect>(
        self,
        db: &D,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        db.fetch_optional(&self).await
    }

    pub(crate) async fn fetch_one<D: Dialect>(self, db: &D) -> Result<D::Row, sqlx::Error> {
        db.fetch_optional(&self)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    pub(crate) async fn fetch_all<D: Dialect>(self, db: &D) -> Result<Vec<D::Row>, sqlx::Error> {
        db.fetch_all(&self).await
    }

    /// Runs the statement in a transaction; how many rows it changed.
    pub(crate) async fn execute_in<D: Dialect>(
        self,
        tx: &mut Tx<'_, D>,
    ) -> Result<u64, sqlx::Error> {
        tx.execute(self).await
    }

    pub(crate) async fn fetch_optional_in<D: Dialect>(
        self,
        tx: &mut Tx<'_, D>,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        tx.fetch_optional(self).await
    }

    pub(crate) async fn fetch_one_in<D: Dialect>(
        self,
        tx: &mut Tx<'_, D>,
    ) -> Result<D::Row, sqlx::Error> {
        tx.fetch_one(self).await
    }
}

/// Typed reads of one result row, as the driver decodes them.
pub(crate) trait Record {
    fn int(&self, column: &str) -> Result<Option<i64>, sqlx::Error>;
    fn text(&self, column: &str) -> Result<Option<String>, sqlx::Error>;
    fn boolean(&self, column: &str) -> Result<Option<bool>, sqlx::Error>;
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

/// An engine: where statements run and what differs between engines.
#[async_trait::async_trait]
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug + 'static {
    type Row: Record + Send + Sync + 'static;
    type Tx: Send + 'static;

    /// `" FOR UPDATE"` where a transaction must lock the rows it reads to decide, empty where
    /// [`Dialect::begin`] already keeps every other writer out.
    const FOR_UPDATE: &'static str;

    /// How a text column is ordered byte by byte (keys, manifest ids), as a suffix.
    const BYTEWISE: &'static str;

    async fn execute(&self, query: &Query<'_>) -> Result<u64, sqlx::Error>;
    async fn fetch_optional(&self, query: &Query<'_>) -> Result<Option<Self::Row>, sqlx::Error>;
    async fn fetch_all(&self, query: &Query<'_>) -> Result<Vec<Self::Row>, sqlx::Error>;

    async fn tx_execute(tx: &mut Self::Tx, query: &Query<'_>) -> Result<u64, sqlx::Error>;
    async fn tx_fetch_optional(
        tx: &mut Self::Tx,
        query: &Query<'_>,
    ) -> Result<Option<Self::Row>, sqlx::Error>;

    /// Begins a transaction that is going to write.
    async fn begin(&self) -> Result<Self::Tx, sqlx::Error>;
    async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error>;
    async fn rollback(tx: Self::Tx) -> Result<(), sqlx::Error>;

    /// Makes the writers of `key` wait for one another until `tx` ends.
    async fn lock(tx: &mut Self::Tx, key: &str) -> Result<(), sqlx::Error>;

    /// The expiry clock read once, for a decision taken in `tx`.
    async fn now(&self, tx: &mut Self::Tx) -> Result<i64, sqlx::Error>;

    /// The clock expiry is judged by.
    fn clock(&self) -> Clock;

    /// Holds `sandbox`'s guard row so no replica can take the guard until the hold is
    /// dropped, when `token` is current; see [`crate::StateStore::hold_fence`].
    async fn hold_fence(
        &self,
        sandbox: &warren_core::SandboxId,
        token: i64,
    ) -> Result<(crate::FenceCheck, Option<crate::FenceHold>), StoreError>;
}

/// A writing transaction on a dialect's engine.
pub(crate) struct Tx<'d, D: Dialect> {
    pub(crate) dialect: &'d D,
    inner: D::Tx,
}

impl<'d, D: Dialect> Tx<'d, D> {
    pub(crate) async fn begin(dialect: &'d D) -> Result<Self, sqlx::Error> {
        Ok(Self {
            dialect,
            inner: dialect.begin().await?,
        })
    }

    pub(crate) async fn execute(&mut self, query: Query<'_>) -> Result<u64, sqlx::Error> {
        D::tx_execute(&mut self.inner, &query).await
    }

    pub(crate) async fn fetch_optional(
        &mut self,
        query: Query<'_>,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        D::tx_fetch_optional(&mut self.inner, &query).await
    }

    pub(crate) async fn fetch_one(&mut self, query: Query<'_>) -> Result<D::Row, sqlx::Error> {
        self.fetch_optional(query)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    pub(crate) async fn lock(&mut self, key: &str) -> Result<(), sqlx::Error> {
        D::lock(&mut self.inner, key).await
    }

    pub(crate) async fn now(&mut self) -> Result<i64, sqlx::Error> {
        self.dialect.now(&mut self.inner).await
    }

    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        D::commit(self.inner).await
    }

    /// Ends a transaction that wrote nothing, releasing its locks now rather than when the
    /// connection goes back to the pool.
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        D::rollback(self.inner).await
    }
}

/// Binds a [`Query`]'s parameters to a driver's statement; instantiated once per driver.
macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match arg {
                $crate::sql::Arg::Int(value) => query.bind(*value),
                $crate::sql::Arg::Int32(value) => query.bind(*value),
                $crate::sql::Arg::Text(value) => query.bind(value.as_deref()),
                $crate::sql::Arg::Bool(value) => query.bind(*value),
                $crate::sql::Arg::Bytes(value) => query.bind(*value),
            };
        }
        query
    }};
}
pub(crate) use bind_args;

/// Implements [`Dialect`] for a driver: the items given (what differs), plus the
/// statement runners, the same text for every driver, each binding a [`Query`] with
/// [`bind_args!`] and running it on the pool or in a transaction.
macro_rules! dialect {
    (impl for $dialect:ty, row $row:ty, tx $tx:ty { $($differs:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::sql::Dialect for $dialect {
        type Row = $row;
        type Tx = $tx;

        $($differs)*

        async fn execute(&self, query: &Query<'_>) -> Result<u64, sqlx::Error> {
            let done = bind_args!(sqlx::query(&query.sql), &query.args)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn fetch_optional(&self, query: &Query<'_>) -> Result<Option<$row>, sqlx::Error> {
            bind_args!(sqlx::query(&query.sql), &query.args)
                .fetch_optional(&self.pool)
                .await
        }

        async fn fetch_all(&self, query: &Query<'_>) -> Result<Vec<$row>, sqlx::Error> {
            bind_args!(sqlx::query(&query.sql), &query.args)
                .fetch_all(&self.pool)
                .await
        }

        async fn tx_execute(tx: &mut Self::Tx, query: &Query<'_>) -> Result<u64, sqlx::Error> {
            let done = bind_args!(sqlx::query(&query.sql), &query.args)
                .execute(&mut **tx)
                .await?;
            Ok(done.rows_affected())
        }

        async fn tx_fetch_optional(
            tx: &mut Self::Tx,
            query: &Query<'_>,
        ) -> Result<Option<$row>, sqlx::Error> {
            bind_args!(sqlx::query(&query.sql), &query.args)
                .fetch_optional(&mut **tx)
                .await
        }

        async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error> {
            tx.commit().await
        }

        async fn rollback(tx: Self::Tx) -> Result<(), sqlx::Error> {
            tx.rollback().await
        }
        }
    };
}
pub(crate) use dialect;
