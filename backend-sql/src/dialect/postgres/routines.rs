//! PostgreSQL's semaphore grant, join and release as server-side routines (PL/pgSQL
//! functions), one round trip each.
//!
//! The grant and the join hold the semaphore row's lock from their first write to their
//! commit (see `crate::semaphore`). Sent statement by statement, that is three or four client
//! round trips, and under contention every other grant, join and try of the name queues
//! behind them. Inside a function the statements are the same, but the lock is held only while
//! the server runs them. Each statement of a `VOLATILE` PL/pgSQL function reads a new snapshot
//! at READ COMMITTED, so the look at the holders after taking the lock sees every grant
//! committed before it, as the statements sent one by one do. The release takes the same lock
//! (see [`release_body`] for why).
//!
//! The functions are named after the lease table and carry a hash of their text
//! (`<table>_grant_permit_<hash>`, `<table>_join_permits_<hash>`, ...; functions and tables
//! have apart namespaces, so these never meet a table's name), as MySQL's procedures do: a
//! client only calls the text it was built with, and clients of two versions that share a
//! database each keep their own functions instead of replacing each other's (PostgreSQL
//! refuses to replace a function whose arguments were renamed). A client creates the ones
//! missing when it connects, under a transaction-scoped advisory lock: two `CREATE FUNCTION`
//! of one function at once fail with "tuple concurrently updated". Their bodies are the
//! templates every dialect runs (`PermitTemplates`), with the parameters as the functions'
//! arguments.

use super::{NOW, semaphore_lock};
use crate::common::routine_name;
use crate::dialect::{PermitRoutines, PermitTemplates, recorded};
use crate::statement::Sql;

/// The advisory lock key under which clients (re)create the functions (`dlock` in ASCII).
const CREATE_LOCK: i64 = 0x0064_6c6f_636b;

/// The grant transaction (see `crate::semaphore`): outcome 0 granted (with the fence), 1
/// blocked (waiters ahead; µs until a holder runs out when full), 2 another count recorded.
/// `p_ticket` is the waiter's ticket, `i64::MAX` for a try; a queued waiter also leaves the
/// queue and, when permits are left after its own, wakes the next head with `wake`. Only a try
/// looks before the lock: a queued waiter comes after a look of its own or a wake-up that named
/// it, so for it that look would only lengthen the handoff.
fn grant_body(s: &Sql, wake: &str) -> String {
    let t = PermitTemplates::new::<super::Postgres>(s);
    let state = "o_recorded, v_holders, o_ahead, v_mine, o_left, v_expired, v_queued";
    let refused = "(o_recorded IS NULL OR o_recorded = p_permits) AND v_mine IS NULL \
                   AND (o_ahead > 0 OR v_holders >= p_permits)";
    format!(
        "DECLARE v_holders bigint; v_mine bigint; v_expired bigint; v_queued bigint; \
         p_fence bigint; \
         BEGIN \
         IF p_ticket = {max} THEN {look} INTO {state}; \
         IF {refused} THEN o_outcome := 1; \
         IF v_holders < p_permits THEN o_left := NULL; END IF; RETURN; END IF; END IF; \
         {lock}; \
         {look} INTO {state}; \
         IF o_recorded IS NOT NULL AND o_recorded <> p_permits THEN o_outcome := 2; RETURN; \
         END IF; \
         IF {refused} THEN o_outcome := 1; \
         IF v_holders < p_permits THEN o_left := NULL; END IF; RETURN; END IF; \
         {bump} INTO p_fence; \
         {writes} \
         IF p_ticket < {max} THEN {dequeue}; \
         IF v_mine IS NULL AND v_holders + 1 < p_permits THEN \
         PERFORM pg_notify('{table}', {wake}); END IF; END IF; \
         o_outcome := 0; o_fence := p_fence; \
         END",
        look = t.state,
        lock = semaphore_lock(&s.semaphores, false),
        bump = semaphore_lock(&s.semaphores, true),
        writes = t.writes("$fence"),
        dequeue = t.dequeue,
        max = i64::MAX,
        table = s.table,
    )
}

/// The join transaction: the new waiter's ticket, or NULL and the other count recorded. Its
/// commit does not wait for the WAL flush (`SqlDialect::RELAXED_COMMIT`): a join a crash loses
/// is a waiter that joins again.
fn join_body(s: &Sql) -> String {
    let t = PermitTemplates::new::<super::Postgres>(s);
    format!(
        "BEGIN \
         PERFORM set_config('synchronous_commit', 'off', true); \
         {lock}; \
         SELECT {recorded} INTO o_recorded; \
         IF o_recorded IS NOT NULL AND o_recorded <> p_permits THEN RETURN; END IF; \
         {enqueue} RETURNING ticket INTO o_ticket; \
         END",
        lock = semaphore_lock(&s.semaphores, false),
        recorded = recorded::<super::Postgres>(s),
        enqueue = t.enqueue,
    )
}

/// The release of `p_owner`'s permit with `p_fence` (any fence when NULL: the give-back of an
/// interrupted acquire; never 0, which a forged lease may carry), under the semaphore row's lock:
/// the number of permits freed (0 or 1), and when one was, the queue's head (or every waiter) woken
/// with `wake`.
///
/// Taking the lock orders the release with every grant. Without it, a release could compute
/// the head while that waiter's grant was under way and wake it, while the grant counted the
/// holders before the release's delete committed and so woke nobody: the freed permit then
/// sat idle until the next release (the bench held 2.5 permits of 4). With it, a release
/// after a grant sees the next head, and a grant after a release counts the freed permit. It
/// waits for the WAL flush like a grant. Committing it without (a release a crash loses only
/// leaves the permit held until its ttl) made the bench worse when the grant was sent statement
/// by statement, and changed nothing with the functions (3.14 holders of 4 both ways).
fn release_body(s: &Sql, wake: &str) -> String {
    format!(
        "BEGIN \
         PERFORM 1 FROM {sem} WHERE name = $name FOR UPDATE; \
         DELETE FROM {p} WHERE name = $name AND owner = $owner \
         AND ($fence IS NULL OR (fence = $fence AND expires_at > {NOW})); \
         GET DIAGNOSTICS o_freed = ROW_COUNT; \
         IF o_freed > 0 THEN PERFORM pg_notify('{table}', {wake}); END IF; \
         END",
        sem = s.semaphores,
        p = s.permits,
        table = s.table,
    )
}

/// The release that hands the freed permit to `p_next` (see `PermitStatements::hand`) under
/// the semaphore row's lock, as the grant would have granted it (still a live waiter, nobody
/// live ahead of its ticket, a permit free, the counts agreeing): the permits freed, `p_next`'s
/// fence or NULL, and the permits still free. It wakes the queue's head with `wake` as the
/// release does when it hands nothing, and when permits are still free after.
fn hand_body(s: &Sql, wake: &str) -> String {
    let t = PermitTemplates::new::<super::Postgres>(s);
    let next = t.of_next("o_fence");
    let state = "v_recorded, v_holders, v_ahead, v_mine, v_left, v_expired, v_queued";
    let refused = "(v_recorded IS NOT NULL AND v_recorded <> p_permits) \
                   OR (v_mine IS NULL AND (v_ahead > 0 OR v_holders >= p_permits))";
    format!(
        "DECLARE v_recorded bigint; v_holders bigint; v_ahead bigint; v_mine bigint; \
         v_left bigint; v_expired bigint; v_queued bigint; \
         BEGIN \
         PERFORM 1 FROM {sem} WHERE name = $name FOR UPDATE; \
         {release}; \
         GET DIAGNOSTICS o_freed = ROW_COUNT; \
         IF o_freed = 0 THEN RETURN; END IF; \
         {look} INTO {state}; \
         IF v_queued = 0 OR {refused} THEN PERFORM pg_notify('{table}', {wake}); RETURN; \
         END IF; \
         {bump} INTO o_fence; \
         {writes} \
         {dequeue}; \
         o_free := p_permits - v_holders - 1; \
         IF o_free > 0 THEN PERFORM pg_notify('{table}', {wake}); END IF; \
         END",
        sem = s.semaphores,
        release = t.release,
        look = next.state,
        bump = semaphore_lock(&s.semaphores, true),
        writes = next.writes(&t.gc),
        dequeue = next.dequeue,
        table = s.table,
    )
}

/// A function of `s`'s table: its name (`base` and the hash of its text) and the `DO` block
/// that creates it unless the database holds it. `body` is a template, its parameters turned
/// into the arguments.
struct Function {
    name: String,
    create: String,
}

impl Function {
    fn new(s: &Sql, base: &str, signature: &str, body: &str) -> Self {
        let body = Sql::inline(body);
        let name = routine_name(&s.table, base, &format!("({signature}) {body}"));
        let create = format!(
            "DO $C$ BEGIN \
             PERFORM pg_advisory_xact_lock({CREATE_LOCK}); \
             IF NOT EXISTS (SELECT 1 FROM pg_proc WHERE proname = '{name}' \
             AND pronamespace = current_schema()::regnamespace) THEN \
             EXECUTE $E$CREATE FUNCTION \"{name}\"({signature}) \
             LANGUAGE plpgsql VOLATILE AS $F${body}$F$$E$; \
             END IF; END $C$"
        );
        Function { name, create }
    }
}

/// The semaphore's functions, to be created with the tables, and their calls; `wake` is the
/// notification payload that wakes the next head of the permit queue.
pub(super) fn permit_routines(s: &Sql, wake: &str) -> PermitRoutines {
    let grant = Function::new(
        s,
        "grant_permit",
        "p_name text, p_owner text, p_ttl bigint, p_min_token bigint, p_permits bigint, \
         p_ticket bigint, OUT o_outcome bigint, OUT o_fence bigint, OUT o_ahead bigint, \
         OUT o_left bigint, OUT o_recorded bigint",
        &grant_body(s, wake),
    );
    let join = Function::new(
        s,
        "join_permits",
        "p_name text, p_owner text, p_ttl bigint, p_permits bigint, \
         OUT o_ticket bigint, OUT o_recorded bigint",
        &join_body(s),
    );
    let release = Function::new(
        s,
        "release_permit",
        "p_name text, p_owner text, p_fence bigint, OUT o_freed bigint",
        &release_body(s, wake),
    );
    let hand = Function::new(
        s,
        "hand_permit",
        "p_name text, p_owner text, p_fence bigint, p_next text, p_ticket bigint, p_ttl bigint, \
         p_min_token bigint, p_permits bigint, OUT o_freed bigint, OUT o_fence bigint, \
         OUT o_free bigint",
        &hand_body(s, wake),
    );
    let create = [&grant, &join, &release, &hand]
        .iter()
        .map(|f| s.done(&f.create))
        .collect();
    let (grant, join, release, hand) = (grant.name, join.name, release.name, hand.name);
    let release_call = |fence: &str| {
        s.row(&format!(
            "SELECT * FROM \"{release}\"($name, $owner, {fence}::bigint)"
        ))
    };
    PermitRoutines {
        create,
        grant: s.row(&format!(
            "SELECT * FROM \"{grant}\"($name, $owner, $ttl::bigint, $min_token::bigint, \
             $permits::bigint, $ticket::bigint)"
        )),
        join: s.row(&format!(
            "SELECT * FROM \"{join}\"($name, $owner, $ttl::bigint, $permits::bigint)"
        )),
        hand: s.row(&format!(
            "SELECT * FROM \"{hand}\"($name, $owner, $fence::bigint, $next, $ticket::bigint, \
             $ttl::bigint, $min_token::bigint, $permits::bigint)"
        )),
        release: release_call("$fence"),
        release_owner: release_call("NULL"),
    }
}
