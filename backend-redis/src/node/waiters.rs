//! One subscriber connection per client, listening on the client's own wake-up channel.
//!
//! Each waiting acquire registers its owner id with the hub and gets its own [`Notify`]. Queue
//! entries in Redis carry the waiter's client id, and a release (or a departure) publishes the
//! head waiter's owner id on that client's channel only: one message per hand-over, to the one
//! client that can use it, however many clients wait on the name. A background task reads the
//! subscriber connection and wakes the waiter the payload names. `Notify::notify_one` stores a
//! permit, so a message that arrives while the waiter is busy re-checking is not lost.
//!
//! The channel is subscribed once per subscriber connection, on the first wait; the connection
//! stays for the client's life. When it breaks, every local waiter is woken to re-check (and the
//! next wait subscribes on a new connection); waiters also re-check on a bounded fallback timer,
//! so a lost message costs a short delay, not a hang. A connection can also die without breaking
//! (a firewall or NAT drops it while idle): the dispatcher sends `PING` on it every [`CHECK`]
//! and treats a ping unanswered within the client's `timeout` as a broken connection. The pings
//! also keep an idle subscriber from looking idle to such middleboxes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisResult;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::Notify;

use super::store::Store;

/// How often the dispatcher pings the subscriber connection.
pub(crate) const CHECK: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    sink: Option<(u64, PubSubSink)>,
    generation: u64,
    /// The subscriber generation the channel is confirmed subscribed on.
    subscribed: Option<u64>,
    /// Waiting acquires by owner id.
    waiters: HashMap<String, Arc<Notify>>,
}

/// The client's subscriber and its dispatch table.
pub(crate) struct Hub {
    state: Mutex<State>,
    /// Serialises connecting and subscribing.
    ops: tokio::sync::Mutex<()>,
    /// How long a ping of the subscriber connection may take (the client's `timeout`).
    ping_timeout: Duration,
    /// This client's wake-up channel.
    channel: String,
    /// Wake-ups received.
    received: AtomicU64,
}

/// A waiter's entry in a node's wake-up hub ([`Node::register`](super::Node::register));
/// removed on drop.
pub struct Registration {
    hub: Arc<Hub>,
    waiter: String,
    notify: Arc<Notify>,
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
        self.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.state().waiters.remove(&self.waiter);
    }
}

impl Hub {
    /// An empty hub for wake-ups on `channel`, whose subscriber pings must be answered within
    /// `ping_timeout`.
    pub(crate) fn new(channel: String, ping_timeout: Duration) -> Self {
        Hub {
            state: Mutex::default(),
            ops: tokio::sync::Mutex::default(),
            ping_timeout,
            channel,
            received: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wake-up messages this client received.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Adds `waiter` (no I/O). Returns the registration and whether the channel is already
    /// confirmed subscribed on the live subscriber connection: if so, any wake-up published
    /// after this call reaches the waiter.
    pub(crate) fn register(self: &Arc<Self>, waiter: &str) -> (Registration, bool) {
        let notify = Arc::new(Notify::new());
        let mut state = self.state();
        state.waiters.insert(waiter.to_owned(), notify.clone());
        let subscribed = Self::live_and_subscribed(&state);
        (
            Registration {
                hub: self.clone(),
                waiter: waiter.to_owned(),
                notify,
            },
            subscribed,
        )
    }

    fn live_and_subscribed(state: &State) -> bool {
        let live = state.sink.as_ref().map(|(g, _)| *g);
        live.is_some() && state.subscribed == live
    }

    /// Makes sure the channel is subscribed on a live subscriber connection (connecting one if
    /// needed) and returns once the server confirmed it.
    pub(crate) async fn ensure_subscribed(self: &Arc<Self>, store: &Store) -> RedisResult<()> {
        if self.is_subscribed() {
            return Ok(());
        }
        let _ops = self.ops.lock().await;
        if self.is_subscribed() {
            return Ok(());
        }
        let live = self.state().sink.clone();
        let (generation, mut sink) = match live {
            Some(s) => s,
            None => self.connect(store).await?,
        };
        match sink.subscribe(self.channel.as_str()).await {
            Ok(()) => {
                let mut state = self.state();
                if state.sink.as_ref().is_some_and(|(g, _)| *g == generation) {
                    state.subscribed = Some(generation);
                }
                Ok(())
            }
            Err(e) => {
                self.lost(generation);
                Err(e)
            }
        }
    }

    pub(crate) fn is_subscribed(&self) -> bool {
        Self::live_and_subscribed(&self.state())
    }

    /// Opens a subscriber connection and starts its dispatcher. Called under `ops`.
    async fn connect(self: &Arc<Self>, store: &Store) -> RedisResult<(u64, PubSubSink)> {
        let (sink, stream) = store.pubsub().await?.split();
        let generation = {
            let mut state = self.state();
            state.generation += 1;
            let generation = state.generation;
            state.sink = Some((generation, sink.clone()));
            state.subscribed = None;
            generation
        };
        tokio::spawn(dispatch(Arc::downgrade(self), generation, stream));
        Ok((generation, sink))
    }

    /// Wakes the waiter a message names.
    fn deliver(&self, payload: &[u8]) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let state = self.state();
        let waiter = std::str::from_utf8(payload)
            .ok()
            .and_then(|id| state.waiters.get(id));
        if let Some(n) = waiter {
            n.notify_one();
        }
    }

    /// The subscriber connection `generation` is gone: forget it and wake every waiter so each
    /// re-checks and subscribes again.
    fn lost(&self, generation: u64) {
        let mut state = self.state();
        if state.sink.as_ref().is_some_and(|(g, _)| *g == generation) {
            state.sink = None;
            state.subscribed = None;
            for n in state.waiters.values() {
                n.notify_one();
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
                    Some(msg) => hub.deliver(msg.get_payload_bytes()),
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
            }
        }
    }
}
