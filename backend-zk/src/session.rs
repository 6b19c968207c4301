//! The ZooKeeper session behind one [`ZkLock`](crate::ZkLock): connecting, replacing an expired
//! session, bounding each request by the `timeout` option, and mapping client errors.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lockcore::{Error, LockName, Result};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::acl::ParentAcls;
use crate::config::ZkConfig;

/// Whether `e` says the connection broke under a request, so the request may or may not have
/// been applied. The client fails pending requests with the connection's own error: EOF is
/// `ConnectionLoss`, while I/O errors and "no response from connection in …" come as `Custom`.
pub(crate) fn is_connection_loss(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// Whether retrying the same call can help after `e`.
pub(crate) fn is_retryable(e: &zk::Error) -> bool {
    is_connection_loss(e)
        || matches!(
            e,
            zk::Error::Timeout
                | zk::Error::NoHosts
                | zk::Error::SessionExpired
                | zk::Error::SessionMoved
                | zk::Error::Throttled
                | zk::Error::ClientClosed
        )
}

/// A client error as a dlock error naming the operation and the lock.
pub(crate) fn zk_error(operation: &'static str, name: Option<&LockName>, e: zk::Error) -> Error {
    match e {
        zk::Error::NoAuth => Error::access_denied(
            BACKEND,
            operation,
            "the server's ACL does not let these credentials use the lock nodes (NoAuth): the \
             lock path was made by another user (zk://USER:PASSWORD@host for digest \
             credentials)",
        ),
        zk::Error::AuthFailed => Error::access_denied(
            BACKEND,
            operation,
            "the server refused the credentials (AuthFailed)",
        ),
        e => Error::backend(BACKEND, operation, name, is_retryable(&e), e),
    }
}

/// The current session and how to make a new one.
pub(crate) struct Session {
    config: ZkConfig,
    current: Mutex<zk::Client>,
    /// Serialises reconnects so that an expired session is replaced once.
    reconnecting: tokio::sync::Mutex<()>,
}

impl Session {
    /// Connects, and makes the base node (`{chroot}/{prefix}`, or the chroot in the path
    /// layouts) if it is missing.
    pub(crate) async fn connect(config: &ZkConfig) -> Result<Self> {
        let client = Self::open(config).await?;
        Ok(Session {
            config: config.clone(),
            current: Mutex::new(client),
            reconnecting: tokio::sync::Mutex::new(()),
        })
    }

    async fn open(config: &ZkConfig) -> Result<zk::Client> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_fail_eagerly();
        if let Some(creds) = &config.credentials {
            connector = connector.with_auth("digest", &creds.digest_auth());
        }
        let hosts = config.connect_string();
        let limit = config.defaults.timeout.max(config.session_timeout);
        let client = match tokio::time::timeout(limit, connector.connect(&hosts)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e @ (zk::Error::AuthFailed | zk::Error::NoAuth))) => {
                return Err(zk_error("connect", None, e));
            }
            Ok(Err(e)) => {
                return Err(Error::backend(
                    BACKEND,
                    "connect",
                    None,
                    is_retryable(&e),
                    format!("{}: {e}", config.redacted()),
                ));
            }
            Err(_) => {
                return Err(Error::backend(
                    BACKEND,
                    "connect",
                    None,
                    true,
                    format!("{}: no session within {limit:?}", config.redacted()),
                ));
            }
        };
        crate::nodelay::keep(&client, crate::nodelay::servers(&config.hosts).await);
        let base = config.base_path();
        if base.is_empty() {
            return Ok(client);
        }
        // Another identity may own the base node: look before creating (a create under a
        // parent one may not write to is refused before its existence is checked).
        let parent_acls = ParentAcls::of(config);
        if base_stands(&client, config, &base, parent_acls.as_ref()).await? {
            return Ok(client);
        }
        let options = zk::CreateMode::Persistent.with_acls(acls(config));
        match timed(config.defaults.timeout, client.mkdir(&base, &options)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(zk_error("create the base node", None, e)),
            Err(()) => {
                return Err(no_answer(
                    "create the base node",
                    None,
                    config.defaults.timeout,
                ));
            }
        }
        // Made here creator-only, or by another client just before: with credentials, checked
        // either way.
        if parent_acls.is_some()
            && !base_stands(&client, config, &base, parent_acls.as_ref()).await?
        {
            return Err(Error::backend(
                BACKEND,
                "connect",
                None,
                true,
                format!("{base} was deleted as it was made"),
            ));
        }
        Ok(client)
    }

    /// A client of a live session: the current one, or a new session if it expired.
    ///
    /// # Errors
    /// A new session cannot be had (retryable), or authentication failed.
    pub(crate) async fn client(&self) -> Result<zk::Client> {
        let current = self.peek();
        if !is_terminal(current.state()) {
            return Ok(current);
        }
        let _one = self.reconnecting.lock().await;
        let current = self.peek();
        if !is_terminal(current.state()) {
            return Ok(current);
        }
        tracing::warn!(backend = BACKEND, state = ?current.state(), "zookeeper session ended; opening a new one");
        let fresh = Self::open(&self.config).await?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
        Ok(fresh)
    }

    /// The current client, whatever its state (for best-effort clean-up).
    pub(crate) fn peek(&self) -> zk::Client {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The limit for one request.
    pub(crate) fn timeout(&self) -> Duration {
        self.config.defaults.timeout
    }
}

/// Whether the base node stands; with credentials (`parent_acls`), refuses it unless its ACL
/// lets no other identity do more than read it.
async fn base_stands(
    client: &zk::Client,
    config: &ZkConfig,
    base: &str,
    parent_acls: Option<&ParentAcls>,
) -> Result<bool> {
    const OP: &str = "connect";
    let limit = config.defaults.timeout;
    let Some(parent_acls) = parent_acls else {
        return Ok(matches!(
            timed(limit, client.check_stat(base)).await,
            Ok(Ok(Some(_)))
        ));
    };
    let reply = timed(limit, client.get_acl(base)).await;
    match read_acl(reply, OP, base, None, limit)? {
        Some((found, _)) => parent_acls.check(OP, base, &found).map(|()| true),
        None => Ok(false),
    }
}

fn is_terminal(state: zk::SessionState) -> bool {
    matches!(
        state,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

/// The ACL for every node this crate creates: creator-only with credentials, else open.
pub(crate) fn acls(config: &ZkConfig) -> zk::Acls<'static> {
    if config.credentials.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    }
}

/// A `getACL` reply, as [`timed`] returns it.
pub(crate) type AclReply =
    std::result::Result<std::result::Result<(Vec<zk::Acl>, zk::Stat), zk::Error>, ()>;

/// `reply` (a `getACL` of `path`) as the ACL and stat, or the error for it.
pub(crate) fn read_acl(
    reply: AclReply,
    operation: &'static str,
    path: &str,
    name: Option<&LockName>,
    limit: std::time::Duration,
) -> Result<Option<(Vec<zk::Acl>, zk::Stat)>> {
    match reply {
        Ok(Ok(read)) => Ok(Some(read)),
        Ok(Err(zk::Error::NoNode)) => Ok(None),
        Ok(Err(zk::Error::NoAuth)) => Err(Error::access_denied(
            BACKEND,
            operation,
            format!(
                "these credentials may not read the ACL of {path} (NoAuth; was it made by \
                 another identity?): with credentials dlock checks the ACL of every node it uses \
                 as a parent, and needs ADMIN on it"
            ),
        )),
        Ok(Err(e)) => Err(Error::backend(
            BACKEND,
            operation,
            name,
            is_retryable(&e),
            format!("read the ACL of {path}: {e}"),
        )),
        Err(()) => Err(no_answer(operation, name, limit)),
    }
}

/// Runs `fut` for at most `limit`; `Err(())` when it did not answer in time.
pub(crate) async fn timed<T>(limit: Duration, fut: impl Future<Output = T>) -> Result<T, ()> {
    tokio::time::timeout(limit, fut).await.map_err(|_| ())
}

/// Runs `fut` until `deadline` (for ever when `None`); `None` when the deadline came first.
pub(crate) async fn until<T>(
    deadline: Option<std::time::Instant>,
    fut: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), fut).await.ok(),
        None => Some(fut.await),
    }
}

/// The error for a request that got no answer within the timeout.
pub(crate) fn no_answer(
    operation: &'static str,
    name: Option<&LockName>,
    limit: Duration,
) -> Error {
    Error::backend(
        BACKEND,
        operation,
        name,
        true,
        format!("no answer within the request timeout of {limit:?}"),
    )
}
