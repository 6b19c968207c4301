//! PostgreSQL's wake-up: one LISTEN connection per client, started by the first wait and shared
//! by every name the client waits on; a background task dispatches release notifications to
//! per-name and per-waiter wakeups, and replaces the connection when it fails or goes silent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lockcore::OwnerId;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::BACKEND;
use crate::common::Core;

/// What a release notification says (the NOTIFY payload). The channel is the table name; the
/// payload's first byte tells the form:
/// - `W<waiter><name>`: wake only `waiter` (32 hex digits), the live head of `name`'s queue when
///   the lock was freed; it is the only waiter whose attempt can be granted. Listeners of the
///   name that are not queued (`wait_for_release`) wake too.
/// - `N<name>`: wake everyone interested in `name` (nobody was queued, or a waiter left).
/// - `Q<waiter><name>`: wake only `waiter`, the live head of the permit queue of the semaphore
///   `name`, when a permit was freed or a grant left one free: the only permit waiter whose
///   attempt can be granted.
/// - `P<name>`: wake every waiter for a permit of the semaphore `name` (a permit was freed with
///   nobody queued, or a permit waiter left); they are registered apart from the lock's, under
///   [`permits_key`].
///
/// Anything else (a client of an older version sends the bare name) wakes nobody; waiters then
/// find the release on their next re-check ([`RECHECK`](crate::queue::RECHECK)), so a mix of
/// versions is slower but never stuck.
#[derive(Debug, PartialEq, Eq)]
enum Payload<'a> {
    Head { waiter: &'a str, name: &'a str },
    PermitHead { waiter: &'a str, name: &'a str },
    Name(&'a str),
    Permits(&'a str),
    Unknown,
}

/// The key under which waiters for the semaphore `name` register: apart from the lock of the
/// same name (a lock name never holds a NUL).
pub fn permits_key(name: &str) -> String {
    format!("\0{name}")
}

impl<'a> Payload<'a> {
    fn parse(payload: &'a str) -> Self {
        if let Some(name) = payload.strip_prefix('N') {
            return Payload::Name(name);
        }
        if let Some(name) = payload.strip_prefix('P') {
            return Payload::Permits(name);
        }
        let (permits, rest) = match (payload.strip_prefix('W'), payload.strip_prefix('Q')) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Payload::Unknown,
        };
        if rest.len() <= 32 || !rest.is_char_boundary(32) {
            return Payload::Unknown;
        }
        let (waiter, name) = rest.split_at(32);
        if permits {
            Payload::PermitHead { waiter, name }
        } else {
            Payload::Head { waiter, name }
        }
    }
}

/// The wakeups of one name in this client.
#[derive(Default)]
struct Interest {
    /// Listeners that are not queued (`wait_for_release`): woken by every release of the name.
    any: Arc<Notify>,
    /// Queued waiters by id: woken when named as the head, or by an `N` payload.
    queued: HashMap<String, Arc<Notify>>,
}

impl Interest {
    /// Wakes everyone interested in the name.
    fn wake_all(&self) {
        self.any.notify_waiters();
        self.queued.values().for_each(|n| n.notify_waiters());
    }
}

/// Per-name wakeups fed by the listener task.
#[derive(Default)]
pub struct Waiters {
    by_name: Mutex<HashMap<String, Interest>>,
    /// Whether the listener connection is up and LISTENing.
    pub ready: watch::Sender<bool>,
}

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Interest>> {
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Interest in every release of `name` (`waiter` `None`), or a queued `waiter`'s: woken
    /// when it is the head a release names.
    pub fn register(self: &Arc<Self>, name: &str, waiter: Option<OwnerId>) -> Registration {
        let waiter = waiter.map(|w| w.to_string());
        let mut map = self.map();
        let interest = map.entry(name.to_owned()).or_default();
        let notify = match &waiter {
            None => interest.any.clone(),
            Some(id) => {
                let notify = Arc::new(Notify::new());
                interest.queued.insert(id.clone(), notify.clone());
                notify
            }
        };
        Registration {
            waiters: self.clone(),
            name: name.to_owned(),
            waiter,
            notify,
        }
    }

    fn wake(&self, payload: &str) {
        let map = self.map();
        match Payload::parse(payload) {
            Payload::Head { waiter, name } => {
                if let Some(i) = map.get(name) {
                    i.any.notify_waiters();
                    if let Some(n) = i.queued.get(waiter) {
                        n.notify_waiters();
                    }
                }
            }
            Payload::Name(name) => map.get(name).into_iter().for_each(Interest::wake_all),
            Payload::PermitHead { waiter, name } => {
                if let Some(n) = map
                    .get(&permits_key(name))
                    .and_then(|i| i.queued.get(waiter))
                {
                    n.notify_waiters();
                }
            }
            Payload::Permits(name) => map
                .get(&permits_key(name))
                .into_iter()
                .for_each(Interest::wake_all),
            Payload::Unknown => {}
        }
    }

    /// After a reconnect notifications may have been missed: everyone re-checks.
    fn wake_all(&self) {
        self.map().values().for_each(Interest::wake_all);
    }
}

/// One interest in a name; removes the map entry when the last one goes.
pub struct Registration {
    waiters: Arc<Waiters>,
    name: String,
    /// The queued waiter's id (see [`Waiters::register`]).
    waiter: Option<String>,
    notify: Arc<Notify>,
}

impl Registration {
    /// The wakeup the listener task fires.
    pub fn notify(&self) -> &Arc<Notify> {
        &self.notify
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.waiters.map();
        let Some(interest) = map.get_mut(&self.name) else {
            return;
        };
        if let Some(waiter) = &self.waiter {
            interest.queued.remove(waiter);
        }
        // The map holds one reference to `any`, and a name-wide registration being dropped
        // holds another.
        let others = Arc::strong_count(&interest.any) - 1 - usize::from(self.waiter.is_none());
        if others == 0 && interest.queued.is_empty() {
            map.remove(&self.name);
        }
    }
}

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
    core: Core<Postgres>,
    /// The release channel (the table name).
    channel: String,
    /// This client's own ping channel.
    ping: String,
}

/// Keeps one LISTEN connection up and dispatches notifications by payload (see [`Payload`]),
/// replacing it when it fails or stops answering pings.
async fn listen_loop(listen: Arc<Listen>, waiters: Arc<Waiters>) {
    let mut delay = Duration::from_millis(50);
    loop {
        // A new one-connection pool each time: dropping a listener returns its connection to
        // its pool only after an `UNLISTEN *`, which a silent connection never answers, so a
        // shared pool would stay exhausted until TCP gave up on that connection.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(listen.core.timeout)
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
        if waiters.map().is_empty() {
            continue;
        }
        let before = *pongs.borrow_and_update();
        let sent = listen
            .core
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
            tokio::time::timeout(listen.core.timeout, pongs.wait_for(|n| *n > before)).await;
        if !matches!(answered, Ok(Ok(_))) {
            return format!(
                "listener silent: a ping sent through the pool did not come back within {:?}",
                listen.core.timeout
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
    /// A listener for `channel` that connects with `opts` once [`ensure`](Self::ensure)d; `core`
    /// sends the pings.
    pub fn new(opts: PgConnectOptions, core: Core<Postgres>, channel: &str) -> Self {
        let listen = Listen {
            opts,
            current: Mutex::default(),
            core,
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

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "000000000000000000000000000000aa";

    /// A wakeup of `r`, enabled so that a notification from now on fires it.
    fn arm(r: &Registration) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut f = Box::pin(r.notify().notified());
        f.as_mut().enable();
        f
    }

    /// Whether the wakeup `f` fired since it was enabled.
    fn woken(f: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>) -> bool {
        use std::future::Future;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn payloads_parse_by_their_first_byte() {
        let head = |name| Payload::Head { waiter: A, name };
        for (payload, parsed) in [
            ("Njobs/1".to_owned(), Payload::Name("jobs/1")),
            (format!("W{A}jobs/1"), head("jobs/1")),
            // A name may itself start with N or W, or be anything but NUL.
            ("NW".to_owned(), Payload::Name("W")),
            (format!("W{A}N"), head("N")),
            // Too short for a waiter id and a name, or an older client's bare name.
            (format!("W{A}"), Payload::Unknown),
            ("jobs/1".to_owned(), Payload::Unknown),
            ("Wé".to_owned(), Payload::Unknown),
            ("Pjobs/1".to_owned(), Payload::Permits("jobs/1")),
            (
                format!("Q{A}jobs/1"),
                Payload::PermitHead {
                    waiter: A,
                    name: "jobs/1",
                },
            ),
            (format!("Q{A}"), Payload::Unknown),
        ] {
            assert_eq!(Payload::parse(&payload), parsed, "{payload}");
        }
    }

    #[test]
    fn a_head_payload_wakes_only_that_waiter_and_name_wide_listeners() {
        let w = Arc::<Waiters>::default();
        let a = OwnerId(0xaa);
        let b = OwnerId(0xbb);
        assert_eq!(a.to_string(), A);
        let ra = w.register("n", Some(a));
        let rb = w.register("n", Some(b));
        let any = w.register("n", None);
        let other = w.register("m", Some(a));
        let (mut fa, mut fb, mut fany, mut fother) = (arm(&ra), arm(&rb), arm(&any), arm(&other));
        w.wake(&format!("W{A}n"));
        assert!(woken(&mut fa), "the head was not woken");
        assert!(!woken(&mut fb), "a waiter behind the head was woken");
        assert!(woken(&mut fany), "a name-wide listener was not woken");
        assert!(!woken(&mut fother), "a waiter of another name was woken");

        let (mut fa, mut fb) = (arm(&ra), arm(&rb));
        w.wake("Nn");
        assert!(
            woken(&mut fa) && woken(&mut fb),
            "N did not wake every waiter"
        );
        assert!(!woken(&mut fother), "N woke another name");

        let mut fb = arm(&rb);
        w.wake("n");
        assert!(!woken(&mut fb), "an unknown payload woke someone");
        w.wake_all();
        assert!(
            woken(&mut fb) && woken(&mut fother),
            "wake_all missed a waiter"
        );
    }

    #[test]
    fn a_permits_payload_wakes_only_the_semaphores_waiters() {
        let w = Arc::<Waiters>::default();
        let lock = w.register("n", Some(OwnerId(1)));
        let any = w.register("n", None);
        let permit_a = w.register(&permits_key("n"), Some(OwnerId(1)));
        let permit_b = w.register(&permits_key("n"), Some(OwnerId(2)));
        let other = w.register(&permits_key("m"), Some(OwnerId(3)));
        let (mut fl, mut fany) = (arm(&lock), arm(&any));
        let (mut fa, mut fb, mut fo) = (arm(&permit_a), arm(&permit_b), arm(&other));
        w.wake("Pn");
        assert!(woken(&mut fa) && woken(&mut fb), "P missed a permit waiter");
        assert!(!woken(&mut fo), "P woke another semaphore's waiter");
        assert!(
            !woken(&mut fl) && !woken(&mut fany),
            "P woke the lock's waiters"
        );
        let mut fa = arm(&permit_a);
        w.wake("Nn");
        w.wake(&format!("W{A}n"));
        assert!(!woken(&mut fa), "the lock's payloads woke a permit waiter");
    }

    #[test]
    fn registrations_remove_their_entries_when_dropped() {
        let w = Arc::<Waiters>::default();
        let ra = w.register("n", Some(OwnerId(1)));
        let any1 = w.register("n", None);
        let any2 = w.register("n", None);
        drop(ra);
        assert!(
            w.map().contains_key("n"),
            "removed while name-wide listeners remain"
        );
        drop(any1);
        assert!(
            w.map().contains_key("n"),
            "removed while one listener remains"
        );
        let rb = w.register("n", Some(OwnerId(2)));
        drop(any2);
        assert!(w.map().contains_key("n"), "removed while a waiter remains");
        assert_eq!(w.map()["n"].queued.len(), 1);
        drop(rb);
        assert!(
            w.map().is_empty(),
            "the entry outlived its last registration"
        );
    }
}
