//! Acquire options and shared URL option parsing.

use std::time::Duration;

use crate::{Error, FencingToken, OwnerId, Result};

/// Shortest accepted ttl.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest accepted ttl (7 days).
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// ttl used when neither the options nor the connection URL give one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How long an acquire may wait for a lock held by someone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Wait {
    /// One attempt only.
    No,
    /// Wait up to this long.
    For(Duration),
    /// Wait until acquired (or the future is dropped).
    #[default]
    Forever,
}

impl Wait {
    /// Parses `0`, `no`, `forever`, or a duration such as `10s` or `250ms`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the text is none of these.
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim() {
            "0" | "no" | "none" => Ok(Wait::No),
            "forever" | "inf" => Ok(Wait::Forever),
            other => parse_duration("wait", other).map(Wait::For),
        }
    }
}

/// Whether and how a [`LockGuard`](crate::LockGuard) renews its lease in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeepAlive {
    /// No renewal: the lease ends at its ttl unless extended by hand.
    Off,
    /// Renew every `every` (default ttl/3) until released, or until a cap is reached; then the
    /// lease runs out and `lost()` reports [`LostReason::RenewalLimit`](crate::LostReason::RenewalLimit).
    Renew {
        /// Renewal interval; `None` means ttl/3.
        every: Option<Duration>,
        /// Stop after this many renewals.
        max_renewals: Option<u32>,
        /// Stop renewing once the lock has been held (or would be held by the next renewal) this long.
        max_hold: Option<Duration>,
    },
}

impl KeepAlive {
    /// Renew at ttl/3 with no cap.
    pub const fn renew() -> Self {
        KeepAlive::Renew {
            every: None,
            max_renewals: None,
            max_hold: None,
        }
    }

    /// Renew at ttl/3 at most `n` times.
    pub const fn max_renewals(n: u32) -> Self {
        KeepAlive::Renew {
            every: None,
            max_renewals: Some(n),
            max_hold: None,
        }
    }

    /// Renew at ttl/3 until the lock has been held for `d`.
    pub const fn max_hold(d: Duration) -> Self {
        KeepAlive::Renew {
            every: None,
            max_renewals: None,
            max_hold: Some(d),
        }
    }

    /// Renew at a custom interval (must be shorter than the ttl).
    pub const fn every(interval: Duration) -> Self {
        KeepAlive::Renew {
            every: Some(interval),
            max_renewals: None,
            max_hold: None,
        }
    }
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive::renew()
    }
}

/// Options for one acquisition, builder style.
///
/// ```
/// use std::time::Duration;
/// use lockcore::{AcquireOptions, KeepAlive, Wait};
/// let opts = AcquireOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Wait::For(Duration::from_secs(2)))
///     .keep_alive(KeepAlive::max_renewals(100));
/// assert!(opts.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AcquireOptions {
    ttl: Option<Duration>,
    wait: Wait,
    keep_alive: KeepAlive,
    drift: Option<Duration>,
    owner: Option<OwnerId>,
    min_token: Option<FencingToken>,
    write_side: bool,
}

impl AcquireOptions {
    /// Defaults: ttl from the connection (else 30 s), wait forever, keep-alive at ttl/3, drift
    /// ttl × 1 % + 2 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lease time to live (10 ms ..= 7 days, checked by [`validate`](Self::validate)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait when the lock is held.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Keep-alive policy for guards.
    pub fn keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// Clock drift allowance subtracted from the lease validity (default ttl × 1 % + 2 ms).
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// The owner id this acquisition records in the store, instead of a fresh random one.
    ///
    /// For composites that hold one acquisition on several stores (the `dual://` backend
    /// records the same id on both, so `dlock migrate check` can tell its holds from those of
    /// single-store clients). Each acquisition must use an id of its own: two acquisitions with
    /// one id would be taken for the same holder by owner-checked release and extend.
    ///
    /// For the same reason a waiting [`LockExt::lock`](crate::LockExt::lock) with a chosen owner
    /// does not ride out store errors as it otherwise does: the clean-up of a failed attempt may
    /// still be on its way to the store, and would take a retry's grant under the same id for
    /// its own. The first retryable error is returned; try again with a new id.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Asks for a fencing token of at least `min_token`: the store's counter for the name moves to
    /// `max(counter + 1, min_token)` in the same atomic step as the grant, so every later token is
    /// above `min_token` too. Only backends whose [`Capabilities::min_token`](crate::Capabilities)
    /// is set accept it; the acquire paths refuse it with
    /// [`Error::Unsupported`] before any I/O elsewhere.
    ///
    /// This is how a `dual://` client carries the first store's token into the second's counter,
    /// so that tokens of clients on either store form one increasing sequence.
    pub fn min_token(mut self, min_token: FencingToken) -> Self {
        self.min_token = Some(min_token);
        self
    }

    /// The same options without a token minimum (a composite asks its first store with these).
    pub fn without_min_token(mut self) -> Self {
        self.min_token = None;
        self
    }

    /// Marks an exclusive acquisition as the write side of a read-write lock
    /// ([`ReadWriteExt::write_lock`](crate::ReadWriteExt::write_lock) sets it). For dlock it is
    /// the same exclusive hold as [`LockExt::lock`](crate::LockExt::lock); a backend whose store
    /// tells the two apart for other clients creates the writer's kind of entry (ZooKeeper in
    /// Curator's layout, where `InterProcessMutex` and `InterProcessReadWriteLock`'s writer name
    /// their nodes differently and each sees only its own).
    pub fn write_side(mut self) -> Self {
        self.write_side = true;
        self
    }

    /// Whether [`write_side`](Self::write_side) was set.
    pub fn is_write_side(&self) -> bool {
        self.write_side
    }

    /// The owner id set with [`owner`](Self::owner), if any.
    pub fn owner_value(&self) -> Option<OwnerId> {
        self.owner
    }

    /// The owner id set with [`owner`](Self::owner), or a fresh random one (backends call this
    /// once per acquisition).
    pub fn owner_or_random(&self) -> OwnerId {
        self.owner.unwrap_or_else(OwnerId::random)
    }

    /// The token minimum set with [`min_token`](Self::min_token), if any.
    pub fn min_token_value(&self) -> Option<FencingToken> {
        self.min_token
    }

    /// The ttl, or [`DEFAULT_TTL`] if none was set.
    pub fn ttl_value(&self) -> Duration {
        self.ttl.unwrap_or(DEFAULT_TTL)
    }

    /// Whether a ttl was set explicitly.
    pub fn has_ttl(&self) -> bool {
        self.ttl.is_some()
    }

    /// The wait policy.
    pub fn wait_value(&self) -> Wait {
        self.wait
    }

    /// The keep-alive policy.
    pub fn keep_alive_value(&self) -> KeepAlive {
        self.keep_alive
    }

    /// The drift allowance for the effective ttl.
    pub fn drift_value(&self) -> Duration {
        self.drift
            .unwrap_or_else(|| default_drift(self.ttl_value()))
    }

    /// Fills unset ttl and drift from a connection's defaults.
    pub fn with_defaults(mut self, defaults: &ClientDefaults) -> Self {
        if self.ttl.is_none() {
            self.ttl = Some(defaults.ttl);
        }
        if self.drift.is_none() {
            self.drift = defaults.drift;
        }
        self
    }

    /// Checks every value; called by the acquire paths before any I/O.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the option at fault.
    pub fn validate(&self) -> Result<()> {
        let ttl = self.ttl_value();
        check_ttl(ttl)?;
        if let Wait::For(d) = self.wait
            && d > MAX_TTL * 52
        {
            return Err(Error::invalid_argument(
                "wait",
                format!("{d:?} is longer than a year; use Wait::Forever"),
            ));
        }
        let drift = self.drift_value();
        if drift >= ttl {
            return Err(Error::invalid_argument(
                "drift",
                format!("drift {drift:?} must be shorter than the ttl {ttl:?}"),
            ));
        }
        if let KeepAlive::Renew {
            every, max_hold, ..
        } = self.keep_alive
        {
            if let Some(every) = every
                && (every.is_zero() || every >= ttl - drift)
            {
                return Err(Error::invalid_argument(
                    "keep_alive",
                    format!(
                        "renewal interval {every:?} must be above zero and below the lease validity {:?}",
                        ttl - drift
                    ),
                ));
            }
            if max_hold.is_some_and(|h| h.is_zero()) {
                return Err(Error::invalid_argument(
                    "keep_alive",
                    "max_hold must be above zero",
                ));
            }
        }
        Ok(())
    }
}

/// Checks a ttl against 10 ms ..= 7 days.
///
/// # Errors
/// [`Error::InvalidArgument`] outside that range.
pub fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid_argument(
            "ttl",
            format!("{ttl:?} is outside the allowed range {MIN_TTL:?} ..= {MAX_TTL:?}"),
        ));
    }
    Ok(())
}

/// The default drift for a ttl: ttl × 1 % + 2 ms.
pub fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Per-connection defaults taken from the URL (`ttl`, `drift`, `timeout`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientDefaults {
    /// ttl for acquisitions that do not set one.
    pub ttl: Duration,
    /// drift for acquisitions that do not set one (`None`: ttl × 1 % + 2 ms).
    pub drift: Option<Duration>,
    /// Time limit for one round trip to the store.
    pub timeout: Duration,
}

impl Default for ClientDefaults {
    fn default() -> Self {
        ClientDefaults {
            ttl: DEFAULT_TTL,
            drift: None,
            timeout: Duration::from_secs(5),
        }
    }
}

impl ClientDefaults {
    /// Applies one query option if it is one of the shared names (`ttl`, `drift`, `timeout`).
    /// Returns `Ok(false)` for a key that is not shared, so the backend can handle it.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a value that does not parse or is out of range.
    pub fn apply(&mut self, backend: &'static str, key: &str, value: &str) -> Result<bool> {
        let parse = |v: &str| option_duration(backend, key, v);
        match key {
            "ttl" => {
                let ttl = parse(value)?;
                check_ttl(ttl).map_err(|e| Error::invalid_config(backend, e.to_string()))?;
                self.ttl = ttl;
            }
            "drift" => self.drift = Some(parse(value)?),
            "timeout" => {
                let t = parse(value)?;
                if t.is_zero() {
                    return Err(Error::invalid_config(
                        backend,
                        "option `timeout` must be above zero",
                    ));
                }
                self.timeout = t;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Parses the duration value of a URL option (`ttl`, `timeout`, `session_timeout`,
/// `node_timeout`, ...): the one rule every backend's URL parser uses, so that a bad value is
/// [`Error::InvalidConfig`] (a configuration error, exit 78 in the CLI) on every scheme.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the option and the value.
pub fn option_duration(backend: &'static str, key: &str, value: &str) -> Result<Duration> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        Error::invalid_config(
            backend,
            format!("option `{key}={value}` is not a duration ({e}); try 30s or 250ms"),
        )
    })
}

/// Parses a human duration such as `30s`, `250ms` or `1h 5m`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `what`.
pub fn parse_duration(what: &'static str, text: &str) -> Result<Duration> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        Error::invalid_argument(
            what,
            format!("`{text}` is not a duration ({e}); try 30s or 250ms"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(
            AcquireOptions::new()
                .ttl(Duration::from_millis(9))
                .validate()
                .is_err()
        );
        assert!(
            AcquireOptions::new()
                .ttl(Duration::from_millis(10))
                .validate()
                .is_ok()
        );
        assert!(AcquireOptions::new().ttl(MAX_TTL).validate().is_ok());
        assert!(
            AcquireOptions::new()
                .ttl(MAX_TTL + Duration::from_millis(1))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn drift_and_interval_checked() {
        let o = AcquireOptions::new()
            .ttl(Duration::from_millis(100))
            .drift(Duration::from_millis(100));
        assert!(matches!(
            o.validate(),
            Err(Error::InvalidArgument {
                argument: "drift",
                ..
            })
        ));
        let o = AcquireOptions::new()
            .ttl(Duration::from_millis(100))
            .keep_alive(KeepAlive::every(Duration::from_millis(200)));
        assert!(matches!(
            o.validate(),
            Err(Error::InvalidArgument {
                argument: "keep_alive",
                ..
            })
        ));
    }

    #[test]
    fn wait_parse() {
        assert_eq!(Wait::parse("0").unwrap(), Wait::No);
        assert_eq!(Wait::parse("forever").unwrap(), Wait::Forever);
        assert_eq!(
            Wait::parse("10s").unwrap(),
            Wait::For(Duration::from_secs(10))
        );
        assert!(Wait::parse("soon").is_err());
    }

    #[test]
    fn client_defaults_apply() {
        let mut d = ClientDefaults::default();
        assert!(d.apply("memory", "ttl", "5s").unwrap());
        assert_eq!(d.ttl, Duration::from_secs(5));
        assert!(!d.apply("memory", "prefix", "x").unwrap());
        assert!(d.apply("memory", "ttl", "1ms").is_err());
        assert!(d.apply("memory", "timeout", "nope").is_err());
    }
}
