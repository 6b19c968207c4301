//! The connections a PostgreSQL or MySQL/MariaDB server has open while a measurement runs,
//! sampled from one connection of the sampler's own: what the clients cost the server, and
//! whether they reached its limit.

use std::time::Duration;

use backend_sql::{Dialect, SqlConfig, SqlConnection};
use lockcore::{Error, Result};
use sqlx::Row;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How often the server is asked.
const EVERY: Duration = Duration::from_millis(100);

/// What the server reported over one measurement. Counts leave out the sampler's own connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConnections {
    /// Client connections open when sampling started (other applications, earlier runs).
    pub before: u64,
    /// The most client connections open at one sample.
    pub peak: u64,
    /// The server's `max_connections`.
    pub limit: u64,
    /// Connection attempts the server refused while sampling (MySQL's and MariaDB's
    /// `Aborted_connects`: for lack of room, or a failed login); `None` where the server does not
    /// count them (PostgreSQL).
    pub refused: Option<u64>,
}

impl ServerConnections {
    /// Connections the measured clients added at the peak.
    pub fn added(&self) -> u64 {
        self.peak.saturating_sub(self.before)
    }

    /// Whether the server was full at some sample (with the sampler's own connection): a
    /// connection asked for then was refused. PostgreSQL's clients retry a refusal until their
    /// timeout, so this is the only sign of it there.
    pub fn reached_limit(&self) -> bool {
        self.peak + 1 >= self.limit
    }
}

/// A sampling task started before the clients connect and stopped after they have gone.
pub struct ConnectionSampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<ServerConnections>>,
}

impl ConnectionSampler {
    /// Starts sampling the server behind `url`; `Ok(None)` for a URL of another store or a
    /// SQLite file, which has no connections of its own to count.
    ///
    /// # Errors
    /// The URL does not parse, or the server cannot be reached or will not say how many
    /// connections it has.
    pub async fn start(url: &str) -> Result<Option<Self>> {
        let Ok(config) = SqlConfig::parse(url) else {
            return Ok(None);
        };
        if config.dialect() == Dialect::Sqlite {
            return Ok(None);
        }
        let mut conn = config.open_connection().await?;
        let backend = config.dialect().backend();
        let failed =
            move |e: sqlx::Error| Error::backend(backend, "count connections", None, false, e);
        let limit = max_connections(&mut conn).await.map_err(failed)?;
        let refused_before = refused(&mut conn).await.map_err(failed)?;
        let before = open(&mut conn).await.map_err(failed)?;
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut peak = before;
            let mut tick = tokio::time::interval(EVERY);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {}
                }
                peak = peak.max(open(&mut conn).await.map_err(failed)?);
            }
            peak = peak.max(open(&mut conn).await.map_err(failed)?);
            let refused_after = refused(&mut conn).await.map_err(failed)?;
            Ok(ServerConnections {
                before,
                peak,
                limit,
                refused: refused_after
                    .zip(refused_before)
                    .map(|(after, before)| after.saturating_sub(before)),
            })
        });
        Ok(Some(ConnectionSampler { stop, task }))
    }

    /// Stops sampling and says what was seen.
    ///
    /// # Errors
    /// The sampler's connection failed while sampling.
    pub async fn finish(self) -> Result<ServerConnections> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| Error::invalid_config("bench", format!("connection sampler: {e}")))?
    }
}

/// Client connections open now, other than this one.
async fn open(conn: &mut SqlConnection) -> sqlx::Result<u64> {
    let n: i64 = match conn {
        SqlConnection::Postgres(c) => sqlx::query(
            "SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .fetch_one(c)
        .await?
        .try_get(0)?,
        SqlConnection::MySql(c) => {
            let v: String = sqlx::query("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
                .fetch_one(c)
                .await?
                .try_get(1)?;
            v.parse::<i64>().unwrap_or(0) - 1
        }
        SqlConnection::Sqlite(_) => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The server's `max_connections`.
async fn max_connections(conn: &mut SqlConnection) -> sqlx::Result<u64> {
    let n: i64 = match conn {
        SqlConnection::Postgres(c) => {
            sqlx::query("SELECT current_setting('max_connections')::bigint")
                .fetch_one(c)
                .await?
                .try_get(0)?
        }
        SqlConnection::MySql(c) => sqlx::query("SELECT CAST(@@max_connections AS SIGNED)")
            .fetch_one(c)
            .await?
            .try_get(0)?,
        SqlConnection::Sqlite(_) => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How many connection attempts the server has refused, where it counts them. (MariaDB counts a
/// refusal for lack of room only here, not in `Connection_errors_max_connections`.)
async fn refused(conn: &mut SqlConnection) -> sqlx::Result<Option<u64>> {
    match conn {
        SqlConnection::MySql(c) => {
            let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Aborted_connects'")
                .fetch_optional(c)
                .await?;
            Ok(match row {
                Some(row) => row.try_get::<String, _>(1)?.parse().ok(),
                None => None,
            })
        }
        _ => Ok(None),
    }
}
