//! MySQL's and MariaDB's semaphore grant, join and hand-over as stored procedures, one round
//! trip each.
//!
//! Sent statement by statement, the grant transaction is six round trips (begin, the semaphore
//! row's lock, the look, the grant, the dequeue, the commit), and it holds the row's lock for
//! all but the first, so every other grant, join and try of the name queues behind the client's
//! round trips. A procedure runs the same statements, from the same templates as every dialect
//! (`PermitTemplates`, the parameters turned into its arguments), and holds the lock only while
//! the server runs them. Each statement of a procedure has its own `NOW(6)`, as when sent one by
//! one, and the transaction inside it is READ COMMITTED like the statements' (see
//! `MySql::TX_BEGIN`), so the look after the lock sees every grant committed before it. An
//! error inside rolls the transaction back before it reaches the client, so no connection goes
//! back to the pool inside one.
//!
//! **Installed where the account may.** `CREATE PROCEDURE` needs the `CREATE ROUTINE`
//! privilege, and a call needs `EXECUTE`. A procedure's name carries a hash of its text
//! (`<table>_grant_permit_<hash>`), so a client only ever calls the text it was built with: it
//! creates the procedure when the database lacks that name (a concurrent client's create of the
//! same name is "already exists", which is as good), and never replaces one an older version's
//! clients may be calling. An account that can neither see nor create them (a DML-only one)
//! keeps the statements, with the same behaviour and more round trips. Procedures of older
//! versions stay in the database until an administrator drops them; they hold no state.

use sqlx::Executor;

use crate::common::{StatementRunner, routine_name};
use crate::dialect::mysql::{MySql, semaphore_lock};
use crate::dialect::{PermitTemplates, Statements, recorded};
use crate::statement::Sql;

/// The state the look reads into (see `PermitStatements::state`).
const STATE: &str = "v_recorded, v_holders, v_ahead, v_mine, v_left, v_expired, v_queued";

/// The look refuses: the counts agree, the permit is not ours already, and waiters are ahead or
/// no permit is free.
const REFUSED: &str = "(v_recorded IS NULL OR v_recorded = p_permits) AND v_mine IS NULL \
                       AND (v_ahead > 0 OR v_holders >= p_permits)";

/// The blocked outcome's row (µs until a holder runs out only when full).
const BLOCKED: &str =
    "SELECT 1, NULL, v_ahead, IF(v_holders < p_permits, NULL, v_left), v_recorded";

/// Begins the procedure's transaction (see the module docs).
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;";

/// Rolls back and passes the error on: the start of every body.
const ON_ERROR: &str = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;";

/// The grant transaction, as PostgreSQL's (see `dialect/postgres/routines.rs`): one row
/// (outcome 0 granted with the fence, 1 blocked with the waiters ahead and the µs until a
/// holder runs out when full, 2 another count recorded). `p_ticket` is the waiter's ticket,
/// `i64::MAX` for a try, which alone looks before taking the lock.
fn grant_body(s: &Sql) -> String {
    let t = PermitTemplates::new::<MySql>(s);
    let look = format!("{} INTO {STATE};", t.state);
    format!(
        "BEGIN \
         DECLARE v_recorded, v_holders, v_ahead, v_mine, v_left, v_expired, v_queued, v_fence \
         BIGINT; \
         {ON_ERROR} \
         body: BEGIN \
         IF p_ticket = {max} THEN {look} \
         IF {REFUSED} THEN {BLOCKED}; LEAVE body; END IF; END IF; \
         {BEGIN} \
         {lock}; \
         {look} \
         IF v_recorded IS NOT NULL AND v_recorded <> p_permits THEN ROLLBACK; \
         SELECT 2, NULL, NULL, NULL, v_recorded; LEAVE body; END IF; \
         IF {REFUSED} THEN ROLLBACK; {BLOCKED}; LEAVE body; END IF; \
         {bump}; \
         SET v_fence = LAST_INSERT_ID(); \
         {writes} \
         IF p_ticket < {max} THEN {dequeue}; END IF; \
         COMMIT; \
         SELECT 0, v_fence, NULL, NULL, NULL; \
         END body; \
         END",
        max = i64::MAX,
        lock = semaphore_lock(&s.semaphores, false),
        bump = semaphore_lock(&s.semaphores, true),
        writes = t.writes("v_fence"),
        dequeue = t.dequeue,
    )
}

/// The join transaction: one row (the new waiter's ticket, or NULL and the other count
/// recorded).
fn join_body(s: &Sql) -> String {
    let t = PermitTemplates::new::<MySql>(s);
    format!(
        "BEGIN \
         DECLARE v_recorded BIGINT; \
         {ON_ERROR} \
         {BEGIN} \
         {lock}; \
         SET v_recorded = {recorded}; \
         IF v_recorded IS NOT NULL AND v_recorded <> p_permits THEN ROLLBACK; \
         SELECT NULL, v_recorded; \
         ELSE {enqueue}; COMMIT; SELECT CAST(LAST_INSERT_ID() AS SIGNED), NULL; END IF; \
         END",
        lock = semaphore_lock(&s.semaphores, false),
        recorded = recorded::<MySql>(s),
        enqueue = t.enqueue,
    )
}

/// The release that hands the freed permit to `$next` (see `PermitStatements::hand`), under
/// the semaphore row's lock: the grant transaction's statements as `$next` would run them, so
/// it is granted only when it would have been (still a live waiter, nobody live ahead of its
/// ticket, a permit free, the counts agreeing). One row: permits freed, `$next`'s fence or
/// NULL, permits still free.
fn hand_body(s: &Sql) -> String {
    let t = PermitTemplates::new::<MySql>(s);
    let next = t.of_next("v_fence");
    let look = format!("{} INTO {STATE};", next.state);
    format!(
        "BEGIN \
         DECLARE v_freed, v_recorded, v_holders, v_ahead, v_mine, v_left, v_expired, v_queued, \
         v_fence BIGINT; \
         {ON_ERROR} \
         body: BEGIN \
         {BEGIN} \
         {lock}; \
         {release}; \
         SET v_freed = ROW_COUNT(); \
         IF v_freed = 0 THEN ROLLBACK; SELECT 0, NULL, NULL; LEAVE body; END IF; \
         {look} \
         IF v_queued = 0 OR (v_recorded IS NOT NULL AND v_recorded <> p_permits) \
         OR ({REFUSED}) THEN COMMIT; SELECT v_freed, NULL, NULL; LEAVE body; END IF; \
         {bump}; \
         SET v_fence = LAST_INSERT_ID(); \
         {writes} \
         {dequeue}; \
         COMMIT; \
         SELECT v_freed, v_fence, p_permits - v_holders - 1; \
         END body; \
         END",
        lock = semaphore_lock(&s.semaphores, false),
        release = t.release,
        bump = semaphore_lock(&s.semaphores, true),
        writes = next.writes(&t.gc),
        dequeue = next.dequeue,
    )
}

/// A stored procedure: its name (with the hash of its text) and its `CREATE PROCEDURE`.
struct Routine {
    name: String,
    create: String,
}

impl Routine {
    /// Procedure `base` of `s`'s table with `params` and `body` (a template, its parameters
    /// turned into the arguments).
    fn new(s: &Sql, base: &str, params: &str, body: &str) -> Self {
        let body = Sql::inline(body);
        let text = format!("({params}) SQL SECURITY INVOKER MODIFIES SQL DATA {body}");
        let name = routine_name(&s.table, base, &text);
        let create = format!("CREATE PROCEDURE `{name}`{text}");
        Routine { name, create }
    }

    /// Whether the procedure is there (visible to this account), creating it if not; `false`
    /// when it is neither there nor creatable.
    async fn install(&self, conn: &mut sqlx::MySqlConnection) -> bool {
        let seen = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'",
        )
        .bind(&self.name)
        .fetch_one(&mut *conn)
        .await;
        if matches!(seen, Ok(n) if n > 0) {
            return true;
        }
        // Not preparable: sent as text.
        let create = sqlx::raw_sql(sqlx::AssertSqlSafe(self.create.clone()));
        match conn.execute(create).await {
            Ok(_) => true,
            // ER_SP_ALREADY_EXISTS: another client created it first.
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == 1304) =>
            {
                true
            }
            Err(e) => {
                tracing::debug!(backend = "mysql", routine = %self.name, error = %e, "cannot create a stored procedure; sending its statements one by one");
                false
            }
        }
    }
}

/// The arguments of a procedure that names a lock and an owner.
const OWNER: &str =
    "p_name VARBINARY(1024), p_owner CHAR(32) CHARACTER SET ascii COLLATE ascii_bin";

/// Creates the procedures where missing and has `sql` call those that are there (else it keeps
/// the statements): the semaphore's grant and join together, and its hand-over.
pub(crate) async fn install(runner: &StatementRunner<sqlx::MySql>, s: &Sql, sql: &mut Statements) {
    let permits = &mut sql.permits;
    let grant = Routine::new(
        s,
        "grant_permit",
        &format!("{OWNER}, p_ttl BIGINT, p_min_token BIGINT, p_permits BIGINT, p_ticket BIGINT"),
        &grant_body(s),
    );
    let join = Routine::new(
        s,
        "join_permits",
        &format!("{OWNER}, p_ttl BIGINT, p_permits BIGINT"),
        &join_body(s),
    );
    let hand = Routine::new(
        s,
        "hand_permit",
        &format!(
            "{OWNER}, p_fence BIGINT, \
             p_next CHAR(32) CHARACTER SET ascii COLLATE ascii_bin, p_ticket BIGINT, \
             p_ttl BIGINT, p_min_token BIGINT, p_permits BIGINT"
        ),
        &hand_body(s),
    );
    // On the client's own connection, as every statement is: straight from the pool, each
    // check would open one more connection, kept idle for a minute.
    let installed = runner
        .run("install procedures", None, |mut c| {
            let (grant, join, hand) = (&grant, &join, &hand);
            async move {
                let conn = c.conn();
                let grant_and_join = grant.install(conn).await && join.install(conn).await;
                let hand = hand.install(conn).await;
                (c, Ok((grant_and_join, hand)))
            }
        })
        .await;
    let (grant_and_join, hand_installed) = installed.unwrap_or((false, false));
    if grant_and_join {
        permits.grant_call = Some(s.row(&format!(
            "CALL `{}`($name, $owner, $ttl, $min_token, $permits, $ticket)",
            grant.name
        )));
        permits.join_call = Some(s.row(&format!(
            "CALL `{}`($name, $owner, $ttl, $permits)",
            join.name
        )));
    }
    if hand_installed {
        permits.hand = Some(s.row(&format!(
            "CALL `{}`($name, $owner, $fence, $next, $ticket, $ttl, $min_token, $permits)",
            hand.name
        )));
    }
}
