//! Running statements: binding a [`Stmt`]'s parameters, and what it hands back ([`Reply`]),
//! read the same way from every driver.

use std::future::Future;

use lockcore::{LockName, Result};
use sqlx::error::BoxDynError;
use sqlx::{Arguments, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row};
use sqlx::{SqlStr, Type};

use super::{Args, Param, Stmt};
use crate::common::{StatementConn, StatementRunner, whole};

/// How many integer columns of a statement's first row a [`Reply`] keeps.
pub const COLUMNS: usize = 7;

/// What a statement handed back.
#[derive(Debug, Default)]
pub struct Reply {
    /// Rows it changed, and MySQL's insert id (a statement run for its changes).
    changed: (u64, u64),
    /// Its first row's first [`COLUMNS`] columns (a statement that answers with a row).
    row: Option<[Option<i64>; COLUMNS]>,
    /// How many tries it took (a retry may have followed a lost reply).
    pub tries: u32,
}

impl Reply {
    /// The number the statement reports: its first column, or the rows it changed.
    pub fn count(&self) -> i64 {
        match self.row {
            Some([n, ..]) => n.unwrap_or(0),
            None => i64::try_from(self.changed.0).unwrap_or(i64::MAX),
        }
    }

    /// The value it hands back (a fence, a ticket): its first column, or, from a MySQL
    /// statement that wrote a row, the insert id.
    pub fn value(&self) -> Option<i64> {
        match (self.row, self.changed) {
            (Some([v, ..]), _) => v,
            (None, (rows, id)) => {
                (rows > 0 && id > 0).then(|| i64::try_from(id).unwrap_or(i64::MAX))
            }
        }
    }

    /// Its second column.
    pub fn second(&self) -> Option<i64> {
        self.col(1)
    }

    /// A reply with this first row (unit tests).
    #[cfg(test)]
    pub fn with_row(row: [Option<i64>; COLUMNS]) -> Self {
        Reply {
            row: Some(row),
            ..Reply::default()
        }
    }

    /// Its column `i` (from 0; `None` beyond [`COLUMNS`]).
    pub fn col(&self, i: usize) -> Option<i64> {
        self.row.and_then(|r| r.get(i).copied().flatten())
    }
}

/// Rows affected and insert id of a driver's query result (sqlx has no trait for them).
pub trait Changed {
    /// (rows affected, MySQL's insert id or 0).
    fn changed(&self) -> (u64, u64);
}

impl Changed for sqlx::postgres::PgQueryResult {
    fn changed(&self) -> (u64, u64) {
        (self.rows_affected(), 0)
    }
}

impl Changed for sqlx::mysql::MySqlQueryResult {
    fn changed(&self) -> (u64, u64) {
        (self.rows_affected(), self.last_insert_id())
    }
}

impl Changed for sqlx::sqlite::SqliteQueryResult {
    fn changed(&self) -> (u64, u64) {
        (self.rows_affected(), 0)
    }
}

/// A lease row as `inspect` reads it: owner, fence, µs left if held, live waiters.
pub type LockRow = (Option<String>, i64, Option<i64>, i64);

/// A permit holder as `inspect_semaphore` reads it: owner, fence, µs left.
pub type HolderRow = (String, i64, Option<i64>);

/// Before a join's statements, on a try after the first (`retry`): the ticket of `$owner`'s live
/// row, read with `own` (the queue's [`own_ticket`](crate::dialect::own_ticket)), which the
/// try whose reply was lost may have committed. The join hands it back rather than joining a
/// second time: a second row would put the waiter behind the waiters that joined in between,
/// while its first row stood ahead of them (see `queue::acquire`). `None` on a first try, and
/// when there is no such row.
pub async fn rejoin<DB: SqlDb>(
    conn: &mut DB::Connection,
    own: &Stmt,
    a: &Args<'_>,
    retry: bool,
) -> sqlx::Result<Option<i64>> {
    if !retry {
        return Ok(None);
    }
    Ok(DB::reply(conn, own, a).await?.value())
}

/// Begins a transaction on `conn` with `statement` (the dialect's `TX_BEGIN`), or with a
/// plain `BEGIN` where there is none.
pub async fn begin<'c, DB: SqlDb>(
    conn: &'c mut DB::Connection,
    statement: Option<&SqlStr>,
) -> sqlx::Result<sqlx::Transaction<'c, DB>> {
    match statement {
        Some(statement) => sqlx::Connection::begin_with(conn, statement.clone()).await,
        None => sqlx::Connection::begin(conn).await,
    }
}

/// What this crate needs of an sqlx driver, as methods, so that generic code asks only for
/// `DB: SqlDb` (sqlx's own bounds are not implied by a trait's where-clauses). PostgreSQL,
/// MySQL and SQLite all have it.
pub trait SqlDb: Database {
    /// Binds `args` as `stmt`'s parameters.
    fn bind(stmt: &Stmt, args: &Args<'_>) -> std::result::Result<Self::Arguments, BoxDynError>;

    /// Runs `stmt` with `args` on `conn`.
    fn reply(
        conn: &mut Self::Connection,
        stmt: &Stmt,
        args: &Args<'_>,
    ) -> impl Future<Output = sqlx::Result<Reply>> + Send;

    /// Fetches the [`LockRow`] that `stmt` selects, if any.
    fn lock_row(
        conn: &mut Self::Connection,
        stmt: &Stmt,
        args: &Args<'_>,
    ) -> impl Future<Output = sqlx::Result<Option<LockRow>>> + Send;

    /// Fetches every [`HolderRow`] that `stmt` selects.
    fn holder_rows(
        conn: &mut Self::Connection,
        stmt: &Stmt,
        args: &Args<'_>,
    ) -> impl Future<Output = sqlx::Result<Vec<HolderRow>>> + Send;

    /// Runs `sql`, without parameters, on the plain (not prepared) protocol: settings such as
    /// PostgreSQL's `SET LOCAL synchronous_commit = off`.
    fn plain(
        conn: &mut Self::Connection,
        sql: &SqlStr,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Runs `stmt` once per set of `args` in one transaction (one commit); the rows each
    /// changed.
    fn each_in_transaction(
        conn: &mut Self::Connection,
        stmt: &Stmt,
        args: &[Args<'_>],
    ) -> impl Future<Output = sqlx::Result<Vec<u64>>> + Send;
}

impl<DB> SqlDb for DB
where
    DB: Database,
    DB::QueryResult: Changed,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn bind(stmt: &Stmt, a: &Args<'_>) -> std::result::Result<DB::Arguments, BoxDynError> {
        let mut out = DB::Arguments::default();
        let name = a.name.map_or("", LockName::as_str);
        let owner = a.owner.map(|o| o.to_string()).unwrap_or_default();
        let next = a.next.map(|o| o.to_string()).unwrap_or_default();
        let secret = a.secret.map(|s| s.hex()).unwrap_or_default();
        for param in &stmt.binds {
            match param {
                Param::Name if stmt.style.binary_names => out.add(name.as_bytes()),
                Param::Name => out.add(name),
                Param::Owner => out.add(owner.as_str()),
                Param::Fence => out.add(a.fence),
                Param::Ttl => out.add(whole(a.ttl, stmt.style.ttl_unit)),
                Param::Ticket => out.add(a.ticket),
                Param::MinToken => out.add(a.min_token),
                Param::Permits => out.add(a.permits),
                Param::Next => out.add(next.as_str()),
                Param::Secret => out.add(secret.as_str()),
            }?;
        }
        Ok(out)
    }

    async fn reply(conn: &mut DB::Connection, stmt: &Stmt, a: &Args<'_>) -> sqlx::Result<Reply> {
        let args = Self::bind(stmt, a).map_err(sqlx::Error::Encode)?;
        let query = sqlx::query_with::<DB, _>(stmt.sql.clone(), args);
        if !stmt.row {
            let changed = query.execute(conn).await?.changed();
            return Ok(Reply {
                changed,
                row: None,
                tries: 1,
            });
        }
        let mut row = None;
        if let Some(first) = query.fetch_optional(conn).await? {
            let mut cols = [None; COLUMNS];
            for (i, col) in cols.iter_mut().enumerate().take(first.len()) {
                *col = first.try_get::<Option<i64>, usize>(i)?;
            }
            row = Some(cols);
        }
        Ok(Reply {
            changed: (0, 0),
            row,
            tries: 1,
        })
    }

    async fn lock_row(
        conn: &mut DB::Connection,
        stmt: &Stmt,
        a: &Args<'_>,
    ) -> sqlx::Result<Option<LockRow>> {
        let args = Self::bind(stmt, a).map_err(sqlx::Error::Encode)?;
        let query = sqlx::query_as_with::<DB, LockRow, _>(stmt.sql.clone(), args);
        query.fetch_optional(conn).await
    }

    async fn holder_rows(
        conn: &mut DB::Connection,
        stmt: &Stmt,
        a: &Args<'_>,
    ) -> sqlx::Result<Vec<HolderRow>> {
        let args = Self::bind(stmt, a).map_err(sqlx::Error::Encode)?;
        let query = sqlx::query_as_with::<DB, HolderRow, _>(stmt.sql.clone(), args);
        query.fetch_all(conn).await
    }

    async fn plain(conn: &mut DB::Connection, sql: &SqlStr) -> sqlx::Result<()> {
        sqlx::raw_sql(sql.clone()).execute(conn).await.map(|_| ())
    }

    async fn each_in_transaction(
        conn: &mut DB::Connection,
        stmt: &Stmt,
        args: &[Args<'_>],
    ) -> sqlx::Result<Vec<u64>> {
        let mut tx = sqlx::Connection::begin(conn).await?;
        let mut out = Vec::with_capacity(args.len());
        for a in args {
            let bound = Self::bind(stmt, a).map_err(sqlx::Error::Encode)?;
            let query = sqlx::query_with::<DB, _>(stmt.sql.clone(), bound);
            out.push(query.execute(&mut *tx).await?.changed().0);
        }
        tx.commit().await?;
        Ok(out)
    }
}

impl<DB: SqlDb> StatementRunner<DB> {
    /// Runs `stmt` with `args` (see [`StatementRunner::run`]), counting the tries in
    /// [`Reply::tries`].
    pub async fn reply(&self, op: &'static str, stmt: &Stmt, a: Args<'_>) -> Result<Reply> {
        let mut tries = 0;
        let reply = self
            .run_as(stmt.priority(), op, a.name, |mut c| {
                tries += 1;
                async move {
                    let r = DB::reply(c.conn(), stmt, &a).await;
                    (c, r)
                }
            })
            .await?;
        Ok(Reply { tries, ..reply })
    }

    /// Runs a join of `a`'s name and owner (see [`StatementRunner::run`]): `join` on the first try;
    /// on a retry, the ticket of the row a lost try committed, read with `own` (see [`rejoin`]) and
    /// handed back through `found`, or `join` again when there is none.
    pub(crate) async fn join<T, F, Fut>(
        &self,
        own: &Stmt,
        a: Args<'_>,
        found: fn(i64) -> T,
        join: F,
    ) -> Result<T>
    where
        F: Fn(StatementConn<DB>) -> Fut,
        Fut: Future<Output = (StatementConn<DB>, sqlx::Result<T>)>,
    {
        let (join, mut tries) = (&join, 0);
        self.run("enqueue", a.name, |mut c| {
            tries += 1;
            let retry = tries > 1;
            async move {
                match rejoin::<DB>(c.conn(), own, &a, retry).await {
                    Ok(None) => join(c).await,
                    Ok(Some(ticket)) => (c, Ok(found(ticket))),
                    Err(e) => (c, Err(e)),
                }
            }
        })
        .await
    }

    /// Reads the permit holders of `name` with `stmt` (see [`HolderRow`]).
    pub async fn holder_rows(&self, stmt: &Stmt, name: &LockName) -> Result<Vec<HolderRow>> {
        self.run_as(None, "inspect", Some(name), |mut c| async move {
            let r = DB::holder_rows(c.conn(), stmt, &Args::of(name)).await;
            (c, r)
        })
        .await
    }

    /// Reads `name`'s lease row with `stmt` (see [`LockRow`]).
    pub async fn lock_row(&self, stmt: &Stmt, name: &LockName) -> Result<Option<LockRow>> {
        self.run_as(None, "inspect", Some(name), |mut c| async move {
            let r = DB::lock_row(c.conn(), stmt, &Args::of(name)).await;
            (c, r)
        })
        .await
    }

    /// Runs `stmt` once per set of `args`, in one transaction on one connection; the rows each
    /// changed.
    pub async fn each_in_transaction(
        &self,
        op: &'static str,
        stmt: &Stmt,
        args: &[Args<'_>],
    ) -> Result<Vec<u64>> {
        self.run_as(stmt.priority(), op, None, |mut c| async move {
            let r = DB::each_in_transaction(c.conn(), stmt, args).await;
            (c, r)
        })
        .await
    }
}
