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

/// A [`Proxy`] in front of every address of a spawned store ([`crate::kit::ServerControl::addrs`]:
/// each Redlock node, say), and the store's URL through them, so that a fault set on them cuts
/// a client off the whole store at once.
pub(crate) struct Proxied {
    proxies: Vec<Proxy>,
    /// The store's URL with every server address replaced by its proxy's.
    pub(crate) url: String,
}

impl Proxied {
    /// Starts the proxies in front of `spawned`'s servers.
    ///
    /// # Panics
    /// A proxy that does not start, or a URL that does not name some server's address.
    pub(crate) async fn start(spawned: &Spawned) -> Self {
        let mut url = spawned.url.clone();
        let mut proxies = Vec::new();
        for addr in spawned.server.addrs() {
            let proxy = Proxy::start(addr).await.expect("proxy");
            let through = replace_addr(&url, &addr.to_string(), &proxy.addr().to_string());
            assert_ne!(through, url, "the store URL {url} does not name {addr}");
            url = through;
            proxies.push(proxy);
        }
        Proxied { proxies, url }
    }

    /// Sets `fault` on every proxy, one after the other, each in force when its `set`
    /// returns.
    pub(crate) fn set(&self, fault: Fault) {
        tokio::task::block_in_place(|| self.proxies.iter().for_each(|p| p.set(fault)));
    }
}

/// `url` with each `from` (a `host:port`) that is not the start of a longer port replaced by
/// `to`: `127.0.0.1:1234` is not a prefix match of `127.0.0.1:12345`.
fn replace_addr(url: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(at) = rest.find(from) {
        let end = at + from.len();
        let longer = rest[end..].starts_with(|c: char| c.is_ascii_digit());
        out.push_str(&rest[..at]);
        out.push_str(if longer { from } else { to });
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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

/// A scenario's first hold, taken before any fault while the store is up. A no-wait take on a
/// healthy store may still fail retryably: a Redlock vote on freshly started durable nodes
/// (each grant an `appendfsync always` write, the first one a `NOSCRIPT` and a script load
/// too) fails as a whole when every node misses the 50 ms node timeout, which a loaded machine
/// once made all three do at once. That is no answer, so it is asked again (see
/// [`take_through_errors`]), for up to a minute; any other error fails the scenario.
pub(crate) async fn first_hold(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    primitive: Primitive,
    opts: &AcquireOptions,
    who: &str,
) -> (LockGuard, Instant) {
    take_through_errors(c, name, primitive, opts, 60 * SEC, who).await
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
    let last = std::sync::Mutex::new(None);
    let taking = async {
        loop {
            match primitive.take(c, name, opts).await {
                Ok(g) => break (g, Instant::now()),
                Err(e @ Error::Timeout { .. }) => {
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    // A no-wait take of a held lock times out at once: not a hot loop.
                    tokio::time::sleep(ms(10)).await;
                }
                Err(e) if e.is_retryable() => {
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    tokio::time::sleep(ms(100)).await;
                }
                Err(e) => panic!("{who}: unexpected error {e}"),
            }
        }
    };
    match tokio::time::timeout(limit, taking).await {
        Ok(taken) => taken,
        Err(_) => panic!(
            "{who}: did not finish within {limit:?}; the last error: {}",
            last.lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref()
                .unwrap_or("none")
        ),
    }
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

mod client;
mod link;
mod server;

pub use client::*;
pub use link::*;
pub use server::*;

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
    fn replace_addr_replaces_whole_addresses_only() {
        let url = "redlock://:pw@127.0.0.1:1234,127.0.0.1:12345/x?timeout=1s";
        assert_eq!(
            replace_addr(url, "127.0.0.1:1234", "127.0.0.1:7"),
            "redlock://:pw@127.0.0.1:7,127.0.0.1:12345/x?timeout=1s"
        );
        assert_eq!(
            replace_addr(url, "127.0.0.1:12345", "127.0.0.1:8"),
            "redlock://:pw@127.0.0.1:1234,127.0.0.1:8/x?timeout=1s"
        );
        assert_eq!(replace_addr(url, "127.0.0.1:9", "x"), url);
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
