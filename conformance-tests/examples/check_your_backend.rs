//! Runs the shared suite against a backend of your own: here the in-memory one stands in for it.
//! A backend's `tests/conformance.rs` does the same through `harness::main`, one test per case.
//!
//! ```text
//! cargo run -p fencedlock-conformance --example check_your_backend [REGEX]
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use conformance_tests::{CASE_TIMEOUT, Kind, Outcome, Target, run_all};
use lockcore::{DistributedLock, MemoryLock};

#[tokio::main]
async fn main() -> ExitCode {
    // What the cases call to get a client: one per call, all on the same store.
    let target = Target::new("mine", "memory://check-your-backend", |url| async move {
        Ok(Arc::new(MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
    })
    // No server to kill or pause: the fault scenarios are not applicable, with this reason.
    .without_server("in-process store: there is no server to break");

    let only = std::env::args().nth(1).unwrap_or_default();
    let reports = run_all(
        &target,
        |case| case.kind == Kind::Case && case.name.contains(only.as_str()),
        CASE_TIMEOUT,
        |report| println!("{:4} {}", report.outcome.short(), report.case),
    )
    .await;

    let failed: Vec<_> = reports
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Failed { message } => Some(format!("{}: {message}", r.case)),
            _ => None,
        })
        .collect();
    for failure in &failed {
        eprintln!("FAIL {failure}");
    }
    println!("{} cases, {} failed", reports.len(), failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
