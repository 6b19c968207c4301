//! The uncontended phase: pairs of acquire and release, interleaved with the store's floors.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use dlock::{AcquireOptions, DistributedLock, Error, KeepAlive, LockName, Released, Result, Wait};
use dlock_bench::{Floor, Floors};

use super::client::hold_one;
use super::report::{
    FloorReport, LatencySummary, UncontendedReport, new_histogram, per_sec, record,
};
use super::{BenchOptions, Phase, Progress};

/// Result of one timed loop.
pub(super) struct LoopStats {
    pub(super) hist: Histogram<u64>,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    /// Wall time spent measuring this loop (after warm-up).
    pub(super) measured: Duration,
    /// Each turn's completed pairs and measured time, in order (interleaved loops only; a turn
    /// wholly inside the warm-up is left out).
    pub(super) turns: Vec<(u64, Duration)>,
}

impl LoopStats {
    pub(super) fn new() -> Self {
        LoopStats {
            hist: new_histogram(),
            errors: 0,
            first_error: None,
            measured: Duration::ZERO,
            turns: Vec::new(),
        }
    }

    fn outcome(&mut self, outcome: Result<()>, latency: Duration) {
        match outcome {
            Ok(()) => record(&mut self.hist, latency),
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e.to_string());
                }
            }
        }
    }
}

/// Length of one turn when two loops are interleaved.
pub(super) const SLICE: Duration = Duration::from_millis(200);

/// Runs `op` back to back until `until`, recording calls that start at or after `measure_from`.
pub(super) async fn run_slice<F, Fut>(
    op: &mut F,
    until: Instant,
    measure_from: Instant,
    stats: &mut LoopStats,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let slice_start = Instant::now();
    let pairs_before = stats.hist.len();
    loop {
        let t0 = Instant::now();
        if t0 >= until {
            break;
        }
        let outcome = op().await;
        if t0 >= measure_from {
            stats.outcome(outcome, t0.elapsed());
        }
    }
    let from = slice_start.max(measure_from);
    let measured = Instant::now().saturating_duration_since(from);
    stats.measured += measured;
    if !measured.is_zero() {
        stats
            .turns
            .push((stats.hist.len() - pairs_before, measured));
    }
}

/// How steady a ratio of two interleaved loops was over one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Spread {
    /// Turns that both loops measured (each turn of one beside the other's next).
    pub(super) rounds: usize,
    /// First quartile of the per-round ratio of `a`'s pairs/s to `b`'s.
    pub(super) p25: f64,
    /// Third quartile of the same.
    pub(super) p75: f64,
    /// `b` against itself: its pairs/s in odd rounds ÷ in even rounds.
    pub(super) self_ratio: f64,
}

/// The spread of `a`'s pairs/s over `b`'s, round by round, and of `b` against itself; `None`
/// with fewer than two rounds in which both loops completed pairs.
pub(super) fn spread(a: &[(u64, Duration)], b: &[(u64, Duration)]) -> Option<Spread> {
    let rate = |(pairs, t): (u64, Duration)| per_sec(pairs, t);
    let mut ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.0 > 0 && y.0 > 0)
        .map(|(&x, &y)| rate(x) / rate(y))
        .collect();
    if ratios.len() < 2 || b.len() < 2 {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let half = |parity: usize| {
        let (pairs, t) = b
            .iter()
            .skip(parity)
            .step_by(2)
            .fold((0, Duration::ZERO), |(p, d), &(x, y)| (p + x, d + y));
        rate((pairs, t))
    };
    Some(Spread {
        rounds: ratios.len(),
        p25: quantile(&ratios, 0.25),
        p75: quantile(&ratios, 0.75),
        self_ratio: half(1) / half(0),
    })
}

/// The `q` quantile of sorted, non-empty `v`, interpolated between neighbours.
fn quantile(v: &[f64], q: f64) -> f64 {
    let at = q * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

/// Alternates `a` and each floor in [`SLICE`] turns for `warmup + duration` each, so each gets
/// about `duration` of measurement and drift on a shared machine hits all of them alike.
pub(super) async fn interleaved<FA, FutA>(
    opts: &BenchOptions,
    progress: &dyn Progress,
    mut a: FA,
    floors: &[(Arc<dyn Floor>, LockName)],
) -> (LoopStats, Vec<LoopStats>)
where
    FA: FnMut() -> FutA,
    FutA: Future<Output = Result<()>>,
{
    let turns = 1 + floors.len() as u32;
    let total = turns * (opts.warmup + opts.duration);
    let start = Instant::now();
    let measure_from = start + turns * opts.warmup;
    let end = start + total;
    let mut sa = LoopStats::new();
    let mut sf: Vec<LoopStats> = floors.iter().map(|_| LoopStats::new()).collect();
    let mut turn = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        progress.update(Phase::Uncontended, now - start, total);
        let until = (now + SLICE).min(end);
        match turn {
            0 => run_slice(&mut a, until, measure_from, &mut sa).await,
            i => {
                let (floor, name) = &floors[i - 1];
                run_slice(
                    &mut || floor.pair(name),
                    until,
                    measure_from,
                    &mut sf[i - 1],
                )
                .await;
            }
        }
        turn = (turn + 1) % turns as usize;
    }
    // The floors' share of the window ends with it.
    progress.update(Phase::Floor, total, total);
    (sa, sf)
}

/// Calls `op` back to back for `warmup + duration`, recording the latency of the calls that start
/// after the warm-up.
pub(super) async fn timed_loop<F, Fut>(
    opts: &BenchOptions,
    phase: Phase,
    progress: &dyn Progress,
    mut op: F,
) -> LoopStats
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let total = opts.warmup + opts.duration;
    let start = Instant::now();
    let measure_from = start + opts.warmup;
    let end = measure_from + opts.duration;
    let mut stats = LoopStats::new();
    let mut last_tick = start;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        if t0.duration_since(last_tick) >= Duration::from_millis(100) {
            progress.update(phase, t0 - start, total);
            last_tick = t0;
        }
        let outcome = op().await;
        if t0 >= measure_from {
            stats.outcome(outcome, t0.elapsed());
        }
    }
    stats.measured = Instant::now().saturating_duration_since(measure_from);
    progress.update(phase, total, total);
    stats
}

pub(super) async fn uncontended(
    opts: &BenchOptions,
    backend: &Arc<dyn DistributedLock>,
    store_floors: &Floors,
    prefix: &str,
    progress: &dyn Progress,
) -> Result<UncontendedReport> {
    let name = format!("{prefix}/uncontended");
    let lock_opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off);
    let (name_ref, opts_ref) = (name.as_str(), &lock_opts);
    let permits = opts.permits;
    let dlock_pair = || async move {
        let guard = hold_one(backend, name_ref, permits, opts_ref).await?;
        match guard.release().await? {
            Released::Released => Ok(()),
            Released::NotHeld => Err(Error::LockLost {
                backend: backend.capabilities().backend,
                name: name_ref.to_owned(),
                operation: "bench release",
            }),
        }
    };
    // With floors, the loops alternate in short turns over the same window, so the ratios are
    // not skewed by whatever else the machine did during one of them.
    let mut floors = Vec::new();
    let mut kinds = Vec::new();
    for (kind, floor) in [
        ("plain", &store_floors.raw),
        ("fenced", &store_floors.fenced),
        ("recipe", &store_floors.recipe),
    ] {
        if let Some(floor) = floor.clone() {
            floors.push((floor, LockName::new(format!("{prefix}/{kind}-floor"))?));
            kinds.push(kind);
        }
    }
    let (dlock, raws) = if floors.is_empty() {
        (
            timed_loop(opts, Phase::Uncontended, progress, dlock_pair).await,
            Vec::new(),
        )
    } else {
        interleaved(opts, progress, dlock_pair, &floors).await
    };
    let pairs = dlock.hist.len();
    let pairs_per_sec = per_sec(pairs, dlock.measured);
    let mut floor = None;
    let mut fenced_floor = None;
    let mut recipe_floor = None;
    for ((kind, (f, _)), raw) in kinds.into_iter().zip(&floors).zip(raws) {
        let floor_pairs = raw.hist.len();
        let floor_per_sec = per_sec(floor_pairs, raw.measured);
        let spread = spread(&dlock.turns, &raw.turns);
        let report = FloorReport {
            description: f.description(),
            pairs: floor_pairs,
            pairs_per_sec: floor_per_sec,
            latency: LatencySummary::of(&raw.hist),
            errors: raw.errors,
            ratio: if floor_per_sec > 0.0 {
                pairs_per_sec / floor_per_sec
            } else {
                0.0
            },
            rounds: spread.map_or(0, |s| s.rounds),
            ratio_p25: spread.map(|s| s.p25),
            ratio_p75: spread.map(|s| s.p75),
            self_ratio: spread.map(|s| s.self_ratio),
        };
        match kind {
            "plain" => floor = Some(report),
            "fenced" => fenced_floor = Some(report),
            _ => recipe_floor = Some(report),
        }
    }

    Ok(UncontendedReport {
        name,
        pairs,
        pairs_per_sec,
        latency: LatencySummary::of(&dlock.hist),
        errors: dlock.errors,
        first_error: dlock.first_error,
        floor,
        fenced_floor,
        recipe_floor,
    })
}

/// The median pair of the floor with the lock's guarantee (fenced where there is one), from a
/// short run of its own, for a contended-only bench.
pub(super) async fn floor_median(
    opts: &BenchOptions,
    floors: &Floors,
    prefix: &str,
    progress: &dyn Progress,
) -> Result<Option<f64>> {
    let Some(floor) = floors.target() else {
        return Ok(None);
    };
    let name = LockName::new(format!("{prefix}/limit-floor"))?;
    let short = BenchOptions {
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(200),
        ..opts.clone()
    };
    let stats = timed_loop(&short, Phase::Floor, progress, || floor.pair(&name)).await;
    Ok((!stats.hist.is_empty()).then(|| LatencySummary::of(&stats.hist).p50_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(rates: &[u64]) -> Vec<(u64, Duration)> {
        // One second per turn, so a turn's pairs are its pairs/s.
        rates.iter().map(|&p| (p, Duration::from_secs(1))).collect()
    }

    #[test]
    fn spread_gives_the_per_round_quartiles_and_the_floor_against_itself() {
        // Ratios per round: 0.5, 0.9, 1.0, 0.8, 0.95 → sorted 0.5, 0.8, 0.9, 0.95, 1.0.
        let a = turns(&[50, 90, 100, 80, 95]);
        let b = turns(&[100, 100, 100, 100, 100]);
        let s = spread(&a, &b).expect("five rounds");
        assert_eq!(s.rounds, 5);
        assert!((s.p25 - 0.8).abs() < 1e-12, "{s:?}");
        assert!((s.p75 - 0.95).abs() < 1e-12, "{s:?}");
        assert!((s.self_ratio - 1.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn the_floor_against_itself_weighs_turns_by_their_time() {
        // Odd turns: 300 pairs in 2 s (150/s); even turns: 100 + 200 pairs in 1 s + 1 s.
        let b = vec![
            (100, Duration::from_secs(1)),
            (100, Duration::from_secs(1)),
            (200, Duration::from_secs(1)),
            (200, Duration::from_secs(1)),
        ];
        let a = turns(&[100, 100, 100, 100]);
        let s = spread(&a, &b).expect("four rounds");
        assert!((s.self_ratio - 1.0).abs() < 1e-12, "{s:?}");
        let b = vec![
            (100, Duration::from_secs(1)),
            (150, Duration::from_secs(1)),
            (100, Duration::from_secs(1)),
            (150, Duration::from_secs(1)),
        ];
        let s = spread(&a, &b).expect("four rounds");
        assert!((s.self_ratio - 1.5).abs() < 1e-12, "{s:?}");
        // Quartiles interpolate: ratios 100/150, 100/150, 1, 1.
        assert!((s.p25 - 2.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert!((s.p75 - 1.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn spread_needs_two_rounds_with_pairs_on_both_sides() {
        assert_eq!(spread(&turns(&[10]), &turns(&[10])), None);
        // A round in which either loop completed nothing is left out.
        assert_eq!(spread(&turns(&[10, 0, 10]), &turns(&[0, 10, 10])), None);
        assert_eq!(
            spread(&turns(&[10, 0, 10, 20]), &turns(&[0, 10, 10, 10])).map(|s| s.rounds),
            Some(2)
        );
    }
}
