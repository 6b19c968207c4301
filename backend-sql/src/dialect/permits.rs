//! The semaphore statements (see `crate::semaphore`): their templates, written once for every
//! dialect, and the statements a client builds from them.

use super::SqlDialect;
use crate::statement::{Sql, Stmt};

/// The statements of counting semaphores (see `crate::semaphore`), over the semaphores table
/// `{s}` (name, fence), the permit holders table `{p}` (name, owner, fence, permits,
/// expires_at; one row per permit held) and the permit waiters table `{v}` (ticket, name,
/// waiter, permits, expires_at).
pub struct PermitStatements {
    /// Begins each semaphore transaction, where not a plain `BEGIN` ([`SqlDialect::TX_BEGIN`]).
    pub begin: Option<sqlx::SqlStr>,
    /// Run first in the join transaction ([`SqlDialect::RELAXED_COMMIT`]).
    pub relaxed: Option<sqlx::SqlStr>,
    /// Takes the semaphore row's lock (see [`SqlDialect::semaphore_lock`]).
    pub lock: Stmt,
    /// Takes the lock and bumps the fence, handing it back.
    pub lock_bump: Stmt,
    /// One row about `$name` as `$owner` (queued with `$ticket`, or `i64::MAX` when not
    /// queued) sees it: the recorded count (of live holders and waiters, all equal), live
    /// holders but `$owner`, live waiters ahead, `$owner`'s own live permit's fence, µs until
    /// the first live holder but `$owner` runs out, expired holder rows, and `$owner`'s live
    /// waiter rows (1 while it waits).
    pub state: Stmt,
    /// Inserts `$owner`'s permit row with `$fence`, `$permits` and `$ttl`.
    pub grant: Stmt,
    /// Takes over `$owner`'s own live permit row with `$fence` and `$ttl`.
    pub regrant: Stmt,
    /// Deletes the name's expired permit rows.
    pub gc: Stmt,
    /// Joins the permit queue's tail (liveness in `$ttl`, count `$permits`); hands back the
    /// ticket.
    pub enqueue: Stmt,
    /// Extends the liveness of a permit waiter's row with `$ticket`, and only that row (see
    /// `Statements::refresh`); never revives an expired one.
    pub refresh: Stmt,
    /// Deletes `$owner`'s and the name's expired waiter rows.
    pub dequeue: Stmt,
    /// The whole grant transaction as one call of a server-side routine (PostgreSQL), with
    /// `$ticket` `i64::MAX` when not queued: a row (outcome: 0 granted, 1 blocked, 2 another
    /// count; fence; waiters ahead; µs until a holder runs out when full; the recorded count).
    /// `None`: the transaction's statements one round trip each.
    pub grant_call: Option<Stmt>,
    /// The whole join transaction as one call (PostgreSQL): a row (the ticket, or NULL and the
    /// other count recorded).
    pub join_call: Option<Stmt>,
    /// The owner- and fence-checked release that hands the freed permit to waiter `$next`
    /// (queued with `$ticket`; its `$ttl`, `$min_token` and `$permits`) in the same transaction,
    /// as its grant would have, when it may have it: one call of a server-side routine, a row
    /// (permits freed; the fence granted to `$next`, or NULL; when granted, how many permits
    /// are still free). `None` where the dialect has no such routine (SQLite), or the account
    /// could not create it (MySQL): then [`handing`](Self::handing), one statement at a time.
    pub hand: Option<Stmt>,
    /// The hand-over's statements about `$next`, sent one by one (see `crate::semaphore`).
    pub handing: HandStatements,
    /// Leaves the queue, frees a permit granted to the waiter and wakes the others, in one
    /// statement that counts the freed permits. `None`: [`dequeue`](Self::dequeue), then
    /// [`release_owner`](Self::release_owner).
    pub leave: Option<Stmt>,
    /// Owner- and fence-checked release of a live permit (deletes its row).
    pub release: Stmt,
    /// Deletes `$owner`'s permit row whatever its fence (the clean-up after an interrupted
    /// acquire).
    pub release_owner: Stmt,
    /// Owner- and fence-checked extension; never resurrects an expired permit.
    pub extend: Stmt,
    /// Live holders: owner, fence, µs left, oldest grant first.
    pub holders: Stmt,
    /// Whether the semaphore row exists, the recorded count, live waiters.
    pub summary: Stmt,
    /// `forget`: the name's expired holder and waiter rows, then its semaphore row unless a
    /// live holder or waiter is left.
    pub forget: Vec<Stmt>,
    /// Expired holder and waiter rows of every name, dropped when a client connects.
    pub gc_all: Vec<Stmt>,
    /// The ticket of the permit queue's live head (see `crate::speedup::doorbell`), if any.
    pub head: Stmt,
    /// `$owner`'s live ticket in the permit queue, if any (see `dialect::own_ticket`).
    pub own_ticket: Stmt,
}

/// A semaphore's transactions as calls of server-side routines that are created with the
/// tables (see [`SqlDialect::permit_routines`]).
pub struct PermitRoutines {
    /// Creates the routines, run after the tables are made.
    pub create: Vec<Stmt>,
    /// [`PermitStatements::grant_call`].
    pub grant: Stmt,
    /// [`PermitStatements::join_call`].
    pub join: Stmt,
    /// [`PermitStatements::hand`].
    pub hand: Stmt,
    /// [`PermitStatements::release`], which also wakes the permit waiters.
    pub release: Stmt,
    /// [`PermitStatements::release_owner`], which also wakes the permit waiters.
    pub release_owner: Stmt,
}

/// The grant's statements about the waiter `$next` that a release hands its permit to (see
/// [`PermitStatements::hand`]): each as the grant's, with `$next` for `$owner`.
pub struct HandStatements {
    /// The state as `$next` (queued with `$ticket`) sees it.
    pub state: Stmt,
    /// Inserts `$next`'s permit row with `$fence`.
    pub grant: Stmt,
    /// Takes over `$next`'s own live permit row with `$fence`.
    pub regrant: Stmt,
    /// Deletes `$next`'s and the name's expired waiter rows.
    pub dequeue: Stmt,
}

/// The grant's templates about the waiter `$next` (see [`HandStatements`]), the new fence in
/// `fence` (`$fence`, or a routine's variable).
pub struct NextTemplates {
    pub state: String,
    pub grant: String,
    pub regrant: String,
    pub dequeue: String,
}

impl NextTemplates {
    /// A routine's writes for `$next` (see [`PermitTemplates::writes`]), with the expired
    /// holders' delete `gc`.
    pub fn writes(&self, gc: &str) -> String {
        routine_writes(gc, &self.grant, &self.regrant)
    }
}

/// The writes of a server-side routine (PostgreSQL's and MySQL's alike) once its look grants
/// the permit: `gc` when the look counted expired holder rows (`v_expired`), then `grant`, or
/// `regrant` where the owner holds a live permit already (`v_mine`).
fn routine_writes(gc: &str, grant: &str, regrant: &str) -> String {
    format!(
        "IF v_expired > 0 THEN {gc}; END IF; \
         IF v_mine IS NULL THEN {grant}; ELSE {regrant}; END IF;"
    )
}

/// The templates of the semaphore statements that PostgreSQL also runs inside its grant and
/// join routines (see [`PermitStatements`] for what each does).
pub struct PermitTemplates {
    pub state: String,
    pub grant: String,
    pub regrant: String,
    pub gc: String,
    pub enqueue: String,
    pub dequeue: String,
    pub release: String,
}

impl PermitTemplates {
    /// The templates about `$owner` made about `$next`, the new fence in `fence`.
    pub fn of_next(&self, fence: &str) -> NextTemplates {
        let as_next = |template: &str| template.replace("$owner", "$next");
        NextTemplates {
            state: as_next(&self.state),
            grant: as_next(&self.grant).replace("$fence", fence),
            regrant: as_next(&self.regrant).replace("$fence", fence),
            dequeue: as_next(&self.dequeue),
        }
    }

    /// What a server-side routine (PostgreSQL's and MySQL's alike) writes once its look grants
    /// the permit: the name's expired holder rows deleted when the look counted any
    /// (`v_expired`), then the owner's permit row inserted, or updated where the owner holds a
    /// live one already (`v_mine`), with the new fence in `fence`.
    pub fn writes(&self, fence: &str) -> String {
        let fenced = |template: &str| template.replace("$fence", fence);
        routine_writes(&self.gc, &fenced(&self.grant), &fenced(&self.regrant))
    }

    /// `D`'s templates, over the tables named in `s`.
    pub fn new<D: SqlDialect>(s: &Sql) -> Self {
        let (p, v, now, expiry) = (&s.permits, &s.permit_waiters, D::NOW, D::expiry());
        PermitTemplates {
            // One pass over each table's rows of the name, not a subquery per column: the
            // look runs in every grant and hand-over, under the semaphore row's lock.
            state: format!(
                "SELECT COALESCE(p.recorded, v.recorded), p.holders, v.ahead, p.mine, \
                 p.soonest, p.expired, v.queued \
                 FROM (SELECT MAX(CASE WHEN {live} THEN permits END) AS recorded, \
                 count(CASE WHEN {live} AND owner <> $owner THEN 1 END) AS holders, \
                 MAX(CASE WHEN {live} AND owner = $owner THEN fence END) AS mine, \
                 MIN(CASE WHEN {live} AND owner <> $owner THEN {left} END) AS soonest, \
                 count(CASE WHEN expires_at <= {now} THEN 1 END) AS expired \
                 FROM {p} WHERE name = $name) AS p, \
                 (SELECT MAX(CASE WHEN {live} THEN permits END) AS recorded, \
                 count(CASE WHEN {live} AND ticket < $ticket AND waiter <> $owner THEN 1 END) \
                 AS ahead, \
                 count(CASE WHEN {live} AND waiter = $owner THEN 1 END) AS queued \
                 FROM {v} WHERE name = $name) AS v",
                live = format!("expires_at > {now}"),
                left = D::micros_between(now, "expires_at"),
            ),
            grant: format!(
                "INSERT INTO {p} (name, owner, fence, permits, expires_at) \
                 VALUES ($name, $owner, $fence, $permits, {expiry})"
            ),
            regrant: format!(
                "UPDATE {p} SET fence = $fence, expires_at = {expiry} \
                 WHERE name = $name AND owner = $owner"
            ),
            gc: format!("DELETE FROM {p} WHERE name = $name AND expires_at <= {now}"),
            enqueue: format!(
                "INSERT INTO {v} (name, waiter, permits, expires_at) \
                 VALUES ($name, $owner, $permits, {expiry})"
            ),
            dequeue: format!(
                "DELETE FROM {v} WHERE name = $name AND (waiter = $owner OR expires_at <= {now})"
            ),
            release: format!("DELETE FROM {p} WHERE {}", super::live_hold::<D>()),
        }
    }
}

/// The count recorded for `$name`: that of its live holders, else of its live waiters (all
/// alike), else NULL.
pub fn recorded<D: SqlDialect>(s: &Sql) -> String {
    let (p, v, now) = (&s.permits, &s.permit_waiters, D::NOW);
    format!(
        "COALESCE((SELECT MAX(p.permits) FROM {p} AS p WHERE p.name = $name \
         AND p.expires_at > {now}), (SELECT MAX(v.permits) FROM {v} AS v \
         WHERE v.name = $name AND v.expires_at > {now}))"
    )
}

impl PermitStatements {
    /// `D`'s semaphore statements, with `routines` (see [`SqlDialect::permit_routines`]) for
    /// the transactions where the dialect has them.
    pub(super) fn new<D: SqlDialect>(s: &Sql, routines: Option<PermitRoutines>) -> Self {
        let (sem, p, v, now, expiry) = (
            &s.semaphores,
            &s.permits,
            &s.permit_waiters,
            D::NOW,
            D::expiry(),
        );
        let live = |a: &str| format!("{a}.name = $name AND {a}.expires_at > {now}");
        let recorded = recorded::<D>(s);
        let t = PermitTemplates::new::<D>(s);
        let (grant_call, join_call, hand, release, release_owner) = match routines {
            Some(r) => (
                Some(r.grant),
                Some(r.join),
                Some(r.hand),
                r.release,
                r.release_owner,
            ),
            None => (
                None,
                None,
                None,
                s.done(&t.release),
                s.done(&format!(
                    "DELETE FROM {p} WHERE name = $name AND owner = $owner"
                )),
            ),
        };
        PermitStatements {
            begin: D::TX_BEGIN.map(sqlx::SqlSafeStr::into_sql_str),
            relaxed: D::RELAXED_COMMIT.map(sqlx::SqlSafeStr::into_sql_str),
            lock: D::semaphore_lock(s, false),
            lock_bump: D::semaphore_lock(s, true),
            state: s.row(&t.state),
            grant: s.done(&t.grant),
            regrant: s.done(&t.regrant),
            gc: s.done(&t.gc),
            enqueue: s.insert_returning(&t.enqueue, "ticket"),
            refresh: super::refresh::<D>(s, v),
            dequeue: s.done(&t.dequeue),
            grant_call,
            join_call,
            leave: D::permit_leave(s),
            hand,
            handing: {
                let next = t.of_next("$fence");
                HandStatements {
                    state: s.row(&next.state),
                    grant: s.done(&next.grant),
                    regrant: s.done(&next.regrant),
                    dequeue: s.done(&next.dequeue),
                }
            },
            release,
            release_owner,
            extend: s
                .done(&format!(
                    "UPDATE {p} SET expires_at = {expiry} WHERE {}",
                    super::live_hold::<D>()
                ))
                .keeping(),
            holders: s.row(&format!(
                "SELECT p.owner, p.fence, {} FROM {p} AS p WHERE {} ORDER BY p.fence",
                D::micros_between(now, "p.expires_at"),
                live("p")
            )),
            summary: s.row(&format!(
                "SELECT (SELECT count(*) FROM {sem} AS s WHERE s.name = $name), {recorded}, \
                 (SELECT count(*) FROM {v} AS v WHERE {})",
                live("v")
            )),
            forget: vec![
                s.done(&t.gc),
                s.done(&format!(
                    "DELETE FROM {v} WHERE name = $name AND expires_at <= {now}"
                )),
                s.done(&format!(
                    "DELETE FROM {sem} WHERE name = $name \
                     AND NOT EXISTS (SELECT 1 FROM {p} AS p WHERE {}) \
                     AND NOT EXISTS (SELECT 1 FROM {v} AS v WHERE {})",
                    live("p"),
                    live("v")
                )),
            ],
            gc_all: vec![
                s.done(&format!("DELETE FROM {p} WHERE expires_at <= {now}")),
                s.done(&format!("DELETE FROM {v} WHERE expires_at <= {now}")),
            ],
            head: s.row(&super::head_of::<D>(v)),
            own_ticket: s.row(&super::own_ticket::<D>(v)),
        }
    }
}
