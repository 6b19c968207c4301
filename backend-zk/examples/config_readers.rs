//! Many readers, one writer: a read-write lock on ZooKeeper, compatible with Curator's
//! `InterProcessReadWriteLock` when the URL says `layout=curator`.
//!
//! ```sh
//! cargo run -p fencedlock-zk --example config_readers -- zk://127.0.0.1:2181/app read
//! cargo run -p fencedlock-zk --example config_readers -- zk://127.0.0.1:2181/app write
//! ```

use std::time::Duration;

use lockcore::{AcquireOptions, ReadWriteExt};

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "zk://127.0.0.1:2181/app".to_owned());
    let write = args.next().as_deref() == Some("write");
    let locks = backend_zk::connect(&url).await?;
    let opts = AcquireOptions::new();

    if write {
        let guard = locks.write_lock("config", &opts).await?;
        println!(
            "writing the config, fencing token {}",
            guard.fencing_token()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        guard.release().await?;
    } else {
        let guard = locks.read_lock("config", &opts).await?;
        println!("reading the config beside other readers");
        tokio::time::sleep(Duration::from_secs(3)).await;
        guard.release().await?;
    }
    Ok(())
}
