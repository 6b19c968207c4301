//! The memory backend's `inspect` counts the read side of a read-write lock: readers holding,
//! and how many of the queued waiters are readers, in `LockInfo::with_readers`' wording.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    AcquireOptions, DistributedLock, KeepAlive, LockName, MemoryLock, ReadWriteExt, Wait,
};

fn opts(wait: Wait) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(wait)
}

#[tokio::test]
async fn inspect_counts_readers_holding_and_readers_queued() {
    let store: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("memory-inspect"));
    let name = LockName::new("rw").unwrap();
    let r1 = store.try_read_lock("rw", &opts(Wait::No)).await.unwrap();
    let r2 = store.try_read_lock("rw", &opts(Wait::No)).await.unwrap();
    assert!(r1.is_some() && r2.is_some(), "two readers share");
    // A writer queues behind the readers, and a reader queues behind the writer.
    let long = Wait::For(Duration::from_secs(60));
    let writer = {
        let store = store.clone();
        tokio::spawn(async move { store.write_lock("rw", &opts(long)).await })
    };
    let queued = |n: usize| {
        let (store, name) = (store.clone(), name.clone());
        async move {
            let hang_guard = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let info = store.inspect(&name).await.unwrap().expect("in use");
                    if info.waiters == Some(n) {
                        return info;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            hang_guard.await.expect("the waiters did not queue")
        }
    };
    let info = queued(1).await;
    assert_eq!(info.details, ["2 reader(s) holding"]);
    let reader = {
        let store = store.clone();
        tokio::spawn(async move { store.read_lock("rw", &opts(long)).await })
    };
    let info = queued(2).await;
    assert_eq!(
        info.details,
        ["2 reader(s) holding", "1 of the 2 waiting are readers"]
    );
    writer.abort();
    reader.abort();
    drop((r1, r2));
}
