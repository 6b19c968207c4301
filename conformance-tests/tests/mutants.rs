//! The suite's own check: each case must fail against a backend broken in the way the case is
//! about. A case that passes against its mutant asserts nothing useful.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use conformance_tests::{BoxFuture, Ctx, cases};
use lockcore::{
    AcquireOptions, Capabilities, DistributedLock, Error, Expiry, Fairness, Fencing, FencingToken,
    Lease, LockInfo, LockName, OwnerId, Released, Result, WaitMechanism, async_trait,
};

/// Which defect a toy backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defect {
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

#[derive(Debug)]
struct Toy {
    defect: Defect,
    state: &'static Mutex<State>,
}

fn state(defect: Defect) -> &'static Mutex<State> {
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
            .is_some_and(|h| self.defect == Defect::NeverExpires || h.expires > now);
        if live && self.defect != Defect::NotExclusive {
            return Ok(None);
        }
        let fence = s.fence.entry(name.clone()).or_default();
        *fence += 1;
        let token = if self.defect == Defect::ConstantToken {
            1
        } else {
            *fence
        };
        let owner = OwnerId::random();
        let ttl = opts.ttl_value();
        let life = if self.defect == Defect::ExpiresEarly {
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
        if self.defect == Defect::ReleaseIsNoop {
            return Ok(Released::Released);
        }
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let ok = s.holders.get(lease.name()).is_some_and(|h| {
            self.defect == Defect::ReleaseIgnoresOwner
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
        if self.defect == Defect::ExtendIsNoop {
            return Ok(lease.renewed(started, ttl));
        }
        if self.defect == Defect::ExtendResurrects {
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
                    && (h.expires > now || self.defect == Defect::NeverExpires) =>
            {
                h.expires = now + ttl;
                Ok(lease.renewed(started, ttl))
            }
            _ => Err(Error::lock_lost("toy", lease.name(), "extend")),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = self.state.lock().unwrap();
        let now = Instant::now();
        Ok(s.holders.get(name).filter(|h| h.expires > now).map(|h| {
            LockInfo::new(
                name,
                Some(h.owner.to_string()),
                Some(FencingToken(h.token)),
                None,
                None,
            )
        }))
    }
}

macro_rules! factory {
    ($fn:ident, $defect:expr) => {
        fn $fn() -> BoxFuture<Arc<dyn DistributedLock>> {
            Box::pin(async {
                Arc::new(Toy {
                    defect: $defect,
                    state: state($defect),
                }) as Arc<dyn DistributedLock>
            })
        }
    };
}

factory!(not_exclusive, Defect::NotExclusive);
factory!(release_ignores_owner, Defect::ReleaseIgnoresOwner);
factory!(constant_token, Defect::ConstantToken);
factory!(extend_resurrects, Defect::ExtendResurrects);
factory!(never_expires, Defect::NeverExpires);
factory!(expires_early, Defect::ExpiresEarly);
factory!(release_is_noop, Defect::ReleaseIsNoop);
factory!(extend_is_noop, Defect::ExtendIsNoop);

/// Runs `case` against the mutant from `factory` and asserts that it fails.
fn must_fail(
    case: &'static str,
    factory: conformance_tests::Factory,
    body: fn(Ctx) -> BoxFuture<()>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(async move {
        let ctx = Ctx::new("mutant", case, factory);
        let run = tokio::spawn(body(ctx));
        tokio::time::timeout(Duration::from_secs(120), run).await
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(Ok(())) => {
            panic!("case {case} passed against a backend with the defect it should catch")
        }
        Ok(Err(e)) => assert!(e.is_panic(), "case {case} was cancelled, not failed"),
        Err(_) => panic!("case {case} hung against the mutant instead of failing"),
    }
}

macro_rules! caught_by {
    ($test:ident: $case:ident on $factory:ident) => {
        #[test]
        fn $test() {
            must_fail(stringify!($case), $factory, |ctx| {
                Box::pin(cases::$case(ctx))
            });
        }
    };
}

caught_by!(exclusivity_catches_non_exclusive: basic_exclusivity on not_exclusive);
caught_by!(contention_catches_non_exclusive: mutual_exclusion_50_tasks on not_exclusive);
caught_by!(race_catches_non_exclusive: try_acquire_race on not_exclusive);
caught_by!(history_catches_non_exclusive: history_is_safe_under_contention on not_exclusive);
caught_by!(owner_check_catches_sloppy_release: owner_only_release on release_ignores_owner);
caught_by!(idempotence_catches_sloppy_release: idempotent_release on release_ignores_owner);
caught_by!(fencing_catches_constant_token: fencing_tokens_increase on constant_token);
caught_by!(expiry_fencing_catches_constant_token: fencing_tokens_increase_across_expiry on constant_token);
caught_by!(history_catches_constant_token: history_is_safe_under_contention on constant_token);
caught_by!(extend_case_catches_resurrection: extend_after_expiry_is_lock_lost on extend_resurrects);
caught_by!(owner_check_catches_resurrection: owner_only_release on extend_resurrects);
caught_by!(expiry_case_catches_immortal_leases: ttl_expiry_frees_lock on never_expires);
caught_by!(expiry_case_catches_early_expiry: ttl_expiry_frees_lock on expires_early);
caught_by!(extend_case_catches_noop_extend: extend_keeps_contender_out on extend_is_noop);
caught_by!(keep_alive_case_catches_noop_extend: keep_alive_holds_past_ttl on extend_is_noop);
caught_by!(lost_expired_case_catches_immortal_leases: lost_fires_expired on never_expires);
caught_by!(drop_case_catches_noop_release: dropping_guard_releases on release_is_noop);
caught_by!(timeout_case_catches_noop_release: wait_for_timeout_leaves_no_trace on release_is_noop);
caught_by!(reentrant_case_catches_noop_release: reentrant_balance on release_is_noop);
caught_by!(multi_case_catches_noop_release: multi_lock_all_or_nothing on release_is_noop);
caught_by!(names_case_catches_noop_release: unusual_names_usable_and_distinct on release_is_noop);
caught_by!(lost_case_catches_sloppy_release: lost_fires_taken on release_is_noop);
