//! Wake-ups of queued waiters, by name: the registry that PostgreSQL's listener feeds from
//! NOTIFY payloads (`dialect/postgres/listen.rs`), and the process-wide one through which, on
//! the dialects that poll (MySQL, SQLite), a release made in this process wakes this process's
//! waiters at once ([`local`]). Waiters in other processes still find such a release by polling;
//! a wake-up that names nobody, or comes late, only costs a look.
//!
//! The process-wide registry also lets a permit's release hand the freed permit to this
//! process's waiter nearest the head in the release's own transaction ([`Waiters::next`],
//! [`Waiters::hand`]; see `crate::semaphore`), on every dialect that has the statement for it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockcore::OwnerId;
use tokio::sync::{Notify, watch};

mod secret;

pub use secret::Secret;

/// What a release notification says (the NOTIFY payload). The channel is the table name; the
/// payload's first byte tells the form:
/// - `W<waiter><name>`: wake only `waiter` (32 hex digits), the live head of `name`'s queue when
///   the lock was freed; it is the only waiter whose attempt can be granted. Listeners of the
///   name that are not queued (`wait_for_release`) wake too.
/// - `H<waiter><fence>,<ttl>,<ticket>,<tag>,<name>`: a release handed the lock row of `name`
///   to `waiter`, whose row in the queue had `ticket`, with `fence` for `ttl` µs from the
///   hand-over (PostgreSQL's hand-over, sent only once it committed). `tag` is made with the
///   secret the waiter stored in that row ([`Secret`]): where it checks out, the notification is
///   the grant itself, which the waiter takes as its lease where it can tell when it was made
///   (see [`Waiters::wake`]); otherwise (a notification anyone else sent, or an older client's)
///   it is a wake-up like `W`. Listeners of the name that are not queued wake too.
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
    Head {
        waiter: &'a str,
        name: &'a str,
    },
    HandOver {
        waiter: &'a str,
        name: &'a str,
        grant: Grant,
        tag: &'a str,
    },
    PermitHead {
        waiter: &'a str,
        name: &'a str,
    },
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
        if let Some(rest) = payload.strip_prefix('H') {
            return Self::hand_over(rest).unwrap_or(Payload::Unknown);
        }
        let (permits, rest) = match (payload.strip_prefix('W'), payload.strip_prefix('Q')) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Payload::Unknown,
        };
        let Some((waiter, name)) = split_waiter(rest) else {
            return Payload::Unknown;
        };
        if permits {
            Payload::PermitHead { waiter, name }
        } else {
            Payload::Head { waiter, name }
        }
    }

    /// An `H` payload after its first byte.
    fn hand_over(rest: &'a str) -> Option<Self> {
        let (waiter, rest) = split_waiter(rest)?;
        let mut fields = rest.splitn(5, ',');
        let mut number = || fields.next()?.parse::<i64>().ok();
        let (fence, ttl_us, ticket) = (number()?, number()?, number()?);
        let tag = fields.next()?;
        let name = fields.next().filter(|n| !n.is_empty())?;
        let ttl = Duration::from_micros(u64::try_from(ttl_us).ok()?);
        let grant = Grant {
            fence,
            ttl,
            ttl_us,
            ticket,
        };
        Some(Payload::HandOver {
            waiter,
            name,
            grant,
            tag,
        })
    }
}

/// The 32-hex-digit waiter that starts `rest`, and what follows it (not empty).
fn split_waiter(rest: &str) -> Option<(&str, &str)> {
    (rest.len() > 32 && rest.is_char_boundary(32)).then(|| rest.split_at(32))
}

/// What an `H` notification says of the lock row a release handed to a waiter (see
/// [`Payload`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    fence: i64,
    /// How long the row runs from the hand-over.
    ttl: Duration,
    /// The same, in µs as the notification gave it.
    ttl_us: i64,
    /// The waiter's ticket in the queue, the row the release found it by.
    ticket: i64,
}

impl Grant {
    /// What the tag of this grant to `waiter` covers, as the hand-over statement writes it.
    fn fields(&self, waiter: &str) -> String {
        format!("{},{},{},{waiter}", self.fence, self.ttl_us, self.ticket)
    }
}

/// The wakeups of one name in this client.
#[derive(Default)]
struct Interest {
    /// Listeners that are not queued (`wait_for_release`): woken by every release of the name.
    any: Arc<Notify>,
    /// Queued waiters, in the order they registered: woken when named as the head, or by an
    /// `N` payload.
    queued: Vec<Queued>,
}

/// A queued waiter's registration.
struct Queued {
    id: String,
    owner: OwnerId,
    /// Its place in the store's queue, once it has joined (see [`Waiters::joined`]).
    ticket: Option<i64>,
    /// When the join that made `ticket` was sent, where the waiter said (see
    /// [`Waiters::joined`]).
    joined_at: Option<Instant>,
    /// The secret that join stored in the waiter's row, where the dialect hands the lock over
    /// by notification.
    secret: Option<Secret>,
    /// A permit waiter's terms, once it has joined: a release may hand it a permit on them.
    terms: Option<Terms>,
    notify: Arc<Notify>,
    delivered: Arc<Mutex<Option<DeliveredGrant>>>,
}

impl Queued {
    /// Keeps the lock's row that an `H` notification says a release handed to this waiter, for
    /// the waiter to take as its lease, where the notification is the store's (its `tag` was
    /// made with the secret of this waiter's join: see [`Secret`]), names the row this waiter
    /// joined with, and that join is recent: the join was sent before the hand-over found its
    /// row, so the row runs at least `ttl` from the join's sending, which becomes the lease's
    /// start. A join more than a tenth of that ttl ago would cost the lease that much of its
    /// time, and a notification for an earlier row or an earlier acquisition under the same
    /// owner id would be no grant of this one: the waiter is then only woken, and its next
    /// attempt looks (a row that is its own it reports, with the time left by the database's
    /// clock).
    fn take_grant(&self, grant: Grant, tag: &str) {
        let (Some(ticket), Some(at), Some(secret)) = (self.ticket, self.joined_at, self.secret)
        else {
            return;
        };
        if ticket != grant.ticket || at.elapsed() > grant.ttl / 10 {
            return;
        }
        if !secret.signed(&grant.fields(&self.id), tag) {
            tracing::debug!(waiter = %self.id, "a hand-over notification without the waiter's tag; only woken");
            return;
        }
        *self
            .delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(DeliveredGrant {
            fence: grant.fence,
            sent: at,
            more: false,
            ttl: Some(grant.ttl),
        });
    }
}

/// One join of the queue: the ticket it got, when it was sent, and the secret it stored in the
/// waiter's row.
#[derive(Clone, Copy, Debug)]
pub struct Join {
    pub ticket: i64,
    pub at: Instant,
    pub secret: Secret,
}

/// What a permit waiter asks for: a release that hands it a permit grants it on these terms.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    /// The permit's ttl.
    pub ttl: Duration,
    /// The token minimum, 0 for none.
    pub min_token: i64,
    /// The semaphore's count.
    pub permits: u32,
}

/// The waiter of this process nearest the head of a permit queue, to hand a freed permit to.
#[derive(Clone, Copy, Debug)]
pub struct Next {
    pub owner: OwnerId,
    pub ticket: i64,
    pub terms: Terms,
}

/// A grant a waiter found waiting for it rather than made: a permit that a release in this
/// process granted to a waiter of this process, or the lock's row that a release handed to it
/// and said so by a notification (PostgreSQL). Its fence; an instant no later than the grant
/// (the permit's release was sent then; the waiter's join was sent then, and the hand-over
/// found its row), so a lease valid from then is valid; whether permits were still free after
/// it (the waiter then wakes the next, once it has left this registry); and for the lock, how
/// long the row runs from the grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveredGrant {
    pub fence: i64,
    pub sent: Instant,
    pub more: bool,
    /// The lock row's ttl from the hand-over; `None` for a permit, granted on the waiter's own
    /// terms.
    pub ttl: Option<Duration>,
}

impl Interest {
    /// Wakes everyone interested in the name.
    fn wake_all(&self) {
        self.any.notify_waiters();
        self.queued.iter().for_each(|q| q.notify.notify_waiters());
    }

    /// The wake-up of the queued waiter `id`.
    fn get(&self, id: &str) -> Option<&Arc<Notify>> {
        self.find(id).map(|q| &q.notify)
    }

    /// The queued waiter `id`.
    fn find(&self, id: &str) -> Option<&Queued> {
        self.queued.iter().find(|q| q.id == id)
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

    /// Whether nobody is registered.
    pub fn is_idle(&self) -> bool {
        self.map().is_empty()
    }

    /// Interest in every release of `name` (`waiter` `None`), or a queued `waiter`'s: woken
    /// when it is the head a release names.
    pub fn register(self: &Arc<Self>, name: &str, waiter: Option<OwnerId>) -> Registration {
        let mut map = self.map();
        let interest = map.entry(name.to_owned()).or_default();
        let notify = match waiter {
            None => interest.any.clone(),
            Some(_) => Arc::new(Notify::new()),
        };
        self.enter(map, name, waiter, notify)
    }

    /// A queued `waiter`'s registration that wakes `notify`, which the waiter also gets from
    /// elsewhere (PostgreSQL's listener): here only for a release to hand it a permit.
    pub fn register_queued(
        self: &Arc<Self>,
        name: &str,
        waiter: OwnerId,
        notify: Arc<Notify>,
    ) -> Registration {
        self.enter(self.map(), name, Some(waiter), notify)
    }

    fn enter(
        self: &Arc<Self>,
        mut map: std::sync::MutexGuard<'_, HashMap<String, Interest>>,
        name: &str,
        waiter: Option<OwnerId>,
        notify: Arc<Notify>,
    ) -> Registration {
        let delivered = Arc::new(Mutex::new(None));
        if let Some(owner) = waiter {
            map.entry(name.to_owned()).or_default().queued.push(Queued {
                id: owner.to_string(),
                owner,
                ticket: None,
                joined_at: None,
                secret: None,
                terms: None,
                notify: notify.clone(),
                delivered: delivered.clone(),
            });
        }
        Registration {
            waiters: self.clone(),
            name: name.to_owned(),
            waiter: waiter.map(|w| w.to_string()),
            notify,
            delivered,
        }
    }

    /// Wakes whoever `payload` names (see [`Payload`]).
    pub fn wake(&self, payload: &str) {
        let map = self.map();
        match Payload::parse(payload) {
            Payload::Head { waiter, name } => {
                if let Some(i) = map.get(name) {
                    i.any.notify_waiters();
                    if let Some(n) = i.get(waiter) {
                        n.notify_waiters();
                    }
                }
            }
            Payload::HandOver {
                waiter,
                name,
                grant,
                tag,
            } => {
                if let Some(i) = map.get(name) {
                    i.any.notify_waiters();
                    if let Some(q) = i.find(waiter) {
                        q.take_grant(grant, tag);
                        q.notify.notify_waiters();
                    }
                }
            }
            Payload::Name(name) => map.get(name).into_iter().for_each(Interest::wake_all),
            Payload::PermitHead { waiter, name } => {
                if let Some(n) = map.get(&permits_key(name)).and_then(|i| i.get(waiter)) {
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

    /// Records the ticket with which the registered `waiter` of `key` joined the store's queue,
    /// when that join was sent, the secret it stored in its row (see [`Secret`]), and a permit
    /// waiter's terms.
    pub fn joined(&self, key: &str, waiter: OwnerId, join: Join, terms: Option<Terms>) {
        let mut map = self.map();
        let queued = map.get_mut(key).into_iter().flat_map(|i| &mut i.queued);
        if let Some(q) = queued.into_iter().find(|q| q.owner == waiter) {
            q.ticket = Some(join.ticket);
            q.joined_at = Some(join.at);
            q.secret = Some(join.secret);
            q.terms = terms;
        }
    }

    /// The joined permit waiter of `key` nearest the head, if it is this registry's nearest.
    pub fn next(&self, key: &str) -> Option<Next> {
        let map = self.map();
        let first = map
            .get(key)?
            .queued
            .iter()
            .min_by_key(|q| q.ticket.unwrap_or(i64::MAX))?;
        Some(Next {
            owner: first.owner,
            ticket: first.ticket?,
            terms: first.terms?,
        })
    }

    /// Hands `waiter` of `key` the permit a release granted it, and wakes it; `false` if it is
    /// no longer registered (it has gone, and its clean-up gives the permit back).
    pub fn hand(&self, key: &str, waiter: OwnerId, delivered: DeliveredGrant) -> bool {
        let map = self.map();
        let queued = map.get(key).into_iter().flat_map(|i| &i.queued);
        let Some(q) = queued.into_iter().find(|q| q.owner == waiter) else {
            return false;
        };
        *q.delivered.lock().unwrap_or_else(PoisonError::into_inner) = Some(delivered);
        q.notify.notify_waiters();
        true
    }

    /// Whether a waiter of this registry queued for `key` is nearer the head than `waiter`.
    pub fn behind_another(&self, key: &str, waiter: OwnerId) -> bool {
        let map = self.map();
        let Some(i) = map.get(key) else {
            return false;
        };
        let ticket = |q: &Queued| q.ticket.unwrap_or(i64::MAX);
        let Some(mine) = i.queued.iter().find(|q| q.owner == waiter).map(ticket) else {
            return false;
        };
        i.queued
            .iter()
            .any(|q| q.owner != waiter && ticket(q) < mine)
    }

    /// Wakes the listeners of `key` (a name, or [`permits_key`]) that are not queued, and the
    /// queued waiter of this registry nearest the head: the smallest ticket (one that has not
    /// joined yet counts as behind every joined one).
    pub fn wake_first(&self, key: &str) {
        if let Some(i) = self.map().get(key) {
            i.any.notify_waiters();
            let first = i.queued.iter().min_by_key(|q| q.ticket.unwrap_or(i64::MAX));
            if let Some(q) = first {
                q.notify.notify_waiters();
            }
        }
    }

    /// After a reconnect notifications may have been missed: everyone re-checks.
    pub fn wake_all(&self) {
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
    delivered: Arc<Mutex<Option<DeliveredGrant>>>,
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
            interest.queued.retain(|q| &q.id != waiter);
        }
        // The map holds one reference to `any`, and a name-wide registration being dropped
        // holds another.
        let others = Arc::strong_count(&interest.any) - 1 - usize::from(self.waiter.is_none());
        if others == 0 && interest.queued.is_empty() {
            map.remove(&self.name);
        }
    }
}

/// How a queued waiter learns that the lock may have been freed (by default: it polls).
#[derive(Default)]
pub struct Wake {
    /// Fired by the dialect's notifications (PostgreSQL), or, where it polls, by the releases
    /// made in this process ([`local`]).
    pub notify: Arc<Notify>,
    /// Whether the notifications flow (PostgreSQL: the listener connection is up and
    /// LISTENing); `None` where the dialect polls.
    pub ready: Option<watch::Receiver<bool>>,
    /// What keeps the subscription: the waiter's [`Registration`].
    pub _subscription: Option<Box<dyn Any + Send + Sync>>,
    /// Where a release of this process puts a permit it handed to this waiter.
    pub delivered: Option<Arc<Mutex<Option<DeliveredGrant>>>>,
}

impl Wake {
    /// Whether a release will be notified: the listener has been LISTENing since before now.
    pub fn listening(&self) -> bool {
        self.ready.as_ref().is_some_and(|r| *r.borrow())
    }

    /// The permit a release of this process handed to this waiter, if one did since the last
    /// call.
    pub fn take_delivered(&self) -> Option<DeliveredGrant> {
        let slot = self.delivered.as_ref()?;
        slot.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Ends the subscription, then hands back the permit a release of this process handed to
    /// this waiter before it ended, if any: no release can hand it one after, so a waiter that
    /// gives up gives back what this returns.
    pub fn end(mut self) -> Option<DeliveredGrant> {
        let slot = self.delivered.take();
        drop(self);
        slot?.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Also registered in this process's registry `hub` as queued `waiter` of `key`, woken
    /// through this wake-up, so that a release here can hand it a permit.
    pub fn with_hand_over(mut self, hub: &Arc<Waiters>, key: &str, waiter: OwnerId) -> Wake {
        let registration = hub.register_queued(key, waiter, self.notify.clone());
        self.delivered = Some(registration.delivered.clone());
        self._subscription = Some(Box::new((self._subscription.take(), registration)));
        self
    }
}

impl Registration {
    /// The waiter's [`Wake`] of this registration, which it keeps; `ready` as in [`Wake`].
    pub fn into_wake(self, ready: Option<watch::Receiver<bool>>) -> Wake {
        Wake {
            notify: self.notify.clone(),
            ready,
            delivered: Some(self.delivered.clone()),
            _subscription: Some(Box::new(self)),
        }
    }
}

/// The wake-up registry of this process for the store and table `key` (any text that tells
/// one store's table from another's; it is never sent anywhere): every client of a polling
/// dialect in the process that names the same store shares it.
pub fn local(key: &str) -> Arc<Waiters> {
    static HUBS: LazyLock<Mutex<HashMap<String, Arc<Waiters>>>> = LazyLock::new(Mutex::default);
    let mut hubs = HUBS.lock().unwrap_or_else(PoisonError::into_inner);
    hubs.entry(key.to_owned()).or_default().clone()
}

/// The key under which waiters for `name` register: the lock's and readers' (the name), or
/// with `permits` the semaphore's ([`permits_key`]).
pub fn key(name: &str, permits: bool) -> String {
    match permits {
        true => permits_key(name),
        false => name.to_owned(),
    }
}

#[cfg(test)]
mod tests;
