//! Recorded lock histories and the safety checker.
//!
//! Every acquisition is recorded with monotonic timestamps: when the acquire call returned, the
//! lease's `valid_until`, and when the holder stopped relying on it (just before it asked to
//! release). A holder's window is `[acquired, min(end, valid_until)]`. The checker asserts that,
//! per lock name, no two windows overlap and that fencing tokens grow with acquisition order;
//! for a semaphore ([`check_permits`]), that no more windows than its permits are open at once
//! and that no token is handed out twice.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockcore::{DistributedLock, Lease};

/// One holder's tenure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Which client held it (test-chosen number).
    pub client: usize,
    /// Lock name.
    pub name: String,
    /// Fencing token of the acquisition.
    pub token: u64,
    /// When the acquire call returned.
    pub acquired: Instant,
    /// The lease's `valid_until` (after the last renewal).
    pub valid_until: Instant,
    /// When the holder stopped relying on the lock (set just before release); `None` if it
    /// never released (the lease ran out).
    pub ended: Option<Instant>,
}

impl Hold {
    /// The end of the window in which this holder may act on the lock.
    pub fn window_end(&self) -> Instant {
        self.ended
            .map_or(self.valid_until, |e| e.min(self.valid_until))
    }
}

/// Whether `lease`'s `valid_until` lies past the store's own expiry of it, by the store's own
/// word: `client` asks the store ([`DistributedLock::inspect`]) for the time left on the
/// lease, and the store's expiry is then at most the instant the reply arrived plus that time
/// (plus 1 ms for a store that rounds it down). A checker that records holds can see only
/// what the lease claims; this sees whether the claim is the store's. `None` when the store
/// says nothing to compare (no inspect, no time left reported, or another holder by now).
pub async fn overpromised(client: &dyn DistributedLock, lease: &Lease) -> Option<Violation> {
    let info = client.inspect(lease.name()).await.ok()??;
    let replied = Instant::now();
    if info.holder.as_deref() != Some(lease.owner().to_string().as_str()) {
        return None;
    }
    let bound = replied + info.remaining? + Duration::from_millis(1);
    (lease.valid_until() > bound).then(|| Violation::Overpromised {
        name: lease.name().as_str().to_owned(),
        token: lease.token().0,
        by: lease.valid_until() - bound,
    })
}

/// A safety violation found in a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two holders' windows overlap on one name.
    Overlap {
        /// The earlier acquisition.
        first: Hold,
        /// The later acquisition, which began before `first`'s window ended.
        second: Hold,
    },
    /// A later acquisition got a token not greater than an earlier one.
    TokenNotIncreasing {
        /// The earlier acquisition.
        earlier: Hold,
        /// The later acquisition.
        later: Hold,
    },
    /// More holders of a semaphore's permits at once than it has permits.
    TooManyHolders {
        /// The semaphore's count.
        permits: usize,
        /// The holds whose windows were open together, in acquisition order (the last one
        /// made them too many).
        holds: Vec<Hold>,
    },
    /// Two permit grants of one semaphore got the same token.
    TokenReused {
        /// The earlier acquisition.
        first: Hold,
        /// The later acquisition with the same token.
        second: Hold,
    },
    /// A lease promised validity past the store's own expiry of it (see [`overpromised`]).
    Overpromised {
        /// The lock name.
        name: String,
        /// The lease's token.
        token: u64,
        /// How far `valid_until` lies past the latest expiry the store's word allows.
        by: Duration,
    },
}

impl Violation {
    /// The acquisition that revealed the violation: when it happened, for reports.
    pub fn at(&self) -> Instant {
        match self {
            Violation::Overlap { second, .. } | Violation::TokenReused { second, .. } => {
                second.acquired
            }
            Violation::TokenNotIncreasing { later, .. } => later.acquired,
            Violation::TooManyHolders { holds, .. } => {
                holds.last().map_or_else(Instant::now, |h| h.acquired)
            }
            Violation::Overpromised { .. } => Instant::now(),
        }
    }

    /// A short kind name (`overlap`, `token-order`, `too-many-holders`, `token-reused`).
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::Overlap { .. } => "overlap",
            Violation::TokenNotIncreasing { .. } => "token-order",
            Violation::TooManyHolders { .. } => "too-many-holders",
            Violation::TokenReused { .. } => "token-reused",
            Violation::Overpromised { .. } => "overpromised",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "overlap on {:?}: client {} (token {}) held until {:?} after client {} (token {}) acquired",
                first.name,
                first.client,
                first.token,
                first
                    .window_end()
                    .saturating_duration_since(second.acquired),
                second.client,
                second.token
            ),
            Violation::TokenNotIncreasing { earlier, later } => write!(
                f,
                "token order on {:?}: client {} got token {} after client {} had token {}",
                earlier.name, later.client, later.token, earlier.client, earlier.token
            ),
            Violation::TooManyHolders { permits, holds } => write!(
                f,
                "{} holders of {:?} at once with {permits} permits: {}",
                holds.len(),
                holds.first().map_or("", |h| h.name.as_str()),
                holds
                    .iter()
                    .map(|h| format!("client {} (token {})", h.client, h.token))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Violation::TokenReused { first, second } => write!(
                f,
                "token {} of {:?} handed out twice: to client {} and to client {}",
                first.token, first.name, first.client, second.client
            ),
            Violation::Overpromised { name, token, by } => write!(
                f,
                "the lease on {name:?} (token {token}) is valid {by:?} past the store's own \
                 expiry of it"
            ),
        }
    }
}

/// The holds of each name, in acquisition order.
fn by_name(holds: &[Hold]) -> impl Iterator<Item = Vec<&Hold>> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<&Hold>> = Default::default();
    for h in holds {
        by_name.entry(&h.name).or_default().push(h);
    }
    by_name.into_values().map(|mut hs| {
        hs.sort_by_key(|h| h.acquired);
        hs
    })
}

/// Checks a set of holds (any order, any names).
pub fn check(holds: &[Hold]) -> Vec<Violation> {
    let mut out = Vec::new();
    for hs in by_name(holds) {
        for pair in hs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.token <= a.token {
                out.push(Violation::TokenNotIncreasing {
                    earlier: a.clone(),
                    later: b.clone(),
                });
            }
        }
        // Overlap: compare each hold against every earlier one whose window is still open.
        for (i, b) in hs.iter().enumerate() {
            for a in &hs[..i] {
                if a.window_end() > b.acquired {
                    out.push(Violation::Overlap {
                        first: (*a).clone(),
                        second: (*b).clone(),
                    });
                }
            }
        }
    }
    out
}

/// Checks the holds of semaphores that have `permits` permits each (any order, any names): per
/// name, never more than `permits` windows open at once, and no token given twice. (Grants that
/// race may return in another order than their tokens, so token order is checked only where
/// one grant came after another: a case does that with grants in sequence.)
pub fn check_permits(holds: &[Hold], permits: usize) -> Vec<Violation> {
    let mut out = Vec::new();
    for hs in by_name(holds) {
        let mut seen: std::collections::HashMap<u64, &Hold> = Default::default();
        for h in &hs {
            if let Some(first) = seen.insert(h.token, h) {
                out.push(Violation::TokenReused {
                    first: first.clone(),
                    second: (*h).clone(),
                });
            }
        }
        // At each acquisition, the holds acquired before it whose windows are still open.
        let mut reported_until: Option<Instant> = None;
        for (i, b) in hs.iter().enumerate() {
            let open: Vec<&Hold> = hs[..i]
                .iter()
                .copied()
                .filter(|a| a.window_end() > b.acquired)
                .collect();
            // One report per stretch of excess, not one per holder in it.
            if open.len() >= permits && reported_until.is_none_or(|t| b.acquired >= t) {
                reported_until = open.iter().map(|a| a.window_end()).min();
                let mut together: Vec<Hold> = open.into_iter().cloned().collect();
                together.push((*b).clone());
                out.push(Violation::TooManyHolders {
                    permits,
                    holds: together,
                });
            }
        }
    }
    out
}

/// A thread-safe recorder for one test's history.
#[derive(Debug, Default)]
pub struct History {
    holds: Mutex<Vec<Hold>>,
}

/// Index of a recorded hold, to close it later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldId(usize);

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    fn holds_mut(&self) -> std::sync::MutexGuard<'_, Vec<Hold>> {
        self.holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `client` got `lease` just now.
    pub fn acquired(&self, client: usize, lease: &Lease) -> HoldId {
        let mut holds = self.holds_mut();
        holds.push(Hold {
            client,
            name: lease.name().as_str().to_owned(),
            token: lease.token().0,
            acquired: Instant::now(),
            valid_until: lease.valid_until(),
            ended: None,
        });
        HoldId(holds.len() - 1)
    }

    /// Records a renewal (the window may now extend to the new `valid_until`).
    pub fn extended(&self, id: HoldId, lease: &Lease) {
        self.holds_mut()[id.0].valid_until = lease.valid_until();
    }

    /// Records that the holder stops relying on the lock now (call before releasing).
    pub fn ended(&self, id: HoldId) {
        self.holds_mut()[id.0].ended = Some(Instant::now());
    }

    /// Adds a hold as is (for checker tests and replayed histories).
    pub fn push(&self, hold: Hold) {
        self.holds_mut().push(hold);
    }

    /// A copy of everything recorded.
    pub fn holds(&self) -> Vec<Hold> {
        self.holds_mut().clone()
    }

    /// Runs [`check`] on the recorded holds.
    pub fn violations(&self) -> Vec<Violation> {
        check(&self.holds())
    }

    /// Panics with every violation listed if there is any.
    pub fn assert_safe(&self) {
        report(&self.violations());
    }

    /// Panics with every violation listed if the holds break a semaphore of `permits` permits
    /// (see [`check_permits`]).
    pub fn assert_at_most(&self, permits: usize) {
        report(&check_permits(&self.holds(), permits));
    }
}

/// Panics with every violation in `v` listed, if there is any.
fn report(v: &[Violation]) {
    assert!(
        v.is_empty(),
        "{} safety violation(s):\n{}",
        v.len(),
        v.iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hold(client: usize, token: u64, from_ms: u64, to_ms: u64, base: Instant) -> Hold {
        Hold {
            client,
            name: "n".into(),
            token,
            acquired: base + Duration::from_millis(from_ms),
            valid_until: base + Duration::from_millis(to_ms + 1000),
            ended: Some(base + Duration::from_millis(to_ms)),
        }
    }

    #[test]
    fn clean_history_passes() {
        let base = Instant::now();
        let h = [
            hold(0, 1, 0, 10, base),
            hold(1, 2, 11, 20, base),
            hold(0, 5, 25, 30, base),
        ];
        assert!(check(&h).is_empty());
    }

    #[test]
    fn overlap_is_reported() {
        let base = Instant::now();
        let h = [hold(0, 1, 0, 10, base), hold(1, 2, 5, 20, base)];
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(
            matches!(&v[0], Violation::Overlap { first, second } if first.client == 0 && second.client == 1)
        );
    }

    #[test]
    fn overlap_through_expiry_window_is_reported() {
        // The first holder never released; its lease was valid until 100 ms, and the second
        // acquired at 50 ms: both could act at once.
        let base = Instant::now();
        let first = Hold {
            client: 0,
            name: "n".into(),
            token: 1,
            acquired: base,
            valid_until: base + Duration::from_millis(100),
            ended: None,
        };
        let second = hold(1, 2, 50, 60, base);
        assert!(matches!(
            check(&[first, second])[..],
            [Violation::Overlap { .. }]
        ));
    }

    #[test]
    fn token_going_backwards_is_reported() {
        let base = Instant::now();
        let h = [hold(0, 7, 0, 10, base), hold(1, 3, 20, 30, base)];
        let v = check(&h);
        assert!(
            matches!(&v[..], [Violation::TokenNotIncreasing { earlier, later }] if earlier.token == 7 && later.token == 3)
        );
    }

    #[test]
    fn equal_tokens_are_reported() {
        let base = Instant::now();
        let h = [hold(0, 4, 0, 10, base), hold(1, 4, 20, 30, base)];
        assert!(matches!(
            check(&h)[..],
            [Violation::TokenNotIncreasing { .. }]
        ));
    }

    #[test]
    fn names_are_checked_separately() {
        let base = Instant::now();
        let mut other = hold(1, 1, 5, 20, base);
        other.name = "m".into();
        assert!(check(&[hold(0, 1, 0, 10, base), other]).is_empty());
    }

    #[test]
    #[should_panic(expected = "safety violation")]
    fn assert_safe_panics_on_violation() {
        let base = Instant::now();
        let h = History::new();
        h.push(hold(0, 2, 0, 10, base));
        h.push(hold(1, 1, 5, 20, base));
        h.assert_safe();
    }

    #[test]
    fn permits_allow_that_many_holders_and_no_more() {
        let base = Instant::now();
        // Two permits: 0 and 1 overlap (fine), 2 starts after 0 ended (fine).
        let fine = [
            hold(0, 1, 0, 10, base),
            hold(1, 2, 5, 20, base),
            hold(2, 3, 12, 30, base),
        ];
        assert!(check_permits(&fine, 2).is_empty());
        assert!(
            matches!(&check(&fine)[..], [Violation::Overlap { .. }, ..]),
            "the mutex checker still calls it an overlap"
        );
        // A third holder while two are in: reported once, naming all three.
        let crowded = [
            hold(0, 1, 0, 10, base),
            hold(1, 2, 5, 20, base),
            hold(2, 3, 8, 30, base),
        ];
        let v = check_permits(&crowded, 2);
        assert!(
            matches!(&v[..], [Violation::TooManyHolders { permits: 2, holds }] if holds.len() == 3 && holds[2].client == 2),
            "{v:?}"
        );
        assert!(check_permits(&crowded, 3).is_empty());
    }

    #[test]
    fn a_permit_token_given_twice_is_reported() {
        let base = Instant::now();
        let h = [hold(0, 4, 0, 10, base), hold(1, 4, 2, 30, base)];
        let v = check_permits(&h, 2);
        assert!(
            matches!(&v[..], [Violation::TokenReused { first, second }] if first.client == 0 && second.client == 1),
            "{v:?}"
        );
    }
}
