//! One Redis server over one multiplexed connection that reconnects after a failure.
//!
//! Every command of a client (acquire, release, extend pipelines, inspect) shares one
//! [`MultiplexedConnection`]: requests from many tasks are written back to back and their
//! replies matched in order, so concurrency costs no extra sockets. When a request fails with a
//! connection error or a timeout, the connection is dropped and the next request opens a new
//! one. A timeout drops it too: a reply that never came (a blackholed link) would otherwise
//! shift every later reply onto the wrong request. A request that may run twice and found the
//! connection already closed is sent again at once over a new one (see [`Single::send`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult};

/// A reconnecting multiplexed connection to one server.
pub(crate) struct Single {
    client: Client,
    config: AsyncConnectionConfig,
    timeout: Duration,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

impl Single {
    /// A handle that connects on first use; `timeout` bounds connecting and every round trip.
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Single {
            client,
            config,
            timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    /// Sends `request` over the live connection, or a new one, and drops the connection if
    /// the answer (an error that `failure` finds in it) says it can no longer be trusted.
    ///
    /// A connection that was opened earlier may have been closed since it was last used (the
    /// server killed it, a proxy or an idle timeout closed it): the first request after that
    /// fails with "broken pipe" or a reset. When `repeatable` says that running the request
    /// twice leaves the store as running it once (a token-checked release, an extend, a
    /// read), such a request is sent once more over a new connection. It may have run the
    /// first time (its reply lost with the connection), so the answer is the second run's.
    /// A request over a connection it opened itself, and a timeout, are not sent again.
    ///
    /// # Cancel safety
    /// As cancel safe as `request`: dropping the future drops the request in flight.
    pub(crate) async fn send<O, Fut>(
        &self,
        repeatable: bool,
        request: impl Fn(MultiplexedConnection) -> Fut,
        failure: fn(&O) -> Option<&RedisError>,
        unconnected: impl Fn(RedisError) -> O,
    ) -> O
    where
        Fut: Future<Output = O>,
    {
        let mut again = repeatable;
        loop {
            let (generation, con, reused) = match self.connection().await {
                Ok(c) => c,
                Err(e) => return unconnected(e),
            };
            let out = request(con).await;
            let retry = match failure(&out) {
                None => return out,
                Some(e) => {
                    self.failed(generation, e);
                    again && reused && e.is_connection_dropped() && !e.is_timeout()
                }
            };
            if !retry {
                return out;
            }
            tracing::debug!("redis: the connection had been closed; sending the request again");
            again = false;
        }
    }

    /// The live connection, or a new one. Returns its generation for [`Single::failed`], and
    /// whether it was opened before this call.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection, bool)> {
        if let Some((g, c)) = self.lock_current().clone() {
            return Ok((g, c, true));
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some((g, c)) = self.lock_current().clone() {
            return Ok((g, c, true));
        }
        let conn = match tokio::time::timeout(
            self.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&self.config),
        )
        .await
        {
            Ok(r) => r?,
            Err(_) => return Err(timeout_error("connecting", self.timeout)),
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.lock_current() = Some((generation, conn.clone()));
        Ok((generation, conn, false))
    }

    /// Reports a failed request on connection `generation`: drops it if the error means the
    /// connection can no longer be trusted.
    fn failed(&self, generation: u64, err: &RedisError) {
        if breaks_connection(err) {
            let mut current = self.lock_current();
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                tracing::debug!(error = %err, "redis: dropping the connection after an error");
                *current = None;
            }
        }
    }

    /// A new dedicated pub/sub connection.
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        match tokio::time::timeout(self.timeout, self.client.get_async_pubsub()).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error("connecting the subscriber", self.timeout)),
        }
    }

    fn lock_current(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a connection that returned `err` must be replaced.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_unrecoverable_error()
}

/// A timeout as a redis I/O error (so it maps to a retryable backend error).
pub(crate) fn timeout_error(what: &str, after: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what}: no answer within {after:?}"),
    ))
}
