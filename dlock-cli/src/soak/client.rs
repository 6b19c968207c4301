//! The soak's clients: one thread and one-thread runtime each, so that a pause freezes all of
//! a client (its keep-alive and connections too) and nothing of the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, Error, KeepAlive, LeaseWatch, LockExt, LockGuard, Released, Wait};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{mpsc, oneshot, watch};

use super::model::{Shared, SoakError, SoakOptions, Store, WriteRecord, lock};

/// Sends a pause of the given length to one client.
pub(crate) type Pauser = mpsc::UnboundedSender<Duration>;

/// The running clients.
pub(crate) struct Clients {
    threads: Vec<std::thread::JoinHandle<()>>,
    pausers: Vec<Pauser>,
}

impl Clients {
    /// One pauser per client, by index.
    pub(crate) fn pausers(&self) -> Vec<Pauser> {
        self.pausers.clone()
    }

    /// Waits for every client to finish its last hold.
    pub(crate) async fn join(self) {
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || {
            threads.into_iter().filter_map(|t| t.join().err()).count()
        })
        .await;
        if !matches!(joined, Ok(0)) {
            tracing::error!("a soak client thread panicked");
        }
    }
}

/// Starts every client and connects it; they start contending once all are connected.
pub(crate) async fn start_all(
    store: &Store<'_>,
    opts: &SoakOptions,
    shared: &Arc<Shared>,
) -> Result<Clients, SoakError> {
    let (go_tx, go_rx) = watch::channel(None::<bool>);
    let mut threads = Vec::with_capacity(opts.clients);
    let mut pausers = Vec::with_capacity(opts.clients);
    let mut ready = Vec::with_capacity(opts.clients);
    for i in 0..opts.clients {
        let url = store.client_urls[i % store.client_urls.len()].clone();
        let connect = store.connect.clone();
        let shared = shared.clone();
        let (pause_tx, pause_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let go = go_rx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("soak-client-{i}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("cannot start a runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    tokio::spawn(freeze_on_request(pause_rx));
                    let backend = match connect(url).await {
                        Ok(b) => b,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let mut go = go;
                    if !matches!(
                        go.wait_for(Option::is_some).await.as_deref(),
                        Ok(Some(true))
                    ) {
                        return;
                    }
                    work(i, backend, &shared).await;
                });
            })
            .map_err(|e| SoakError(format!("cannot start a client thread: {e}")))?;
        threads.push(thread);
        pausers.push(pause_tx);
        ready.push(ready_rx);
    }
    let mut failure = None;
    for (i, r) in ready.into_iter().enumerate() {
        match r.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(format!("client {i} cannot connect: {e}"))),
            Err(_) => failure = failure.or(Some(format!("client {i} ended before connecting"))),
        }
    }
    let _ = go_tx.send(Some(failure.is_none()));
    if let Some(why) = failure {
        Clients { threads, pausers }.join().await;
        return Err(SoakError(why));
    }
    Ok(Clients { threads, pausers })
}

/// Blocks this client's only runtime thread for each requested pause: every task of the client
/// stops, as in a stopped process.
async fn freeze_on_request(mut requests: mpsc::UnboundedReceiver<Duration>) {
    while let Some(pause) = requests.recv().await {
        std::thread::sleep(pause);
    }
}

/// Contends until the deadline: take a random name, hold it for a random time, release.
async fn work(client: usize, backend: Arc<dyn lockcore::DistributedLock>, shared: &Shared) {
    let ttl = shared.ttl;
    let mut rng = StdRng::seed_from_u64(
        shared.seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let opts = AcquireOptions::new()
        .ttl(ttl)
        .wait(Wait::For(ttl * 3))
        .keep_alive(KeepAlive::renew());
    while Instant::now() < shared.deadline {
        let name = rng.random_range(0..shared.names.len());
        // From a tenth of the ttl to twice it: short holds hand off often, long ones renew.
        let hold_for = Duration::from_millis(
            rng.random_range(ttl.as_millis() as u64 / 10..=ttl.as_millis() as u64 * 2),
        );
        match backend.lock(&shared.names[name], &opts).await {
            Ok(guard) => hold(client, name, guard, hold_for, shared).await,
            Err(Error::Timeout { .. }) => shared.counters().timeouts += 1,
            Err(e) => {
                note_error(shared, &e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn note_error(shared: &Shared, e: &Error) {
    let mut c = shared.counters();
    c.errors += 1;
    if c.first_error.is_none() {
        c.first_error = Some(e.to_string());
    }
}

/// One hold: write at once (as a correct client, only while it holds), hold, write again
/// without looking (after a pause this is the late write fencing must refuse), release.
async fn hold(client: usize, name: usize, guard: LockGuard, hold_for: Duration, shared: &Shared) {
    let watch = guard.watch();
    let id = shared.history.acquired(client, &watch.lease());
    shared.counters().per_client[client] += 1;
    set_holder(shared, name, Some((client, Instant::now() + hold_for)));
    if watch.is_held() {
        write(client, name, &watch, shared);
    }
    let lost = tokio::select! {
        // Sleep first: after a freeze both are ready, and the frozen client does not know.
        biased;
        () = tokio::time::sleep(hold_for) => None,
        reason = watch.lost() => Some(reason),
    };
    if lost.is_none() {
        write(client, name, &watch, shared);
    }
    shared.history.extended(id, &watch.lease());
    shared.history.ended(id);
    set_holder(shared, name, None);
    let believed_valid = watch.is_held();
    let released = guard.release().await;
    let reason = match (&released, lost) {
        (_, Some(reason)) => Some(reason),
        (Ok(Released::NotHeld), None) => {
            if believed_valid {
                shared.counters().gone_while_valid.push((
                    Instant::now(),
                    client,
                    shared.names[name].clone(),
                ));
            }
            // The keep-alive reports it by the lease's end at the latest.
            tokio::time::timeout(shared.ttl + Duration::from_secs(1), watch.lost())
                .await
                .ok()
        }
        _ => None,
    };
    if let Err(e) = &released {
        note_error(shared, e);
    }
    if let Some(reason) = reason {
        *shared
            .counters()
            .lost
            .entry(format!("{reason:?}"))
            .or_default() += 1;
    } else if matches!(released, Ok(Released::NotHeld)) {
        *shared
            .counters()
            .lost
            .entry("unreported".to_owned())
            .or_default() += 1;
    }
}

fn set_holder(shared: &Shared, name: usize, holder: Option<(usize, Instant)>) {
    lock(&shared.holders)[name] = holder;
}

/// Writes through the name's fenced resource with the lease's token, and records it.
fn write(client: usize, name: usize, watch: &LeaseWatch, shared: &Shared) {
    let lease = watch.lease();
    let accepted = shared.fenced[name]
        .write(lease.token(), client as u64)
        .is_ok();
    lock(&shared.writes).push(WriteRecord {
        client,
        name,
        token: lease.token().0,
        at: Instant::now(),
        valid_until: lease.valid_until(),
        accepted,
    });
}
