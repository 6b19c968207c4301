//! Redis, Redis Cluster, the Tair emulation and Redlock: `SET NX PX` (or one script of
//! `SET NX PX` + `INCR` of a fence counter) and a compare-and-delete script, on one node or
//! on every Redlock node at once.

use std::sync::Arc;

use backend_redis::config::{Deployment, RedisConfig};
use backend_redis::node::Node;
use futures_util::future::join_all;
use lockcore::{Error, LockName, OwnerId, Result, async_trait};
use redis::{Script, Value};

use super::{Floor, Floors};

/// The floors of a Redis-family URL: a raw and a fenced one.
pub(super) async fn floors(url: &str) -> Result<Floors> {
    let config = RedisConfig::parse(url)?;
    let shown = config.redacted_url().to_owned();
    let nodes = match &config.deployment {
        Deployment::Single { host, port, tls } => {
            vec![Node::open(&config, host, *port, *tls, shown)?]
        }
        Deployment::Cluster { nodes } => vec![Node::cluster(&config, nodes).await?],
        Deployment::Redlock { nodes, tls } => nodes
            .iter()
            .map(|(host, port)| Node::open(&config, host, *port, *tls, format!("{host}:{port}")))
            .collect::<Result<_>>()?,
    };
    for node in &nodes {
        node.ping().await?;
    }
    let scripts = Arc::new(Scripts {
        fenced_acquire: Lua::of(include_str!("lua/fenced_acquire.lua")),
        delete: Lua::of(include_str!("lua/delete.lua")),
    });
    let floor = |fenced| -> Arc<dyn Floor> {
        Arc::new(RedisFloor {
            nodes: nodes.clone(),
            prefix: config.prefix.clone(),
            scripts: scripts.clone(),
            fenced,
        })
    };
    Ok(Floors {
        raw: Some(floor(false)),
        fenced: Some(floor(true)),
        recipe: None,
    })
}

struct Scripts {
    fenced_acquire: Lua,
    delete: Lua,
}

/// A script's text and the SHA1 `EVALSHA` names it by.
struct Lua {
    code: &'static str,
    sha: String,
}

impl Lua {
    fn of(code: &'static str) -> Self {
        let sha = Script::new(code).get_hash().to_owned();
        Lua { code, sha }
    }
}

/// Takes a key of its own and deletes it with a compare-and-delete script. With several nodes
/// (Redlock), every node at once, all answers awaited, then the deletes on every node at once:
/// Redlock's two rounds, each node over its own connection.
struct RedisFloor {
    nodes: Vec<Node>,
    prefix: String,
    scripts: Arc<Scripts>,
    fenced: bool,
}

#[async_trait]
impl Floor for RedisFloor {
    fn description(&self) -> String {
        let acquire = if self.fenced {
            "one script SET NX PX + INCR fence"
        } else {
            "SET NX PX"
        };
        match self.nodes.len() {
            1 => {
                format!("{acquire}, then EVALSHA compare-and-delete, on one multiplexed connection")
            }
            n => format!(
                "on all {n} nodes in parallel: {acquire}; once all answered, EVALSHA compare-and-delete on all"
            ),
        }
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let base = format!("{{{}:floor:{}}}", self.prefix, name.escaped());
        let key = format!("{base}:lock");
        let fence = format!("{base}:fence");
        let value = OwnerId::random().to_string();
        let take = |node| self.take(node, &key, &fence, &value);
        let delete = |node| self.delete(node, &key, &value);
        if let [node] = self.nodes.as_slice() {
            take(node).await?;
            return delete(node).await;
        }
        let taken = join_all(self.nodes.iter().map(take)).await;
        taken.into_iter().collect::<Result<Vec<()>>>()?;
        let deleted = join_all(self.nodes.iter().map(delete)).await;
        deleted.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }
}

impl RedisFloor {
    async fn take(&self, node: &Node, key: &str, fence: &str, value: &str) -> Result<()> {
        let reply = if self.fenced {
            let mut call = evalsha(&self.scripts.fenced_acquire, &[key, fence]);
            call.arg(value).arg(10_000);
            run(node, &self.scripts.fenced_acquire, call).await?
        } else {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(value).arg("NX").arg("PX").arg(10_000);
            node.command(&set).await?
        };
        match reply {
            Value::Nil | Value::Int(0) => Err(Error::backend(
                backend_redis::BACKEND,
                "floor acquire",
                None,
                true,
                "the floor's key was held",
            )),
            _ => Ok(()),
        }
    }

    async fn delete(&self, node: &Node, key: &str, value: &str) -> Result<()> {
        let mut call = evalsha(&self.scripts.delete, &[key]);
        call.arg(value);
        run(node, &self.scripts.delete, call).await.map(drop)
    }
}

/// `EVALSHA` of `script` on `keys`; the caller appends the arguments.
fn evalsha(script: &Lua, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(keys.len()).arg(keys);
    cmd
}

/// Sends `call`; where the server does not hold the script yet, sends it whole once with
/// `SCRIPT LOAD` and the call again.
async fn run(node: &Node, script: &Lua, call: redis::Cmd) -> Result<Value> {
    match node.command(&call).await {
        Err(e) if is_noscript(&e) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.code);
            node.command(&load).await?;
            node.command(&call).await
        }
        answer => answer,
    }
}

fn is_noscript(e: &Error) -> bool {
    let Error::Backend { source, .. } = e else {
        return false;
    };
    let redis = source.downcast_ref::<redis::RedisError>();
    redis.is_some_and(|r| r.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
}
