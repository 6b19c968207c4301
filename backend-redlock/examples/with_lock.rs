//! A critical section over a majority of independent Redis masters.
//!
//! ```sh
//! cargo run -p fencedlock-redlock --example with_lock -- redlock://h1:6379,h2:6379,h3:6379
//! ```
//!
//! `with_lock` releases the lock when the work ends, and drops the work (returning
//! `Error::LockLost`) if the lock is lost while it runs.

use std::time::Duration;

use lockcore::{AcquireOptions, LockExt};

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redlock://127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381".to_owned());
    let locks = backend_redlock::connect(&url).await?;
    let opts = AcquireOptions::new().ttl(Duration::from_secs(10));
    let total = locks
        .with_lock("invoices", &opts, |token| async move {
            // Pass the token with every write, so the resource can refuse a stale holder.
            println!("charging invoices with fencing token {token}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            42
        })
        .await?;
    println!("charged {total} invoices");
    Ok(())
}
