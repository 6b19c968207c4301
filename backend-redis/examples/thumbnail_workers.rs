//! At most three workers at once, fleet-wide: a counting semaphore on Redis.
//!
//! ```sh
//! cargo run -p fencedlock-redis --example thumbnail_workers -- redis://127.0.0.1:6379
//! ```
//!
//! Start it several times at once: three run, the others wait for a permit.

use std::time::Duration;

use lockcore::{AcquireOptions, SemaphoreExt, Wait};

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let locks = backend_redis::connect(&url).await?;

    // The count is checked when the semaphore is made (no I/O) and against the store's when
    // permits are taken: every worker must ask for the same count.
    let workers = locks.semaphore("thumbnails", 3)?;
    let opts = AcquireOptions::new().wait(Wait::For(Duration::from_secs(120)));
    let permit = workers.acquire(&opts).await?;
    println!("working with permit token {}", permit.fencing_token());
    tokio::time::sleep(Duration::from_secs(5)).await;
    permit.release().await?;
    Ok(())
}
