//! One subscriber connection per client, multiplexed over every lock name the client waits on.
//!
//! Each waiting acquire registers its owner id under the lock's release channel and gets its
//! own [`Notify`]. A background task reads the subscriber connection and dispatches each
//! message: the payload names the waiter at the head of the queue, so only that waiter is woken
//! (an empty payload wakes every local waiter of the channel). `Notify::notify_one` stores a
//! permit, so a message that arrives while the waiter is busy re-checking is not lost.
//!
//! Channels stay subscribed while anyone waits on them and for a while after ([`LINGER`]), so a
//! client that keeps contending for a name pays the `SUBSCRIBE` round trip once. All
//! (un)subscriptions go through one async lock in order, so an `UNSUBSCRIBE` of an idle channel
//! can never overtake a new waiter's `SUBSCRIBE`.
//!
//! When the subscriber connection breaks, every local waiter is woken to re-check (and to
//! re-subscribe on a new connection); waiters also re-check on a bounded fallback timer, so a
//! lost message costs a short delay, not a hang. A connection can also die without breaking (a
//! firewall or NAT drops it while idle): the dispatcher sends `PING` on it every [`CHECK`] and
//! treats a ping unanswered within the client's `timeout` as a broken connection. The pings also
//! keep an idle subscriber from looking idle to such middleboxes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::RedisResult;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::Notify;

use crate::store::Store;

/// How long an unused channel stays subscribed.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// How often the dispatcher sweeps idle channels and pings the subscriber connection.
pub(crate) const CHECK: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Channel {
    waiters: HashMap<String, Arc<Notify>>,
    /// The subscriber generation this channel is confirmed subscribed on.
    subscribed: Option<u64>,
    idle_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    sink: Option<(u64, PubSubSink)>,
    generation: u64,
    channels: HashMap<String, Channel>,
}

/// The client's subscriber and its dispatch table.
pub(crate) struct Hub {
    state: Mutex<State>,
    /// Serialises connecting, subscribing and unsubscribing.
    ops: tokio::sync::Mutex<()>,
    /// How long a ping of the subscriber connection may take (the client's `timeout`).
    ping_timeout: Duration,
}

/// A waiter's entry in the hub; removed on drop.
pub(crate) struct Registration {
    hub: Arc<Hub>,
    channel: String,
    waiter: String,
    notify: Arc<Notify>,
}

impl Registration {
    /// Resolves once this waiter was told to re-check (or right away if it was told meanwhile).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.hub.state();
        if let Some(ch) = state.channels.get_mut(&self.channel) {
            ch.waiters.remove(&self.waiter);
            if ch.waiters.is_empty() {
                ch.idle_since = Some(Instant::now());
            }
        }
    }
}

impl Hub {
    /// An empty hub whose subscriber pings must be answered within `ping_timeout`.
    pub(crate) fn new(ping_timeout: Duration) -> Self {
        Hub {
            state: Mutex::default(),
            ops: tokio::sync::Mutex::default(),
            ping_timeout,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `waiter` under `channel` (no I/O). Returns the registration and whether the channel
    /// is already confirmed subscribed on the live subscriber connection: if so, any release
    /// published after this call reaches the waiter.
    pub(crate) fn register(self: &Arc<Self>, channel: &str, waiter: &str) -> (Registration, bool) {
        let notify = Arc::new(Notify::new());
        let mut state = self.state();
        let live = state.sink.as_ref().map(|(g, _)| *g);
        let ch = state.channels.entry(channel.to_owned()).or_default();
        ch.waiters.insert(waiter.to_owned(), notify.clone());
        ch.idle_since = None;
        let subscribed = live.is_some() && ch.subscribed == live;
        (
            Registration {
                hub: self.clone(),
                channel: channel.to_owned(),
                waiter: waiter.to_owned(),
                notify,
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
        let (generation, mut sink) = match live {
            Some(s) => s,
            None => self.connect(store).await?,
        };
        match sink.subscribe(channel).await {
            Ok(()) => {
                let mut state = self.state();
                if state.sink.as_ref().is_some_and(|(g, _)| *g == generation) {
                    state
                        .channels
                        .entry(channel.to_owned())
                        .or_default()
                        .subscribed = Some(generation);
                }
                Ok(())
            }
            Err(e) => {
                self.lost(generation);
                Err(e)
            }
        }
    }

    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        let state = self.state();
        let live = state.sink.as_ref().map(|(g, _)| *g);
        live.is_some() && state.channels.get(channel).and_then(|c| c.subscribed) == live
    }

    /// Opens a subscriber connection and starts its dispatcher. Called under `ops`.
    async fn connect(self: &Arc<Self>, store: &Store) -> RedisResult<(u64, PubSubSink)> {
        let (sink, stream) = store.pubsub().await?.split();
        let generation = {
            let mut state = self.state();
            state.generation += 1;
            let generation = state.generation;
            state.sink = Some((generation, sink.clone()));
            for ch in state.channels.values_mut() {
                ch.subscribed = None;
            }
            generation
        };
        tokio::spawn(dispatch(Arc::downgrade(self), generation, stream));
        Ok((generation, sink))
    }

    /// Wakes the waiter a message names (every waiter of the channel for an empty payload),
    /// and every watcher (ids starting with `*`, from `wait_for_release`).
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let state = self.state();
        let Some(ch) = state.channels.get(channel) else {
            return;
        };
        for (id, n) in &ch.waiters {
            if payload.is_empty() || id.starts_with('*') || id.as_bytes() == payload {
                n.notify_one();
            }
        }
    }

    /// The subscriber connection `generation` is gone: forget it and wake every waiter so each
    /// re-checks and re-subscribes.
    fn lost(&self, generation: u64) {
        let mut state = self.state();
        if state.sink.as_ref().is_some_and(|(g, _)| *g == generation) {
            state.sink = None;
            for ch in state.channels.values_mut() {
                ch.subscribed = None;
                for n in ch.waiters.values() {
                    n.notify_one();
                }
            }
        }
    }

    /// Pings subscriber connection `generation`; an error or no answer within the client's
    /// `timeout` means it is gone (see [`Hub::lost`]). Returns whether it answered.
    async fn ping(&self, generation: u64) -> bool {
        let sink = match &self.state().sink {
            Some((g, sink)) if *g == generation => sink.clone(),
            _ => return false,
        };
        let mut sink = sink;
        let answered = tokio::time::timeout(self.ping_timeout, sink.ping::<redis::Value>()).await;
        match answered {
            Ok(Ok(_)) => true,
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

    /// Unsubscribes channels nobody has waited on for [`LINGER`].
    async fn sweep(&self, generation: u64) {
        let _ops = self.ops.lock().await;
        let (sink, idle) = {
            let mut state = self.state();
            let Some((g, sink)) = state.sink.clone() else {
                return;
            };
            if g != generation {
                return;
            }
            let now = Instant::now();
            let idle: Vec<String> = state
                .channels
                .iter()
                .filter(|(_, c)| {
                    c.waiters.is_empty() && c.idle_since.is_some_and(|t| now - t >= LINGER)
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in &idle {
                state.channels.remove(name);
            }
            (sink, idle)
        };
        if !idle.is_empty() {
            let mut sink = sink;
            if let Err(e) = sink.unsubscribe(idle.as_slice()).await {
                tracing::debug!(error = %e, "redis subscriber: unsubscribe failed");
                self.lost(generation);
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

/// Reads one subscriber connection until it ends or the hub is dropped.
async fn dispatch(hub: Weak<Hub>, generation: u64, mut stream: PubSubStream) {
    let _lost = LostOnDrop(hub.clone(), generation);
    let mut tick = tokio::time::interval(CHECK);
    tick.tick().await;
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(hub) = hub.upgrade() else { return };
                match msg {
                    Some(msg) => hub.deliver(msg.get_channel_name(), msg.get_payload_bytes()),
                    None => {
                        tracing::debug!("redis subscriber connection closed");
                        return;
                    }
                }
            }
            _ = tick.tick() => {
                let Some(hub) = hub.upgrade() else { return };
                if hub.state().sink.as_ref().is_none_or(|(g, _)| *g != generation) {
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
