//! The store chosen in configuration, not in code: the same program runs on SQLite in
//! development and on PostgreSQL, Redis or ZooKeeper in production.
//!
//! ```sh
//! cargo run -p fencedlock --example from_config
//! DLOCK_CONFIG='{"url": "redis://127.0.0.1:6379", "ttl": "10s"}' \
//!     cargo run -p fencedlock --example from_config
//! ```

use dlock::{AcquireOptions, LockConfig, LockExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In an application this is a section of its own configuration file.
    let default = format!(
        r#"{{"url": "sqlite://{}/from-config.db", "ttl": "30s"}}"#,
        std::env::temp_dir().display()
    );
    let text = std::env::var("DLOCK_CONFIG").unwrap_or(default);
    let config: LockConfig = serde_json::from_str(&text)?;
    let locks = dlock::connect_config(&config).await?;
    println!("connected: {}", locks.capabilities().backend);

    let guard = locks.lock("daily-report", &AcquireOptions::new()).await?;
    println!(
        "holding daily-report, fencing token {}",
        guard.fencing_token()
    );
    guard.release().await?;
    Ok(())
}
