//! What the cost ladders (`cost_ladder`, `redlock_ladder`) share: the least scripts that keep
//! the backend's queue, the shuffled rounds of steps, and the report.

use std::time::Duration;

/// A step's failure.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The owner id every raw step writes.
pub const OWNER: &str = "0123456789abcdef0123456789abcdef";

/// The least acquire that keeps the queue: `SET NX PX` + `INCR` of the fence counter, refused
/// while someone is queued. KEYS lock, fence, queue; ARGV owner, ttl_ms.
pub const FAIR: &str = "if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end return redis.call('INCR', KEYS[2])";

/// The least release that keeps the queue: compare-and-delete that also looks at the queue (to
/// wake its head). KEYS lock, queue; ARGV owner.
pub const FAIR_DELETE: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('DEL', KEYS[1]) if redis.call('EXISTS', KEYS[2]) == 0 then return 1 end return 2";

/// Pairs per step and round.
const BLOCK: usize = 200;

/// The order the steps run in: `rounds` rounds after one warm-up round that is not recorded,
/// each round every step once in a new order, `BLOCK` pairs at a time, so that no step always
/// follows another and all see the same machine load.
///
/// ```text
/// while let Some(step) = schedule.next_step() { time one pair of `step`; schedule.record(..) }
/// ```
pub struct Schedule {
    order: Vec<usize>,
    seed: u64,
    rounds: usize,
    round: usize,
    at: usize,
    done_in_block: usize,
    samples: Vec<Vec<Duration>>,
}

impl Schedule {
    /// A schedule of `steps` steps over `rounds` recorded rounds.
    pub fn new(steps: usize, rounds: usize) -> Self {
        let mut schedule = Schedule {
            order: (0..steps).collect(),
            seed: 0x9e37_79b9_7f4a_7c15,
            rounds,
            round: 0,
            at: 0,
            done_in_block: 0,
            samples: vec![Vec::new(); steps],
        };
        schedule.shuffle();
        schedule
    }

    fn shuffle(&mut self) {
        for i in (1..self.order.len()).rev() {
            // xorshift64: a fixed, dependency-free sequence of shuffles.
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.order.swap(i, (self.seed % (i as u64 + 1)) as usize);
        }
    }

    /// The step whose pair runs next; `None` when all rounds are done.
    pub fn next_step(&mut self) -> Option<usize> {
        if self.done_in_block == BLOCK {
            self.done_in_block = 0;
            self.at += 1;
            if self.at == self.order.len() {
                self.at = 0;
                self.round += 1;
                self.shuffle();
            }
        }
        if self.round > self.rounds || self.order.is_empty() {
            return None;
        }
        self.done_in_block += 1;
        Some(self.order[self.at])
    }

    /// Records one pair of `step` that took `took` (dropped in the warm-up round).
    pub fn record(&mut self, step: usize, took: Duration) {
        if self.round > 0 {
            self.samples[step].push(took);
        }
    }

    /// Each step's recorded pair times.
    pub fn into_samples(self) -> Vec<Vec<Duration>> {
        self.samples
    }
}

/// Prints each step's median, mean and p90 pair, and its pairs/s relative to the first step's
/// (total pairs over total time, as `dlock bench` reports it).
pub fn report(steps: &[&str], samples: Vec<Vec<Duration>>) {
    let width = steps.iter().map(|s| s.chars().count()).max().unwrap_or(4);
    println!(
        "{:<width$} {:>9} {:>9} {:>9} {:>9}",
        "step", "median", "mean", "p90", "÷ floor"
    );
    let mean_of =
        |v: &[Duration]| v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap_or(u32::MAX);
    let floor_mean = mean_of(&samples[0]);
    for (label, mut v) in steps.iter().zip(samples) {
        v.sort_unstable();
        let mean = mean_of(&v);
        let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
        let ratio = floor_mean.as_secs_f64() / mean.as_secs_f64();
        println!(
            "{label:<width$} {:>9.1?} {:>9.1?} {:>9.1?} {ratio:>9.3}",
            at(0.5),
            mean,
            at(0.9)
        );
    }
}
