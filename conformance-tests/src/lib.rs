//! The shared dlock conformance suite.
//!
//! * [`cases`]: one `pub async fn` per case, each asserting something a broken backend would fail.
//! * [`suite!`]: expands to one `#[test]` per case for a backend factory, so every failure names
//!   its case and backend. Cases that need a capability are grouped (`ttl`, `fifo`); a backend
//!   lists the groups its capabilities claim, and a generated test checks that the list matches
//!   `capabilities()`, so no backend can skip a case silently. Each instantiation also writes its
//!   row of the case × backend table (see [`table`]).
//! * [`history`], [`fenced`]: the safety tooling (recorder, checker, fenced resource).
//! * [`kit`]: real servers as child processes and a fault-injecting TCP proxy.
//!
//! In a backend crate's `tests/conformance.rs`:
//!
//! ```text
//! async fn make() -> std::sync::Arc<dyn lockcore::DistributedLock> { /* a new client */ }
//! conformance_tests::suite!(memory, make, [ttl, fifo]);
//! ```

pub mod cases;
mod counting;
pub mod fenced;
pub mod history;
pub mod kit;
pub mod table;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use counting::CountingLock;
pub use fenced::{FencedResource, StaleWrite};
pub use history::{History, Hold, HoldId, Violation, check};
use lockcore::DistributedLock;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Makes a new, independent client of the backend under test (same store every time).
pub type Factory = fn() -> BoxFuture<Arc<dyn DistributedLock>>;

/// What a case gets: independent clients and names unique to this run of this case.
#[derive(Clone)]
pub struct Ctx {
    /// Backend label from the `suite!` invocation.
    pub backend: &'static str,
    /// Case name.
    pub case: &'static str,
    factory: Factory,
    run: String,
}

impl Ctx {
    /// A context for running `case` against `backend`.
    pub fn new(backend: &'static str, case: &'static str, factory: Factory) -> Self {
        Ctx {
            backend,
            case,
            factory,
            run: format!("{:08x}", rand::random::<u32>()),
        }
    }

    /// A new independent client.
    pub async fn client(&self) -> Arc<dyn DistributedLock> {
        (self.factory)().await
    }

    /// A lock name unique to this case and run.
    pub fn name(&self, label: &str) -> String {
        format!("dlock-ct/{}/{}/{label}", self.case, self.run)
    }
}

/// How long a single case may run before it fails instead of hanging.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs one case on a fresh multi-threaded runtime; panics (fails the test) on timeout. The
/// outcome (`pass` or `fail`) is written to `<dir>/dlock-conformance/<backend>/<case>` for the
/// case × backend table.
pub fn run_case(
    backend: &'static str,
    case: &'static str,
    factory: Factory,
    body: fn(Ctx) -> BoxFuture<()>,
    dir: &str,
) {
    struct Outcome {
        path: std::path::PathBuf,
        passed: bool,
    }
    impl Drop for Outcome {
        fn drop(&mut self) {
            if let Some(parent) = self.path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::write(&self.path, if self.passed { "pass" } else { "fail" });
        }
    }
    let mut outcome = Outcome {
        path: std::path::Path::new(dir)
            .join("dlock-conformance")
            .join(backend)
            .join(case),
        passed: false,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ctx = Ctx::new(backend, case, factory);
    let finished = rt.block_on(async move { tokio::time::timeout(CASE_TIMEOUT, body(ctx)).await });
    rt.shutdown_timeout(Duration::from_secs(2));
    if finished.is_err() {
        panic!("case {case} on {backend} did not finish within {CASE_TIMEOUT:?}");
    }
    outcome.passed = true;
}

/// Instantiates every applicable case for one backend as `#[test]` functions in a module named
/// after the backend.
///
/// `suite!(label, factory_fn, [groups...])`: `factory_fn` is an `async fn() -> Arc<dyn
/// DistributedLock>` returning a new client each call; groups are `ttl` (leases expire at their
/// ttl: [`lockcore::Expiry::Ttl`]) and `fifo` ([`lockcore::Fairness::Fifo`]).
#[macro_export]
macro_rules! suite {
    ($backend:ident, $factory:path) => {
        $crate::suite!($backend, $factory, []);
    };
    ($backend:ident, $factory:path, [$($group:ident),* $(,)?]) => {
        #[allow(non_snake_case)]
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            fn __factory() -> $crate::BoxFuture<::std::sync::Arc<dyn ::lockcore::DistributedLock>> {
                ::std::boxed::Box::pin($factory())
            }

            $crate::__cases!(
                basic_exclusivity,
                mutual_exclusion_50_tasks,
                try_acquire_race,
                owner_only_release,
                idempotent_release,
                extend_keeps_contender_out,
                fencing_tokens_increase,
                reentrant_balance,
                multi_lock_all_or_nothing,
                multi_lock_no_deadlock,
                wait_for_timeout_leaves_no_trace,
                dropped_acquire_leaves_nothing,
                dropping_guard_releases,
                keep_alive_holds_past_ttl,
                lost_fires_taken,
                with_lock_returns_and_releases,
                bad_names_rejected_before_io,
                bad_options_rejected_before_io,
                unusual_names_usable_and_distinct,
                history_is_safe_under_contention
            );
            $( $crate::__group!($group); )*

            #[test]
            fn capabilities_match_declared_groups() {
                $crate::table::check_and_record(
                    stringify!($backend),
                    __factory,
                    &[$(stringify!($group)),*],
                    env!("CARGO_TARGET_TMPDIR"),
                );
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_case(
                    module_path!().rsplit("::").next().unwrap_or("backend"),
                    stringify!($case),
                    __factory,
                    |ctx| ::std::boxed::Box::pin($crate::cases::$case(ctx)),
                    env!("CARGO_TARGET_TMPDIR"),
                );
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __group {
    (ttl) => {
        $crate::__cases!(
            ttl_expiry_frees_lock,
            extend_after_expiry_is_lock_lost,
            fencing_tokens_increase_across_expiry,
            lost_fires_expired,
            keep_alive_renewal_cap_ends_lease,
            with_lock_stops_work_when_lost
        );
    };
    (fifo) => {
        $crate::__cases!(fifo_waiters_served_in_order);
    };
}
