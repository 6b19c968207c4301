//! The scheme registry: which URL schemes this build can connect to, and `connect` itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{DistributedLock, Error, LockConfig, MemoryLock, NativePrimitives, Result, redact};

/// A connection in progress.
type Connecting<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'a>>;

/// A backend's constructor: takes the full URL, returns a connected client.
type ConnectFn = for<'a> fn(&'a str) -> Connecting<'a>;

/// What a backend offers natively for a URL, read from the URL alone (no I/O).
type NativeFn = fn(&str) -> Result<NativePrimitives>;

/// One compiled-in backend and the URL schemes it serves.
#[derive(Clone, Copy)]
pub struct Backend {
    /// Backend family name (`memory`, `sql`, ...).
    pub name: &'static str,
    /// Schemes it serves, lowercase, without `://`.
    pub schemes: &'static [&'static str],
    connect: ConnectFn,
    native: NativeFn,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

fn connect_memory(url: &str) -> Connecting<'_> {
    Box::pin(async move { Ok(Arc::new(MemoryLock::from_url(url)?) as Arc<dyn DistributedLock>) })
}

#[cfg(feature = "sql")]
fn connect_sql(url: &str) -> Connecting<'_> {
    Box::pin(backend_sql::connect(url))
}

#[cfg(feature = "redis")]
fn connect_redis(url: &str) -> Connecting<'_> {
    Box::pin(backend_redis::connect(url))
}

#[cfg(feature = "redlock")]
fn connect_redlock(url: &str) -> Connecting<'_> {
    Box::pin(backend_redlock::connect(url))
}

#[cfg(feature = "zk")]
fn connect_zk(url: &str) -> Connecting<'_> {
    Box::pin(backend_zk::connect(url))
}

#[cfg(feature = "dual")]
fn native_dual(url: &str) -> Result<NativePrimitives> {
    let config = backend_dual::DualConfig::parse(url)?;
    let (first, second) = (
        native_primitives(&config.first)?,
        native_primitives(&config.second)?,
    );
    Ok(backend_dual::native_of(first, second))
}

#[cfg(feature = "dual")]
fn connect_dual(url: &str) -> Connecting<'_> {
    // Each inner URL goes through `connect` again, so any compiled-in store can be either side.
    Box::pin(backend_dual::connect(
        url,
        |inner: String| -> Connecting<'static> { Box::pin(async move { connect(&inner).await }) },
    ))
}

/// Every backend compiled into this build. A new backend crate joins with one entry here (behind
/// its cargo feature) and one feature line in `Cargo.toml`.
static BACKENDS: &[Backend] = &[
    Backend {
        name: "memory",
        schemes: &["memory"],
        connect: connect_memory,
        native: |_| Ok(lockcore::memory::NATIVE),
    },
    #[cfg(feature = "sql")]
    Backend {
        name: "sql",
        schemes: backend_sql::SCHEMES,
        connect: connect_sql,
        native: |_| Ok(backend_sql::NATIVE),
    },
    #[cfg(feature = "redis")]
    Backend {
        name: "redis",
        schemes: backend_redis::SCHEMES,
        connect: connect_redis,
        native: |_| Ok(backend_redis::NATIVE),
    },
    #[cfg(feature = "redlock")]
    Backend {
        name: "redlock",
        schemes: backend_redlock::SCHEMES,
        connect: connect_redlock,
        native: |_| Ok(backend_redlock::NATIVE),
    },
    // The Tair emulation is backend-redis's too; its `connect` serves both.
    #[cfg(feature = "redis")]
    Backend {
        name: "tair",
        schemes: backend_redis::tair::SCHEMES,
        connect: connect_redis,
        native: |_| Ok(backend_redis::tair::NATIVE),
    },
    #[cfg(feature = "zk")]
    Backend {
        name: "zk",
        schemes: backend_zk::SCHEMES,
        connect: connect_zk,
        native: |_| Ok(backend_zk::NATIVE),
    },
    #[cfg(feature = "dual")]
    Backend {
        name: "dual",
        schemes: backend_dual::SCHEMES,
        connect: connect_dual,
        native: native_dual,
    },
];

/// The backends compiled into this build.
pub fn backends() -> &'static [Backend] {
    BACKENDS
}

/// Every URL scheme this build accepts, in registry order (`memory` first).
pub fn schemes() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .flat_map(|b| b.schemes.iter().copied())
        .collect()
}

/// The scheme of `url`, lowercased: the text before the first `:` (`redis`, `redis+cluster`,
/// `sqlite` for both `sqlite:///abs/path` and `sqlite:relative.db`).
///
/// Parsed by hand: multi-host URLs such as `redlock://h1:p1,h2:p2` are not valid for the `url`
/// crate.
///
/// # Errors
/// [`Error::InvalidConfig`] when `url` does not start with a scheme (RFC 3986: a letter, then
/// letters, digits, `+`, `-` or `.`). The message shows the URL redacted.
pub fn scheme_of(url: &str) -> Result<String> {
    let url = url.trim();
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(Error::invalid_config(
            "dlock",
            format!(
                "`{}` is not a lock store URL; expected scheme://..., e.g. memory://default (compiled-in schemes: {})",
                redact(url),
                schemes().join(", ")
            ),
        ));
    }
    Ok(scheme.to_ascii_lowercase())
}

/// What the store at `url` offers besides the mutex (read-write locks, semaphores), read from
/// the URL alone, so that a command can refuse what the store cannot do before any I/O. The
/// connected client's [`Capabilities::native`](crate::Capabilities) says the same.
///
/// # Errors
/// As [`connect`] for a malformed URL or an unknown scheme; no I/O.
pub fn native_primitives(url: &str) -> Result<NativePrimitives> {
    let scheme = scheme_of(url)?;
    let backend = BACKENDS
        .iter()
        .find(|b| b.schemes.contains(&scheme.as_str()))
        .ok_or_else(|| Error::UnsupportedScheme {
            scheme,
            available: schemes(),
        })?;
    (backend.native)(url.trim())
}

/// Connects to the lock store named by `url`; the scheme picks the backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::{AcquireOptions, LockExt};
/// let locks = dlock::connect("memory://docs").await?;
/// let guard = locks.lock("reports/daily", &AcquireOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Dropping the future abandons the connection attempt; nothing is held yet.
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL or options; [`Error::UnsupportedScheme`] listing
/// the compiled-in schemes for an unknown scheme (or one whose cargo feature is off);
/// [`Error::Backend`] when the store cannot be reached.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let scheme = scheme_of(url)?;
    let Some(backend) = BACKENDS
        .iter()
        .find(|b| b.schemes.contains(&scheme.as_str()))
    else {
        return Err(Error::UnsupportedScheme {
            scheme,
            available: schemes(),
        });
    };
    // Schemes are case-insensitive; backends see them lowercase.
    let url = url.trim();
    let url = format!("{scheme}{}", &url[scheme.len()..]);
    let url = url.as_str();
    tracing::debug!(url = %redact(url), backend = backend.name, "connecting");
    let client = (backend.connect)(url).await;
    match &client {
        Ok(c) => {
            tracing::debug!(url = %redact(url), backend = c.capabilities().backend, "connected")
        }
        Err(e) => tracing::debug!(url = %redact(url), error = %e, "connect failed"),
    }
    client
}

/// Connects per an application's [`LockConfig`]: its `ttl`, `drift`, `timeout` and `options` are
/// merged into the URL's query string, the configuration winning (see [`LockConfig`]).
///
/// # Cancel safety
/// As [`connect`].
///
/// # Errors
/// As [`connect`], plus [`Error::InvalidConfig`] for options that cannot be merged.
pub async fn connect_config(cfg: &LockConfig) -> Result<Arc<dyn DistributedLock>> {
    connect(&cfg.url_with_options()?).await
}
