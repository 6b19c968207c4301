//! One lock held on two stores at once, the step in the middle of moving from one store to
//! another. Here both are ZooKeeper and Redis servers on this machine; `connect_store` decides
//! how each store URL is connected (the `dlock` facade passes its own `connect`).
//!
//! ```sh
//! cargo run -p fencedlock-dual --example two_stores -- zk://127.0.0.1:2181/app redis://127.0.0.1:6379
//! ```

use std::sync::Arc;

use lockcore::{AcquireOptions, DistributedLock, Error, LockExt, percent_encode};

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let first = args
        .next()
        .unwrap_or_else(|| "zk://127.0.0.1:2181/app".to_owned());
    let second = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let url = format!(
        "dual://?first={}&second={}",
        percent_encode(&first),
        percent_encode(&second)
    );
    let locks =
        backend_dual::connect(&url, |store| async move { connect_store(&store).await }).await?;

    let guard = locks.lock("orders", &AcquireOptions::new()).await?;
    // The second store's token, carried above the first store's: higher than any token either
    // store gave before.
    println!(
        "held on both stores, fencing token {}",
        guard.fencing_token()
    );
    guard.release().await?;
    Ok(())
}

async fn connect_store(url: &str) -> lockcore::Result<Arc<dyn DistributedLock>> {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    match scheme {
        "zk" => backend_zk::connect(url).await,
        "redis" => backend_redis::connect(url).await,
        _ => Err(Error::UnsupportedScheme {
            scheme: scheme.to_owned(),
            available: vec!["zk", "redis"],
        }),
    }
}
