//! The one error type every backend returns.

use std::time::Duration;

/// Result alias used throughout dlock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Boxed source error carried by [`Error::Backend`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in dlock.
///
/// Messages name the backend, the operation and the lock where they are known, and never contain
/// credentials. [`Error::is_retryable`] says whether trying the same call again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is empty, contains NUL, or is longer than 1024 bytes. Raised before any I/O.
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// What is wrong with the name.
        reason: String,
    },
    /// An option is out of range (for example a ttl outside 10 ms ..= 7 days). Raised before any I/O.
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// The option or parameter at fault.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A connection URL or configuration could not be used.
    #[error("invalid {backend} configuration: {reason}")]
    InvalidConfig {
        /// Backend the configuration was meant for.
        backend: &'static str,
        /// What is wrong (never contains a password).
        reason: String,
    },
    /// The URL scheme is not one of the backends compiled in.
    #[error("unsupported URL scheme `{scheme}`; compiled-in schemes: {}", available.join(", "))]
    UnsupportedScheme {
        /// The scheme that was asked for.
        scheme: String,
        /// The schemes this build knows.
        available: Vec<&'static str>,
    },
    /// The lock could not be acquired before the wait deadline.
    #[error("{backend}: lock {name:?} was not acquired within {waited:?}")]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// Lock name.
        name: String,
        /// How long the caller was prepared to wait.
        waited: Duration,
    },
    /// The lease is no longer held: it expired or another owner took the lock.
    #[error("{backend}: lock {name:?} is no longer held by this owner ({operation})")]
    LockLost {
        /// Backend name.
        backend: &'static str,
        /// Lock name.
        name: String,
        /// The operation that found out (`extend`, `with_lock`, ...).
        operation: &'static str,
    },
    /// A quorum-based backend could not get a majority.
    #[error("{backend}: quorum not reached for {operation}: {got} of {needed} nodes")]
    QuorumNotReached {
        /// Backend name.
        backend: &'static str,
        /// The operation that needed the quorum.
        operation: &'static str,
        /// Nodes that agreed.
        got: usize,
        /// Nodes needed.
        needed: usize,
    },
    /// The backend cannot do this operation.
    #[error("{operation} is not supported by the {backend} backend")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
        /// Backend name.
        backend: &'static str,
    },
    /// The store refused this client: a password is needed and none was given, the user name
    /// or password is wrong, or the store's access control does not let this user do what the
    /// lock needs. Not retryable: the configuration has to change.
    #[error("{backend}: access denied for {operation}: {reason}")]
    AccessDenied {
        /// Backend name.
        backend: &'static str,
        /// The operation that was refused (`connect`, `acquire`, ...).
        operation: &'static str,
        /// What the store said and what to do about it (never contains a password).
        reason: String,
    },
    /// The store failed (I/O, protocol or server error).
    #[error("{backend}: {operation}{} failed: {source}", name.as_ref().map(|n| format!(" of lock {n:?}")).unwrap_or_default())]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The operation that failed.
        operation: &'static str,
        /// The lock concerned, if any.
        name: Option<String>,
        /// Whether retrying the same call can help (connection trouble: yes; a bad schema: no).
        retryable: bool,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Backend { retryable, .. } => *retryable,
            Error::Timeout { .. } | Error::QuorumNotReached { .. } => true,
            _ => false,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid_argument(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub fn invalid_config(backend: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            backend,
            reason: reason.into(),
        }
    }

    /// Shorthand for a [`Error::Backend`].
    pub fn backend(
        backend: &'static str,
        operation: &'static str,
        name: Option<&crate::LockName>,
        retryable: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            operation,
            name: name.map(|n| n.as_str().to_owned()),
            retryable,
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::AccessDenied`].
    pub fn access_denied(
        backend: &'static str,
        operation: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Error::AccessDenied {
            backend,
            operation,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::LockLost`].
    pub fn lock_lost(
        backend: &'static str,
        name: &crate::LockName,
        operation: &'static str,
    ) -> Self {
        Error::LockLost {
            backend,
            name: name.as_str().to_owned(),
            operation,
        }
    }
}
