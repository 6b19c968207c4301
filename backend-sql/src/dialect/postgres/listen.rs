//! PostgreSQL's wake-up: one LISTEN connection per client, started by the first wait and shared
//! by every name the client waits on; a background task dispatches release notifications to
//! per-name and per-waiter wakeups, and replaces the connection when it fails or goes silent.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lockcore::OwnerId;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::BACKEND;
use crate::common::StatementRunner;
use crate::wake::Waiters;

/// How often, while anyone in this client waits, the listener is checked: a notification sent
/// through the pool to the client's own ping channel must come back through the listener within
/// the client's `timeout`. A LISTEN connection that died silently (a middlebox dropped it while
/// idle, its server process hangs) never reports an error; without this, waits would fall back
/// to the 0.5 s re-check for the rest of the client's life.
pub const LISTENER_CHECK: Duration = Duration::from_secs(5);

/// Where the listener task gets its connections and what it listens to.
struct Listen {
    /// How to open a LISTEN connection.
    opts: PgConnectOptions,
    /// The one-connection pool of the LISTEN connection in use, for `close()`.
    current: Mutex<Option<PgPool>>,
    /// The client's pool and statement rules, which send the pings.
    runner: StatementRunner<Postgres>,
    /// The release channel (the table name).
    channel: String,
    /// This client's own ping channel.
    ping: String,
}

/// Keeps one LISTEN connection up and dispatches notifications by payload (see
/// `crate::wake::Payload`), replacing it when it fails or stops answering pings.
async fn listen_loop(listen: Arc<Listen>, waiters: Arc<Waiters>) {
    let mut delay = Duration::from_millis(50);
    loop {
        // A new one-connection pool each time: dropping a listener returns its connection to
        // its pool only after an `UNLISTEN *`, which a silent connection never answers, so a
        // shared pool would stay exhausted until TCP gave up on that connection.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(listen.runner.timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_lazy_with(listen.opts.clone());
        *listen
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(listen_pool.clone());
        let connected = async {
            let mut l = PgListener::connect_with(&listen_pool).await?;
            l.listen_all([listen.channel.as_str(), listen.ping.as_str()])
                .await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let listener = match connected {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(backend = BACKEND, error = %e, "listener connection failed; waiters poll until it is back");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        delay = Duration::from_millis(50);
        let (pongs, seen) = watch::channel(0u64);
        let receiving = Receiving(tokio::spawn(receive(
            listener,
            listen.ping.clone(),
            waiters.clone(),
            pongs,
        )));
        // Waiters that arrived while we were not listening wait for this flag (they have not
        // re-checked the row yet), so they need no extra wakeup.
        waiters.ready.send_replace(true);
        let why = supervise(&listen, &waiters, receiving, seen).await;
        tracing::debug!(backend = BACKEND, "{why}; listening on a new connection");
        waiters.ready.send_replace(false);
        waiters.wake_all();
    }
}

/// The task reading the LISTEN connection, aborted (with its connection) when dropped.
struct Receiving(JoinHandle<sqlx::Error>);

impl Drop for Receiving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads notifications until the connection fails: releases wake waiters, pings count.
async fn receive(
    mut listener: PgListener,
    ping: String,
    waiters: Arc<Waiters>,
    pongs: watch::Sender<u64>,
) -> sqlx::Error {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) if n.channel() == ping => pongs.send_modify(|c| *c += 1),
            Ok(Some(n)) => waiters.wake(n.payload()),
            // The connection dropped and was re-established (LISTEN included); anything sent
            // in between is lost, so everyone re-checks.
            Ok(None) => waiters.wake_all(),
            Err(e) => return e,
        }
    }
}

/// Watches the receiving task and, while anyone waits, pings through the pool every
/// [`LISTENER_CHECK`]. Returns why the connection must be replaced.
async fn supervise(
    listen: &Listen,
    waiters: &Waiters,
    mut receiving: Receiving,
    mut pongs: watch::Receiver<u64>,
) -> String {
    loop {
        tokio::select! {
            ended = &mut receiving.0 => {
                return match ended {
                    Ok(e) => format!("listener connection lost: {e}"),
                    Err(e) => format!("listener task ended: {e}"),
                };
            }
            _ = tokio::time::sleep(LISTENER_CHECK) => {}
        }
        if waiters.is_idle() {
            continue;
        }
        let before = *pongs.borrow_and_update();
        let sent = listen
            .runner
            .run("ping the listener", None, |mut c| {
                let q = sqlx::query("SELECT pg_notify($1, '')").bind(listen.ping.as_str());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await;
        if sent.is_err() {
            // The server is out of reach for the pool too; the waiters' own statements see
            // that, and the listener's errors end `receiving`.
            continue;
        }
        let answered =
            tokio::time::timeout(listen.runner.timeout, pongs.wait_for(|n| *n > before)).await;
        if !matches!(answered, Ok(Ok(_))) {
            return format!(
                "listener silent: a ping sent through the pool did not come back within {:?}",
                listen.runner.timeout
            );
        }
    }
}

/// The client's listener: the LISTEN connection's task and the wakeups it feeds. The task
/// stops when this is dropped.
pub struct Listener {
    listen: Arc<Listen>,
    task: Mutex<Option<JoinHandle<()>>>,
    pub waiters: Arc<Waiters>,
}

impl Listener {
    /// A listener for `channel` that connects with `opts` once [`ensure`](Self::ensure)d; `runner`
    /// sends the pings.
    pub fn new(opts: PgConnectOptions, runner: StatementRunner<Postgres>, channel: &str) -> Self {
        let listen = Listen {
            opts,
            current: Mutex::default(),
            runner,
            channel: channel.to_owned(),
            ping: format!("dlock_ping_{}", OwnerId::random()),
        };
        Listener {
            listen: Arc::new(listen),
            task: Mutex::default(),
            waiters: Arc::default(),
        }
    }

    /// Starts the listener task if it is not running.
    pub fn ensure(&self) {
        let mut slot = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            let (listen, waiters) = (self.listen.clone(), self.waiters.clone());
            *slot = Some(tokio::spawn(listen_loop(listen, waiters)));
        }
    }

    /// Stops the task and closes its connection, waiting for both.
    pub async fn close(&self) {
        if let Some(task) = take(&self.task) {
            task.abort();
            let _ = task.await;
        }
        if let Some(pool) = take(&self.listen.current) {
            pool.close().await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = take(&self.task) {
            task.abort();
        }
    }
}

/// Takes what `slot` holds.
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}
