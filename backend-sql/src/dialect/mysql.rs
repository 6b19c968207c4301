//! MySQL and MariaDB: lease rows, `INSERT .. ON DUPLICATE KEY UPDATE` with `IF(..)` and
//! `LAST_INSERT_ID(expr)` to return the fence; a FIFO queue of waiter rows (see
//! [`crate::queue`]); waiters poll (the store has no notification).

use std::time::Duration;

use lockcore::{Error, Result};
use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;

use super::{SqlDialect, Statements, connect_server};
use crate::common::{Class, StatementRunner};
use crate::config::{Speedup, SqlConfig, Target};
use crate::statement::{Sql, Stmt, Style};

const BACKEND: &str = "mysql";

/// MySQL has no state besides the pool. (Sessions run in UTC: see [`MySqlLock`](crate::MySqlLock).)
pub struct MySql;

/// Whether the row is free, expired or already ours (the retry of a statement whose reply was
/// lost).
const TAKEABLE: &str = "owner IS NULL OR expires_at <= NOW(6) OR owner = $owner";

/// A new row for an acquire: `LAST_INSERT_ID(expr)` reports the fence (the token minimum, at
/// least 1) in the OK packet.
fn insert(s: &Sql, fence: &str) -> String {
    format!(
        "INSERT INTO {} (name, owner, fence, expires_at) \
         VALUES ($name, $owner, LAST_INSERT_ID({fence}), NOW(6) + INTERVAL $ttl MICROSECOND)",
        s.leases
    )
}

/// The acquires' update. MySQL applies the SET list left to right, each assignment seeing the
/// columns already assigned. `fence` is decided first: bumped if the row is free, expired or
/// already ours AND the queue condition `gate` holds. `owner` then follows that one decision:
/// `LAST_INSERT_ID()` returns what the `fence` assignment passed to `LAST_INSERT_ID(expr)`, the
/// new fence if granted and 0 if not (fences start at 1). `expires_at` last tests whether
/// `owner` is now ours (owner ids are unique per acquisition). The queue condition is a
/// subquery in the update, not an `INSERT .. SELECT .. WHERE NOT EXISTS`, which costs MariaDB
/// twice as much per statement. A grant's fence is GREATEST(fence + 1, token minimum) (0 = no
/// min_token).
fn gated(s: &Sql, gate: &str) -> Stmt {
    s.done(&format!(
        "{} ON DUPLICATE KEY UPDATE \
         fence = IF(({TAKEABLE}) AND NOT EXISTS (SELECT 1 FROM {} AS w \
         WHERE w.name = $name{gate} AND w.expires_at > NOW(6)), \
         LAST_INSERT_ID(GREATEST(fence + 1, $min_token)), fence + LAST_INSERT_ID(0)), \
         owner = IF(LAST_INSERT_ID() = fence, $owner, owner), \
         expires_at = IF(owner <=> $owner, NOW(6) + INTERVAL $ttl MICROSECOND, expires_at)",
        insert(s, "GREATEST(1, $min_token)"),
        s.waiters
    ))
}

/// A queued waiter's gate: no live waiter with a smaller ticket is queued.
const WAITER_GATE: &str = " AND w.ticket < $ticket AND w.waiter <> $owner";

/// The semaphore row's lock (see [`SqlDialect::semaphore_lock`]) on table `sem`: with `bump`, the
/// new fence is the OK packet's insert id (see `insert`), which `LAST_INSERT_ID()` also reads
/// back on the same connection.
pub(crate) fn semaphore_lock(sem: &str, bump: bool) -> String {
    if bump {
        format!(
            "INSERT INTO {sem} (name, fence) VALUES ($name, LAST_INSERT_ID(GREATEST(1, $min_token))) \
             ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, $min_token))"
        )
    } else {
        format!(
            "INSERT INTO {sem} (name, fence) VALUES ($name, 0) \
             ON DUPLICATE KEY UPDATE fence = fence"
        )
    }
}

impl SqlDialect for MySql {
    type Db = sqlx::MySql;
    const BACKEND: &'static str = BACKEND;
    const CLIENT: &'static str = "MySqlLock";
    const STYLE: Style = Style {
        numbered: None,
        quote: '`',
        binary_names: true,
        returning: false,
        ttl_unit: Duration::from_micros(1),
    };
    const NOW: &'static str = "NOW(6)";

    fn expiry() -> String {
        "NOW(6) + INTERVAL $ttl MICROSECOND".to_owned()
    }

    fn micros_between(now: &str, at: &str) -> String {
        format!("TIMESTAMPDIFF(MICROSECOND, {now}, {at})")
    }

    fn classify(db: &dyn DatabaseError) -> Class {
        match db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map_or(0, MySqlDatabaseError::number)
        {
            // deadlock, lock wait timeout: the statement was rolled back.
            1205 | 1213 => Class::Busy,
            // server shutdown, connection killed (MariaDB), gone away, lost, idle disconnect.
            1053 | 1927 | 2006 | 2013 | 4031 => Class::Stale,
            // too many connections, out of resources.
            1040 | 1041 | 1203 => Class::Fail { retryable: true },
            // access denied: for the user (1045), to the database (1044), for a command (1142,
            // 1143), for lack of a privilege (1227), without a password (1698).
            1044 | 1045 | 1142 | 1143 | 1227 | 1698 => Class::Denied,
            _ => Class::Fail { retryable: false },
        }
    }

    async fn connect(
        config: &SqlConfig,
        sql: &mut Statements,
    ) -> Result<(StatementRunner<Self::Db>, Self)> {
        let Target::MySql(opts) = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a mysql:// URL"));
        };
        let runner = connect_server::<Self>(config, opts, sql).await?.0;
        let s = Sql::new(Self::STYLE, &config.table);
        if config.speedups.contains(Speedup::MysqlProcedures) {
            crate::speedup::mysql_procedures::install(&runner, &s, sql).await;
        }
        Ok((runner, MySql))
    }

    const CREATE: &[&str] = &[
        // VARBINARY: names compare byte for byte (case-sensitive), and 1024 bytes fit InnoDB's
        // 3072-byte index limit whatever the character set.
        "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
         owner CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL, \
         fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
        // Waiters: one row per queued acquire; `ticket` orders them, `expires_at` is the
        // waiter's liveness (refreshed while it waits).
        "CREATE TABLE IF NOT EXISTS {w} (ticket BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         name VARBINARY(1024) NOT NULL, \
         waiter CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
         expires_at DATETIME(6) NOT NULL, KEY by_name (name, ticket)) ENGINE=InnoDB",
        // Semaphores: the fence of each (never reset by release or expiry), and the row whose
        // lock serialises the semaphore's grants and joins.
        "CREATE TABLE IF NOT EXISTS {s} (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
         fence BIGINT NOT NULL) ENGINE=InnoDB",
        // Permit holders: one row per permit held, with the count it was granted under.
        "CREATE TABLE IF NOT EXISTS {p} (name VARBINARY(1024) NOT NULL, \
         owner CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
         fence BIGINT NOT NULL, permits BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
         PRIMARY KEY (name, owner)) ENGINE=InnoDB",
        // Permit waiters: as the lock's waiters, apart from them, with the count.
        "CREATE TABLE IF NOT EXISTS {v} (ticket BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         name VARBINARY(1024) NOT NULL, \
         waiter CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
         permits BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
         KEY by_name (name, ticket)) ENGINE=InnoDB",
        // Readers: one row per read hold (fence set) or per queued reader's mark (fence NULL).
        "CREATE TABLE IF NOT EXISTS {r} (name VARBINARY(1024) NOT NULL, \
         owner CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, fence BIGINT NULL, \
         expires_at DATETIME(6) NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB",
    ];

    /// Each statement of a semaphore transaction reads what committed before it (the default
    /// REPEATABLE READ would read a snapshot taken at the transaction's first read). The setting
    /// applies to the next transaction only; both go in one text query, one round trip.
    const TX_BEGIN: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION");

    fn semaphore_lock(s: &Sql, bump: bool) -> Stmt {
        s.done(&semaphore_lock(&s.semaphores, bump))
    }

    fn lease_bump(s: &Sql) -> Stmt {
        // The OK packet's insert id is the new fence (see `insert`).
        s.done(&format!(
            "INSERT INTO {} (name, owner, fence, expires_at) \
             VALUES ($name, NULL, LAST_INSERT_ID(GREATEST(1, $min_token)), NOW(6)) \
             ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, $min_token))",
            s.leases
        ))
    }

    fn acquire(s: &Sql) -> Stmt {
        // LAST_INSERT_ID(expr) reports the outcome in the OK packet: the new fence for a new
        // row (1, or the minimum) and for a take-over, 0 when the row is held by someone else or
        // a live waiter is queued for the name. A new row (a name never used) is not gated: a
        // waiter only queues after finding the row held, and rows are never deleted.
        gated(s, "")
    }

    fn wait_acquire(s: &Sql) -> Stmt {
        gated(s, WAITER_GATE)
    }

    fn hand(s: &Sql, next: &str, held: &str) -> Stmt {
        // No `UPDATE .. FROM`; the SET list runs left to right, each assignment reading the
        // columns already assigned, so `owner` is set first (running `next` once) and the
        // others follow it.
        s.done(&format!(
            "UPDATE {} SET owner = ({next}), fence = IF(owner IS NULL, fence, fence + 1), \
             expires_at = IF(owner IS NULL, expires_at, {}) WHERE {held}",
            s.leases,
            Self::expiry()
        ))
    }
}
