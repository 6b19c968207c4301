//! Building a connection from a [`RedisConfig`], in one place: address, TLS (CA, client
//! certificate), ACL user and password, database and `timeout`; connect errors; and reading a
//! server's persistence settings to decide the fencing guarantee it gives.

use lockcore::{Error, Fencing, Result};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisResult,
    Value,
};

use super::replies;
use super::single::Single;
use super::store::{self, Store};
use crate::BACKEND;
use crate::config::RedisConfig;

/// Fencing assumption of a single server without synchronous persistence.
pub const ASSUMPTION_NO_PERSISTENCE: &str = "the Redis server is never restarted and never evicts keys: it does not run with appendonly yes + appendfsync always (or may evict keys under maxmemory), so a restart or an eviction resets the fence counter";

/// Fencing assumption when the server's persistence could not be read at connect.
pub const ASSUMPTION_UNKNOWN: &str = "the Redis server keeps its data across restarts (appendonly yes + appendfsync always) and never evicts keys; CONFIG GET was not permitted, so this could not be checked at connect";

pub(super) fn connection_info(
    config: &RedisConfig,
    host: &str,
    port: u16,
    tls: bool,
) -> RedisResult<ConnectionInfo> {
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_owned(), port)
    };
    let mut settings = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password.expose());
    }
    Ok(addr.into_connection_info()?.set_redis_settings(settings))
}

/// A connect failure as a backend error naming the (redacted) URL.
pub(super) fn connect_error(shown: &str, e: redis::RedisError) -> Error {
    if let Some(denied) = store::access_denied("connect", &e) {
        return denied;
    }
    let retryable = store::is_retryable(&e);
    Error::backend(
        BACKEND,
        "connect",
        None,
        retryable,
        format!("cannot connect to {shown}: {e}"),
    )
}

/// The one place a connection to one server is built: address, TLS (CA, client certificate),
/// ACL user and password, database, and the `timeout` that bounds connecting and every round
/// trip. No I/O: the connection opens on first use.
pub(super) fn open_single(
    config: &RedisConfig,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<Single> {
    let redacted = config.redacted_url();
    let info = connection_info(config, host, port, tls).map_err(|e| connect_error(redacted, e))?;
    let client = if tls {
        // redis-rs builds rustls configs with the process-wide default provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |what: &str, path: &std::path::PathBuf| {
            std::fs::read(path).map_err(|e| {
                Error::invalid_config(
                    BACKEND,
                    format!("cannot read the {what} file {}: {e}", path.display()),
                )
            })
        };
        let root_cert = config
            .ca_file
            .as_ref()
            .map(|path| read("CA", path))
            .transpose()?;
        let client_tls = match &config.client_cert {
            None => None,
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
        };
        if root_cert.is_none() && client_tls.is_none() {
            Client::open(info).map_err(|e| connect_error(redacted, e))?
        } else {
            // redis-rs parses the files here; its messages say which one is bad and never
            // show their contents.
            Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls,
                    root_cert,
                },
            )
            .map_err(|e| {
                Error::invalid_config(BACKEND, format!("the TLS files are not usable: {e}"))
            })?
        }
    } else {
        Client::open(info).map_err(|e| connect_error(redacted, e))?
    };
    Ok(Single::new(client, config.defaults.timeout))
}

/// The fencing a server's persistence settings give (`CONFIG GET appendonly`, `appendfsync`,
/// `maxmemory`, `maxmemory-policy`): `Strict` only for a server that fsyncs every write to its
/// AOF and never evicts keys; [`ASSUMPTION_UNKNOWN`] when `CONFIG GET` is not permitted.
pub(super) async fn detect_fencing(store: &Store) -> Fencing {
    let params = ["appendonly", "appendfsync", "maxmemory", "maxmemory-policy"];
    let cmds: Vec<redis::Cmd> = (params.iter())
        .map(|param| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(*param);
            cmd
        })
        .collect();
    let mut values = Vec::new();
    for answer in store.query_many(&cmds).await {
        match answer {
            Ok(v) => values.push(config_value(&v).unwrap_or_default()),
            Err(e) => {
                tracing::debug!(error = %e, "redis: CONFIG GET not permitted; fencing is conditional");
                return Fencing::Conditional {
                    assumption: ASSUMPTION_UNKNOWN,
                };
            }
        }
    }
    let no_eviction =
        values[2] == "0" || values[3] == "noeviction" || values[3].starts_with("volatile-");
    if values[0] == "yes" && values[1] == "always" && no_eviction {
        Fencing::Strict
    } else {
        Fencing::Conditional {
            assumption: ASSUMPTION_NO_PERSISTENCE,
        }
    }
}

/// The value of a one-parameter `CONFIG GET` reply (`[name, value]` or a map).
fn config_value(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => items.get(1).and_then(replies::text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| replies::text(v)),
        _ => None,
    }
}
