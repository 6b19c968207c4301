//! The case × backend table: which cases each backend runs, and why others are excluded.

use std::path::Path;

use lockcore::{Expiry, Fairness};

use crate::Factory;

/// Every case and the capability group it belongs to (`core` runs on every backend).
pub const CASES: &[(&str, &str)] = &[
    ("basic_exclusivity", "core"),
    ("mutual_exclusion_50_tasks", "core"),
    ("try_acquire_race", "core"),
    ("owner_only_release", "core"),
    ("idempotent_release", "core"),
    ("extend_keeps_contender_out", "core"),
    ("fencing_tokens_increase", "core"),
    ("reentrant_balance", "core"),
    ("multi_lock_all_or_nothing", "core"),
    ("multi_lock_no_deadlock", "core"),
    ("wait_for_timeout_leaves_no_trace", "core"),
    ("dropped_acquire_leaves_nothing", "core"),
    ("dropping_guard_releases", "core"),
    ("keep_alive_holds_past_ttl", "core"),
    ("lost_fires_taken", "core"),
    ("with_lock_returns_and_releases", "core"),
    ("bad_names_rejected_before_io", "core"),
    ("bad_options_rejected_before_io", "core"),
    ("unusual_names_usable_and_distinct", "core"),
    ("history_is_safe_under_contention", "core"),
    ("ttl_expiry_frees_lock", "ttl"),
    ("extend_after_expiry_is_lock_lost", "ttl"),
    ("fencing_tokens_increase_across_expiry", "ttl"),
    ("lost_fires_expired", "ttl"),
    ("keep_alive_renewal_cap_ends_lease", "ttl"),
    ("with_lock_stops_work_when_lost", "ttl"),
    ("fifo_waiters_served_in_order", "fifo"),
];

/// The groups a backend's capabilities call for.
pub fn groups_for(caps: &lockcore::Capabilities) -> Vec<&'static str> {
    let mut g = Vec::new();
    if caps.expiry == Expiry::Ttl {
        g.push("ttl");
    }
    if caps.fairness == Fairness::Fifo {
        g.push("fifo");
    }
    g
}

/// Asserts that the declared groups are exactly those the capabilities call for, then writes
/// this backend's plan (which cases run, which are excluded and why) to
/// `<dir>/dlock-conformance/<backend>.tsv` and prints it. Each case writes its own outcome next
/// to it (see [`crate::run_case`]); `scripts/test` joins the two into the case × backend table.
pub fn check_and_record(backend: &'static str, factory: Factory, declared: &[&str], dir: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let caps = rt.block_on(async { factory().await.capabilities() });
    let mut want = groups_for(&caps);
    let mut got: Vec<&str> = declared.to_vec();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(
        got, want,
        "{backend}: suite! declares groups {got:?} but its capabilities ({caps}) call for {want:?}"
    );
    let mut rows = String::new();
    for (case, group) in CASES {
        let status = if *group == "core" || declared.contains(group) {
            "run".to_owned()
        } else {
            format!("n/a ({group})")
        };
        rows.push_str(&format!("{backend}\t{case}\t{status}\n"));
    }
    let out = Path::new(dir).join("dlock-conformance");
    std::fs::create_dir_all(&out).expect("create table dir");
    std::fs::write(out.join(format!("{backend}.tsv")), &rows).expect("write table row");
    eprintln!("conformance table for {backend} ({caps}):\n{rows}");
}
