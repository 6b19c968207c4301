//! The wake-up hub: how a waiting acquire hears that its turn may have come.
//!
//! Each waiting acquire registers its owner id with the hub and gets its own [`Notify`]. Queue
//! entries in Redis carry the waiter's client id, and a release (or a departure) publishes the
//! head waiter's owner id on a channel of that client only: one message per hand-over, to the
//! one client that can use it, however many clients wait on the name. The hub wakes the waiter
//! the payload names. `Notify::notify_one` stores a permit, so a message that arrives while the
//! waiter is busy re-checking is not lost. A semaphore's release that handed the waiter a permit
//! says so in the payload, `<owner id>:<token>:<tag>`: where the tag is the one the waiter's
//! secret makes (stored with its queue entry and never sent), the hub keeps the token for the
//! waiter ([`Registration::handed`]), which then holds without another request. Anyone allowed
//! to `PUBLISH` can send a message, so one without that tag only wakes.
//!
//! Two routes ([`Route`]):
//! * **One channel per client** (a single server, and a Cluster older than Redis 7): the
//!   client's own channel, `<prefix>:wake:<client>`, on one plain subscriber connection; the
//!   scripts `PUBLISH` to it. In a Cluster a `PUBLISH` reaches the subscribers of every node
//!   over the cluster bus.
//! * **Shard channels** (Redis Cluster 7 and later): one channel per lock name and client,
//!   `{<prefix>:<name>}:wake:<client>`, in the lock's own hash slot; the scripts `SPUBLISH` to
//!   it and the hub subscribes it (`SSUBSCRIBE`) on the node serving that slot, through a
//!   cluster connection of its own that follows the slot map and subscribes again after a
//!   reconnect. The message then never crosses the cluster bus. That matters: Redis 7.0 opens
//!   its outgoing cluster-bus links without `TCP_NODELAY`, so a `PUBLISH` that follows another
//!   within a delayed-ACK interval waits up to 40 ms there (measured: a busy semaphore on a
//!   node other than the subscriber's stayed at 0.67 holders of 4). A shard channel nobody
//!   waited on for [`IDLE`] is unsubscribed.
//!
//! A channel is subscribed on the first wait that needs it. When the subscriber connection
//! breaks, every local waiter is woken to re-check (and the next wait subscribes on a new
//! connection); waiters also re-check on a bounded fallback timer, so a lost message costs a
//! short delay, not a hang. A connection can also die without breaking (a firewall or NAT
//! drops it while idle): the hub pings it every [`CHECK`] and treats a ping unanswered within
//! the client's `timeout` as a broken connection. The pings also keep an idle subscriber from
//! looking idle to such middleboxes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::Notify;

use super::store::Store;

/// How often the hub pings its subscriber connection.
pub(crate) const CHECK: Duration = Duration::from_secs(5);

/// How long a shard channel stays subscribed after its last waiter left.
pub(crate) const IDLE: Duration = Duration::from_secs(60);

/// How wake-ups reach this client (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// One channel of the client's own, `PUBLISH`ed to.
    Client,
    /// A shard channel per lock name, `SPUBLISH`ed to on the lock's own node.
    Sharded,
}

/// A live subscriber connection.
#[derive(Clone)]
enum Sink {
    /// A plain subscriber connection (the [`Route::Client`] route).
    Plain(PubSubSink),
    /// A cluster connection with a push sender (the [`Route::Sharded`] route).
    Sharded(ClusterConnection),
}

/// A channel some waiter needed.
struct Channel {
    /// The subscriber generation it is confirmed subscribed on.
    confirmed: Option<u64>,
    /// Registered waiters that need it.
    users: usize,
    /// When a waiter last registered or left.
    last_used: Instant,
}

#[derive(Default)]
struct State {
    sink: Option<(u64, Sink)>,
    generation: u64,
    /// Channels by name.
    channels: HashMap<String, Channel>,
    /// Waiting acquires by owner id.
    waiters: HashMap<String, Arc<Waiter>>,
}

impl State {
    fn live(&self) -> Option<u64> {
        self.sink.as_ref().map(|(g, _)| *g)
    }

    fn live_and_subscribed(&self, channel: &str) -> bool {
        let live = self.live();
        live.is_some() && self.channels.get(channel).and_then(|c| c.confirmed) == live
    }

    fn wake_all(&self) {
        for w in self.waiters.values() {
            w.notify.notify_one();
        }
    }
}

/// The client's subscriber and its dispatch table.
pub(crate) struct Hub {
    state: Mutex<State>,
    /// Serialises connecting and subscribing.
    ops: tokio::sync::Mutex<()>,
    /// How long a ping of the subscriber connection may take (the client's `timeout`).
    ping_timeout: Duration,
    route: Route,
    /// Wake-ups received.
    received: AtomicU64,
}

/// What the hub keeps for one registered waiter.
struct Waiter {
    /// Told to re-check.
    notify: Notify,
    /// The token of a permit a release handed this waiter (0: none).
    handed: AtomicU64,
    /// The waiter's secret, 32 hex digits (see the module docs).
    secret: String,
}

impl Waiter {
    fn new() -> Self {
        let bytes: [u8; 16] = rand::random();
        Waiter {
            notify: Notify::new(),
            handed: AtomicU64::new(0),
            secret: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// Whether `tag` is what `sem_release.lua` makes of the grant of `token` to `owner` with
    /// this waiter's secret: the SHA-1 of `<secret>:<owner>:<token>:<secret>`, in hex.
    fn signed(&self, owner: &str, token: u64, tag: &str) -> bool {
        let secret = &self.secret;
        let text = format!("{secret}:{owner}:{token}:{secret}");
        let mine = sha1_smol::Sha1::from(text.as_bytes()).digest().to_string();
        // Compared in full whatever differs first: how long a wrong tag took says nothing.
        mine.len() == tag.len()
            && mine
                .bytes()
                .zip(tag.bytes())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

/// A waiter's entry in a node's wake-up hub ([`Node::register`](super::Node::register));
/// removed on drop.
pub struct Registration {
    hub: Arc<Hub>,
    waiter: String,
    channel: String,
    entry: Arc<Waiter>,
}

impl Registration {
    /// Resolves once this waiter was told to re-check (or right away if it was told meanwhile:
    /// a wake-up that arrives while the waiter is busy is kept).
    ///
    /// # Cancel safety
    /// Cancel safe: a wake-up not yet consumed stays for the next call.
    ///
    /// # Errors
    /// None.
    pub async fn notified(&self) {
        self.entry.notify.notified().await;
    }

    /// The token of a semaphore permit a release handed this waiter, if a message tagged with
    /// this waiter's secret said so (taken: a second call returns `None`). The waiter holds that
    /// permit: its lease runs from the waiter's last attempt that was answered with a place in
    /// the queue.
    pub fn handed(&self) -> Option<u64> {
        match self.entry.handed.swap(0, Ordering::AcqRel) {
            0 => None,
            token => Some(token),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.hub.state();
        state.waiters.remove(&self.waiter);
        if let Some(c) = state.channels.get_mut(&self.channel) {
            c.users = c.users.saturating_sub(1);
            c.last_used = Instant::now();
        }
    }
}

impl Hub {
    /// An empty hub delivering by `route`, whose subscriber pings must be answered within
    /// `ping_timeout`.
    pub(crate) fn new(route: Route, ping_timeout: Duration) -> Self {
        Hub {
            state: Mutex::default(),
            ops: tokio::sync::Mutex::default(),
            ping_timeout,
            route,
            received: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How wake-ups reach this client.
    pub(crate) fn route(&self) -> Route {
        self.route
    }

    /// Wake-up messages this client received.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Adds `waiter`, woken by messages on `channel` (no I/O). Returns the registration and
    /// whether the channel is already confirmed subscribed on the live subscriber connection:
    /// if so, any wake-up published on it after this call reaches the waiter.
    pub(crate) fn register(self: &Arc<Self>, waiter: &str, channel: &str) -> (Registration, bool) {
        let waiting = Arc::new(Waiter::new());
        let mut state = self.state();
        state.waiters.insert(waiter.to_owned(), waiting.clone());
        let entry = state.channels.entry(channel.to_owned()).or_insert(Channel {
            confirmed: None,
            users: 0,
            last_used: Instant::now(),
        });
        entry.users += 1;
        entry.last_used = Instant::now();
        let subscribed = state.live_and_subscribed(channel);
        (
            Registration {
                hub: self.clone(),
                waiter: waiter.to_owned(),
                channel: channel.to_owned(),
                entry: waiting,
            },
            subscribed,
        )
    }

    /// Makes sure `channel` is subscribed on a live subscriber connection (connecting one if
    /// needed) and returns once the server confirmed it.
    pub(crate) async fn ensure_subscribed(
        self: &Arc<Self>,
        store: &Store,
        channel: &str,
    ) -> RedisResult<()> {
        if self.is_subscribed(channel) {
            return Ok(());
        }
        let _ops = self.ops.lock().await;
        if self.is_subscribed(channel) {
            return Ok(());
        }
        let live = self.state().sink.clone();
        let (generation, sink) = match live {
            Some(s) => s,
            None => self.connect(store).await?,
        };
        let subscribed = match sink {
            Sink::Plain(mut sink) => sink.subscribe(channel).await,
            Sink::Sharded(mut con) => con.ssubscribe(channel).await,
        };
        match subscribed {
            Ok(()) => {
                let mut state = self.state();
                if state.live() == Some(generation)
                    && let Some(c) = state.channels.get_mut(channel)
                {
                    c.confirmed = Some(generation);
                }
                Ok(())
            }
            Err(e) => {
                self.lost(generation);
                Err(e)
            }
        }
    }

    /// Whether `channel` is confirmed subscribed on a live subscriber connection.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.state().live_and_subscribed(channel)
    }

    /// Opens a subscriber connection and starts what reads and pings it. Called under `ops`.
    async fn connect(self: &Arc<Self>, store: &Store) -> RedisResult<(u64, Sink)> {
        let generation = self.state().generation + 1;
        let (sink, stream) = match (self.route, store) {
            (Route::Sharded, Store::Cluster(cluster)) => {
                let hub = Arc::downgrade(self);
                let push = move |info: PushInfo| {
                    if let Some(hub) = hub.upgrade() {
                        hub.pushed(generation, info);
                    }
                    Ok::<(), std::convert::Infallible>(())
                };
                (Sink::Sharded(cluster.subscriber(push).await?), None)
            }
            _ => {
                let (sink, stream) = store.pubsub().await?.split();
                (Sink::Plain(sink), Some(stream))
            }
        };
        {
            let mut state = self.state();
            state.generation = generation;
            state.sink = Some((generation, sink.clone()));
            for c in state.channels.values_mut() {
                c.confirmed = None;
            }
        }
        tokio::spawn(dispatch(Arc::downgrade(self), generation, stream));
        Ok((generation, sink))
    }

    /// The secret of the registered `waiter` (see the module docs), which its queue entry
    /// stores; `None` when it is not registered.
    pub(crate) fn secret_of(&self, waiter: &str) -> Option<String> {
        self.state().waiters.get(waiter).map(|w| w.secret.clone())
    }

    /// Wakes the waiter a message names (`<owner id>`, or `<owner id>:<token>:<tag>` for a
    /// handed permit, whose token it keeps for the waiter when the tag checks out).
    fn deliver(&self, payload: &[u8]) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let Ok(text) = std::str::from_utf8(payload) else {
            return;
        };
        let mut parts = text.splitn(3, ':');
        let id = parts.next().unwrap_or_default();
        let token = parts.next().and_then(|t| t.parse::<u64>().ok());
        let tag = parts.next();
        let state = self.state();
        if let Some(w) = state.waiters.get(id) {
            match (token.filter(|t| *t > 0), tag) {
                (Some(token), Some(tag)) if w.signed(id, token, tag) => {
                    w.handed.store(token, Ordering::Release);
                }
                (Some(_), _) => {
                    tracing::debug!(
                        waiter = id,
                        "a hand-over message without the waiter's tag; only woken"
                    );
                }
                _ => {}
            }
            w.notify.notify_one();
        }
    }

    /// A push from the shard subscriber of `generation`: a message wakes its waiter; a lost
    /// node connection (redis-rs subscribes again when it reconnects) or a channel the server
    /// unsubscribed (its slot moved) makes every waiter re-check and subscribe again.
    fn pushed(&self, generation: u64, info: PushInfo) {
        match info.kind {
            PushKind::SMessage => {
                if let Some(Value::BulkString(payload)) = info.data.get(1) {
                    self.deliver(payload);
                }
            }
            PushKind::Disconnection => {
                let mut state = self.state();
                for c in state.channels.values_mut() {
                    if c.confirmed == Some(generation) {
                        c.confirmed = None;
                    }
                }
                state.wake_all();
            }
            PushKind::SUnsubscribe => {
                let mut state = self.state();
                if let Some(Value::BulkString(name)) = info.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(c) = state.channels.get_mut(name)
                {
                    c.confirmed = None;
                }
                state.wake_all();
            }
            _ => {}
        }
    }

    /// The subscriber connection `generation` is gone: forget it and wake every waiter so each
    /// re-checks and subscribes again.
    fn lost(&self, generation: u64) {
        let mut state = self.state();
        if state.live() == Some(generation) {
            state.sink = None;
            for c in state.channels.values_mut() {
                c.confirmed = None;
            }
            state.wake_all();
        }
    }

    /// The live sink if it is `generation`'s.
    fn sink_of(&self, generation: u64) -> Option<Sink> {
        match &self.state().sink {
            Some((g, sink)) if *g == generation => Some(sink.clone()),
            _ => None,
        }
    }

    /// Pings subscriber connection `generation` (every master's, for shard channels); an error
    /// or no answer within the client's `timeout` means it is gone (see [`Hub::lost`]).
    /// Returns whether it answered.
    async fn ping(&self, generation: u64) -> bool {
        let Some(sink) = self.sink_of(generation) else {
            return false;
        };
        let answered = tokio::time::timeout(self.ping_timeout, async {
            match sink {
                Sink::Plain(mut sink) => sink.ping::<Value>().await.map(drop),
                Sink::Sharded(mut con) => {
                    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                    let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                    con.route_command(redis::cmd("PING"), every).await.map(drop)
                }
            }
        })
        .await;
        match answered {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis subscriber: ping failed; reconnecting");
                self.lost(generation);
                false
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.ping_timeout, "redis subscriber: ping unanswered; reconnecting");
                self.lost(generation);
                false
            }
        }
    }

    /// Unsubscribes the shard channels no waiter needed for [`IDLE`] (no-op on the client's
    /// own channel).
    async fn sweep(&self, generation: u64) {
        let Some(Sink::Sharded(mut con)) = self.sink_of(generation) else {
            return;
        };
        let idle: Vec<String> = {
            let mut state = self.state();
            let now = Instant::now();
            let idle: Vec<String> = state
                .channels
                .iter()
                .filter(|(_, c)| c.users == 0 && now.duration_since(c.last_used) >= IDLE)
                .map(|(name, _)| name.clone())
                .collect();
            for name in &idle {
                state.channels.remove(name);
            }
            idle
        };
        for name in idle {
            if let Err(e) = con.sunsubscribe(&name).await {
                tracing::debug!(channel = %name, error = %e, "redis subscriber: unsubscribing an idle channel failed");
            }
        }
    }
}

/// Marks the subscriber connection lost when its dispatcher ends for any reason, including its
/// runtime shutting down (the task is then dropped, not finished).
struct LostOnDrop(Weak<Hub>, u64);

impl Drop for LostOnDrop {
    fn drop(&mut self) {
        if let Some(hub) = self.0.upgrade() {
            hub.lost(self.1);
        }
    }
}

/// Reads one plain subscriber connection (`stream`; shard subscribers deliver through their
/// push sender instead) and pings the connection, until it ends or the hub is dropped.
async fn dispatch(hub: Weak<Hub>, generation: u64, stream: Option<PubSubStream>) {
    let _lost = LostOnDrop(hub.clone(), generation);
    let mut stream = stream;
    let mut tick = tokio::time::interval(CHECK);
    tick.tick().await;
    loop {
        let message = async {
            match stream.as_mut() {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = message => {
                let Some(hub) = hub.upgrade() else { return };
                match msg {
                    Some(msg) => hub.deliver(msg.get_payload_bytes()),
                    None => {
                        tracing::debug!("redis subscriber connection closed");
                        return;
                    }
                }
            }
            _ = tick.tick() => {
                let Some(hub) = hub.upgrade() else { return };
                if hub.state().live() != Some(generation) {
                    return;
                }
                // Replies to the ping come through the connection's own driver, not this
                // stream, so waiting for one here does not hold them up; messages queue
                // meanwhile.
                if !hub.ping(generation).await {
                    return;
                }
                hub.sweep(generation).await;
            }
        }
    }
}
