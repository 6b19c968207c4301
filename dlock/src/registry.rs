//! The scheme registry: which URL schemes this build can connect to, and `connect` itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{DistributedLock, Error, LockConfig, MemoryLock, Result, redact};

/// A connection in progress.
type Connecting<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'a>>;

/// A backend's constructor: takes the full URL, returns a connected client.
type ConnectFn = for<'a> fn(&'a str) -> Connecting<'a>;

/// One compiled-in backend and the URL schemes it serves.
#[derive(Clone, Copy)]
pub struct Backend {
    /// Backend family name (`memory`, `sql`, ...).
    pub name: &'static str,
    /// Schemes it serves, lowercase, without `://`.
    pub schemes: &'static [&'static str],
    connect: ConnectFn,
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

#[cfg(feature = "zk")]
fn connect_zk(url: &str) -> Connecting<'_> {
    Box::pin(backend_zk::connect(url))
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
    },
    #[cfg(feature = "sql")]
    Backend {
        name: "sql",
        schemes: backend_sql::SCHEMES,
        connect: connect_sql,
    },
    #[cfg(feature = "redis")]
    Backend {
        name: "redis",
        schemes: backend_redis::SCHEMES,
        connect: connect_redis,
    },
    #[cfg(feature = "zk")]
    Backend {
        name: "zk",
        schemes: backend_zk::SCHEMES,
        connect: connect_zk,
    },
    #[cfg(feature = "dual")]
    Backend {
        name: "dual",
        schemes: backend_dual::SCHEMES,
        connect: connect_dual,
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
