//! The fault scenarios every backend shares, as library functions over a [`Ctx`] whose target
//! can start private servers ([`crate::Target::spawn_with`]).
//!
//! Each scenario records who held the lock when ([`History`]) and writes through one
//! [`FencedResource`], then hands what it saw to [`verdict`], which compares it with the
//! target's declaration ([`Expect`]):
//!
//! * declared **safe**: no two holders' windows overlap, tokens grow, every new holder's write
//!   is accepted and every old holder's late write is refused — any violation fails the test;
//! * declared **documented unsafe**: the scenario's deterministic schedule must show the
//!   violation the declaration describes — if it does not, the declaration is stale and the test
//!   fails, so the documentation cannot drift from the behaviour.
//!
//! Liveness (the holder's `lost()` fires, the waiters get the lock once the store is back, the
//! old holder's client recovers) is asserted directly: a scenario that hangs or loses a client
//! fails whatever the declaration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, KeepAlive, LockExt, LockGuard, LockName,
    LostReason, ReadWriteExt, Released, SemaphoreExt, Wait,
};

use crate::cases::{try_answered, within};
use crate::kit::{Fault, Proxy};
use crate::{Ctx, Expect, FencedResource, History, Hold, Persistence, Spawned, Target};

const SEC: Duration = Duration::from_secs(1);

/// The count of the semaphores the fault scenarios use.
pub(crate) const PERMITS: u32 = 2;

/// What a scenario's clients hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Primitive {
    /// The lock (on a read-write store, its write side).
    Lock,
    /// A permit of a semaphore of [`PERMITS`].
    Permit,
    /// The read side of a read-write lock.
    Read,
}

impl Primitive {
    /// Takes `name` as this primitive for `c` with `opts`.
    pub(crate) async fn take(
        self,
        c: &Arc<dyn DistributedLock>,
        name: &str,
        opts: &AcquireOptions,
    ) -> lockcore::Result<LockGuard> {
        match self {
            Primitive::Lock => c.lock(name, opts).await,
            Primitive::Permit => Ok(c
                .semaphore(name, PERMITS)?
                .acquire(opts)
                .await?
                .into_inner()),
            Primitive::Read => Ok(c.read_lock(name, opts).await?.into_inner()),
        }
    }
}

/// The fault scenarios that break a server (kill, pause, blackhole its link, end its
/// connections): a store without one declares them all not applicable at once with
/// [`Target::without_server`].
pub const NEED_A_SERVER: &[&str] = &[
    "server_killed_and_restarted",
    "server_killed_and_restarted_without_persistence",
    "server_paused_past_ttl",
    "holder_replies_blackholed_past_ttl",
    "holder_requests_blackholed_past_ttl",
    "store_connections_killed",
    "sem_server_killed_and_restarted",
    "sem_holder_blackholed_past_ttl",
    "rw_reader_server_killed_and_restarted",
    "rw_reader_blackholed_past_ttl",
];

/// What `lost()` may say when the store stopped answering: the lease ran out, renewals could
/// not reach the store, or (a quorum backend) could not reach a majority of it.
fn unreachable_reason(reason: LostReason) -> bool {
    matches!(
        reason,
        LostReason::ConnectionLost | LostReason::Expired | LostReason::QuorumLost
    )
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `url` with `query` appended (`?` or `&`).
pub fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

/// A guarded holder's tenure: from when `lock` returned to the last `valid_until` the guard
/// knew of, or to `ended` if it stopped relying on the lock earlier.
pub fn hold_of(
    client: usize,
    guard: &LockGuard,
    acquired: Instant,
    ended: Option<Instant>,
) -> Hold {
    let lease = guard.lease();
    Hold {
        client,
        name: lease.name().as_str().to_owned(),
        token: lease.token().0,
        acquired,
        valid_until: lease.valid_until(),
        ended,
    }
}

/// What a scenario saw that breaks safety, in words.
#[derive(Debug, Default)]
pub struct Findings(Vec<String>);

impl Findings {
    /// Adds the history's violations.
    pub fn history(&mut self, history: &History) {
        self.0
            .extend(history.violations().iter().map(ToString::to_string));
    }

    /// A new holder writes with its token: refused means tokens went backwards.
    pub fn new_holder_writes(&mut self, fenced: &FencedResource, token: FencingToken, who: u64) {
        if let Err(e) = fenced.write(token, who) {
            self.0.push(format!(
                "the new holder's write was refused ({e}): its token is below an earlier holder's"
            ));
        }
    }

    /// The old holder writes late with its token: accepted means fencing did not protect.
    pub fn old_holder_writes_late(&mut self, fenced: &FencedResource, token: FencingToken) {
        if fenced.write(token, u64::MAX).is_ok() {
            self.0.push(format!(
                "the old holder's late write with token {} was accepted after another client held the lock",
                token.0
            ));
        }
    }

    /// Records a violation seen another way.
    pub fn push(&mut self, what: impl Into<String>) {
        self.0.push(what.into());
    }
}

/// Compares what the scenario saw with the target's declaration; panics (fails the case) when
/// they disagree.
///
/// # Panics
/// Declared safe with findings; declared documented unsafe without any; not declared.
pub fn verdict(ctx: &Ctx, findings: Findings) {
    let listed = findings
        .0
        .iter()
        .map(|f| format!("  {f}"))
        .collect::<Vec<_>>()
        .join("\n");
    match ctx.expect() {
        Some(Expect::Safe) => assert!(
            findings.0.is_empty(),
            "{} is declared safe on {}, but:\n{listed}",
            ctx.case(),
            ctx.backend()
        ),
        Some(Expect::DocumentedUnsafe(reason)) => assert!(
            !findings.0.is_empty(),
            "{} is declared documented-unsafe on {} ({reason}), but its schedule showed no \
             violation: update the declaration",
            ctx.case(),
            ctx.backend()
        ),
        other => panic!(
            "{} ran on {} with declaration {other:?}",
            ctx.case(),
            ctx.backend()
        ),
    }
}

async fn spawn(ctx: &Ctx, persistence: Persistence) -> Spawned {
    ctx.target()
        .spawn(persistence)
        .await
        .unwrap_or_else(|e| panic!("cannot start a server for {}: {e}", ctx.case()))
}

fn held(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No)
}

fn plain(ttl: Duration, wait: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(wait))
}

/// Acquires `name`, riding out retryable store errors (the store may be down or coming back),
/// until `limit` has passed.
async fn acquire_through_errors(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
    limit: Duration,
    who: &str,
) -> (LockGuard, Instant) {
    take_through_errors(c, name, Primitive::Lock, opts, limit, who).await
}

/// [`acquire_through_errors`] for any primitive.
pub(crate) async fn take_through_errors(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    primitive: Primitive,
    opts: &AcquireOptions,
    limit: Duration,
    who: &str,
) -> (LockGuard, Instant) {
    within(limit, who, async {
        loop {
            match primitive.take(c, name, opts).await {
                Ok(g) => break (g, Instant::now()),
                Err(Error::Timeout { .. }) => {}
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(100)).await,
                Err(e) => panic!("{who}: unexpected error {e}"),
            }
        }
    })
    .await
}

/// Releases `guard`'s lease through `c` once the store answers again; must say `NotHeld`.
async fn stale_release_frees_nothing(c: &Arc<dyn DistributedLock>, guard: &LockGuard) {
    let released = within(30 * SEC, "the old holder's release", async {
        loop {
            match c.release(&guard.lease()).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(100)).await,
                Err(e) => panic!("the old holder's release: {e}"),
            }
        }
    })
    .await;
    assert_eq!(
        released,
        Released::NotHeld,
        "a lease that had run out released the lock"
    );
}

/// Takes and releases `name` `n` times, so that a counter that restarts becomes visible.
async fn bump(c: &Arc<dyn DistributedLock>, name: &str, n: usize) {
    for _ in 0..n {
        let g = c
            .lock(name, &plain(10 * SEC, 30 * SEC))
            .await
            .expect("acquire");
        g.release().await.expect("release");
    }
}

/// Waits for `name` while the store may be down, writes through `fenced`, holds briefly and
/// releases; returns its tenure and token.
async fn waiter(
    id: usize,
    c: Arc<dyn DistributedLock>,
    name: String,
    history: Arc<History>,
    fenced: Arc<FencedResource>,
    findings: Arc<std::sync::Mutex<Findings>>,
) -> FencingToken {
    let opts = plain(2 * SEC, 3 * SEC);
    let (guard, acquired) =
        acquire_through_errors(&c, &name, &opts, 150 * SEC, &format!("waiter {id}")).await;
    let token = guard.fencing_token();
    findings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .new_holder_writes(&fenced, token, id as u64);
    tokio::time::sleep(ms(100)).await;
    history.push(hold_of(id, &guard, acquired, Some(Instant::now())));
    let _ = guard.release().await;
    token
}

/// The server killed -9 and restarted while a client holds `primitive` (the lock, or a read
/// hold) and two writers wait; see [`server_killed_and_restarted`].
async fn kill9_and_restart(ctx: Ctx, persistence: Persistence, primitive: Primitive) {
    let spawned = spawn(&ctx, persistence).await;
    let url = with_query(&spawned.url, "timeout=1s");
    let name = ctx.name("crashed");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());
    let findings = Arc::new(std::sync::Mutex::new(Findings::default()));

    let holder = ctx.connect(&url).await;
    bump(&holder, &name, 3).await;
    let guard = primitive
        .take(&holder, &name, &held(2 * SEC))
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    let holder_token = guard.fencing_token();
    fenced.write(holder_token, 0).expect("the first write");

    let mut waiters = tokio::task::JoinSet::new();
    for id in 1..=2 {
        let c = ctx.connect(&url).await;
        waiters.spawn(waiter(
            id,
            c,
            name.clone(),
            history.clone(),
            fenced.clone(),
            findings.clone(),
        ));
    }
    tokio::time::sleep(ms(500)).await;
    assert!(
        guard.is_held(),
        "the holder lost the lock while the server was up"
    );
    assert!(
        waiters.try_join_next().is_none(),
        "a waiter got a held lock"
    );

    spawned.server.kill9();
    let reason = within(30 * SEC, "the holder's lost() after kill -9", guard.lost()).await;
    assert!(
        unreachable_reason(reason),
        "lost() said {reason:?} after kill -9"
    );
    assert!(
        !guard.is_held(),
        "a guard that was told it lost still claims the lock"
    );
    history.push(hold_of(0, &guard, held_at, None));
    assert_eq!(
        fenced.accepted().len(),
        1,
        "someone wrote while the server was down"
    );

    spawned.server.restart().await.expect("restart");
    let mut tokens = Vec::new();
    while let Some(r) = within(
        180 * SEC,
        "the waiters after the restart",
        waiters.join_next(),
    )
    .await
    {
        tokens.push(r.expect("waiter task"));
    }
    assert_eq!(
        tokens.len(),
        2,
        "both waiters got the lock after the restart"
    );
    let mut findings = std::mem::take(&mut *findings.lock().unwrap_or_else(|p| p.into_inner()));
    findings.old_holder_writes_late(&fenced, holder_token);
    findings.history(&history);
    stale_release_frees_nothing(&holder, &guard).await;
    drop(guard);
    verdict(&ctx, findings);
}

/// The server is killed -9 while one client holds the lock (keep-alive on) and two wait for
/// it, then restarted with its data. The holder's `lost()` fires; nobody gets the lock while
/// the server is down; both waiters get it after the restart, with tokens above the holder's;
/// the holder's late write is refused and its stale release frees nothing.
pub async fn server_killed_and_restarted(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::Durable, Primitive::Lock).await;
}

/// [`server_killed_and_restarted`] with a reader holding: after the restart the waiting writers
/// get in, each with a token above the reader's, and the reader's late action is refused.
pub async fn rw_reader_server_killed_and_restarted(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::Durable, Primitive::Read).await;
}

/// As [`server_killed_and_restarted`], on a server that keeps nothing across a restart. A
/// backend whose fencing counter lives only in memory shows the token reset here: the next
/// holder's token is lower than the old holder's, its writes are refused and the old holder's
/// late write is accepted (declare it documented unsafe).
pub async fn server_killed_and_restarted_without_persistence(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::None, Primitive::Lock).await;
}

/// The server is stopped (SIGSTOP) for longer than the ttl while a client holds the lock: the
/// holder's renewals time out and `lost()` fires by the end of its lease; after SIGCONT the
/// store has expired the lease (its own clock ran on), another client gets the lock with a
/// higher token, and the holder's renewals queued during the pause never bring it back. The
/// holder's client works again on its own.
pub async fn server_paused_past_ttl(ctx: Ctx) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let url = with_query(&spawned.url, "timeout=1s");
    let name = ctx.name("paused");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();

    let a = ctx.connect(&url).await;
    let ga = a.lock(&name, &held(2 * SEC)).await.expect("A acquires");
    let a_at = Instant::now();
    fenced.write(ga.fencing_token(), 1).expect("A writes");

    spawned.server.pause();
    let paused_at = Instant::now();
    let reason = within(
        30 * SEC,
        "A's lost() while the server is stopped",
        ga.lost(),
    )
    .await;
    assert!(unreachable_reason(reason), "lost() said {reason:?}");
    history.push(hold_of(0, &ga, a_at, None));
    // Stopped for well over the ttl in total.
    let stopped_for = paused_at.elapsed();
    if stopped_for < 4 * SEC {
        tokio::time::sleep(4 * SEC - stopped_for).await;
    }
    spawned.server.resume();

    let b = ctx.connect(&url).await;
    let (gb, b_at) =
        acquire_through_errors(&b, &name, &plain(10 * SEC, 5 * SEC), 90 * SEC, "B").await;
    findings.new_holder_writes(&fenced, gb.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, ga.fencing_token());
    history.push(hold_of(1, &gb, b_at, Some(Instant::now())));
    gb.release().await.expect("B releases");
    findings.history(&history);

    // A's client recovers once the server answers again.
    let again = ctx.name("paused-after");
    let (g, _) =
        acquire_through_errors(&a, &again, &plain(5 * SEC, 5 * SEC), 60 * SEC, "A again").await;
    g.release().await.expect("release");
    drop(ga);
    verdict(&ctx, findings);
}

/// The holder's replies are blackholed through a proxy (its requests arrive, nothing comes
/// back) for longer than the ttl. Its `lost()` fires; a client on a direct link takes over with
/// a higher token only once the holder's lease is over; the holder's late write is refused;
/// when the link heals, its client works again and its stale release frees nothing.
pub async fn holder_replies_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeReplies, Primitive::Lock).await;
}

/// [`holder_replies_blackholed_past_ttl`] with a reader cut off: a writer on a direct link gets
/// in only once the reader's lease is over, with a higher token.
pub async fn rw_reader_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeReplies, Primitive::Read).await;
}

/// As [`holder_replies_blackholed_past_ttl`], with the holder's requests lost instead (nothing
/// it sends arrives): its renewals never reach the store.
pub async fn holder_requests_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeRequests, Primitive::Lock).await;
}

/// The holder of `primitive` (the lock, or a read hold) cut off by `fault`; a writer takes
/// over. See [`holder_replies_blackholed_past_ttl`].
async fn holder_blackholed(ctx: Ctx, fault: Fault, primitive: Primitive) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let addr = spawned.server.addr().to_string();
    let proxy = Proxy::start(spawned.server.addr()).await.expect("proxy");
    let proxied = spawned.url.replace(&addr, &proxy.addr().to_string());
    assert_ne!(proxied, spawned.url, "the store URL does not name {addr}");
    let holder = ctx.connect(&with_query(&proxied, "timeout=500ms")).await;
    let other = ctx.connect(&spawned.url).await;
    let name = ctx.name("blackholed");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();

    let guard = primitive
        .take(&holder, &name, &held(1500 * ms(1)))
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    let stale = guard.fencing_token();
    fenced.write(stale, 1).expect("the holder writes");

    let taker = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(5 * SEC, 60 * SEC))
                .await
                .expect("the other client takes over");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(!taker.is_finished(), "taken while the holder renews");

    tokio::task::block_in_place(|| proxy.set(fault));
    let reason = within(30 * SEC, "the holder's lost()", guard.lost()).await;
    assert!(unreachable_reason(reason), "lost() said {reason:?}");
    history.push(hold_of(1, &guard, held_at, None));
    let (taken, taken_at) = within(90 * SEC, "the takeover", taker)
        .await
        .expect("taker task");
    findings.new_holder_writes(&fenced, taken.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, stale);

    tokio::task::block_in_place(|| proxy.set(Fault::PassThrough));
    stale_release_frees_nothing(&holder, &guard).await;
    let info = other
        .inspect(&LockName::new(&name).expect("name"))
        .await
        .expect("inspect")
        .expect("the lock is known");
    assert_eq!(
        info.holder,
        Some(taken.lease().owner().to_string()),
        "the stale release changed the holder"
    );
    history.push(hold_of(2, &taken, taken_at, Some(Instant::now())));
    taken.release().await.expect("release");
    findings.history(&history);
    drop(guard);
    verdict(&ctx, findings);
}

/// The server ends every client connection from its side (`CLIENT KILL`,
/// `pg_terminate_backend`, `KILL CONNECTION`), four times, while one client holds the lock
/// (keep-alive on) and another waits. A lease is not a connection: the holder keeps the lock
/// and renews it over new connections (an explicit extend may meet a dead connection once, with
/// a retryable error), the waiter does not get it meanwhile, and gets it with a higher token
/// when the holder releases.
pub async fn store_connections_killed(ctx: Ctx) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let url = spawned.url.clone();
    let name = ctx.name("killed-connections");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());
    let mut findings = Findings::default();

    let holder = ctx.connect(&url).await;
    let waiter_client = ctx.connect(&url).await;
    let guard = holder
        .lock(&name, &held(SEC))
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    let token = guard.fencing_token();
    fenced.write(token, 1).expect("the holder writes");
    let waiting = {
        let (name, history) = (name.clone(), history.clone());
        tokio::spawn(async move {
            let (g, at) = acquire_through_errors(
                &waiter_client,
                &name,
                &plain(5 * SEC, 60 * SEC),
                120 * SEC,
                "the waiter",
            )
            .await;
            let token = g.fencing_token();
            history.push(hold_of(2, &g, at, Some(Instant::now())));
            g.release().await.expect("release");
            token
        })
    };
    let mut killed = 0;
    for _ in 0..4 {
        tokio::time::sleep(ms(700)).await;
        killed += spawned
            .server
            .kill_client_connections()
            .await
            .expect("kill the clients' connections");
    }
    assert!(killed >= 2, "only {killed} connections were killed");
    assert!(
        guard.lost_reason().is_none() && guard.is_held(),
        "the holder lost the lock because its connections were killed: {:?}",
        guard.lost_reason()
    );
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    // The first request on a connection the server ended may fail; a retryable error says so,
    // and the next attempt goes over a new connection.
    within(30 * SEC, "extend after the kills", async {
        loop {
            match guard.extend(SEC).await {
                Ok(()) => break,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(50)).await,
                Err(e) => panic!("extend after the kills: {e}"),
            }
        }
    })
    .await;
    history.push(hold_of(1, &guard, held_at, Some(Instant::now())));
    guard.release().await.expect("release");
    let next = within(120 * SEC, "the waiter", waiting)
        .await
        .expect("waiter task");
    findings.new_holder_writes(&fenced, next, 2);
    findings.history(&history);
    verdict(&ctx, findings);
}

/// A client is paused past its ttl (its one runtime thread blocked, so keep-alive cannot run).
/// The store expires its lease, another client takes the lock with a higher token and writes;
/// when the paused client resumes, its guard no longer claims the lock, `lost()` resolves, its
/// late write is refused and its release says `NotHeld`.
pub async fn client_paused_past_ttl(ctx: Ctx) {
    paused_past_ttl(ctx, Primitive::Lock).await;
}

/// [`client_paused_past_ttl`] for a reader: a writer gets in only once the paused reader's
/// lease is over, with a higher token, so the reader's late action on what it guarded is
/// refused; the resumed reader's guard says it is lost and its release frees nothing.
pub async fn rw_reader_paused_past_ttl(ctx: Ctx) {
    paused_past_ttl(ctx, Primitive::Read).await;
}

/// A client holding `primitive` is paused past its ttl (see [`client_paused_past_ttl`]). The
/// one who then takes over: for the lock, another client's lock; for a permit, another client's
/// permit while a steady holder keeps the other one (so the taker must wait for the paused
/// permit to run out); for a read hold, a writer.
pub(crate) async fn paused_past_ttl(ctx: Ctx, primitive: Primitive) {
    let url = ctx.target().url().await;
    let name = ctx.name("paused-client");
    let fenced = Arc::new(FencedResource::new());
    let history = Arc::new(History::new());
    let (to_a, a_waits) = std::sync::mpsc::channel::<()>();
    let (a_got, got_a) = tokio::sync::oneshot::channel::<FencingToken>();
    let a_thread = {
        let (target, url, name, fenced, history) = (
            ctx.target().clone(),
            url.clone(),
            name.clone(),
            fenced.clone(),
            history.clone(),
        );
        std::thread::spawn(move || {
            let a = PausedClient {
                target,
                url,
                name,
                primitive,
                fenced,
                history,
            };
            a.run(a_got, a_waits)
        })
    };
    let token_a = within(60 * SEC, "A acquires", got_a)
        .await
        .expect("A's thread ended before acquiring");
    let steady = if primitive == Primitive::Permit {
        let s = ctx.connect(&url).await;
        let opts = held(10 * SEC);
        let guard = primitive
            .take(&s, &name, &opts)
            .await
            .expect("the steady holder");
        Some((guard, Instant::now()))
    } else {
        None
    };
    let b = ctx.connect(&url).await;
    let taker = match primitive {
        Primitive::Read => Primitive::Lock,
        other => other,
    };
    let opts = plain(10 * SEC, 30 * SEC);
    let (gb, b_at) = take_through_errors(&b, &name, taker, &opts, 60 * SEC, "B").await;
    let mut findings = Findings::default();
    if gb.fencing_token() <= token_a {
        findings.push(format!(
            "B's token {} is not above paused A's {}",
            gb.fencing_token(),
            token_a
        ));
    }
    findings.new_holder_writes(&fenced, gb.fencing_token(), 2);
    to_a.send(()).expect("A listens");
    let late = tokio::task::spawn_blocking(move || a_thread.join())
        .await
        .expect("join")
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    if late {
        findings.push("paused A's late write was accepted after B wrote");
    }
    history.push(hold_of(1, &gb, b_at, Some(Instant::now())));
    gb.release().await.expect("release");
    if let Some((s, s_at)) = steady {
        assert!(s.is_held(), "the steady holder lost its permit");
        history.push(hold_of(2, &s, s_at, Some(Instant::now())));
        s.release().await.expect("release");
        for v in crate::check_permits(&history.holds(), PERMITS as usize) {
            findings.push(v.to_string());
        }
    } else {
        findings.history(&history);
    }
    verdict(&ctx, findings);
}

/// Paused A of [`paused_past_ttl`]: on a runtime of its own with one thread.
struct PausedClient {
    target: Target,
    url: String,
    name: String,
    primitive: Primitive,
    fenced: Arc<FencedResource>,
    history: Arc<History>,
}

impl PausedClient {
    /// Takes its primitive, writes, reports its token, then blocks its only runtime thread
    /// until told to go on; returns whether its late write was accepted.
    fn run(
        self,
        got: tokio::sync::oneshot::Sender<FencingToken>,
        go_on: std::sync::mpsc::Receiver<()>,
    ) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("A's runtime");
        rt.block_on(async move {
            let a = self.target.connect(&self.url).await.expect("A connects");
            let ga = self
                .primitive
                .take(&a, &self.name, &held(SEC))
                .await
                .expect("A acquires");
            let at = Instant::now();
            self.fenced.write(ga.fencing_token(), 1).expect("A writes");
            let _ = got.send(ga.fencing_token());
            // Paused: nothing of A's runs until B has taken over.
            go_on.recv().expect("resumed");
            assert!(
                !ga.is_held(),
                "a paused guard still claims its hold after its ttl"
            );
            let late = self.fenced.write(ga.fencing_token(), 3).is_ok();
            let reason = within(30 * SEC, "A's lost()", ga.lost()).await;
            assert!(
                matches!(reason, LostReason::Expired | LostReason::Taken),
                "lost() said {reason:?}"
            );
            self.history.push(hold_of(0, &ga, at, None));
            assert_eq!(ga.release().await.expect("release"), Released::NotHeld);
            late
        })
    }
}

const CHILD_TARGET: &str = "DLOCK_CT_CHILD_TARGET";
const CHILD_URL: &str = "DLOCK_CT_CHILD_URL";
const CHILD_NAME: &str = "DLOCK_CT_CHILD_NAME";
const CHILD_TTL: Duration = Duration::from_secs(3);

/// In a test binary started by [`holder_process_killed`]: holds the lock it was told to,
/// prints its token and waits to be killed. `None` when this process is not such a child.
pub fn child_main(targets: &[Target]) -> Option<std::process::ExitCode> {
    let label = std::env::var(CHILD_TARGET).ok()?;
    let url = std::env::var(CHILD_URL).expect("child url");
    let name = std::env::var(CHILD_NAME).expect("child lock name");
    let target = targets
        .iter()
        .find(|t| t.label() == label)
        .unwrap_or_else(|| panic!("no target {label} in this test binary"))
        .clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let c = target.connect(&url).await.expect("child connects");
        let guard = c
            .lock(&name, &AcquireOptions::new().ttl(CHILD_TTL))
            .await
            .expect("child acquires");
        println!("DLOCK_HELD {}", guard.fencing_token().0);
        use std::io::Write as _;
        std::io::stdout().flush().expect("flush");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(guard);
    });
    Some(std::process::ExitCode::SUCCESS)
}

/// Another OS process holds the lock (keep-alive on) and is killed -9. The lock frees, but not
/// before ttl − drift has passed since that process was started, and the next token is higher.
/// The child is this same test binary, started again with the store's URL in its environment
/// (see [`child_main`]).
pub async fn holder_process_killed(ctx: Ctx) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let url = ctx.target().url().await;
    let name = ctx.name("held-by-another-process");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();
    let spawned_at = Instant::now();
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .env(CHILD_TARGET, ctx.backend())
        .env(CHILD_URL, &url)
        .env(CHILD_NAME, &name)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the holder process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let child_token: u64 = within(60 * SEC, "the holder process", async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read")
                .expect("the holder process ended before holding the lock");
            if let Some((_, t)) = line.split_once("DLOCK_HELD ") {
                break t.trim().parse().expect("token");
            }
        }
    })
    .await;
    fenced
        .write(FencingToken(child_token), 1)
        .expect("the child's write");
    // The child's lease began after it was started, so it is valid at least until then +
    // ttl − drift: nobody may hold the lock before that.
    history.push(Hold {
        client: 0,
        name: name.clone(),
        token: child_token,
        acquired: spawned_at,
        valid_until: spawned_at + CHILD_TTL - lockcore::default_drift(CHILD_TTL),
        ended: None,
    });
    let c = ctx.client().await;
    let opts = plain(5 * SEC, SEC).wait(Wait::No);
    assert!(
        try_answered(&c, &name, &opts).await.is_none(),
        "the lock is free while another process holds it"
    );
    child.kill().await.expect("kill -9 the holder process");
    let (guard, at) = within(60 * SEC, "the lock frees after the kill", async {
        loop {
            if let Some(g) = try_answered(&c, &name, &opts).await {
                break (g, Instant::now());
            }
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    findings.new_holder_writes(&fenced, guard.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, FencingToken(child_token));
    history.push(hold_of(1, &guard, at, Some(Instant::now())));
    guard.release().await.expect("release");
    findings.history(&history);
    verdict(&ctx, findings);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx_declared(expect: Expect) -> Ctx {
        let target = Target::new("t", "", |_| async {
            Ok(Arc::new(lockcore::MemoryLock::new("verdict")) as Arc<dyn DistributedLock>)
        })
        .fault("server_paused_past_ttl", expect);
        Ctx::new(target, "server_paused_past_ttl")
    }

    fn panics(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<String> {
        std::panic::catch_unwind(f)
            .err()
            .map(|p| crate::runner::panic_message(&*p))
    }

    #[test]
    fn verdict_holds_each_declaration_to_what_was_seen() {
        let seen = || {
            let mut f = Findings::default();
            f.push("token went back");
            f
        };
        assert_eq!(
            panics(|| verdict(&ctx_declared(Expect::Safe), Findings::default())),
            None
        );
        let msg = panics(|| verdict(&ctx_declared(Expect::Safe), seen())).expect("must fail");
        assert!(
            msg.contains("declared safe") && msg.contains("token went back"),
            "{msg}"
        );
        let unsafe_ = Expect::DocumentedUnsafe("counter in memory");
        assert_eq!(panics(|| verdict(&ctx_declared(unsafe_), seen())), None);
        let msg =
            panics(|| verdict(&ctx_declared(unsafe_), Findings::default())).expect("must fail");
        assert!(msg.contains("update the declaration"), "{msg}");
    }

    #[test]
    fn findings_see_refused_new_holders_and_accepted_stale_writes() {
        let fenced = FencedResource::new();
        let mut f = Findings::default();
        fenced.write(FencingToken(4), 0).unwrap();
        f.new_holder_writes(&fenced, FencingToken(5), 1);
        f.old_holder_writes_late(&fenced, FencingToken(4));
        assert!(f.0.is_empty(), "{:?}", f.0);
        f.new_holder_writes(&fenced, FencingToken(1), 2);
        f.old_holder_writes_late(&fenced, FencingToken(5));
        assert_eq!(f.0.len(), 2, "{:?}", f.0);
    }
}
