//! Read-write locks on every dialect.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::within;
use lockcore::{DistributedLock, Error, Lease, LockName, Released};

use crate::support::*;

async fn try_read(c: &Arc<dyn DistributedLock>, n: &LockName, ttl: Duration) -> Option<Lease> {
    c.try_acquire_shared(n, &opts(ttl).with_defaults(&c.defaults()))
        .await
        .expect("try_acquire_shared")
}

/// Waits until a writer's `try` on `n` succeeds (the readers' row came free), and returns
/// that lease.
async fn until_writer_gets_in(c: &Arc<dyn DistributedLock>, n: &LockName) -> Lease {
    within(Duration::from_secs(30), "the writer to get in", async {
        loop {
            if let Some(w) = take(c, n, Duration::from_secs(30)).await {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

per_dialect!(
    readers_hold_the_row_until_the_last_goes,
    dropped_read_waits_leave_no_rows,
    no_reader_outlives_the_readers_lease_row,
);

impl Raw {
    /// Live read holds of `name` that expire after the lease row does, by the database's
    /// stored times (one query, so both are read at once).
    pub(crate) async fn holds_past_the_row(&self, name: &str) -> i64 {
        let sql = self.sql(&format!(
            "SELECT count(*) FROM {{q}}{READERS}{{q}} AS r JOIN {{q}}{TABLE}{{q}} AS l \
             ON l.name = r.name WHERE r.name = $1 AND r.fence IS NOT NULL \
             AND r.expires_at > l.expires_at"
        ));
        on_pool!(self, pool => sqlx::query_scalar(sql).bind(name).fetch_one(pool).await)
            .expect("raw comparison")
    }
}

/// A reader's hold never runs out after the lease row that keeps writers out. A writer takes
/// the row as soon as it expires; a hold that outlived it, even by the time between two
/// statements of one transaction, could still be released (`Released`, where the holder had
/// lost it) or, worse, extended while the writer held. CI once saw the release: the fault case
/// `rw_reader_paused_past_ttl` on PostgreSQL, whose writer gets in 1 ms after the row expires.
/// Checked after a grant, after an extension, and after a second reader joins and extends.
async fn no_reader_outlives_the_readers_lease_row(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let ttl = Duration::from_secs(30);
    let a = try_read(&c, &n, ttl).await.expect("a reader");
    assert_eq!(raw.holds_past_the_row(n.as_str()).await, 0, "after a grant");
    let a = c.extend(&a, ttl).await.expect("extend");
    assert_eq!(
        raw.holds_past_the_row(n.as_str()).await,
        0,
        "after an extension"
    );
    let b = try_read(&c, &n, ttl).await.expect("a second reader");
    let _b = c.extend(&b, ttl).await.expect("extend");
    assert_eq!(
        raw.holds_past_the_row(n.as_str()).await,
        0,
        "with two readers"
    );
    assert_eq!(c.release(&a).await.unwrap(), Released::Released);
}

/// Readers share the name and keep a writer out until the last of them goes: a release that
/// leaves another reader keeps the writer out, a reader's extension keeps it out past the
/// reader's first ttl, and a reader that is never released (a crashed process) holds it out
/// only until its lease runs out; then its release and extension find nothing, and the
/// writer's token is above every reader's. While the writer holds, readers are refused; once
/// it has gone, the last reader's release frees the name at once, and nothing is left in the
/// readers table.
async fn readers_hold_the_row_until_the_last_goes(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let long = Duration::from_secs(30);
    let a = try_read(&c, &n, long).await.expect("the first reader");
    let b = try_read(&c, &n, Duration::from_secs(2))
        .await
        .expect("a second reader shares");
    assert!(b.token() > a.token(), "reader tokens increase");
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!(info.holder.as_deref(), Some("readers"));
    assert_eq!(info.details, ["2 reader(s) holding"]);
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer beside readers"
    );
    assert_eq!(c.release(&a).await.unwrap(), Released::Released);
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer got in while a reader still held"
    );
    let b = c
        .extend(&b, Duration::from_secs(6))
        .await
        .expect("a live reader extends");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer got in past the reader's first ttl although it had extended"
    );
    // `b` is never released: its lease runs out.
    let w = until_writer_gets_in(&c, &n).await;
    assert!(
        w.token() > b.token(),
        "the writer's token is above the readers'"
    );
    assert_eq!(c.release(&b).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&b, long).await,
        Err(Error::LockLost { .. })
    ));
    assert!(
        try_read(&c, &n, long).await.is_none(),
        "a reader beside the writer"
    );
    assert_eq!(c.release(&w).await.unwrap(), Released::Released);
    let r = try_read(&c, &n, long)
        .await
        .expect("a reader after the writer");
    assert!(r.token() > w.token());
    assert_eq!(c.release(&r).await.unwrap(), Released::Released);
    let w2 = take(&c, &n, long)
        .await
        .expect("the last reader's release frees the name at once");
    c.release(&w2).await.unwrap();
    assert_eq!(
        raw.rows_of(READERS, n.as_str()).await,
        0,
        "reader rows left"
    );
}

/// A reader queued behind a writer leaves its mark in the readers table and a row in the
/// waiters table; a reader whose wait is dropped (its task aborted) leaves neither behind, and
/// the writer's release then finds nobody waiting.
async fn dropped_read_waits_leave_no_rows(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let w = take(&c, &n, Duration::from_secs(30)).await.expect("writer");
    let reader = {
        let (c, n) = (c.clone(), n.clone());
        tokio::spawn(async move {
            let opts = opts(Duration::from_secs(30)).with_defaults(&c.defaults());
            let until = Instant::now() + Duration::from_secs(60);
            c.acquire_shared_wait(&n, &opts, Some(until)).await
        })
    };
    until_queued(&c, &n, 1).await;
    assert_eq!(
        raw.rows_of(READERS, n.as_str()).await,
        1,
        "the queued reader's mark"
    );
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!(info.details, ["1 of the 1 waiting are readers"]);
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    until_no_rows(&raw, READERS, &n, "the dropped reader's mark").await;
    until_no_rows(&raw, WAITERS, &n, "the dropped reader's waiter row").await;
    assert_eq!(c.release(&w).await.unwrap(), Released::Released);
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!((info.holder, info.waiters), (None, Some(0)));
}
