//! The pinned not-applicable cells against what the `memory` target decides, and the cases
//! about a missing primitive: not applicable where the store has it, a real check where it
//! does not.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use conformance_tests::mutants::{Defect, target};
use conformance_tests::pins::Pins;
use conformance_tests::runner::applicability;
use conformance_tests::{Ctx, Outcome, registry, run_case};

const LIMIT: Duration = Duration::from_secs(60);

/// The cases that check that a store without a primitive refuses it, with the words their
/// reason gives on a store that has it.
const REFUSALS: &[(&str, &str)] = &[
    ("rw_unsupported_says_so", "a store without read-write locks"),
    ("sem_unsupported_says_so", "a store without semaphores"),
    (
        "min_token_unsupported_says_so",
        "a store without token minimums",
    ),
];

fn case(name: &str) -> &'static conformance_tests::Case {
    registry::find(name).unwrap_or_else(|| panic!("{name} is not in the registry"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_pins_are_what_the_memory_target_decides() {
    let memory = common::memory();
    let mut decided = BTreeMap::new();
    for entry in registry::registry() {
        let answer = applicability(&memory, entry, LIMIT)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", entry.name));
        if let Some(reason) = answer {
            decided.insert(entry.name, reason);
        }
    }
    let pinned: BTreeMap<&str, String> = Pins::committed()
        .of("memory")
        .into_iter()
        .map(|(case, reason)| (case, reason.to_owned()))
        .collect();
    assert_eq!(
        decided,
        pinned,
        "the memory target's n/a cells differ from conformance-tests/not-applicable.txt; \
         rewrite it with `{} target/tmp` after running the suite",
        conformance_tests::pins::REWRITE
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_case_is_not_applicable_on_a_store_with_the_primitive() {
    let memory = common::memory();
    for (name, why) in REFUSALS {
        let report = run_case(&memory, case(name), LIMIT).await;
        assert!(
            matches!(&report.outcome, Outcome::NotApplicable { reason } if reason.contains(why)),
            "{name} on memory: {:?}",
            report.outcome
        );
    }
    // And there its body would fail rather than pass: it asserts the refusal.
    for (name, _) in REFUSALS {
        let run = (case(name).run)(Ctx::new(memory.clone(), case(name).name));
        let ended = tokio::spawn(run).await;
        assert!(
            ended.is_err_and(|e| e.is_panic()),
            "{name}'s body passed on a store that has what it says is refused"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_case_runs_and_passes_on_a_store_without_the_primitive() {
    // The toy backend has no read-write locks, no semaphores and no token minimums.
    let toy = target(Defect::NotExclusive);
    for (name, _) in REFUSALS {
        let report = run_case(&toy, case(name), LIMIT).await;
        assert_eq!(report.outcome, Outcome::Passed, "{name} on the toy backend");
    }
    // The cases of the primitive itself are the ones that do not apply there.
    for name in [
        "rw_readers_share_writer_waits",
        "sem_permits_fill_then_refuse",
        "min_token_carries_the_counter",
    ] {
        let report = run_case(&toy, case(name), LIMIT).await;
        assert!(
            matches!(report.outcome, Outcome::NotApplicable { .. }),
            "{name} on the toy backend: {:?}",
            report.outcome
        );
    }
}
