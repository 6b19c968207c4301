//! A job that must run on one machine at a time, stopped in time if its lease cannot be kept.
//!
//! ```sh
//! cargo run -p fencedlock-sql --example nightly_job                     # a SQLite file in /tmp
//! cargo run -p fencedlock-sql --example nightly_job -- 'postgres://app:secret@db/app'
//! ```
//!
//! Start it twice at once: the second run waits for the first, then runs with a higher fencing
//! token.

use std::time::Duration;

use lockcore::{AcquireOptions, LockExt, Wait};

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let default = format!("sqlite://{}/nightly-job.db", std::env::temp_dir().display());
    let url = std::env::args().nth(1).unwrap_or(default);
    let locks = backend_sql::connect(&url).await?;

    // Wait up to a minute for another run to finish; keep-alive renews the 30 s lease.
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::For(Duration::from_secs(60)));
    let guard = locks.lock("nightly-report", &opts).await?;
    println!("running with fencing token {}", guard.fencing_token());

    tokio::select! {
        () = run_job() => println!("done"),
        // Renewals failing (the database unreachable): stop 5 s before the lease would end, so
        // the job never runs beside the next holder.
        reason = guard.expiring(Duration::from_secs(5)) => {
            eprintln!("stopping: the lock is ending ({reason:?})");
        }
    }
    guard.release().await?;
    Ok(())
}

async fn run_job() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}
