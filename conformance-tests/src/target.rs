//! What the suite runs against: a [`Target`] names a store, says how to connect to it, and
//! optionally how to start private servers that fault scenarios may break.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;

use lockcore::DistributedLock;
use tokio::sync::OnceCell;

use crate::BoxFuture;
use crate::kit::{KitResult, ServerControl};

/// Connects a new, independent client to the store at a URL.
pub type Connect =
    Arc<dyn Fn(String) -> BoxFuture<lockcore::Result<Arc<dyn DistributedLock>>> + Send + Sync>;

/// Starts a private server with the given persistence and returns it with its URL.
pub type Spawn = Arc<dyn Fn(Persistence) -> BoxFuture<KitResult<Spawned>> + Send + Sync>;

/// Whether a server started for a fault scenario keeps acknowledged writes across a kill -9.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Every acknowledged write survives a crash (Redis `appendfsync always`; every SQL server).
    Durable,
    /// A restart starts empty (Redis without AOF or RDB).
    None,
}

/// A private server started for one fault scenario, and the URL of a store on it. The server
/// is killed when this is dropped.
pub struct Spawned {
    /// The server, to kill, pause, restart.
    pub server: Box<dyn ServerControl>,
    /// Where a client connects (a fresh database or key prefix of its own).
    pub url: String,
    /// Anything else that must live as long as the server (a kit handle, a temp dir).
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl fmt::Debug for Spawned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spawned")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// How a backend is expected to fare in a fault scenario, declared once per backend in its
/// `tests/conformance.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No two holders' windows overlap, tokens grow, and the fenced resource never accepts a
    /// stale write.
    Safe,
    /// The scenario breaks a safety property, for the stated reason; the scenario shows it with
    /// a deterministic schedule and fails if the violation does *not* happen (so the declaration
    /// stays true).
    DocumentedUnsafe(&'static str),
    /// The scenario cannot be staged on this backend, for the stated reason.
    NotApplicable(&'static str),
}

enum Store {
    Url(String),
    Lazy {
        init: Arc<dyn Fn() -> BoxFuture<String> + Send + Sync>,
        cell: OnceCell<String>,
    },
}

struct Inner {
    label: String,
    connect: Connect,
    store: Store,
    spawn: Option<Spawn>,
    faults: BTreeMap<&'static str, Expect>,
    prefix: String,
    names: Option<Mutex<BTreeSet<String>>>,
    bare_names: bool,
}

/// A store the suite runs against: a label (the column of the table, the test name's first
/// part), a way to connect to it, and, for fault scenarios, a way to start private servers plus
/// one declaration per scenario. Cheap to clone.
#[derive(Clone)]
pub struct Target {
    inner: Arc<Inner>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.inner.label)
            .field("spawn", &self.inner.spawn.is_some())
            .field("faults", &self.inner.faults)
            .finish_non_exhaustive()
    }
}

impl Target {
    fn build(label: &str, connect: Connect, store: Store) -> Self {
        Target {
            inner: Arc::new(Inner {
                label: label.to_owned(),
                connect,
                store,
                spawn: None,
                faults: BTreeMap::new(),
                prefix: "dlock-ct".to_owned(),
                names: None,
                bare_names: true,
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("configure a Target before cloning it")
    }

    /// A target whose clients `connect` to `url`.
    pub fn new<C, F>(label: &str, url: impl Into<String>, connect: C) -> Self
    where
        C: Fn(String) -> F + Send + Sync + 'static,
        F: Future<Output = lockcore::Result<Arc<dyn DistributedLock>>> + Send + 'static,
    {
        Self::build(
            label,
            Arc::new(move |url| Box::pin(connect(url))),
            Store::Url(url.into()),
        )
    }

    /// A target whose store is made on first use by `init` (for example a database on the
    /// kit's shared server), so that a filtered test run starts only the servers it needs.
    pub fn lazy<I, IF, C, F>(label: &str, init: I, connect: C) -> Self
    where
        I: Fn() -> IF + Send + Sync + 'static,
        IF: Future<Output = String> + Send + 'static,
        C: Fn(String) -> F + Send + Sync + 'static,
        F: Future<Output = lockcore::Result<Arc<dyn DistributedLock>>> + Send + 'static,
    {
        Self::build(
            label,
            Arc::new(move |url| Box::pin(connect(url))),
            Store::Lazy {
                init: Arc::new(move || Box::pin(init())),
                cell: OnceCell::new(),
            },
        )
    }

    /// Lets fault scenarios start private servers with `spawn`.
    pub fn spawn_with<S, SF>(mut self, spawn: S) -> Self
    where
        S: Fn(Persistence) -> SF + Send + Sync + 'static,
        SF: Future<Output = KitResult<Spawned>> + Send + 'static,
    {
        self.inner_mut().spawn = Some(Arc::new(move |p| Box::pin(spawn(p))));
        self
    }

    /// Declares how this backend fares in the fault scenario `scenario` (a name from the
    /// registry). On a target that runs fault scenarios, every scenario that applies to its
    /// store (whose capabilities the scenario needs) must be declared.
    ///
    /// # Panics
    /// When `scenario` is not a fault scenario of the registry.
    pub fn fault(mut self, scenario: &'static str, expect: Expect) -> Self {
        let known =
            crate::registry::find(scenario).is_some_and(|c| c.kind == crate::registry::Kind::Fault);
        assert!(known, "{scenario} is not a fault scenario of the registry");
        self.inner_mut().faults.insert(scenario, expect);
        self
    }

    /// Declares every scenario of [`crate::faults::NEED_A_SERVER`] not applicable, for `reason`
    /// (an embedded or in-process store has no server to break).
    pub fn without_server(self, reason: &'static str) -> Self {
        crate::faults::NEED_A_SERVER
            .iter()
            .fold(self, |t, s| t.fault(s, Expect::NotApplicable(reason)))
    }

    /// Lock names of this target start with `prefix` (default `dlock-ct`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.inner_mut().prefix = prefix.into();
        self
    }

    /// Whether cases may also use a few bare names outside the prefix (`/`, `.`, `..`,
    /// `zookeeper`, to test escaping); on by default, off for a store others use.
    pub fn bare_names(mut self, allowed: bool) -> Self {
        self.inner_mut().bare_names = allowed;
        self
    }

    /// See [`Target::bare_names`].
    pub fn allows_bare_names(&self) -> bool {
        self.inner.bare_names
    }

    /// Remembers every lock name cases make ([`crate::Ctx::name`]), so that the caller can
    /// check afterwards that none is left held ([`Target::recorded_names`]).
    pub fn record_names(mut self) -> Self {
        self.inner_mut().names = Some(Mutex::new(BTreeSet::new()));
        self
    }

    /// The names cases made, when [`Target::record_names`] is on (else empty).
    pub fn recorded_names(&self) -> Vec<String> {
        self.inner.names.as_ref().map_or_else(Vec::new, |n| {
            n.lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect()
        })
    }

    pub(crate) fn note_name(&self, name: &str) {
        if let Some(names) = &self.inner.names {
            names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_owned());
        }
    }

    /// The label.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The lock-name prefix.
    pub fn name_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Whether fault scenarios can run (the target can start servers it may break).
    pub fn can_spawn(&self) -> bool {
        self.inner.spawn.is_some()
    }

    /// Whether this target runs fault scenarios (it declared at least one; then every one that
    /// applies to its store must be declared).
    pub fn runs_faults(&self) -> bool {
        !self.inner.faults.is_empty()
    }

    /// The declaration for `scenario`, if any.
    pub fn expectation(&self, scenario: &str) -> Option<Expect> {
        self.inner.faults.get(scenario).copied()
    }

    /// The store's URL (made on first use for a lazy target).
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped call leaves the cell empty and a later call starts again.
    pub async fn url(&self) -> String {
        match &self.inner.store {
            Store::Url(url) => url.clone(),
            Store::Lazy { init, cell } => cell.get_or_init(|| init()).await.clone(),
        }
    }

    /// A new client of the store at `url`.
    ///
    /// # Cancel safety
    /// As the backend's connect.
    ///
    /// # Errors
    /// The backend's connect error.
    pub async fn connect(&self, url: &str) -> lockcore::Result<Arc<dyn DistributedLock>> {
        (self.inner.connect)(url.to_owned()).await
    }

    /// A private server with the given persistence, for a fault scenario.
    ///
    /// # Cancel safety
    /// A dropped call kills whatever it had started (the kit kills servers on drop).
    ///
    /// # Errors
    /// No spawner configured, or the server failing to start.
    pub async fn spawn(&self, persistence: Persistence) -> KitResult<Spawned> {
        match &self.inner.spawn {
            Some(spawn) => spawn(persistence).await,
            None => Err(crate::kit::KitError::new(
                crate::kit::KitErrorKind::InvalidArgument,
                format!("target {} cannot start servers", self.inner.label),
            )),
        }
    }
}
