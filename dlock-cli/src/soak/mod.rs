//! `dlock soak`: clients contend on a few names for minutes while a nemesis breaks the store in
//! random ways, and the recorded history is judged.
//!
//! Each client is a thread of its own with a one-thread tokio runtime, so that a *client pause*
//! freezes everything of that client (its work, its keep-alive, its connections) as a stopped
//! process would be, while the others go on. Clients take a random name, write through that
//! name's [`FencedResource`] with their token at once, hold for a random time around the ttl
//! (renewing), write again, and release. The nemesis (`nemesis`) applies faults from the kit,
//! alone or two or three at once, for durations around the ttl, aimed at renewals and hand-offs
//! half the time, and heals them.
//!
//! What is judged (`judge`): no two holders' validity windows overlap and tokens grow with
//! acquisition order (the history checker); no write made within its holder's validity is
//! refused (that would mean a newer holder existed); nothing is left held or queued once every
//! client has ended; and the nemesis did enough (fault counts). Stale writes the fenced
//! resources refused, lost leases by reason, availability and the longest gap without a holder
//! are reported.
//!
//! The seed fixes every random choice (fault kinds, durations, gaps, targets, clients' names and
//! hold times); where a fault lands relative to renewals depends on timing, so a rerun with the
//! same seed applies the same schedule of faults, not at the same instants.

mod client;
mod judge;
mod model;
mod nemesis;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::{FencedResource, History};

pub use judge::{Anomaly, FaultStats, NameStats, SoakReport};
use model::{Counters, Shared};
pub use model::{FaultKind, SoakError, SoakOptions, SoakProgress, Store};

/// Runs a soak on `store`, calling `progress` about once a second.
///
/// # Cancel safety
/// Not cancel safe: dropping the future leaves client threads running until the soak's own
/// deadline, and faults unhealed (servers the stack owns are killed when it is dropped).
///
/// # Errors
/// Options out of range, a fault the store cannot take, or clients that cannot connect at the
/// start. Problems found while soaking are anomalies in the report, not errors.
pub async fn soak(
    store: &Store<'_>,
    opts: &SoakOptions,
    progress: &(dyn Fn(&SoakProgress) + Send + Sync),
) -> Result<SoakReport, SoakError> {
    opts.validate().map_err(SoakError)?;
    let kinds = store.faults_for(&opts.faults)?;
    let start = Instant::now();
    let shared = Arc::new(Shared {
        names: (0..opts.names)
            .map(|i| format!("dlock-soak/{}/{i}", opts.seed))
            .collect(),
        history: History::new(),
        fenced: (0..opts.names).map(|_| FencedResource::new()).collect(),
        writes: Mutex::default(),
        faults: Mutex::default(),
        counters: Mutex::new(Counters {
            per_client: vec![0; opts.clients],
            ..Counters::default()
        }),
        holders: Mutex::new(vec![None; opts.names]),
        ttl: opts.ttl,
        start,
        deadline: start + opts.duration,
        seed: opts.seed,
    });

    let clients = client::start_all(store, opts, &shared).await?;
    let nemesis = nemesis::Nemesis::new(store, &kinds, &shared, clients.pausers());
    let run = nemesis.run();
    tokio::pin!(run);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = &mut run => break,
            _ = tick.tick() => progress(&shared.progress(opts.duration, false)),
        }
    }
    progress(&shared.progress(opts.duration, true));
    clients.join().await;
    let ended = Instant::now();
    let leftovers = judge::leftovers(store, &shared).await;
    Ok(judge::report(store, opts, kinds, &shared, ended, leftovers))
}
