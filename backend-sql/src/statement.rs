//! Statements written once for every dialect: templates name their parameters (`$name`,
//! `$owner`, `$fence`, `$ttl`, `$ticket`, `$min_token`, `$permits`, `$next`, `$secret`), which are
//! expanded to the database's placeholders and bound in the order it expects (`statement/run.rs`:
//! binding them, and what a statement hands back, read the same way from every driver).

use std::time::Duration;

use lockcore::{LockName, OwnerId};
use sqlx::{SqlSafeStr, SqlStr};

use crate::speedup::sqlite_write_queue::WritePriority;
use crate::wake::Secret;

mod run;

pub use run::*;

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
    MinToken,
    Permits,
    Next,
    Secret,
}

impl Param {
    const ALL: [Param; 9] = [
        Param::Name,
        Param::Owner,
        Param::Fence,
        Param::Ttl,
        Param::Ticket,
        Param::MinToken,
        Param::Permits,
        Param::Next,
        Param::Secret,
    ];

    /// How templates name it, after the `$`.
    fn word(self) -> &'static str {
        match self {
            Param::Name => "name",
            Param::Owner => "owner",
            Param::Fence => "fence",
            Param::Ttl => "ttl",
            Param::Ticket => "ticket",
            Param::MinToken => "min_token",
            Param::Permits => "permits",
            Param::Next => "next",
            Param::Secret => "secret",
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
    /// Whether it only reads (so it need not wait for SQLite's write turn: see [`Stmt::priority`]),
    /// decided once when it is built.
    reads: bool,
    /// Whether it keeps a lease or a waiter's place alive (see [`Stmt::keeping`]).
    keeps: bool,
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
    /// The token minimum, 0 for none.
    min_token: i64,
    /// A semaphore's count.
    permits: i64,
    /// The waiter a release hands the freed permit to (see `crate::semaphore`).
    next: Option<OwnerId>,
    /// The secret a waiter stores in its row as it joins (see [`Secret`]).
    secret: Option<Secret>,
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

    /// With `$min_token`.
    pub fn min_token(self, min_token: i64) -> Self {
        Args { min_token, ..self }
    }

    /// With `$permits`.
    pub fn permits(self, permits: u32) -> Self {
        Args {
            permits: permits.into(),
            ..self
        }
    }

    /// With `$next`.
    pub fn next(self, next: OwnerId) -> Self {
        Args {
            next: Some(next),
            ..self
        }
    }

    /// With `$secret`.
    pub fn secret(self, secret: Secret) -> Self {
        Args {
            secret: Some(secret),
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
    pub leases: String,
    /// The waiters table (see `common::queue_table`), quoted.
    pub waiters: String,
    /// The semaphores table (`<table>_semaphores`: name, fence), quoted.
    pub semaphores: String,
    /// The permit holders table (`<table>_permits`), quoted.
    pub permits: String,
    /// The permit waiters table (`<table>_permit_queue`), quoted.
    pub permit_waiters: String,
    /// The readers table (`<table>_readers`), quoted.
    pub readers: String,
    style: Style,
}

impl Sql {
    /// Names for lease table `table`.
    pub fn new(style: Style, table: &str) -> Self {
        let quoted = |ident: &str| format!("{q}{ident}{q}", q = style.quote);
        Sql {
            leases: quoted(table),
            waiters: quoted(&crate::common::queue_table(table)),
            semaphores: quoted(&crate::common::aux_table(table, SEMAPHORES)),
            permits: quoted(&crate::common::aux_table(table, PERMITS)),
            permit_waiters: quoted(&crate::common::aux_table(table, PERMIT_QUEUE)),
            readers: quoted(&crate::common::aux_table(table, READERS)),
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
            keeps: false,
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
    // A parameter's name is lower case, `_` inside (`$min_token`).
    let len = match tail.starts_with(|c: char| c.is_ascii_lowercase()) {
        true => tail.find(|c: char| !(c.is_ascii_lowercase() || c == '_')),
        false => Some(0),
    };
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
    /// Marks a statement that keeps a lease or a waiter's place alive (an extend, a refresh),
    /// so that it waits in SQLite's keep line (see [`WritePriority::KeepAlive`]).
    pub fn keeping(mut self) -> Self {
        self.keeps = true;
        self
    }

    /// The line it waits in for SQLite's write turn; `None` when it only reads.
    pub fn priority(&self) -> Option<WritePriority> {
        match (self.reads, self.keeps) {
            (true, _) => None,
            (false, true) => Some(WritePriority::KeepAlive),
            (false, false) => Some(WritePriority::Normal),
        }
    }
}

#[cfg(test)]
mod tests;
