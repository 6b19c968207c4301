//! PostgreSQL, MySQL/MariaDB and SQLite: the lease table's plain upsert (no waiter-queue check,
//! no token minimum) and its release, on a connection of their own.

use std::sync::Arc;
use std::time::Duration;

use backend_sql::{Dialect, SqlConfig, SqlConnection};
use lockcore::{Error, LockName, OwnerId, Result, async_trait};
use sqlx::{Row, SqlSafeStr, SqlStr};
use tokio::sync::Mutex;

use super::{Floor, Floors};

/// The floors of a SQL URL: a raw one (its upsert hands out the fence, so it is fenced too).
/// An in-memory SQLite database has none: no other connection can reach it.
pub(super) async fn floors(url: &str) -> Result<Floors> {
    let config = SqlConfig::parse(url)?;
    if matches!(config.sqlite_path(), Some(backend_sql::SqlitePath::Memory)) {
        return Ok(Floors::default());
    }
    // A lock client makes the table, as it would for the lock being measured.
    drop(backend_sql::connect_config(&config).await?);
    let conn = config.open_connection().await?;
    let (acquire, release) = statements(config.dialect(), config.table());
    let sql = |text: String| SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(Arc::<str>::from(text)));
    Ok(Floors {
        raw: Some(Arc::new(SqlFloor {
            backend: config.dialect().backend(),
            conn: Mutex::new(conn),
            acquire: sql(acquire),
            release: sql(release),
        })),
        ..Floors::default()
    })
}

/// The acquire and the release of `dialect` on `table`: the statements the lock's uncontended
/// acquire and release reduce to without the waiter queue.
fn statements(dialect: Dialect, table: &str) -> (String, String) {
    match dialect {
        Dialect::Postgres => (
            format!(
                "INSERT INTO \"{table}\" AS l (name, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, clock_timestamp() + $3::bigint * interval '1 microsecond') \
                 ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, \
                 expires_at = EXCLUDED.expires_at WHERE l.owner IS NULL \
                 OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner RETURNING fence"
            ),
            format!(
                "WITH released AS (UPDATE \"{table}\" SET owner = NULL WHERE name = $1 \
                 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp() RETURNING name) \
                 SELECT count(pg_notify('{table}', 'N' || r.name)) FROM released AS r"
            ),
        ),
        Dialect::MySql => {
            let takeable = "owner IS NULL OR expires_at <= NOW(6) OR owner = ?";
            (
                format!(
                    "INSERT INTO `{table}` (name, owner, fence, expires_at) \
                     VALUES (?, ?, LAST_INSERT_ID(1), NOW(6) + INTERVAL ? MICROSECOND) \
                     ON DUPLICATE KEY UPDATE \
                     fence = IF({takeable}, LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0)), \
                     owner = IF({takeable}, ?, owner), \
                     expires_at = IF(owner <=> ?, NOW(6) + INTERVAL ? MICROSECOND, expires_at)"
                ),
                format!(
                    "UPDATE `{table}` SET owner = NULL WHERE name = ? AND owner = ? AND fence = ? \
                     AND expires_at > NOW(6)"
                ),
            )
        }
        Dialect::Sqlite => {
            let now = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";
            (
                format!(
                    "INSERT INTO \"{table}\" (name, owner, fence, expires_at) \
                     VALUES (?1, ?2, 1, {now} + ?3) ON CONFLICT (name) DO UPDATE \
                     SET owner = excluded.owner, fence = fence + 1, expires_at = excluded.expires_at \
                     WHERE owner IS NULL OR expires_at <= {now} OR owner = excluded.owner \
                     RETURNING fence"
                ),
                format!(
                    "UPDATE \"{table}\" SET owner = NULL WHERE name = ?1 AND owner = ?2 \
                     AND fence = ?3 AND expires_at > {now}"
                ),
            )
        }
    }
}

/// The upsert that takes the row and hands out its next fence, then the update that frees it,
/// as prepared statements on one connection.
struct SqlFloor {
    backend: &'static str,
    conn: Mutex<SqlConnection>,
    acquire: SqlStr,
    release: SqlStr,
}

/// The floor's ttl: long enough that a pair never outlives it.
const TTL: Duration = Duration::from_secs(10);

#[async_trait]
impl Floor for SqlFloor {
    fn description(&self) -> String {
        match self.backend {
            "mysql" => "INSERT .. ON DUPLICATE KEY UPDATE (fence via LAST_INSERT_ID; without the \
                        queue check), then UPDATE .. SET owner = NULL, on one connection",
            "postgres" => "INSERT .. ON CONFLICT DO UPDATE .. RETURNING fence (without the queue \
                           check), then UPDATE .. SET owner = NULL with pg_notify, on one connection",
            _ => "INSERT .. ON CONFLICT DO UPDATE .. RETURNING fence (without the queue check), \
                  then UPDATE .. SET owner = NULL, on one connection",
        }
        .into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let owner = OwnerId::random().to_string();
        let owner = owner.as_str();
        let n = name.as_str();
        let failed = |e: sqlx::Error| Error::backend(self.backend, "floor", Some(name), true, e);
        let (acquire, release) = (self.acquire.clone(), self.release.clone());
        let micros = TTL.as_micros() as i64;
        match &mut *self.conn.lock().await {
            SqlConnection::Postgres(c) => {
                let q = sqlx::query(acquire).bind(n).bind(owner).bind(micros);
                if let Some(row) = q.fetch_optional(&mut *c).await.map_err(failed)? {
                    let fence: i64 = row.try_get(0).map_err(failed)?;
                    let q = sqlx::query(release).bind(n).bind(owner).bind(fence);
                    q.fetch_one(&mut *c).await.map_err(failed)?;
                }
            }
            SqlConnection::MySql(c) => {
                let q = sqlx::query(acquire)
                    .bind(n.as_bytes())
                    .bind(owner)
                    .bind(micros);
                let q = q
                    .bind(owner)
                    .bind(owner)
                    .bind(owner)
                    .bind(owner)
                    .bind(micros);
                let done = q.execute(&mut *c).await.map_err(failed)?;
                let fence = done.last_insert_id();
                if done.rows_affected() > 0 && fence > 0 {
                    let q = sqlx::query(release)
                        .bind(n.as_bytes())
                        .bind(owner)
                        .bind(fence as i64);
                    q.execute(&mut *c).await.map_err(failed)?;
                }
            }
            SqlConnection::Sqlite(c) => {
                let q = sqlx::query(acquire)
                    .bind(n)
                    .bind(owner)
                    .bind(TTL.as_millis() as i64);
                if let Some(row) = q.fetch_optional(&mut *c).await.map_err(failed)? {
                    let fence: i64 = row.try_get(0).map_err(failed)?;
                    let q = sqlx::query(release).bind(n).bind(owner).bind(fence);
                    q.execute(&mut *c).await.map_err(failed)?;
                }
            }
        }
        Ok(())
    }
}
