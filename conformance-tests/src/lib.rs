//! The shared dlock conformance suite, as a library.
//!
//! * [`registry`](mod@registry): the one list of conformance cases ([`cases`]) and fault scenarios
//!   ([`faults`]), each with the capabilities it needs.
//! * [`Target`]: a store to run them against (a label, how to connect, optionally how to start
//!   private servers that fault scenarios may break, and one declaration per scenario:
//!   [`Expect`]).
//! * [`runner`]: turns each entry into a [`Report`] (passed, failed with its message, not
//!   applicable with the reason), with its duration; `dlock check` uses it on a user's store.
//! * [`harness`]: the `cargo test` main of every backend crate's `tests/conformance.rs`, one
//!   named test per case × target.
//! * [`table`]: the case × backend table, from reports; [`pins`]: every cell that is not
//!   applicable, with its reason, pinned in `not-applicable.txt` and compared with each run.
//! * [`history`], [`fenced`]: the safety tooling (recorder, checker, fenced resource);
//!   [`timeline`]: what the library logged about a failed case's locks, for its message.
//! * [`catalog`]: how each backend the kit can start fares in every fault scenario, declared
//!   once for its tests and `dlock compare`.
//! * [`kit`]: real servers as child processes and a fault-injecting TCP proxy; [`spawn`]: the
//!   backends a command starts with it (`dlock soak --spawn`).
//!
//! A backend crate's `tests/conformance.rs` (with `harness = false` in its `Cargo.toml`):
//!
//! ```text
//! fn main() -> std::process::ExitCode {
//!     let memory = Target::new("memory", "conformance", |url| async move {
//!         Ok(Arc::new(MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
//!     });
//!     conformance_tests::harness::main(vec![memory], env!("CARGO_TARGET_TMPDIR"))
//! }
//! ```

pub mod cases;
pub mod catalog;
mod counting;
pub mod faults;
pub mod fenced;
pub mod harness;
pub mod history;
pub mod kit;
pub mod mutants;
pub mod pins;
pub mod registry;
pub mod runner;
pub mod sem_faults;
pub mod spawn;
pub mod table;
mod target;
pub mod timeline;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use cases::within;
pub use counting::{CountingLock, Renewals};
pub use fenced::{FencedResource, StaleWrite};
pub use history::{History, Hold, HoldId, Violation, check, check_permits};
use lockcore::DistributedLock;
pub use registry::{Case, Kind, Needs, registry};
pub use runner::{CASE_TIMEOUT, Outcome, Report, run_all, run_case};
pub use target::{Connect, Expect, Persistence, Spawn, Spawned, Target};

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a case gets: independent clients of the target's store and names unique to this run of
/// this case.
#[derive(Clone, Debug)]
pub struct Ctx {
    target: Target,
    case: &'static str,
    run: String,
}

impl Ctx {
    /// A context for running `case` against `target`.
    pub fn new(target: Target, case: &'static str) -> Self {
        Ctx {
            target,
            case,
            run: format!("{:08x}", rand::random::<u32>()),
        }
    }

    /// The target's label.
    pub fn backend(&self) -> &str {
        self.target.label()
    }

    /// The case's name.
    pub fn case(&self) -> &'static str {
        self.case
    }

    /// The target (for fault scenarios: its spawner and declarations).
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// How the target declared this fault scenario.
    pub fn expect(&self) -> Option<Expect> {
        self.target.expectation(self.case)
    }

    /// A new independent client of the target's store.
    ///
    /// # Panics
    /// When the client cannot connect (the case fails with the error).
    pub async fn client(&self) -> Arc<dyn DistributedLock> {
        let url = self.target.url().await;
        self.connect(&url).await
    }

    /// A new client of the store at `url` (a server a fault scenario started).
    ///
    /// # Panics
    /// When the client cannot connect (the case fails with the error).
    pub async fn connect(&self, url: &str) -> Arc<dyn DistributedLock> {
        self.target
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect a client: {e}"))
    }

    /// Records a name the case made itself (from [`Ctx::name`]), so that the target's name
    /// recorder sees it too.
    pub fn note_name(&self, name: &str) {
        self.target.note_name(name);
    }

    /// A lock name unique to this case and run, under the target's prefix.
    pub fn name(&self, label: &str) -> String {
        let name = format!("{}{label}", self.names());
        self.target.note_name(&name);
        name
    }

    /// What every name of this run of this case starts with (see [`name`](Self::name)).
    pub fn names(&self) -> String {
        format!("{}/{}/{}/", self.target.name_prefix(), self.case, self.run)
    }
}
