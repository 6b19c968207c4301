//! The suite's own check: each case must fail against a backend broken in the way the case is
//! about (`conformance_tests::mutants`). A case that passes against its mutant asserts nothing
//! useful. Each check goes through the same runner `dlock check` uses, so it also shows that a
//! failing case becomes a failed outcome with its message.

use std::time::Duration;

use conformance_tests::mutants::{Defect, target};
use conformance_tests::{Outcome, Target, registry, run_case};

/// Runs `case` against `target` (a backend broken in the way the case is about) and asserts
/// that it fails, rather than passing or hanging; `what` names the defect in messages.
fn fails_against(case: &'static str, target: &Target, what: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let entry = registry::find(case).expect("a registry case");
    let report = rt.block_on(run_case(target, entry, Duration::from_secs(120)));
    rt.shutdown_timeout(Duration::from_secs(1));
    match report.outcome {
        Outcome::Failed { message } => assert!(
            !message.contains("did not finish within"),
            "case {case} hung against {what} instead of failing"
        ),
        other => panic!("case {case} did not fail against {what}: {other:?}"),
    }
}

/// Runs `case` against the mutant with `defect` and asserts that it fails.
fn must_fail(case: &'static str, defect: Defect) {
    fails_against(case, &target(defect), &format!("a backend with {defect:?}"));
}

macro_rules! caught_by {
    ($test:ident: $case:ident on $defect:ident) => {
        #[test]
        fn $test() {
            must_fail(stringify!($case), Defect::$defect);
        }
    };
}

caught_by!(exclusivity_catches_non_exclusive: basic_exclusivity on NotExclusive);
caught_by!(contention_catches_non_exclusive: mutual_exclusion_50_tasks on NotExclusive);
caught_by!(race_catches_non_exclusive: try_acquire_race on NotExclusive);
caught_by!(history_catches_non_exclusive: history_is_safe_under_contention on NotExclusive);
caught_by!(owner_check_catches_sloppy_release: owner_only_release on ReleaseIgnoresOwner);
caught_by!(idempotence_catches_sloppy_release: idempotent_release on ReleaseIgnoresOwner);
caught_by!(fencing_catches_constant_token: fencing_tokens_increase on ConstantToken);
caught_by!(expiry_fencing_catches_constant_token: fencing_tokens_increase_across_expiry on ConstantToken);
caught_by!(history_catches_constant_token: history_is_safe_under_contention on ConstantToken);
caught_by!(extend_case_catches_resurrection: extend_after_expiry_is_lock_lost on ExtendResurrects);
caught_by!(owner_check_catches_resurrection: owner_only_release on ExtendResurrects);
caught_by!(expiry_case_catches_immortal_leases: ttl_expiry_frees_lock on NeverExpires);
caught_by!(expiry_case_catches_early_expiry: ttl_expiry_frees_lock on ExpiresEarly);
caught_by!(extend_case_catches_noop_extend: extend_keeps_contender_out on ExtendIsNoop);
caught_by!(keep_alive_case_catches_noop_extend: keep_alive_holds_past_ttl on ExtendIsNoop);
caught_by!(lost_expired_case_catches_immortal_leases: lost_fires_expired on NeverExpires);
caught_by!(drop_case_catches_noop_release: dropping_guard_releases on ReleaseIsNoop);
caught_by!(timeout_case_catches_noop_release: wait_for_timeout_leaves_no_trace on ReleaseIsNoop);
caught_by!(reentrant_case_catches_noop_release: reentrant_balance on ReleaseIsNoop);
caught_by!(multi_case_catches_noop_release: multi_lock_all_or_nothing on ReleaseIsNoop);
caught_by!(names_case_catches_noop_release: unusual_names_usable_and_distinct on ReleaseIsNoop);
caught_by!(lost_case_catches_sloppy_release: lost_fires_taken on ReleaseIsNoop);

/// The read-write cases fail against a backend whose readers and writers ignore each other.
#[test]
fn read_write_cases_catch_blind_readers() {
    for case in [
        "rw_readers_share_writer_waits",
        "rw_writer_excludes_readers_and_writers",
        "rw_no_writer_starvation",
    ] {
        let target = conformance_tests::mutants::blind_readers_target();
        fails_against(case, &target, "blind readers");
    }
}

/// A fault scenario goes through the same verdict: declared safe on a backend whose leases
/// never expire (the paused client is never replaced) or whose tokens do not grow, it fails.
#[test]
fn paused_client_scenario_catches_immortal_leases_and_constant_tokens() {
    for defect in [Defect::NeverExpires, Defect::ConstantToken] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let declared =
            target(defect).fault("client_paused_past_ttl", conformance_tests::Expect::Safe);
        let entry = registry::find("client_paused_past_ttl").unwrap();
        let report = rt.block_on(run_case(&declared, entry, Duration::from_secs(150)));
        rt.shutdown_timeout(Duration::from_secs(1));
        assert!(
            matches!(report.outcome, Outcome::Failed { .. }),
            "client_paused_past_ttl passed against {defect:?}: {:?}",
            report.outcome
        );
    }
}

/// Runs `case` against the semaphore mutant with `defect` and asserts that it fails.
fn semaphore_case_must_fail(
    case: &'static str,
    defect: conformance_tests::mutants::SemaphoreDefect,
) {
    let target = conformance_tests::mutants::semaphore_target(defect);
    fails_against(case, &target, &format!("a semaphore with {defect:?}"));
}

#[test]
fn semaphore_cases_catch_overbooking() {
    use conformance_tests::mutants::SemaphoreDefect::Overbooked;
    semaphore_case_must_fail("sem_permits_fill_then_refuse", Overbooked);
    semaphore_case_must_fail("sem_history_never_exceeds_permits", Overbooked);
    semaphore_case_must_fail("sem_waiter_woken_when_a_permit_frees", Overbooked);
}

#[test]
fn semaphore_cases_catch_an_ignored_count() {
    use conformance_tests::mutants::SemaphoreDefect::CountIgnored;
    semaphore_case_must_fail("sem_mismatched_permits_rejected", CountIgnored);
}

#[test]
fn semaphore_cases_catch_a_leaky_wait() {
    use conformance_tests::mutants::SemaphoreDefect::LeakyWait;
    semaphore_case_must_fail("sem_dropped_acquire_leaves_nothing", LeakyWait);
}

/// The paused-client scenarios of the other primitives, declared safe on a mutant, fail: a
/// semaphore that overbooks hands a third permit out while the paused holder's is still live,
/// and readers that ignore writers let the writer in beside the paused reader.
#[test]
fn paused_client_scenarios_catch_overbooking_and_blind_readers() {
    use conformance_tests::Expect;
    use conformance_tests::mutants::SemaphoreDefect::Overbooked;
    let overbooked = conformance_tests::mutants::semaphore_target(Overbooked)
        .fault("sem_client_paused_past_ttl", Expect::Safe);
    fails_against(
        "sem_client_paused_past_ttl",
        &overbooked,
        "an overbooking semaphore",
    );
    let blind = conformance_tests::mutants::blind_readers_target()
        .fault("rw_reader_paused_past_ttl", Expect::Safe);
    fails_against("rw_reader_paused_past_ttl", &blind, "blind readers");
}
