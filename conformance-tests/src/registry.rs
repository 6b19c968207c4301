//! The one list of conformance cases and fault scenarios, each with what it needs.
//!
//! Everything that runs the suite reads this list: the `cargo test` harness of every backend
//! crate ([`crate::harness`]), `dlock check`, and the case × backend table. Adding a case here is
//! the only step needed for every backend to run it (or to list it as not applicable, with the
//! reason).

use lockcore::{Capabilities, Expiry, Fairness};

use crate::{BoxFuture, Ctx, cases, faults, sem_faults};

/// Whether an entry is a conformance case or a fault scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Runs against any store the target can connect to.
    Case,
    /// Breaks something (a server, a link, a process) and checks the recorded history; needs a
    /// store the runner may break (see [`crate::Target::spawn_with`]).
    Fault,
}

/// What a case needs from the store, as a predicate over its [`Capabilities`] and a label that
/// says why a store without it is not tested.
#[derive(Clone, Copy)]
pub struct Needs {
    /// Shown when the predicate rejects a store: "needs `<label>`".
    pub label: &'static str,
    /// Whether the store admits the case.
    pub admits: fn(&Capabilities) -> bool,
}

impl std::fmt::Debug for Needs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Needs({})", self.label)
    }
}

impl Needs {
    /// Every store.
    pub const ANY: Needs = Needs {
        label: "nothing",
        admits: |_| true,
    };
    /// Leases that end at their ttl ([`Expiry::Ttl`]).
    pub const TTL: Needs = Needs {
        label: "ttl expiry",
        admits: |c| c.expiry == Expiry::Ttl,
    };
    /// FIFO waiters ([`Fairness::Fifo`]).
    pub const FIFO: Needs = Needs {
        label: "FIFO fairness",
        admits: |c| c.fairness == Fairness::Fifo,
    };
    /// Read-write locks ([`lockcore::NativePrimitives::read_write`]).
    pub const READ_WRITE: Needs = Needs {
        label: "read-write locks",
        admits: |c| c.native.read_write,
    };
    /// Read-write locks whose holds end at their ttl.
    pub const READ_WRITE_TTL: Needs = Needs {
        label: "read-write locks with ttl expiry",
        admits: |c| c.native.read_write && c.expiry == Expiry::Ttl,
    };
    /// A store without read-write locks: the case checks that such a store refuses them.
    pub const WITHOUT_READ_WRITE: Needs = Needs {
        label: "a store without read-write locks (the case checks that one refuses them)",
        admits: |c| !c.native.read_write,
    };
    /// Counting semaphores ([`lockcore::NativePrimitives::semaphore`]).
    pub const SEMAPHORE: Needs = Needs {
        label: "semaphores",
        admits: |c| c.native.semaphore,
    };
    /// Counting semaphores with FIFO waiters.
    pub const SEMAPHORE_FIFO: Needs = Needs {
        label: "semaphores with FIFO fairness",
        admits: |c| c.native.semaphore && c.fairness == Fairness::Fifo,
    };
    /// Counting semaphores whose permits end at their ttl.
    pub const SEMAPHORE_TTL: Needs = Needs {
        label: "semaphores with ttl expiry",
        admits: |c| c.native.semaphore && c.expiry == Expiry::Ttl,
    };
    /// A store without semaphores: the case checks that such a store refuses them.
    pub const WITHOUT_SEMAPHORE: Needs = Needs {
        label: "a store without semaphores (the case checks that one refuses them)",
        admits: |c| !c.native.semaphore,
    };
    /// Token minimums ([`Capabilities::min_token`]).
    pub const MIN_TOKEN: Needs = Needs {
        label: "token minimums",
        admits: |c| c.min_token,
    };
    /// A store without token minimums: the case checks that such a store refuses one.
    pub const WITHOUT_MIN_TOKEN: Needs = Needs {
        label: "a store without token minimums (the case checks that one refuses them)",
        admits: |c| !c.min_token,
    };
    /// Any [`lockcore::LockName`], kept distinct by escaping, rather than names that must be
    /// paths in the store's tree ([`Capabilities::path_names`]).
    pub const ANY_NAME: Needs = Needs {
        label: "any lock name (names are not store paths)",
        admits: |c| !c.path_names,
    };
    /// Ttl leases on a store other OS processes share.
    pub const TTL_SHARED: Needs = Needs {
        label: "ttl expiry on a store shared across processes",
        admits: |c| c.expiry == Expiry::Ttl && c.shared_across_processes,
    };
}

/// One entry of the registry.
#[derive(Clone, Copy)]
pub struct Case {
    /// Unique snake_case name (the test name, the row of the table).
    pub name: &'static str,
    /// Case or fault scenario.
    pub kind: Kind,
    /// What the store must offer for the case to apply.
    pub needs: Needs,
    /// The case itself: panics (with a message saying what went wrong) when the store fails it.
    pub run: fn(Ctx) -> BoxFuture<()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}

macro_rules! entries {
    ($($kind:ident $module:ident :: $name:ident needs $needs:ident;)*) => {
        &[$(Case {
            name: stringify!($name),
            kind: Kind::$kind,
            needs: Needs::$needs,
            run: |ctx| Box::pin($module::$name(ctx)),
        }),*]
    };
}

static REGISTRY: &[Case] = entries! {
    Case cases::basic_exclusivity needs ANY;
    Case cases::mutual_exclusion_50_tasks needs ANY;
    Case cases::try_acquire_race needs ANY;
    Case cases::owner_only_release needs ANY;
    Case cases::idempotent_release needs ANY;
    Case cases::extend_keeps_contender_out needs ANY;
    Case cases::fencing_tokens_increase needs ANY;
    Case cases::reentrant_balance needs ANY;
    Case cases::multi_lock_all_or_nothing needs ANY;
    Case cases::multi_lock_no_deadlock needs ANY;
    Case cases::wait_for_timeout_leaves_no_trace needs ANY;
    Case cases::dropped_acquire_leaves_nothing needs ANY;
    Case cases::dropping_guard_releases needs ANY;
    Case cases::keep_alive_holds_past_ttl needs ANY;
    Case cases::long_waiter_keeps_its_lease needs ANY;
    Case cases::lost_fires_taken needs ANY;
    Case cases::with_lock_returns_and_releases needs ANY;
    Case cases::bad_names_rejected_before_io needs ANY;
    Case cases::bad_options_rejected_before_io needs ANY;
    Case cases::unusual_names_usable_and_distinct needs ANY_NAME;
    Case cases::history_is_safe_under_contention needs ANY;
    Case cases::forget_removes_only_free_names needs ANY;
    Case cases::ttl_expiry_frees_lock needs TTL;
    Case cases::extend_after_expiry_is_lock_lost needs TTL;
    Case cases::fencing_tokens_increase_across_expiry needs TTL;
    Case cases::lost_fires_expired needs TTL;
    Case cases::keep_alive_renewal_cap_ends_lease needs TTL;
    Case cases::with_lock_stops_work_when_lost needs TTL;
    Case cases::fifo_waiters_served_in_order needs FIFO;
    Case cases::rw_readers_share_writer_waits needs READ_WRITE;
    Case cases::rw_writer_excludes_readers_and_writers needs READ_WRITE;
    Case cases::rw_no_writer_starvation needs READ_WRITE;
    Case cases::rw_tokens_increase_across_writers needs READ_WRITE;
    Case cases::rw_unsupported_says_so needs WITHOUT_READ_WRITE;
    Case cases::sem_permits_fill_then_refuse needs SEMAPHORE;
    Case cases::sem_history_never_exceeds_permits needs SEMAPHORE;
    Case cases::sem_waiter_woken_when_a_permit_frees needs SEMAPHORE;
    Case cases::sem_fifo_waiters_served_in_order needs SEMAPHORE_FIFO;
    Case cases::sem_expired_permit_comes_back needs SEMAPHORE_TTL;
    Case cases::sem_mismatched_permits_rejected needs SEMAPHORE;
    Case cases::sem_dropped_acquire_leaves_nothing needs SEMAPHORE;
    Case cases::sem_bad_count_rejected_before_io needs ANY;
    Case cases::sem_unsupported_says_so needs WITHOUT_SEMAPHORE;
    Case cases::chosen_owner_is_recorded needs ANY;
    Case cases::min_token_carries_the_counter needs MIN_TOKEN;
    Case cases::min_token_unsupported_says_so needs WITHOUT_MIN_TOKEN;
    Fault faults::client_paused_past_ttl needs TTL;
    Fault faults::holder_process_killed needs TTL_SHARED;
    Fault faults::server_killed_and_restarted needs ANY;
    Fault faults::server_killed_and_restarted_without_persistence needs ANY;
    Fault faults::server_paused_past_ttl needs TTL;
    Fault faults::holder_replies_blackholed_past_ttl needs TTL;
    Fault faults::holder_requests_blackholed_past_ttl needs TTL;
    Fault faults::store_connections_killed needs ANY;
    Fault sem_faults::sem_server_killed_and_restarted needs SEMAPHORE;
    Fault sem_faults::sem_holder_blackholed_past_ttl needs SEMAPHORE_TTL;
    Fault sem_faults::sem_client_paused_past_ttl needs SEMAPHORE_TTL;
    Fault faults::rw_reader_paused_past_ttl needs READ_WRITE_TTL;
    Fault faults::rw_reader_server_killed_and_restarted needs READ_WRITE;
    Fault faults::rw_reader_blackholed_past_ttl needs READ_WRITE_TTL;
};

/// Every case and fault scenario, in a stable order (cases first).
pub fn registry() -> &'static [Case] {
    REGISTRY
}

/// The entry named `name`.
pub fn find(name: &str) -> Option<&'static Case> {
    REGISTRY.iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for case in registry() {
            assert!(seen.insert(case.name), "{} is listed twice", case.name);
            assert!(
                case.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{} is not snake_case",
                case.name
            );
        }
        assert!(find("basic_exclusivity").is_some());
        assert!(find("no_such_case").is_none());
    }
}
