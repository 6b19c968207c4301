//! The runner's rule for fault declarations: a scenario that applies to a target must be
//! declared there; one whose capability the store lacks need not be.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{Expect, Outcome, Target, registry, run_case};
use lockcore::{DistributedLock, MemoryLock};

fn memory_target(label: &str) -> Target {
    Target::new(label, "memory://runner-rule", |url: String| async move {
        Ok(Arc::new(MemoryLock::from_url(&url)?) as Arc<dyn DistributedLock>)
    })
    .fault(
        "store_connections_killed",
        Expect::NotApplicable("no server"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applicable_undeclared_scenario_fails_and_an_inapplicable_one_is_not_applicable() {
    let target = memory_target("runner-rule");
    // memory:// has semaphores: the semaphore scenario applies, and is not declared.
    let sem = registry::find("sem_server_killed_and_restarted").expect("registered");
    let report = run_case(&target, sem, Duration::from_secs(30)).await;
    assert!(
        matches!(&report.outcome, Outcome::Failed { message } if message.contains("not declared")),
        "{:?}",
        report.outcome
    );
    // A declared not-applicable scenario stays so.
    let killed = registry::find("store_connections_killed").expect("registered");
    let report = run_case(&target, killed, Duration::from_secs(30)).await;
    assert!(
        matches!(report.outcome, Outcome::NotApplicable { .. }),
        "{:?}",
        report.outcome
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_semaphores_need_not_declare_their_scenarios() {
    use conformance_tests::mutants::{Defect, target};
    let target = target(Defect::ReleaseIsNoop).fault(
        "store_connections_killed",
        Expect::NotApplicable("no server"),
    );
    let sem = registry::find("sem_server_killed_and_restarted").expect("registered");
    let report = run_case(&target, sem, Duration::from_secs(30)).await;
    assert!(
        matches!(&report.outcome, Outcome::NotApplicable { reason } if reason.contains("semaphores")),
        "{:?}",
        report.outcome
    );
}

/// A failed case's message carries what the library logged about its locks: here a store
/// whose extend changes nothing, so the keep-alive case finds the renewed lease valid past the
/// store's own expiry of it, while the renewer's log shows the renewal sent and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_case_shows_what_the_library_logged_about_its_locks() {
    use conformance_tests::mutants::{Defect, target};
    conformance_tests::timeline::install();
    let target = target(Defect::ExtendIsNoop);
    let case = registry::find("keep_alive_holds_past_ttl").expect("registered");
    let report = run_case(&target, case, Duration::from_secs(60)).await;
    let Outcome::Failed { message } = &report.outcome else {
        panic!("the mutant passed: {:?}", report.outcome);
    };
    assert!(message.contains("past the store's own expiry"), "{message}");
    assert!(
        message.contains("what the library logged about its locks"),
        "{message}"
    );
    assert!(
        message.contains("[x] TRACE lockcore::renewer: renewal sent")
            && message.contains("[x] TRACE lockcore::renewer: lease renewed"),
        "{message}"
    );
}
