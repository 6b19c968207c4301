//! What backend-zk's test binaries share: short durations, a guard against hangs, a
//! client of a `zk://` URL, plain acquire options and unique lock names.
// Each test binary uses part of this module.
#![allow(dead_code, unused_imports)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backend_zk::zookeeper_client as zk;
use backend_zk::{ZkConfig, ZkLock};
use conformance_tests::{FencedResource, History};
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, Wait};

pub const SEC: Duration = Duration::from_secs(1);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub use conformance_tests::within;

pub async fn client(url: &str) -> ZkLock {
    ZkLock::connect(&ZkConfig::parse(url).expect("url"))
        .await
        .expect("connect")
}

pub fn dyn_lock(lock: &ZkLock) -> Arc<dyn DistributedLock> {
    Arc::new(lock.clone())
}

/// `ttl`, no keep-alive, `wait`.
pub fn plain(ttl: Duration, wait: Wait) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(wait)
}

/// `label` with a random suffix, so that runs never share a lock.
pub fn unique(label: &str) -> String {
    format!("{label}-{:08x}", rand_u32())
}

pub fn rand_u32() -> u32 {
    lockcore::OwnerId::random().0 as u32
}

/// The children of `name`'s parent node, as another session sees them.
pub async fn nodes(observer: &ZkLock, name: &str) -> Vec<String> {
    let parent = observer.parent_path(&LockName::new(name).unwrap());
    match observer.zk_client().list_children(&parent).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {parent}: {e}"),
    }
}

/// Client `id` takes `name` again and again until `stop` is set: each hold is recorded in
/// `history`, writes its token to `fenced` (a refusal fails the test) and lasts 20 ms; store
/// errors that may pass are waited out. Returns how many holds it had.
pub fn contend(
    locks: Arc<dyn DistributedLock>,
    name: &str,
    id: usize,
    history: &Arc<History>,
    fenced: &Arc<FencedResource>,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let (name, history, fenced, stop) = (
        name.to_owned(),
        history.clone(),
        fenced.clone(),
        stop.clone(),
    );
    tokio::spawn(async move {
        let mut held = 0;
        while !stop.load(Ordering::SeqCst) {
            match locks
                .lock(&name, &plain(5 * SEC, Wait::For(20 * SEC)))
                .await
            {
                Ok(g) => {
                    let hold = history.acquired(id, &g.lease());
                    fenced
                        .write(g.fencing_token(), id as u64)
                        .expect("a current holder was refused");
                    tokio::time::sleep(ms(20)).await;
                    history.ended(hold);
                    let _ = g.release().await;
                    held += 1;
                }
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(100)).await,
                Err(e) => panic!("client {id}: {e}"),
            }
        }
        held
    })
}
