//! PostgreSQL's wake-up: one LISTEN connection per client, started by the first wait and shared
//! by every name the client waits on; a background task dispatches release notifications to
//! per-name and per-waiter wakeups, and replaces the connection when it fails or goes silent.
//! Between notifications the connection is lent to the client's statements ([`Shared`]), so a
//! client that waits needs no second connection.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use lockcore::OwnerId;
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPool, PgPoolOptions};
use sqlx::{Acquire, PgConnection, Postgres};
use tokio::sync::{Notify, OwnedMutexGuard, watch};
use tokio::task::JoinHandle;

use super::BACKEND;
use crate::common::{Lender, Lending, LentConnection, StatementRunner};
use crate::wake::Waiters;

/// How often, while anyone in this client waits, the listener is checked: a notification it
/// sends to the client's own ping channel must come back to it within the client's `timeout`. A LISTEN connection that died silently (a middlebox dropped it while
/// idle, its server process hangs) never reports an error; without this, waits would fall back
/// to the 0.5 s re-check for the rest of the client's life.
pub const LISTENER_CHECK: Duration = Duration::from_secs(5);

/// The LISTEN connection in use, shared by the task that reads its notifications and the
/// client's statements: between notifications it is lent to one statement at a time, while
/// notifications that arrive meanwhile wait in its buffer.
#[derive(Default)]
pub struct Shared {
    /// The listener; `None` before the first wait, while it is replaced, and after a statement
    /// gave it back unusable.
    listener: Arc<tokio::sync::Mutex<Option<PgListener>>>,
    /// Whether a statement has it (the next statement then takes another connection rather than
    /// wait for this one).
    lent: Arc<AtomicBool>,
    /// Statements waiting for it: the reading task lets go, and waits until they have it.
    wanted: AtomicUsize,
    /// Wakes the reading task to let go.
    want: Notify,
    /// Wakes the reading task once no statement waits for the connection.
    taken: Notify,
}

impl Lender<Postgres> for Shared {
    fn lend(&self) -> Lending<'_, Postgres> {
        Box::pin(async move {
            if self.lent.swap(true, Ordering::AcqRel) {
                return None;
            }
            let lent = self.take().await;
            if lent.is_none() {
                self.lent.store(false, Ordering::Release);
            }
            lent.map(|lent| Box::new(lent) as Box<dyn LentConnection<Postgres>>)
        })
    }
}

impl Shared {
    /// Asks the reading task to let go of the connection, then takes it if there is one and it
    /// is connected.
    async fn take(&self) -> Option<Lent> {
        // A dropped wait must not leave the reader waiting for it.
        struct Wanted<'a>(&'a Shared);
        impl Drop for Wanted<'_> {
            fn drop(&mut self) {
                self.0.wanted.fetch_sub(1, Ordering::AcqRel);
                self.0.taken.notify_waiters();
            }
        }
        self.wanted.fetch_add(1, Ordering::AcqRel);
        let wanted = Wanted(self);
        self.want.notify_one();
        let mut guard = self.listener.clone().lock_owned().await;
        drop(wanted);
        connection(guard.as_mut()?)?;
        Some(Lent {
            guard,
            lent: self.lent.clone(),
        })
    }
}

/// The LISTEN connection lent to one statement.
struct Lent {
    guard: OwnedMutexGuard<Option<PgListener>>,
    /// [`Shared::lent`], cleared when it is given back.
    lent: Arc<AtomicBool>,
}

impl LentConnection<Postgres> for Lent {
    fn conn(&mut self) -> &mut PgConnection {
        // Lent only while connected, and only the statement uses it meanwhile.
        let listener = self.guard.as_mut().expect("lent with a listener");
        connection(listener).expect("a lent listener stays connected")
    }

    fn give_back(mut self: Box<Self>, usable: bool) {
        if !usable {
            // The reading task finds none, ends, and a new connection replaces this one.
            *self.guard = None;
        }
        self.lent.store(false, Ordering::Release);
    }
}

/// The listener's connection if it has one now (it reconnects on its next read otherwise).
fn connection(listener: &mut PgListener) -> Option<&mut PgConnection> {
    let mut acquire = pin!(listener.acquire());
    match acquire
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(conn)) => Some(conn),
        _ => None,
    }
}

/// Where the listener task gets its connections and what it listens to.
struct Listen {
    /// How to open a LISTEN connection.
    opts: PgConnectOptions,
    /// The one-connection pool of the LISTEN connection in use, for `close()`.
    current: Mutex<Option<PgPool>>,
    /// The client's pool and statement rules (its `timeout` bounds a ping).
    runner: StatementRunner<Postgres>,
    /// The release channel (the table name).
    channel: String,
    /// This client's own ping channel.
    ping: String,
    /// The connection in use, lent to the client's statements between notifications.
    shared: Arc<Shared>,
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
        *listen.shared.listener.lock().await = Some(listener);
        // The statements run on it from now on: the connections they used close.
        listen.runner.retire_connections();
        let receiving = Receiving(tokio::spawn(receive(
            listen.shared.clone(),
            listen.ping.clone(),
            waiters.clone(),
            pongs,
        )));
        // Waiters that arrived while we were not listening wait for this flag (they have not
        // re-checked the row yet), so they need no extra wakeup.
        waiters.ready.send_replace(true);
        let why = supervise(&listen, &waiters, receiving, seen).await;
        // (After the statement that has it, if one does.)
        *listen.shared.listener.lock().await = None;
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

/// Reads notifications until the connection fails: releases wake waiters, pings count. Lets go
/// of the connection whenever a statement wants it (see [`Shared`]).
async fn receive(
    shared: Arc<Shared>,
    ping: String,
    waiters: Arc<Waiters>,
    pongs: watch::Sender<u64>,
) -> sqlx::Error {
    loop {
        // The statements that asked for the connection take it first.
        loop {
            let taken = shared.taken.notified();
            let mut taken = pin!(taken);
            taken.as_mut().enable();
            if shared.wanted.load(Ordering::Acquire) == 0 {
                break;
            }
            taken.await;
        }
        let mut guard = shared.listener.lock().await;
        let Some(listener) = guard.as_mut() else {
            return sqlx::Error::Protocol(
                "a statement left the listener's connection unusable".into(),
            );
        };
        // What arrived while a statement had the connection.
        while let Some(n) = listener.next_buffered() {
            dispatch(&n, &ping, &waiters, &pongs);
        }
        let received = tokio::select! {
            biased;
            () = shared.want.notified() => continue,
            // Cancel safe: a notification is taken from the connection only when whole.
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(n)) => dispatch(&n, &ping, &waiters, &pongs),
            // The connection dropped and was re-established (LISTEN included); anything sent
            // in between is lost, so everyone re-checks.
            Ok(None) => waiters.wake_all(),
            Err(e) => {
                *guard = None;
                return e;
            }
        }
    }
}

/// A release wakes waiters; a ping counts.
fn dispatch(n: &PgNotification, ping: &str, waiters: &Waiters, pongs: &watch::Sender<u64>) {
    if n.channel() == ping {
        pongs.send_modify(|c| *c += 1);
    } else {
        waiters.wake(n.payload());
    }
}

/// Watches the receiving task and, while anyone waits, pings the listener every
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
        // Sent on the listener's own connection, when no statement has it (a statement that
        // has it finds a silent connection by timing out, which replaces it too).
        let Some(mut lent) = listen.shared.lend().await else {
            continue;
        };
        let ping = sqlx::query("SELECT pg_notify($1, '')").bind(listen.ping.as_str());
        let sent = tokio::time::timeout(listen.runner.timeout, ping.execute(lent.conn())).await;
        let sent = matches!(sent, Ok(Ok(_)));
        lent.give_back(sent);
        let answered = match sent {
            true => {
                tokio::time::timeout(listen.runner.timeout, pongs.wait_for(|n| *n > before)).await
            }
            false => return "listener silent: a ping on it did not complete".to_owned(),
        };
        if !matches!(answered, Ok(Ok(_))) {
            return format!(
                "listener silent: a ping did not come back through it within {:?}",
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
    /// A listener for `channel` that connects with `opts` once [`ensure`](Self::ensure)d and
    /// lends its connection through `shared`; `runner` closes the connections it makes unneeded.
    pub fn new(
        opts: PgConnectOptions,
        runner: StatementRunner<Postgres>,
        channel: &str,
        shared: Arc<Shared>,
    ) -> Self {
        // Told apart in `pg_stat_activity`: it lives as long as the client.
        let name = format!(
            "{} listener",
            opts.get_application_name().unwrap_or("dlock")
        );
        let opts = opts.application_name(&name);
        let listen = Listen {
            shared,
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
        // Its pool closes only once the listener has given its connection back.
        drop(self.listen.shared.listener.lock().await.take());
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
