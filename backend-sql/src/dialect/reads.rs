//! The statements of read-write locks' shared side (see `crate::read`), written once for every
//! dialect.

use super::SqlDialect;
use crate::statement::{Sql, Stmt};

/// The owner value of a lease row held by readers (an owner id is 32 hex digits, so no owner
/// ever equals it). Its `expires_at` is the latest live reader's; the readers themselves are
/// rows of the readers table.
pub const READERS_OWNER: &str = "readers";

/// The statements of read-write locks' shared side (see `crate::read`), over the lease table
/// `{t}` (whose row a group of readers holds with owner [`READERS_OWNER`]), the waiters table
/// `{w}` (readers queue there with writers, in one ticket order) and the readers table `{r}`
/// (name, owner, fence, expires_at): one row per reader, a holder when `fence` is set, else
/// the mark that says the waiter row of that owner is a reader's.
pub struct ReadStatements {
    /// Begins each reader transaction, where not a plain `BEGIN` ([`SqlDialect::TX_BEGIN`]).
    pub begin: Option<sqlx::SqlStr>,
    /// Run first in the join transaction ([`SqlDialect::RELAXED_COMMIT`]).
    pub relaxed: Option<sqlx::SqlStr>,
    /// See [`SqlDialect::lease_bump`].
    pub bump: Stmt,
    /// Takes the lease row's lock without changing it (release, extend, leave).
    pub lock: Stmt,
    /// One row about `$name` as `$owner` (queued with `$ticket`, or `i64::MAX`) sees it: 1 if
    /// a writer holds the lease row (live), live writers queued ahead (waiter rows without a
    /// reader's mark), `$owner`'s own live read hold's fence, µs left on a live writer's lease,
    /// and 1 if readers hold the row (live).
    pub state: Stmt,
    /// Makes the lease row the readers' with an expiry at least `$ttl` from now.
    pub hold: Stmt,
    /// Deletes `$owner`'s reader row (a mark, or a hold whatever its fence).
    pub drop_owner: Stmt,
    /// Deletes the name's expired holds and the marks whose waiter row is gone or expired.
    pub gc: Stmt,
    /// Inserts `$owner`'s hold with `$fence`, valid for `$ttl`.
    pub insert_hold: Stmt,
    /// Inserts `$owner`'s mark (a reader is joining the queue).
    pub mark: Stmt,
    /// Deletes `$owner`'s waiter rows and the name's expired ones.
    pub dequeue: Stmt,
    /// Owner- and fence-checked delete of a live hold.
    pub release: Stmt,
    /// Owner- and fence-checked extension of a live hold to `$ttl` from now.
    pub extend: Stmt,
    /// Raises the readers' lease row expiry to at least `$ttl` from now.
    pub extend_row: Stmt,
    /// After a hold went: the lease row's expiry becomes the latest live hold's, and the row
    /// is freed when no live hold is left (whether it was, [`state`](Self::state) tells).
    pub settle: Stmt,
    /// For `inspect`: live read holds of `$name`, and how many of its live waiters are readers.
    pub summary: Stmt,
    /// Wakes the name's waiters (PostgreSQL's NOTIFY; `None` where waiters poll): after the
    /// readers freed the row, and after a queued reader's grant (readers queued behind it may
    /// share).
    pub notify: Option<Stmt>,
}

impl ReadStatements {
    /// `D`'s reader statements.
    pub(super) fn new<D: SqlDialect>(s: &Sql) -> Self {
        let (t, w, r, now, expiry) = (&s.leases, &s.waiters, &s.readers, D::NOW, D::expiry());
        // A reader's own live hold: what its release and extend change.
        let mine = super::live_hold::<D>();
        let held = "r.fence IS NOT NULL";
        // Any reader's live hold of the name (`super::live_hold` is one owner's).
        let any_hold = format!("r.name = $name AND {held} AND r.expires_at > {now}");
        let writer = format!(
            "l.name = $name AND l.owner IS NOT NULL AND l.owner <> '{READERS_OWNER}' \
             AND l.expires_at > {now}"
        );
        ReadStatements {
            begin: D::TX_BEGIN.map(sqlx::SqlSafeStr::into_sql_str),
            relaxed: D::RELAXED_COMMIT.map(sqlx::SqlSafeStr::into_sql_str),
            bump: D::lease_bump(s),
            lock: s.done(&format!("UPDATE {t} SET fence = fence WHERE name = $name")),
            state: s.row(&format!(
                "SELECT (SELECT count(*) FROM {t} AS l WHERE {writer}), \
                 (SELECT count(*) FROM {w} AS w WHERE w.name = $name AND w.ticket < $ticket \
                 AND w.waiter <> $owner AND w.expires_at > {now} AND NOT EXISTS \
                 (SELECT 1 FROM {r} AS m WHERE m.name = w.name AND m.owner = w.waiter)), \
                 (SELECT r.fence FROM {r} AS r WHERE {any_hold} AND r.owner = $owner), \
                 (SELECT {} FROM {t} AS l WHERE {writer}), \
                 (SELECT count(*) FROM {t} AS l WHERE l.name = $name \
                 AND l.owner = '{READERS_OWNER}' AND l.expires_at > {now})",
                D::micros_between(now, "l.expires_at")
            )),
            // `expires_at` first: MySQL's SET sees the columns it already assigned.
            hold: s.done(&format!(
                "UPDATE {t} SET expires_at = CASE WHEN owner = '{READERS_OWNER}' \
                 AND expires_at > {expiry} THEN expires_at ELSE {expiry} END, \
                 owner = '{READERS_OWNER}' WHERE name = $name"
            )),
            drop_owner: s.done(&format!(
                "DELETE FROM {r} WHERE name = $name AND owner = $owner"
            )),
            gc: s.done(&format!(
                "DELETE FROM {r} WHERE name = $name AND ((fence IS NOT NULL AND expires_at <= {now}) \
                 OR (fence IS NULL AND NOT EXISTS (SELECT 1 FROM {w} AS w \
                 WHERE w.name = $name AND w.waiter = {r}.owner AND w.expires_at > {now})))"
            )),
            insert_hold: s.done(&format!(
                "INSERT INTO {r} (name, owner, fence, expires_at) \
                 VALUES ($name, $owner, $fence, {expiry})"
            )),
            mark: s.done(&format!(
                "INSERT INTO {r} (name, owner, fence, expires_at) VALUES ($name, $owner, NULL, {now})"
            )),
            dequeue: s.done(&format!(
                "DELETE FROM {w} WHERE name = $name AND (waiter = $owner OR expires_at <= {now})"
            )),
            release: s.done(&format!("DELETE FROM {r} WHERE {mine}")),
            extend: s
                .done(&format!("UPDATE {r} SET expires_at = {expiry} WHERE {mine}"))
                .keeping(),
            extend_row: s.done(&format!(
                "UPDATE {t} SET expires_at = CASE WHEN expires_at > {expiry} THEN expires_at \
                 ELSE {expiry} END WHERE name = $name AND owner = '{READERS_OWNER}'"
            )),
            settle: s.done(&format!(
                "UPDATE {t} SET expires_at = COALESCE((SELECT MAX(r.expires_at) FROM {r} AS r \
                 WHERE {any_hold}), expires_at), \
                 owner = CASE WHEN EXISTS (SELECT 1 FROM {r} AS r WHERE {any_hold}) \
                 THEN owner ELSE NULL END \
                 WHERE name = $name AND owner = '{READERS_OWNER}'"
            )),
            summary: s.row(&format!(
                "SELECT (SELECT count(*) FROM {r} AS r WHERE {any_hold}), \
                 (SELECT count(*) FROM {w} AS w WHERE w.name = $name AND w.expires_at > {now} \
                 AND EXISTS (SELECT 1 FROM {r} AS m WHERE m.name = w.name AND m.owner = w.waiter))"
            )),
            notify: D::reader_notify(s),
        }
    }
}
