//! Statements written once for every dialect: templates name their parameters (`$name`,
//! `$owner`, `$fence`, `$ttl`, `$ticket`, `$floor`, `$permits`), which are expanded to the database's
//! placeholders and bound in the order it expects; and what a statement hands back, read the
//! same way from every driver.

use std::future::Future;
use std::time::Duration;

use lockcore::{Error, LockName, OwnerId, Result};
use sqlx::error::BoxDynError;
use sqlx::{Arguments, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row};
use sqlx::{SqlSafeStr, SqlStr, Type};

use crate::common::{Core, whole};

/// How a dialect writes and binds parameters.
#[derive(Clone, Copy)]
pub struct Style {
    /// The prefix of numbered placeholders, each parameter bound once (`$` for PostgreSQL's
    /// `$1`, `?` for SQLite's `?1`); `None` for MySQL's bare `?`, bound once per use in the
    /// order of the text.
    pub numbered: Option<char>,
    /// The quote around identifiers.
    pub quote: char,
    /// Whether lock names are bound as bytes (MySQL's `VARBINARY` column) rather than text.
    pub binary_names: bool,
    /// Whether a generated ticket comes back by `RETURNING` rather than as MySQL's insert id.
    pub returning: bool,
    /// The unit of the integer a duration is in for the dialect's `expires_at` arithmetic.
    pub ttl_unit: Duration,
}

/// A statement parameter, named in templates as `$` and its name in lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Param {
    Name,
    Owner,
    Fence,
    Ttl,
    Ticket,
    Floor,
    Permits,
}

impl Param {
    const ALL: [Param; 7] = [
        Param::Name,
        Param::Owner,
        Param::Fence,
        Param::Ttl,
        Param::Ticket,
        Param::Floor,
        Param::Permits,
    ];

    /// How templates name it, after the `$`.
    fn word(self) -> &'static str {
        match self {
            Param::Name => "name",
            Param::Owner => "owner",
            Param::Fence => "fence",
            Param::Ttl => "ttl",
            Param::Ticket => "ticket",
            Param::Floor => "floor",
            Param::Permits => "permits",
        }
    }
}

/// One statement, ready to run: its text with the dialect's placeholders, and what to bind.
#[derive(Clone)]
pub struct Stmt {
    /// Built once per client; cloning clones an `Arc`.
    pub sql: SqlStr,
    /// The parameters in the order they are bound.
    binds: Vec<Param>,
    style: Style,
    /// Whether it answers with a row (`SELECT`, `RETURNING`) rather than with what it changed.
    row: bool,
    /// Whether it only reads (see [`Stmt::reads_only`]), decided once when it is built.
    reads: bool,
}

/// The values a statement's parameters take (those it does not use are ignored).
#[derive(Clone, Copy, Default)]
pub struct Args<'a> {
    pub name: Option<&'a LockName>,
    /// The owner id (a queued waiter's id is its owner id).
    owner: Option<OwnerId>,
    fence: i64,
    /// The lease's ttl, or a waiter's liveness.
    ttl: Duration,
    ticket: i64,
    /// The token floor, 0 for none.
    floor: i64,
    /// A semaphore's count.
    permits: i64,
}

impl<'a> Args<'a> {
    /// Values for a statement about `name`.
    pub fn of(name: &'a LockName) -> Self {
        Args {
            name: Some(name),
            ..Args::default()
        }
    }

    /// With `$owner`.
    pub fn owner(self, owner: OwnerId) -> Self {
        Args {
            owner: Some(owner),
            ..self
        }
    }

    /// With `$fence`.
    pub fn fence(self, fence: i64) -> Self {
        Args { fence, ..self }
    }

    /// With `$ttl`.
    pub fn ttl(self, ttl: Duration) -> Self {
        Args { ttl, ..self }
    }

    /// With `$ticket`.
    pub fn ticket(self, ticket: i64) -> Self {
        Args { ticket, ..self }
    }

    /// With `$floor`.
    pub fn floor(self, floor: i64) -> Self {
        Args { floor, ..self }
    }

    /// With `$permits`.
    pub fn permits(self, permits: u32) -> Self {
        Args {
            permits: permits.into(),
            ..self
        }
    }
}

/// The suffix of the semaphores table's name.
pub const SEMAPHORES: &str = "_semaphores";
/// The suffix of the permit holders table's name.
pub const PERMITS: &str = "_permits";
/// The suffix of the permit waiters table's name.
pub const PERMIT_QUEUE: &str = "_permit_queue";
/// The suffix of the readers table's name (read-write locks' shared holders).
pub const READERS: &str = "_readers";

/// Writes one client's statements in a dialect's style, with its validated table names (so
/// quoting them is enough).
pub struct Sql {
    /// The lease table, as given (PostgreSQL's NOTIFY channel).
    pub table: String,
    /// The lease table, quoted.
    pub t: String,
    /// The waiters table (see `common::queue_table`), quoted.
    pub w: String,
    /// The semaphores table (`<table>_semaphores`: name, fence), quoted.
    pub s: String,
    /// The permit holders table (`<table>_permits`), quoted.
    pub p: String,
    /// The permit waiters table (`<table>_permit_queue`), quoted.
    pub v: String,
    /// The readers table (`<table>_readers`), quoted.
    pub r: String,
    style: Style,
}

impl Sql {
    /// Names for lease table `table`.
    pub fn new(style: Style, table: &str) -> Self {
        let quoted = |ident: &str| format!("{q}{ident}{q}", q = style.quote);
        Sql {
            t: quoted(table),
            w: quoted(&crate::common::queue_table(table)),
            s: quoted(&crate::common::aux_table(table, SEMAPHORES)),
            p: quoted(&crate::common::aux_table(table, PERMITS)),
            v: quoted(&crate::common::aux_table(table, PERMIT_QUEUE)),
            r: quoted(&crate::common::aux_table(table, READERS)),
            table: table.to_owned(),
            style,
        }
    }

    /// A statement that answers with a row (`SELECT`, `RETURNING`).
    pub fn row(&self, template: &str) -> Stmt {
        self.expand(template, true)
    }

    /// A statement whose answer is what it changed (rows affected, MySQL's insert id).
    pub fn done(&self, template: &str) -> Stmt {
        self.expand(template, false)
    }

    /// An `INSERT` that hands back the generated `column`: by `RETURNING` where the database
    /// has it, else as MySQL's insert id.
    pub fn insert_returning(&self, template: &str, column: &str) -> Stmt {
        if self.style.returning {
            self.row(&format!("{template} RETURNING {column}"))
        } else {
            self.done(template)
        }
    }

    /// `template` as the body of a server-side routine whose arguments are named `p_` and the
    /// parameter's name (`$name` becomes `p_name`).
    pub fn inline(template: &str) -> String {
        let mut text = String::with_capacity(template.len());
        let mut rest = template;
        while let Some((before, param, after)) = next_param(rest, template) {
            text.push_str(before);
            if let Some(param) = param {
                text.push_str(&format!("p_{}", param.word()));
            }
            rest = after;
        }
        text.push_str(rest);
        text
    }

    /// Replaces each `$param` by the dialect's placeholder.
    fn expand(&self, template: &str, row: bool) -> Stmt {
        let (mut text, mut binds) = (String::with_capacity(template.len()), Vec::new());
        let mut rest = template;
        while let Some((before, param, after)) = next_param(rest, template) {
            text.push_str(before);
            rest = after;
            let Some(param) = param else {
                continue;
            };
            match self.style.numbered {
                Some(prefix) => {
                    let n = binds.iter().position(|p| *p == param).unwrap_or_else(|| {
                        binds.push(param);
                        binds.len() - 1
                    });
                    text.push_str(&format!("{prefix}{}", n + 1));
                }
                None => {
                    binds.push(param);
                    text.push('?');
                }
            }
        }
        text.push_str(rest);
        let reads = reads_only(&text);
        let sql = sqlx::AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str();
        Stmt {
            sql,
            binds,
            style: self.style,
            row,
            reads,
        }
    }
}

/// Splits `rest` at its first `$`: the text before it, the parameter named after it, and the
/// text after that. A `$` that names no parameter comes back in the text before, with the
/// dollar-quote tag it opens or closes (`$F$`), so that a word right after a tag is not taken
/// for a parameter. An unknown lower-case word is a mistake in `template`, found by the first
/// connect of any test.
fn next_param<'t>(rest: &'t str, template: &str) -> Option<(&'t str, Option<Param>, &'t str)> {
    let at = rest.find('$')?;
    let tail = &rest[at + 1..];
    let len = tail.find(|c: char| !c.is_ascii_lowercase());
    let (word, after) = tail.split_at(len.unwrap_or(tail.len()));
    if word.is_empty() {
        let tag = tail.find(|c: char| !(c.is_ascii_uppercase() || c == '_'));
        let tag = tag.unwrap_or(tail.len());
        let end = at
            + 1
            + if tail[tag..].starts_with('$') {
                tag + 1
            } else {
                0
            };
        return Some((&rest[..end], None, &rest[end..]));
    }
    let param = Param::ALL.into_iter().find(|p| p.word() == word);
    let param = param.unwrap_or_else(|| panic!("unknown parameter ${word} in {template:?}"));
    Some((&rest[..at], Some(param), after))
}

/// Whether the statement `text` only reads: a plain `SELECT` (one that calls `pg_notify` sends
/// a notification, which this crate counts as a write).
fn reads_only(text: &str) -> bool {
    let text = text.trim_start();
    text.get(..6)
        .is_some_and(|w| w.eq_ignore_ascii_case("SELECT"))
        && !text.contains("pg_notify")
}

impl Stmt {
    /// Whether the statement only reads, so that it need not wait for SQLite's write turn.
    pub fn reads_only(&self) -> bool {
        self.reads
    }
}

/// How many integer columns of a statement's first row a [`Reply`] keeps.
pub const COLUMNS: usize = 6;

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
        for param in &stmt.binds {
            match param {
                Param::Name if stmt.style.binary_names => out.add(name.as_bytes()),
                Param::Name => out.add(name),
                Param::Owner => out.add(owner.as_str()),
                Param::Fence => out.add(a.fence),
                Param::Ttl => out.add(whole(a.ttl, stmt.style.ttl_unit)),
                Param::Ticket => out.add(a.ticket),
                Param::Floor => out.add(a.floor),
                Param::Permits => out.add(a.permits),
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

impl<DB: SqlDb> Core<DB> {
    /// Runs `stmt` with `args` (see [`Core::run`]), counting the tries in [`Reply::tries`].
    pub async fn reply(&self, op: &'static str, stmt: &Stmt, a: Args<'_>) -> Result<Reply> {
        let mut tries = 0;
        let reply = self
            .run_as(!stmt.reads_only(), op, a.name, |mut c| {
                tries += 1;
                async move {
                    let r = DB::reply(c.conn(), stmt, &a).await;
                    (c, r)
                }
            })
            .await?;
        Ok(Reply { tries, ..reply })
    }

    /// Reads the permit holders of `name` with `stmt` (see [`HolderRow`]).
    pub async fn holder_rows(&self, stmt: &Stmt, name: &LockName) -> Result<Vec<HolderRow>> {
        self.run_as(false, "inspect", Some(name), |mut c| async move {
            let r = DB::holder_rows(c.conn(), stmt, &Args::of(name)).await;
            (c, r)
        })
        .await
    }

    /// Reads `name`'s lease row with `stmt` (see [`LockRow`]).
    pub async fn lock_row(&self, stmt: &Stmt, name: &LockName) -> Result<Option<LockRow>> {
        self.run_as(false, "inspect", Some(name), |mut c| async move {
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
        self.run(op, None, |mut c| async move {
            let r = DB::each_in_transaction(c.conn(), stmt, args).await;
            (c, r)
        })
        .await
    }

    /// Runs `stmt` straight on the pool: no retries, time limit or connection checks (the raw
    /// floor's way).
    pub async fn reply_raw(&self, stmt: &Stmt, a: Args<'_>) -> Result<Reply> {
        let raw = async { DB::reply(&mut *self.pool.acquire().await?, stmt, &a).await };
        raw.await
            .map_err(|e| Error::backend(self.backend, "raw floor", a.name, true, e))
    }
}

#[cfg(test)]
mod tests;
