//! A resource protected by fencing tokens: it remembers the highest token it has seen and
//! rejects any write that carries a lower one.

use std::sync::Mutex;

use lockcore::FencingToken;

#[derive(Debug, Default)]
struct State {
    highest: Option<u64>,
    accepted: Vec<(u64, u64)>,
    rejected: u64,
}

/// A write refused because a newer holder had already written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// Token the writer presented.
    pub token: u64,
    /// Highest token the resource had seen.
    pub highest: u64,
}

impl std::fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale write rejected: token {} < highest seen {}",
            self.token, self.highest
        )
    }
}

impl std::error::Error for StaleWrite {}

/// The fenced resource. Writes with a token equal to the highest are accepted (the same holder
/// writing again); lower tokens are rejected and counted.
#[derive(Debug, Default)]
pub struct FencedResource {
    state: Mutex<State>,
}

impl FencedResource {
    /// A resource that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `value` under `token`.
    ///
    /// # Errors
    /// [`StaleWrite`] if a higher token was seen before.
    pub fn write(&self, token: FencingToken, value: u64) -> Result<(), StaleWrite> {
        let mut s = self.state();
        if let Some(highest) = s.highest
            && token.0 < highest
        {
            s.rejected += 1;
            return Err(StaleWrite {
                token: token.0,
                highest,
            });
        }
        s.highest = Some(token.0);
        s.accepted.push((token.0, value));
        Ok(())
    }

    /// Accepted writes as (token, value), in order.
    pub fn accepted(&self) -> Vec<(u64, u64)> {
        self.state().accepted.clone()
    }

    /// How many stale writes were rejected.
    pub fn rejected(&self) -> u64 {
        self.state().rejected
    }

    /// Highest token seen.
    pub fn highest(&self) -> Option<u64> {
        self.state().highest
    }

    /// Panics unless the accepted tokens never decrease (the resource's own invariant).
    pub fn assert_never_accepted_stale(&self) {
        let acc = self.accepted();
        for w in acc.windows(2) {
            assert!(
                w[1].0 >= w[0].0,
                "fenced resource accepted token {} after {}",
                w[1].0,
                w[0].0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_lower_tokens_and_counts_them() {
        let r = FencedResource::new();
        r.write(FencingToken(3), 1).unwrap();
        r.write(FencingToken(3), 2).unwrap();
        r.write(FencingToken(5), 3).unwrap();
        assert_eq!(
            r.write(FencingToken(4), 4),
            Err(StaleWrite {
                token: 4,
                highest: 5
            })
        );
        assert_eq!(r.rejected(), 1);
        assert_eq!(r.accepted(), vec![(3, 1), (3, 2), (5, 3)]);
        r.assert_never_accepted_stale();
    }
}
