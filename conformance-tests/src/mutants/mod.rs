//! Deliberately broken backends, each with one defect, to show that the suite catches what it
//! claims to: a case that passes against the backend broken in the way the case is about
//! asserts nothing useful. Used by this crate's own tests and by `dlock check`'s.
//!
//! Never connect an application to these.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, LostReason, OwnerId, Released, Result,
    WaitMechanism, async_trait,
};

use crate::{Expect, Target};

mod mutated;
mod queued;

pub use mutated::{Mutated, Twist, memory_target, mutated_target};
pub use queued::{FifoDefect, Queued, ordered_target};

/// Which defect a toy backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Every acquire succeeds, held or not.
    NotExclusive,
    /// Release frees the lock whoever asks.
    ReleaseIgnoresOwner,
    /// Every acquisition gets token 1.
    ConstantToken,
    /// Extend revives expired or taken leases.
    ExtendResurrects,
    /// Leases never expire.
    NeverExpires,
    /// Leases expire at half their ttl (before the client's valid_until).
    ExpiresEarly,
    /// Release does nothing (the lock stays until its ttl).
    ReleaseIsNoop,
    /// Extend reports success but changes nothing in the store.
    ExtendIsNoop,
    /// Forget deletes a name that someone holds.
    ForgetsHeld,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    token: u64,
    expires: Instant,
}

#[derive(Debug, Default)]
struct State {
    holders: HashMap<LockName, Holder>,
    fence: HashMap<LockName, u64>,
}

/// A toy backend with one defect (or none: [`Toy::correct`]); every client with the same
/// defect shares one store.
#[derive(Debug)]
pub struct Toy {
    defect: Option<Defect>,
    state: &'static Mutex<State>,
}

fn state(defect: Option<Defect>) -> &'static Mutex<State> {
    static STATES: OnceLock<Mutex<HashMap<String, &'static Mutex<State>>>> = OnceLock::new();
    let mut m = STATES.get_or_init(Default::default).lock().unwrap();
    m.entry(format!("{defect:?}"))
        .or_insert_with(|| Box::leak(Box::default()))
}

#[async_trait]
impl DistributedLock for Toy {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            "toy",
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Unordered,
            WaitMechanism::Poll,
        )
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        let started = Instant::now();
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let live = s
            .holders
            .get(name)
            .is_some_and(|h| self.has(Defect::NeverExpires) || h.expires > now);
        if live && !self.has(Defect::NotExclusive) {
            return Ok(None);
        }
        let fence = s.fence.entry(name.clone()).or_default();
        *fence += 1;
        let token = if self.has(Defect::ConstantToken) {
            1
        } else {
            *fence
        };
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        let life = if self.has(Defect::ExpiresEarly) {
            ttl / 2
        } else {
            ttl
        };
        s.holders.insert(
            name.clone(),
            Holder {
                owner,
                token,
                expires: now + life,
            },
        );
        Ok(Some(Lease::new(
            name.clone(),
            owner,
            FencingToken(token),
            started,
            ttl,
            opts.drift_value(),
        )))
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        if self.has(Defect::ReleaseIsNoop) {
            return Ok(Released::Released);
        }
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let ok = s.holders.get(lease.name()).is_some_and(|h| {
            self.has(Defect::ReleaseIgnoresOwner)
                || (h.owner == lease.owner() && h.token == lease.token().0 && h.expires > now)
        });
        if ok {
            s.holders.remove(lease.name());
            Ok(Released::Released)
        } else {
            Ok(Released::NotHeld)
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let started = Instant::now();
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        if self.has(Defect::ExtendIsNoop) {
            return Ok(lease.renewed(started, ttl));
        }
        if self.has(Defect::ExtendResurrects) {
            s.holders.insert(
                lease.name().clone(),
                Holder {
                    owner: lease.owner(),
                    token: lease.token().0,
                    expires: now + ttl,
                },
            );
            return Ok(lease.renewed(started, ttl));
        }
        match s.holders.get_mut(lease.name()) {
            Some(h)
                if h.owner == lease.owner()
                    && (h.expires > now || self.has(Defect::NeverExpires)) =>
            {
                h.expires = now + ttl;
                Ok(lease.renewed(started, ttl))
            }
            _ => Err(Error::lock_lost("toy", lease.name(), "extend")),
        }
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        if s.holders.get(name).is_some_and(|h| h.expires > now) && !self.has(Defect::ForgetsHeld) {
            return Ok(false);
        }
        s.holders.remove(name);
        s.fence.remove(name);
        Ok(true)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = self.state.lock().unwrap();
        let now = Instant::now();
        Ok(s.holders.get(name).filter(|h| h.expires > now).map(|h| {
            LockInfo::new(
                name,
                Some(h.owner.to_string()),
                Some(FencingToken(h.token)),
                Some(h.expires - now),
                None,
            )
        }))
    }
}

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 9] = [
        Defect::NotExclusive,
        Defect::ReleaseIgnoresOwner,
        Defect::ConstantToken,
        Defect::ExtendResurrects,
        Defect::NeverExpires,
        Defect::ExpiresEarly,
        Defect::ReleaseIsNoop,
        Defect::ExtendIsNoop,
        Defect::ForgetsHeld,
    ];
}

impl Toy {
    /// A client of the shared store of toys with `defect`.
    pub fn new(defect: Defect) -> Self {
        Toy {
            defect: Some(defect),
            state: state(Some(defect)),
        }
    }

    /// A client of the shared store of toys without a defect: the baseline every defect is
    /// measured against (it must pass every case that applies to it).
    pub fn correct() -> Self {
        Toy {
            defect: None,
            state: state(None),
        }
    }

    fn has(&self, defect: Defect) -> bool {
        self.defect == Some(defect)
    }
}

/// A target whose clients are correct toys (label `toy`).
pub fn correct_target() -> Target {
    Target::new("toy", "", |_| async {
        Ok(Arc::new(Toy::correct()) as Arc<dyn DistributedLock>)
    })
}

/// A target whose clients all have `defect` (label `mutant-<defect>`).
pub fn target(defect: Defect) -> Target {
    Target::new(&format!("mutant-{defect:?}"), "", move |_| async move {
        Ok(Arc::new(Toy::new(defect)) as Arc<dyn DistributedLock>)
    })
}

/// A read-write backend whose readers and writers do not see each other: shared holds live in a
/// store of their own (memory namespaces), so a writer gets in while readers hold and readers
/// get in while a writer holds. Everything else is the memory backend's.
#[derive(Debug)]
pub struct BlindReaders {
    writers: lockcore::MemoryLock,
    readers: lockcore::MemoryLock,
}

/// Marks a lease that came from the readers' store.
const READERS: &str = "blind-readers";

impl BlindReaders {
    /// A client of the shared (process-wide) blind-readers store.
    pub fn new() -> Self {
        BlindReaders {
            writers: lockcore::MemoryLock::new("mutant-blind-readers-w"),
            readers: lockcore::MemoryLock::new("mutant-blind-readers-r"),
        }
    }

    fn store_of(&self, lease: &Lease) -> &lockcore::MemoryLock {
        if lease.handle() == Some(READERS) {
            &self.readers
        } else {
            &self.writers
        }
    }
}

impl Default for BlindReaders {
    fn default() -> Self {
        Self::new()
    }
}

// A delegating double: every method forwarded, so only the defect differs from memory.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for BlindReaders {
    fn capabilities(&self) -> Capabilities {
        self.writers.capabilities()
    }

    fn defaults(&self) -> ClientDefaults {
        self.writers.defaults()
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.writers.wait_for_release(name, until).await
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.store_of(lease).lost_reason(lease, error)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let mut out = Vec::with_capacity(leases.len());
        for (lease, ttl) in leases {
            out.push(self.store_of(lease).extend(lease, *ttl).await);
        }
        out
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.writers.inspect_semaphore(name).await
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        Ok(self.writers.forget(name).await? && self.readers.forget(name).await?)
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        let mut names = self.writers.names().await?;
        names.extend(self.readers.names().await?);
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.writers.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.writers.acquire_wait(name, opts, deadline).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let lease = self.readers.try_acquire_shared(name, opts).await?;
        Ok(lease.map(|l| l.with_handle(READERS)))
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let lease = self
            .readers
            .acquire_shared_wait(name, opts, deadline)
            .await?;
        Ok(lease.map(|l| l.with_handle(READERS)))
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.writers.try_acquire_permit(name, permits, opts).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.writers
            .acquire_permit_wait(name, permits, opts, deadline)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.store_of(lease).release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.store_of(lease).extend(lease, ttl).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.writers.inspect(name).await
    }
}

/// A target whose clients all share one [`BlindReaders`] store (label `mutant-BlindReaders`).
pub fn blind_readers_target() -> Target {
    Target::new("mutant-BlindReaders", "", |_| async {
        Ok(Arc::new(BlindReaders::new()) as Arc<dyn DistributedLock>)
    })
}

/// Every mutant of this module, one enumeration: each builds its [`Target`] with
/// [`Mutant::target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The toy with one [`Defect`].
    Toy(Defect),
    /// [`BlindReaders`].
    BlindReaders,
    /// The memory semaphore with one [`SemaphoreDefect`].
    Semaphore(SemaphoreDefect),
    /// The ordered toy with one [`FifoDefect`].
    Ordered(FifoDefect),
    /// The memory store with one [`Twist`].
    Memory(Twist),
}

/// The fault scenarios a store in this process can stage: they pause a client, not a server.
pub const CLIENT_SIDE_FAULTS: [&str; 3] = [
    "client_paused_past_ttl",
    "sem_client_paused_past_ttl",
    "rw_reader_paused_past_ttl",
];

/// `target` with every fault scenario declared: the client-side ones safe (a correct store is),
/// the others not applicable (an in-process store has no server to break, and no other process
/// shares it).
pub fn declare_faults(target: Target) -> Target {
    crate::registry()
        .iter()
        .filter(|c| c.kind == crate::Kind::Fault)
        .fold(target, |t, c| {
            let expect = if CLIENT_SIDE_FAULTS.contains(&c.name) {
                Expect::Safe
            } else {
                Expect::NotApplicable(
                    "an in-process store has no server to break or process to share it",
                )
            };
            t.fault(c.name, expect)
        })
}

impl Mutant {
    /// Every mutant: each toy defect, the blind readers, each semaphore defect, each FIFO
    /// defect, each twist of the memory store.
    pub fn all() -> Vec<Mutant> {
        let mut all: Vec<Mutant> = Defect::ALL.iter().map(|d| Mutant::Toy(*d)).collect();
        all.push(Mutant::BlindReaders);
        all.extend(SemaphoreDefect::ALL.iter().map(|d| Mutant::Semaphore(*d)));
        all.extend(FifoDefect::ALL.iter().map(|d| Mutant::Ordered(*d)));
        all.extend(Twist::ALL.iter().map(|t| Mutant::Memory(*t)));
        all
    }

    /// The mutant's target, with every fault scenario declared ([`declare_faults`]).
    pub fn target(self) -> Target {
        declare_faults(match self {
            Mutant::Toy(d) => target(d),
            Mutant::BlindReaders => blind_readers_target(),
            Mutant::Semaphore(d) => semaphore_target(d),
            Mutant::Ordered(d) => ordered_target(Some(d)),
            Mutant::Memory(t) => memory_target(t),
        })
    }

    /// The correct stores the mutants are broken copies of (the toy, the ordered toy, the
    /// memory store), with every fault scenario declared: each must pass every case that
    /// applies to it, or a mutant's kill may be the base's fault rather than the defect's.
    pub fn baselines() -> Vec<Target> {
        vec![
            declare_faults(correct_target()),
            declare_faults(ordered_target(None)),
            declare_faults(Target::new(
                "memory",
                "mutant-baseline-memory",
                |url| async move {
                    Ok(Arc::new(lockcore::MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
                },
            )),
        ]
    }
}

/// The cases that cannot fail against any mutant of a backend, each with why: lockcore answers
/// them before any backend call. Every other case of the registry must kill at least one
/// mutant ([`gaps`]).
pub const UNKILLABLE: &[(&str, &str)] = &[
    (
        "bad_names_rejected_before_io",
        "lockcore refuses the name before any backend call",
    ),
    (
        "bad_options_rejected_before_io",
        "lockcore refuses the options before any backend call",
    ),
    (
        "sem_bad_count_rejected_before_io",
        "lockcore refuses the count before any backend call",
    ),
    (
        "rw_unsupported_says_so",
        "a refusal case: lockcore refuses from the capabilities, before any backend call",
    ),
    (
        "sem_unsupported_says_so",
        "a refusal case: lockcore refuses from the capabilities, before any backend call",
    ),
    (
        "min_token_unsupported_says_so",
        "a refusal case: lockcore refuses from the capabilities, before any backend call",
    ),
];

/// What a run of every mutant over the registry leaves unproven, given `kills` (each mutant's
/// label and the cases that failed against it): a mutant no case kills, a case that kills no
/// mutant and is not in [`UNKILLABLE`], and an [`UNKILLABLE`] entry that does kill one (stale).
pub fn gaps(kills: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (mutant, cases) in kills {
        if cases.is_empty() {
            out.push(format!("mutant {mutant} survives every case"));
        }
    }
    for case in crate::registry() {
        let killed = kills.values().any(|k| k.contains(case.name));
        let exempt = UNKILLABLE.iter().any(|(name, _)| *name == case.name);
        match (killed, exempt) {
            (false, false) => out.push(format!("case {} kills no mutant", case.name)),
            (true, true) => out.push(format!(
                "case {} is listed as unable to kill a mutant, yet kills one: drop it from UNKILLABLE",
                case.name
            )),
            _ => {}
        }
    }
    for (name, _) in UNKILLABLE {
        if crate::registry::find(name).is_none() {
            out.push(format!(
                "UNKILLABLE lists {name}, which is not in the registry"
            ));
        }
    }
    out
}

/// What a [`SemaphoreMutant`] gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemaphoreDefect {
    /// Admits one holder more than the count.
    Overbooked,
    /// Ignores the caller's count (every semaphore has a thousand permits), so callers that
    /// disagree are never told.
    CountIgnored,
    /// A waiting acquire runs on in a task of its own when dropped, and keeps what it gets.
    LeakyWait,
}

impl SemaphoreDefect {
    /// Every semaphore defect.
    pub const ALL: [SemaphoreDefect; 3] = [
        SemaphoreDefect::Overbooked,
        SemaphoreDefect::CountIgnored,
        SemaphoreDefect::LeakyWait,
    ];
}

/// The memory backend with one semaphore defect; clients with the same defect share a store.
#[derive(Debug)]
pub struct SemaphoreMutant {
    inner: lockcore::MemoryLock,
    defect: SemaphoreDefect,
}

impl SemaphoreMutant {
    /// A client of the store of `defect`.
    pub fn new(defect: SemaphoreDefect) -> Self {
        SemaphoreMutant {
            inner: lockcore::MemoryLock::new(&format!("mutant-semaphore-{defect:?}")),
            defect,
        }
    }

    fn count(&self, permits: u32) -> u32 {
        match self.defect {
            SemaphoreDefect::Overbooked => permits + 1,
            SemaphoreDefect::CountIgnored => 1000,
            SemaphoreDefect::LeakyWait => permits,
        }
    }
}

// A delegating double: every method forwarded, so only the defect differs from memory.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for SemaphoreMutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_wait(name, opts, deadline).await
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.inner.wait_for_release(name, until).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.inner.try_acquire_shared(name, opts).await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_shared_wait(name, opts, deadline).await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let permits = self.count(permits);
        self.inner.try_acquire_permit(name, permits, opts).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let permits = self.count(permits);
        if self.defect != SemaphoreDefect::LeakyWait {
            return self
                .inner
                .acquire_permit_wait(name, permits, opts, deadline)
                .await;
        }
        let (inner, name, opts) = (self.inner.clone(), name.clone(), opts.clone());
        let detached = tokio::spawn(async move {
            inner
                .acquire_permit_wait(&name, permits, &opts, deadline)
                .await
        });
        detached.await.unwrap_or(Ok(None))
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        self.inner.extend_many(leases).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.inner.inspect_semaphore(name).await
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.inner.forget(name).await
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.names().await
    }
}

/// A target whose clients share the [`SemaphoreMutant`] store of `defect`.
pub fn semaphore_target(defect: SemaphoreDefect) -> Target {
    Target::new(
        &format!("mutant-semaphore-{defect:?}"),
        "",
        move |_| async move { Ok(Arc::new(SemaphoreMutant::new(defect)) as Arc<dyn DistributedLock>) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_killed() -> BTreeMap<String, BTreeSet<String>> {
        let every: BTreeSet<String> = crate::registry()
            .iter()
            .map(|c| c.name)
            .filter(|n| !UNKILLABLE.iter().any(|(u, _)| u == n))
            .map(str::to_owned)
            .collect();
        BTreeMap::from([("mutant-a".to_owned(), every)])
    }

    #[test]
    fn gaps_accept_a_full_matrix() {
        assert_eq!(gaps(&all_killed()), Vec::<String>::new());
    }

    #[test]
    fn gaps_name_a_surviving_mutant() {
        let mut kills = all_killed();
        kills.insert("mutant-b".to_owned(), BTreeSet::new());
        assert_eq!(gaps(&kills), vec!["mutant mutant-b survives every case"]);
    }

    #[test]
    fn gaps_name_a_case_that_kills_nothing_and_a_stale_exemption() {
        let mut kills = all_killed();
        let cases = kills.get_mut("mutant-a").unwrap();
        cases.remove("basic_exclusivity");
        cases.insert("rw_unsupported_says_so".to_owned());
        let found = gaps(&kills);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("basic_exclusivity kills no mutant"));
        assert!(found[1].contains("rw_unsupported_says_so is listed"));
    }

    #[test]
    fn every_mutant_has_its_own_label() {
        let labels: BTreeSet<String> = Mutant::all()
            .into_iter()
            .map(|m| m.target().label().to_owned())
            .collect();
        assert_eq!(labels.len(), Mutant::all().len());
    }
}
