//! One Redis master's primitives: everything a lock needs from one server, and what
//! `backend-redlock` composes a quorum from.
//!
//! A [`Node`] is one logical Redis server behind one client: a single master over one
//! multiplexed connection (what `redis://` and `rediss://` name, and what each Redlock node is),
//! or a Redis Cluster whose client routes each call by its hash slot (`redis+cluster://`, built
//! by [`Node::cluster`]). It holds
//!
//! * **the connection** ([`Node::open`]): address, TLS (CA, client certificate), ACL user and
//!   password, database, and the `timeout` that bounds connecting and every round trip, built
//!   in this one place from a [`RedisConfig`]; one multiplexed connection that reconnects after
//!   a failure;
//! * **the scripts** (`src/node/lua/`): acquire, release, extend, cancel, inspect, forget, the
//!   fence write-back, and the counting semaphore's (`sem_*.lua`), sent with
//!   `EVALSHA` and, on `NOSCRIPT`, again behind their `SCRIPT LOAD` in one pipeline; the
//!   read-write lock's readers go through the lock's acquire, cancel and inspect scripts and
//!   the semaphore's release and extend;
//! * **the node operations** over one lock name's keys, each one script call with its reply
//!   decoded and checked: [`try_once`](Node::try_once), [`acquire`](Node::acquire),
//!   [`give_back`](Node::give_back), [`release`](Node::release), [`extend`](Node::extend),
//!   [`extend_many`](Node::extend_many), [`fence_max`](Node::fence_max),
//!   [`inspect`](Node::inspect), [`forget`](Node::forget), [`names`](Node::names); and over
//!   the semaphore of the same name (an object apart, with keys of its own under the same hash
//!   tag): [`acquire_permit`](Node::acquire_permit), [`cancel_permit`](Node::cancel_permit),
//!   [`inspect_semaphore`](Node::inspect_semaphore); and the read (shared) side of the lock's
//!   read-write form, whose write side is the lock itself:
//!   [`acquire_shared`](Node::acquire_shared), [`cancel_shared`](Node::cancel_shared); while
//!   `release`, `extend` and `extend_many` take a permit's or a reader's lease by its handle
//!   ([`PERMIT`], [`READER`]);
//! * **the wake-up hub**: one subscriber connection listening on the client's own channel, or
//!   in a Redis 7 Cluster on shard channels in each waited-on lock's own slot
//!   ([`register`](Node::register), [`ensure_subscribed`](Node::ensure_subscribed)).
//!
//! The operations are kept by kind: the lock's acquire and its undo here, a held lease's
//! release and extend in `leases`, the semaphore's in `permits`, the read side's in `readers`,
//! inspect, names, forget and the fence write-back in `state`;
//! the scripts and their calls in `scripts`, their replies' decoding in `replies`.
//!
//! What a node does not decide is left to its caller: the single-server backend
//! ([`crate::RedisLock`]) turns one node's answers into leases, and Redlock turns a majority's.
//! Errors name the backend `redis` and the lock; messages name the node by the text given to
//! [`Node::open`], never with a password.

mod cluster;
mod connect;
mod leases;
mod permits;
mod readers;
pub(crate) mod replies;
pub(crate) mod scripts;
mod single;
mod state;
mod store;
mod waiters;

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, Fencing, FencingToken, Lease, LockName, OwnerId, Result};
use redis::{RedisResult, Value};

use crate::config::RedisConfig;
use cluster::Cluster;
use scripts::{Call, Key, Keys};
use store::Store;
use waiters::{Hub, Route};

pub use connect::{ASSUMPTION_NO_PERSISTENCE, ASSUMPTION_UNKNOWN};
use connect::{connect_error, connection_info, open_single};
pub use replies::{AcquireReply, AttemptReply, InspectReply, PermitReply, SemaphoreReply};
pub use scripts::{MAX_MIN_TOKEN, min_token_arg, script_source};
pub(crate) use store::{backend_error, protocol_error};
pub use waiters::Registration;

/// Longest a waiter sleeps between re-checks when no notification comes (also the interval at
/// which it refreshes its liveness).
pub const RECHECK: Duration = Duration::from_millis(500);

/// How long a waiter stays in a node's queue after its last re-check: a waiter that crashed (or
/// stalled longer than this) is dropped from the queue, and rejoins at the tail if it comes back.
pub const ALIVE: Duration = Duration::from_millis(2000);

/// The handle of a semaphore permit's lease ([`Lease::handle`]): release, extend and
/// [`extend_many`](Node::extend_many) of such a lease run the semaphore's scripts.
pub const PERMIT: &str = "permit";

/// Whether `lease` is a semaphore permit's (see [`PERMIT`]).
pub fn is_permit(lease: &Lease) -> bool {
    lease.handle() == Some(PERMIT)
}

/// The handle of a reader's lease (a shared hold of a read-write lock, [`Lease::handle`]):
/// release, extend and [`extend_many`](Node::extend_many) of such a lease act on the lock's
/// read holds, not on its exclusive hold.
pub const READER: &str = "reader";

/// Whether `lease` is a reader's (see [`READER`]).
pub fn is_reader(lease: &Lease) -> bool {
    lease.handle() == Some(READER)
}

/// The handle of a lock's lease that the `try` fast path granted ([`Lease::handle`]): its key
/// was left in the plain form, so its release sends the short `lua/release_plain.lua` first and
/// the full `lua/release.lua` only when a waiter has marked the key since. A hint, never a
/// promise: a lease without it is released by the full script alone, as before.
pub const PLAIN: &str = "plain";

/// Whether `lease` is a lock's that the fast path granted (see [`PLAIN`]).
pub fn is_plain(lease: &Lease) -> bool {
    lease.handle() == Some(PLAIN)
}

/// A `try` answered as a queued waiter would be: nothing is handed to an owner that never
/// queued, so the reply belongs to some other request.
pub(crate) fn handed_to_a_try(name: &LockName) -> lockcore::Error {
    let what = "a try was answered as a queued waiter".to_owned();
    protocol_error("acquire", Some(name), what)
}

/// `lease` with the [`PLAIN`] handle (one shared string, not one per lease).
pub(crate) fn plain(lease: Lease) -> Lease {
    static HANDLE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(PLAIN));
    lease.with_handle(HANDLE.clone())
}

/// How the acquire script treats the queue (see `lua/acquire.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Grant only if the lock is free and nobody live is queued: never jump the queue.
    Try,
    /// Grant if the lock is free and this owner heads the queue (or it is empty); otherwise
    /// join the queue at its tail and refresh this owner's liveness. A grant leaves the queue.
    Wait,
    /// As [`Mode::Wait`], but a free lock goes to any live member of the queue, and the member
    /// keeps its entry when granted (Redlock: its nodes may order the same waiters differently).
    Member,
}

impl Mode {
    /// The mode for a hold that Redlock does not vote on (a read hold, a permit): a
    /// [`Mode::Member`] waits as [`Mode::Wait`] does.
    pub(crate) fn unvoted(self) -> Mode {
        match self {
            Mode::Try => Mode::Try,
            Mode::Wait | Mode::Member => Mode::Wait,
        }
    }

    /// The mode as the scripts take it (`ARGV` mode).
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Mode::Try => "try",
            Mode::Wait => "wait",
            Mode::Member => "member",
        }
    }
}

/// One Redis server (or Cluster) as a lock store: its connection, its subscriber hub, and the
/// key layout under one prefix. Cheap to clone (the clones share everything).
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
}

struct Shared {
    store: Store,
    hub: Arc<Hub>,
    prefix: String,
    /// This client's id (16 hex digits): queue entries carry it after the owner id.
    client: String,
    /// The prefix of every client's wake-up channel (`<prefix>:wake:`); a client's channel is
    /// this followed by its id.
    wakes: String,
    /// This client's own wake-up channel, `wakes` followed by `client`.
    channel: String,
    /// How messages name this node (a redacted URL).
    shown: String,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.shared.shown)
            .field("prefix", &self.shared.prefix)
            .finish()
    }
}

impl Node {
    /// One master at `host:port` (TLS when `tls`), with the credentials, database, prefix,
    /// TLS files and `timeout` of `config`; `shown` names it in messages (a redacted URL, never
    /// a password). No I/O: the connection opens on first use ([`Node::probe`] opens it).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](lockcore::Error::InvalidConfig) for TLS files that cannot be read
    /// or used; [`Error::Backend`](lockcore::Error::Backend) for an address redis-rs refuses.
    pub fn open(
        config: &RedisConfig,
        host: &str,
        port: u16,
        tls: bool,
        shown: impl Into<String>,
    ) -> Result<Node> {
        let single = open_single(config, host, port, tls)?;
        Ok(Self::over(
            config,
            Store::Single(Box::new(single)),
            shown.into(),
            Route::Client,
        ))
    }

    /// A Redis Cluster through its seed `nodes` (TLS, credentials and `timeout` of `config`),
    /// connected: the slot map loaded.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) when no seed answers or redis-rs refuses an
    /// address.
    pub async fn cluster(config: &RedisConfig, nodes: &[(String, u16)]) -> Result<Node> {
        let shown = config.redacted_url();
        let infos = nodes
            .iter()
            .map(|(h, p)| connection_info(config, h, *p, false))
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| connect_error(shown, e))?;
        let cluster = Cluster::connect(infos, config.defaults.timeout)
            .await
            .map_err(|e| connect_error(shown, e))?;
        // Wake-ups on shard channels where the cluster has them (see `waiters`); a cluster that
        // cannot say is treated as an older one.
        let route = match cluster.has_shard_channels().await {
            Ok(true) => Route::Sharded,
            Ok(false) => Route::Client,
            Err(e) => {
                tracing::debug!(error = %e, "redis cluster: COMMAND INFO SPUBLISH failed; waking by PUBLISH");
                Route::Client
            }
        };
        tracing::debug!(nodes = %cluster.describe(), ?route, "redis: connected to the cluster");
        Ok(Self::over(
            config,
            Store::Cluster(Box::new(cluster)),
            shown.to_owned(),
            route,
        ))
    }

    fn over(config: &RedisConfig, store: Store, shown: String, route: Route) -> Node {
        let client = format!("{:016x}", rand::random::<u64>());
        let wakes = format!("{}:wake:", config.prefix);
        Node {
            shared: Arc::new(Shared {
                store,
                hub: Arc::new(Hub::new(route, config.defaults.timeout)),
                prefix: config.prefix.clone(),
                channel: format!("{wakes}{client}"),
                client,
                wakes,
                shown,
            }),
        }
    }

    /// How messages name this node.
    pub fn shown(&self) -> &str {
        &self.shared.shown
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// Whether this is a Redis Cluster (whose client retries a request after a timeout).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.shared.store, Store::Cluster(_))
    }

    fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.shared.prefix, name)
    }

    /// The prefix of the wake-up channels the scripts publish on for `name` (`ARGV` wakes): the
    /// client channels' `<prefix>:wake:`, or on shard channels `{<prefix>:<name>}:wake:`, whose
    /// leading brace tells the scripts to `SPUBLISH` (a prefix never holds a brace).
    fn wakes_of(&self, name: &LockName) -> Cow<'_, str> {
        match self.shared.hub.route() {
            Route::Client => Cow::Borrowed(&self.shared.wakes),
            Route::Sharded => Cow::Owned(self.keys(name).wakes()),
        }
    }

    /// The `ARGV` pair a queueing script needs to wake waiters of `name`: this client's id
    /// (for its own queue entries) and the wake-up channels' prefix (see `wakes_of`).
    pub(crate) fn wake_args(&self, name: &LockName) -> (&str, Cow<'_, str>) {
        (&self.shared.client, self.wakes_of(name))
    }

    /// The channel on which this client hears wake-ups for `name`: its own channel (kept, so
    /// the waiting loop builds nothing), or the name's shard channel.
    fn channel_of(&self, name: &LockName) -> Cow<'_, str> {
        match self.shared.hub.route() {
            Route::Client => Cow::Borrowed(&self.shared.channel),
            Route::Sharded => {
                Cow::Owned(format!("{}{}", self.keys(name).wakes(), self.shared.client))
            }
        }
    }

    /// Runs one script call for `operation` on `name` (the Tair emulation's calls, too); a
    /// store failure comes back as the error naming both.
    pub(crate) async fn run(
        &self,
        operation: &'static str,
        name: &LockName,
        call: &Call,
    ) -> Result<Value> {
        self.shared
            .store
            .eval(call)
            .await
            .map_err(|e| backend_error(operation, Some(name), e))
    }

    /// A call of `lua` on the keys of `name` with these suffixes (the Tair emulation's keys).
    pub(crate) fn call_on(
        &self,
        lua: &'static scripts::Lua,
        name: &LockName,
        suffixes: &[&str],
    ) -> Call {
        self.keys(name).call_suffixed(lua, suffixes.iter().copied())
    }

    /// Connects if needed and sends `PING`, so a server that wants a password, or refuses
    /// this one, says so here.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    ///
    /// # Errors
    /// [`Error::AccessDenied`](lockcore::Error::AccessDenied) for refused credentials;
    /// [`Error::Backend`](lockcore::Error::Backend) (retryable) naming the node when it cannot be
    /// reached within `timeout`.
    pub async fn ping(&self) -> Result<()> {
        self.shared
            .store
            .query(&redis::cmd("PING"))
            .await
            .map_err(|e| connect_error(&self.shared.shown, e))?;
        Ok(())
    }

    /// Sends one command as given on this node's connection (in a Cluster, to the master of its
    /// first key's slot) and answers the reply, for tools beside the lock: reports, repairs,
    /// measurements. A command that changes this crate's keys can break the locks they stand
    /// for.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have reached the server.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a failure or an error reply (`NOSCRIPT`
    /// for an `EVALSHA` of a script the server does not hold, among others).
    pub async fn command(&self, cmd: &redis::Cmd) -> Result<redis::Value> {
        self.shared
            .store
            .query(cmd)
            .await
            .map_err(|e| backend_error("command", None, e))
    }

    /// [`ping`](Node::ping)s, then reads the persistence settings (`CONFIG GET appendonly`,
    /// `appendfsync`, `maxmemory`, `maxmemory-policy`; one pipeline, so the probe is two round
    /// trips on a single server) to decide the fencing guarantee the node gives: `Strict` only
    /// for a server that fsyncs every write to its AOF and never evicts keys;
    /// [`ASSUMPTION_UNKNOWN`] when `CONFIG GET` is not permitted.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    ///
    /// # Errors
    /// As [`ping`](Node::ping).
    pub async fn probe(&self) -> Result<Fencing> {
        self.ping().await?;
        Ok(connect::detect_fencing(&self.shared.store).await)
    }

    /// One run of the acquire script in `mode` for `owner`, with token minimum `min_token` (0 = none;
    /// see [`min_token_arg`]). The reply must echo `owner`: a reply matched to another request is an
    /// error, never a grant.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: a dropped call may still grant the lock or queue `owner`;
    /// callers arm a clean-up that runs [`give_back`](Node::give_back).
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn acquire(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
    ) -> Result<AcquireReply> {
        self.acquire_as(name, owner, opts, mode, min_token, false)
            .await
    }

    async fn acquire_as(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        read: bool,
    ) -> Result<AcquireReply> {
        let keys = [
            Key::Lock,
            Key::Fence,
            Key::Queue,
            Key::Alive,
            Key::Seq,
            Key::Readers,
        ];
        let call = self
            .queued_call(&scripts::ACQUIRE, &keys, name, owner, opts, mode, min_token)
            .arg(u8::from(read));
        let value = self.run("acquire", name, &call).await?;
        replies::parse_acquire(&value, owner).map_err(|e| protocol_error("acquire", Some(name), e))
    }

    /// A call of `lua` (an acquire script that may queue `owner`: the lock's or the
    /// semaphore's) on `keys`, with the arguments both take first: the owner, the ttl, the
    /// mode, the waiter's liveness, this client's id, the wake-up channel prefix and the token
    /// min_token. The caller appends its own.
    // One argument per script input, as the acquires have; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn queued_call(
        &self,
        lua: &'static scripts::Lua,
        keys: &[Key],
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
    ) -> Call {
        self.keys(name)
            .call(lua, keys)
            .owner_arg(owner)
            .arg(millis(opts.ttl_value()))
            .arg(mode.arg())
            .arg(millis(ALIVE))
            .arg(self.shared.client.as_str())
            .arg(&*self.wakes_of(name))
            .arg(min_token)
    }

    /// One `try` for `owner` that never jumps the queue: the short fast script (`SET NX PX` and
    /// the token; the lock key exists while anyone waits or reads, see `lua/common.lua`), and
    /// the full acquire script in [`Mode::Try`] only when the key says someone may be queued
    /// or reading (it prunes dead waiters and expired readers and never jumps live ones). A
    /// refusal carries the node's fence counter, as the full script's does.
    ///
    /// # Cancel safety
    /// As [`acquire`](Node::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Node::acquire).
    pub async fn try_once(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        min_token: u64,
    ) -> Result<AcquireReply> {
        Ok(
            match self.try_attempt(name, owner, opts, min_token).await? {
                AttemptReply::Plain(token) => AcquireReply::Granted(token),
                AttemptReply::Now(reply) => reply,
                AttemptReply::Handed(_) => return Err(handed_to_a_try(name)),
            },
        )
    }

    /// [`try_once`](Node::try_once), saying which script granted: [`AttemptReply::Plain`]
    /// when the fast script did (the key is in its plain form), else [`AttemptReply::Now`].
    ///
    /// # Cancel safety
    /// As [`acquire`](Node::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Node::acquire).
    pub async fn try_attempt(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        min_token: u64,
    ) -> Result<AttemptReply> {
        let keys = self.keys(name);
        let fast = keys
            .call(&scripts::TRY_FAST, &[Key::Lock, Key::Fence])
            .owner_arg(owner)
            .arg(millis(opts.ttl_value()))
            .min_token_arg(min_token);
        let value = self.run("acquire", name, &fast).await?;
        match replies::parse_try_fast(&value, owner)
            .map_err(|e| protocol_error("acquire", Some(name), e))?
        {
            Some(AcquireReply::Granted(token)) => Ok(AttemptReply::Plain(token)),
            Some(refused) => Ok(AttemptReply::Now(refused)),
            None => {
                let full = self
                    .acquire(name, owner, opts, Mode::Try, min_token)
                    .await?;
                Ok(AttemptReply::Now(full))
            }
        }
    }

    /// Leaves the queue and deletes the lock if it was granted to `owner` (the undo of an
    /// acquire whose caller went away); `true` when a lock was deleted.
    ///
    /// # Cancel safety
    /// The undo either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure.
    pub async fn cancel(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        self.give_back(name, owner, false, None).await
    }

    /// The call of `cancel.lua` (see [`give_back`](Node::give_back)); `read` for a reader's.
    fn cancel_call(
        &self,
        name: &LockName,
        owner: OwnerId,
        keep_place: bool,
        spare: Option<FencingToken>,
        read: bool,
    ) -> Call {
        let s = &self.shared;
        self.keys(name)
            .call(
                &scripts::CANCEL,
                &[Key::Lock, Key::Queue, Key::Alive, Key::Fence, Key::Readers],
            )
            .owner_arg(owner)
            .arg(s.client.as_str())
            .arg(&*self.wakes_of(name))
            .arg(u8::from(keep_place))
            .arg(spare.map_or(0, |t| t.0))
            .arg(u8::from(read))
    }

    /// Deletes the lock if it was granted to `owner`, and leaves the queue unless `keep_place`
    /// (a Redlock waiter that lost a split vote keeps its place for its next attempt); wakes the
    /// next head if that frees the lock. `true` when a lock was deleted.
    ///
    /// With `spare`, a grant whose fencing counter equals that token is kept: a Redlock vote won
    /// with that token left this node's grant late (it was not heard in time), and such a grant
    /// is part of the winner's lease, which an extend (it checks owner and token) may already
    /// have counted toward its majority. Deleting it after that would shrink the majority the
    /// extend promised.
    ///
    /// # Cancel safety
    /// The undo either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure.
    pub async fn give_back(
        &self,
        name: &LockName,
        owner: OwnerId,
        keep_place: bool,
        spare: Option<FencingToken>,
    ) -> Result<bool> {
        let call = self.cancel_call(name, owner, keep_place, spare, false);
        let value = self.run("cancel acquire", name, &call).await?;
        replies::parse_flag(&value).map_err(|e| protocol_error("cancel acquire", Some(name), e))
    }

    /// Adds `waiter` (an owner id's text) to this node's wake-up hub (no I/O). Returns the
    /// registration and whether the client's channel is already confirmed subscribed on a live
    /// subscriber connection: if so, any wake-up published after this call reaches the waiter.
    /// Register before the first request, so a wake-up that names the waiter is never dropped.
    pub fn register(&self, waiter: &str, name: &LockName) -> (Registration, bool) {
        self.shared.hub.register(waiter, &self.channel_of(name))
    }

    /// Makes sure the client's wake-up channel is subscribed on a live subscriber connection
    /// (connecting one if needed) and returns once the server confirmed it.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the channel subscribed or not; the next call finishes the job.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) when the subscriber cannot connect or
    /// subscribe.
    pub async fn ensure_subscribed(&self, name: &LockName) -> Result<()> {
        let s = &self.shared;
        s.hub
            .ensure_subscribed(&s.store, &self.channel_of(name))
            .await
            .map_err(|e| backend_error("subscribe", Some(name), e))
    }

    /// Whether the channel of this client's wake-ups for `name` is confirmed subscribed on a
    /// live connection.
    pub fn is_subscribed(&self, name: &LockName) -> bool {
        self.shared.hub.is_subscribed(&self.channel_of(name))
    }

    /// Wake-up messages this client received on this node.
    pub fn wakeups(&self) -> u64 {
        self.shared.hub.received()
    }
}

/// The lease of a grant with `token` to `owner`, valid from `started` (the start of the request
/// that was granted) for the ttl of `opts`, less its drift.
pub fn lease(
    name: &LockName,
    owner: OwnerId,
    token: u64,
    started: Instant,
    opts: &AcquireOptions,
) -> Lease {
    Lease::new(
        name.clone(),
        owner,
        FencingToken(token),
        started,
        opts.ttl_value(),
        opts.drift_value(),
    )
}

/// The start of an `extend_many`: a slot per lease, filled now with the error of a lease whose
/// ttl is out of bounds (no I/O for it), and the indices of the leases to send.
pub fn checked_batch(leases: &[(Lease, Duration)]) -> (Vec<Option<Result<Lease>>>, Vec<usize>) {
    let mut out = Vec::with_capacity(leases.len());
    let mut sent = Vec::with_capacity(leases.len());
    for (i, (_, ttl)) in leases.iter().enumerate() {
        match lockcore::backend_support::check_ttl(*ttl) {
            Ok(()) => {
                sent.push(i);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    (out, sent)
}

/// Whole milliseconds, at least 1 (ttls are ≥ 10 ms by contract).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
