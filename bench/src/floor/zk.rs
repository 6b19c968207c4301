//! ZooKeeper: a plain create and delete, and the recipe's own three calls sent bare, on the
//! session of a lock client of their own (so with its credentials and its base node).

use backend_zk::zookeeper_client as zk;
use backend_zk::{ZkConfig, ZkLock};
use lockcore::{Error, LockName, Result, async_trait};
use std::sync::Arc;

use super::{Floor, Floors};

/// The floors of a `zk://` URL: a raw one and the recipe's.
pub(super) async fn floors(url: &str) -> Result<Floors> {
    let config = ZkConfig::parse(url)?;
    let session = Arc::new(Session {
        lock: ZkLock::connect(&config).await?,
        base: config.base_path(),
        acls: if config.credentials.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        },
    });
    Ok(Floors {
        raw: Some(Arc::new(Plain(session.clone()))),
        fenced: None,
        recipe: Some(Arc::new(Recipe(session))),
    })
}

/// The floors' session: a lock client's, which keeps its connection and credentials.
struct Session {
    lock: ZkLock,
    base: String,
    acls: zk::Acls<'static>,
}

fn failed<'a>(operation: &'static str, name: &'a LockName) -> impl Fn(zk::Error) -> Error + 'a {
    move |e| {
        let retryable = matches!(e, zk::Error::ConnectionLoss | zk::Error::Timeout);
        Error::backend(backend_zk::BACKEND, operation, Some(name), retryable, e)
    }
}

/// Create an ephemeral node and delete it, on one session.
struct Plain(Arc<Session>);

#[async_trait]
impl Floor for Plain {
    fn description(&self) -> String {
        "create EPHEMERAL + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.0.lock.zk_client();
        let path = format!("{}/floor-{}", self.0.base, name.escaped());
        let opts = zk::CreateMode::Ephemeral.with_acls(self.0.acls);
        client
            .create(&path, &[], &opts)
            .await
            .map_err(failed("floor create", name))?;
        client
            .delete(&path, None)
            .await
            .map_err(failed("floor delete", name))
    }
}

/// The recipe's own three calls, bare: an EPHEMERAL_SEQUENTIAL create under a CONTAINER
/// parent with the parent's `getChildren` sent right behind it, then a plain `delete`, on one
/// session; no owner id, no parse of the listing, no lease, no renewal.
struct Recipe(Arc<Session>);

#[async_trait]
impl Floor for Recipe {
    fn description(&self) -> String {
        "create EPHEMERAL_SEQUENTIAL + getChildren behind it + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.0.lock.zk_client();
        let parent = format!("{}/recipe-floor-{}", self.0.base, name.escaped());
        let prefix = format!("{parent}/n-");
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.0.acls);
        for _ in 0..3 {
            let create = client.create(&prefix, &[], &opts);
            let list = client.list_children(&parent);
            match tokio::join!(create, list) {
                (Ok((_, seq)), listed) => {
                    listed.map_err(failed("recipe floor list", name))?;
                    let path = format!("{prefix}{seq}");
                    return client
                        .delete(&path, None)
                        .await
                        .map_err(failed("recipe floor delete", name));
                }
                (Err(zk::Error::NoNode), _) => {
                    let container = zk::CreateMode::Container.with_acls(self.0.acls);
                    match client.create(&parent, &[], &container).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(failed("recipe floor parent", name)(e)),
                    }
                }
                (Err(e), _) => return Err(failed("recipe floor create", name)(e)),
            }
        }
        Err(Error::backend(
            backend_zk::BACKEND,
            "recipe floor",
            Some(name),
            true,
            "the floor's parent node kept disappearing",
        ))
    }
}
