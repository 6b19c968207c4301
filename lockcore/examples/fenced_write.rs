//! Why a lock needs a fencing token: a holder that stalls past its lease (a GC pause, a frozen
//! VM) wakes up still believing it holds the lock. The resource it writes to keeps the highest
//! token it has seen and refuses anything lower, so the stale write is refused instead of
//! overwriting the new holder's.
//!
//! Runs on the in-memory backend; the same code works with any `Arc<dyn DistributedLock>`.
//!
//! ```sh
//! cargo run -p fencedlock-core --example fenced_write
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{AcquireOptions, DistributedLock, FencingToken, KeepAlive, LockExt, MemoryLock};

/// A resource that remembers the highest fencing token it accepted.
#[derive(Default)]
struct Storage {
    highest: Mutex<Option<FencingToken>>,
    value: Mutex<String>,
}

impl Storage {
    /// Accepts the write only if `token` is at least the highest token seen so far.
    fn write(&self, token: FencingToken, value: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().unwrap();
        if highest.is_some_and(|h| token < h) {
            return Err(format!(
                "refused: token {token} is older than {}",
                highest.unwrap()
            ));
        }
        *highest = Some(token);
        *self.value.lock().unwrap() = value.to_owned();
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> lockcore::Result<()> {
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("example"));
    let storage = Storage::default();
    // No keep-alive, so the lease really ends while the first holder stalls.
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(200))
        .keep_alive(KeepAlive::Off);

    let first = locks.lock("report", &opts).await?;
    let stale_token = first.fencing_token();
    println!("first holder: token {stale_token}");

    // The first holder stalls past its lease; the second one gets the lock and writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = locks.lock("report", &opts).await?;
    println!("second holder: token {}", second.fencing_token());
    storage
        .write(second.fencing_token(), "written by the second holder")
        .expect("the current holder's write is accepted");

    // The first holder wakes up and writes: the resource refuses it.
    match storage.write(stale_token, "written by the first holder") {
        Ok(()) => panic!("a stale holder's write was accepted"),
        Err(why) => println!("first holder's late write: {why}"),
    }
    println!("value: {}", storage.value.lock().unwrap());

    second.release().await?;
    drop(first);
    Ok(())
}
