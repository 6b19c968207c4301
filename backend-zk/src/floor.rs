//! `dlock bench`'s floors for ZooKeeper: the recipe's own three calls, bare, and a plain
//! create and delete.

use std::sync::Arc;

use lockcore::async_trait;
use lockcore::{Error, LockName, RawFloor, Result};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::lock::ZkLock;
use crate::names::{self};
use crate::recipe::PARENT_RETRIES;
use crate::session::{acls, zk_error};

impl ZkLock {
    /// The floor: create an ephemeral node and delete it.
    pub(crate) fn bench_floor(&self) -> Arc<dyn RawFloor> {
        Arc::new(Floor { lock: self.clone() })
    }

    /// The recipe's own three calls, bare.
    pub(crate) fn bench_recipe_floor(&self) -> Arc<dyn RawFloor> {
        Arc::new(RecipeFloor { lock: self.clone() })
    }
}

/// The recipe's own three calls, bare: an EPHEMERAL_SEQUENTIAL create under a CONTAINER
/// parent with the parent's `getChildren` sent right behind it, then a plain `delete`, on the
/// same session; no owner id, no parse of the listing, no lease, no renewal.
struct RecipeFloor {
    lock: ZkLock,
}

#[async_trait]
impl RawFloor for RecipeFloor {
    fn description(&self) -> String {
        "create EPHEMERAL_SEQUENTIAL + getChildren behind it + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.lock.inner.session.client().await?;
        let inner = &self.lock.inner;
        let parent = format!("{}/recipe-floor-{}", inner.base, names::node_name(name));
        let opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&inner.config));
        let failed = |e| zk_error("recipe floor", Some(name), e);
        let prefix = format!("{parent}/n-");
        for _ in 0..PARENT_RETRIES {
            let create = client.create(&prefix, &[], &opts);
            let list = client.list_children(&parent);
            match tokio::join!(create, list) {
                (Ok((_, seq)), listed) => {
                    listed.map_err(failed)?;
                    let path = format!("{prefix}{seq}");
                    return client.delete(&path, None).await.map_err(failed);
                }
                (Err(zk::Error::NoNode), _) => {
                    self.lock.make_parent(&client, &parent, name).await?;
                }
                (Err(e), _) => return Err(failed(e)),
            }
        }
        Err(Error::backend(
            BACKEND,
            "recipe floor",
            Some(name),
            true,
            "the floor's parent node kept disappearing",
        ))
    }
}

/// The floor: create an ephemeral node and delete it, on the same session.
struct Floor {
    lock: ZkLock,
}

#[async_trait]
impl RawFloor for Floor {
    fn description(&self) -> String {
        "create EPHEMERAL + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.lock.inner.session.client().await?;
        let path = format!("{}/floor-{}", self.lock.inner.base, names::node_name(name));
        let opts = zk::CreateMode::Ephemeral.with_acls(acls(&self.lock.inner.config));
        client
            .create(&path, &[], &opts)
            .await
            .map_err(|e| zk_error("floor create", Some(name), e))?;
        client
            .delete(&path, None)
            .await
            .map_err(|e| zk_error("floor delete", Some(name), e))
    }
}
