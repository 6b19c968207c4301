//! The floors of every store: what `dlock bench` judges a lock against.
//!
//! A floor is the cheapest lock-like pair of round trips a store offers over the same kind of
//! connection a lock client uses. It runs on keys, nodes or rows of its own and keeps no
//! lease, queue or renewal, so the ratio of dlock's pairs per second to a floor's is what the
//! library costs above the store.

mod redis;
mod sql;
mod zk;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use lockcore::{Error, LockName, Result, async_trait};

/// One store's floor: a raw acquire and release on a name.
#[async_trait]
pub trait Floor: Send + Sync + 'static {
    /// What one pair consists of, for the report.
    fn description(&self) -> String;

    /// One raw acquire-and-release on `name`.
    ///
    /// # Cancel safety
    /// A dropped pair may leave its key, node or row behind (keys and rows with a 10 s ttl).
    ///
    /// # Errors
    /// Store failures.
    async fn pair(&self, name: &LockName) -> Result<()>;
}

/// The floors of one store URL; a store has those that tell it apart.
#[derive(Clone, Default)]
pub struct Floors {
    /// The cheapest pair (Redis: `SET NX PX` + a compare-and-delete).
    pub raw: Option<Arc<dyn Floor>>,
    /// The cheapest pair that also hands out a fencing token, where `raw` does not (Redis: one
    /// script of `SET NX PX` + `INCR`): the floor with the guarantee a fenced lock gives.
    pub fenced: Option<Arc<dyn Floor>>,
    /// The store calls of the recipe's own uncontended acquire and release, sent bare, where
    /// the recipe needs more than `raw` (ZooKeeper: `create`, the `getChildren` that decides
    /// the attempt, `delete`): what the recipe costs, apart from the library around it.
    pub recipe: Option<Arc<dyn Floor>>,
}

impl Floors {
    /// The floor a lock is judged against: the fenced one where there is one, else the raw.
    pub fn target(&self) -> Option<&Arc<dyn Floor>> {
        self.fenced.as_ref().or(self.raw.as_ref())
    }
}

/// Connects the floors of the store `url` names (any URL `dlock::connect` takes), over
/// connections of their own.
///
/// # Cancel safety
/// Dropping the future closes what was opened.
///
/// # Errors
/// [`Error::UnsupportedScheme`] for a scheme no floor is known for; the backends' parse and
/// connect errors.
pub async fn connect(url: &str) -> Result<Floors> {
    let scheme = url
        .split_once(':')
        .map_or("", |(s, _)| s)
        .to_ascii_lowercase();
    let url = format!("{scheme}{}", &url.trim()[scheme.len()..]);
    let url = url.as_str();
    match scheme.as_str() {
        "memory" => Ok(Floors {
            raw: Some(Arc::new(MemoryFloor::default())),
            ..Floors::default()
        }),
        s if backend_sql::SCHEMES.contains(&s) => sql::floors(url).await,
        s if backend_zk::SCHEMES.contains(&s) => zk::floors(url).await,
        s if backend_redis::SCHEMES.contains(&s)
            || backend_redis::tair::SCHEMES.contains(&s)
            || backend_redlock::SCHEMES.contains(&s) =>
        {
            redis::floors(url).await
        }
        s if backend_dual::SCHEMES.contains(&s) => dual(url).await,
        _ => Err(Error::UnsupportedScheme {
            scheme,
            available: [
                &["memory"],
                backend_sql::SCHEMES,
                backend_zk::SCHEMES,
                backend_redis::SCHEMES,
                backend_redis::tair::SCHEMES,
                backend_redlock::SCHEMES,
                backend_dual::SCHEMES,
            ]
            .concat(),
        }),
    }
}

/// A dual store's floors: the first store's, then the second's, one after the other (a dual
/// lock makes the round trips of both), each store's fenced (or raw) and recipe (or fenced, or
/// raw) floor in the matching slot.
async fn dual(url: &str) -> Result<Floors> {
    let (first, second) = backend_dual::DualConfig::parse(url)?.store_urls();
    let (first, second) = (
        Box::pin(connect(&first)).await?,
        Box::pin(connect(&second)).await?,
    );
    let fenced = |f: &Floors| f.fenced.clone().or_else(|| f.raw.clone());
    let recipe = |f: &Floors| f.recipe.clone().or_else(|| fenced(f));
    Ok(Floors {
        raw: Both::of(first.raw.clone(), second.raw.clone()),
        fenced: Both::of(fenced(&first), fenced(&second)),
        recipe: Both::of(recipe(&first), recipe(&second)),
    })
}

/// Two stores' floors one after the other, the first store's first.
struct Both {
    first: Arc<dyn Floor>,
    second: Arc<dyn Floor>,
}

impl Both {
    fn of(first: Option<Arc<dyn Floor>>, second: Option<Arc<dyn Floor>>) -> Option<Arc<dyn Floor>> {
        Some(Arc::new(Both {
            first: first?,
            second: second?,
        }))
    }
}

#[async_trait]
impl Floor for Both {
    fn description(&self) -> String {
        format!(
            "first store: {}; then second store: {}",
            self.first.description(),
            self.second.description()
        )
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        self.first.pair(name).await?;
        self.second.pair(name).await
    }
}

/// The memory store's floor: insert and remove a key in a mutex-guarded map.
#[derive(Default)]
struct MemoryFloor {
    map: Mutex<HashMap<LockName, u64>>,
}

#[async_trait]
impl Floor for MemoryFloor {
    fn description(&self) -> String {
        "HashMap insert + remove under a std Mutex".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let map = || self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map().insert(name.clone(), 1);
        map().remove(name);
        Ok(())
    }
}
