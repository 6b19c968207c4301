//! What a hand-over between processes costs on PostgreSQL and MySQL/MariaDB, stripped to its
//! store calls: the floor under `dlock bench --mode contended --processes`.
//!
//! `PROCESSES` processes (8 by default, as the bench's contended run) pass one lease row around
//! a ring for `SECONDS` (4) in each step, each holding it 1 ms (slept, then spun, as the bench
//! holds). A hand-over is timed from the moment the holder starts giving the row up to the
//! moment the next process may use it, as the bench times it, and the rate is set against the
//! bench's limit, `1 / (hold + the backend's own floor pair)`, with the floor pair measured
//! first through `dlock_bench::floor` (what `dlock bench` uses). Each step is one way to
//! hand over, the least first:
//!
//! 1. **hand, ring**: one flushed `UPDATE` makes the next process the owner with the next
//!    fence, then a datagram (a Linux abstract socket, as `crate::bell`'s doorbells) tells it;
//!    it holds on the datagram alone. Not sound (anyone on the host can send a datagram); the
//!    least any design that writes the new fence durably can do.
//! 2. **hand, ring, look**: as 1, and the woken process reads the row before it holds (what
//!    this crate does on MySQL and SQLite: a doorbell only hastens a look).
//! 3. **hand, NOTIFY** (PostgreSQL): the flushed `UPDATE` sends `pg_notify`, which the server
//!    delivers only after the commit, so the next process may hold on the notification alone.
//! 4. **free, NOTIFY, grant** (PostgreSQL): the row freed without waiting for the flush and a
//!    notification, then the woken process's own flushed grant (this crate on PostgreSQL).
//! 5. **free, ring, grant**: a flushed free, a datagram, and the woken process's flushed grant:
//!    two flushes in a row.
//! 6. **+ the queue**: a design with what its FIFO queue adds, the releaser joining the queue
//!    again at once (a waiter row `INSERT`, on PostgreSQL without waiting for the flush) and
//!    looking once (a read), and the new holder's waiter row deleted by its grant (PostgreSQL)
//!    or after its look (MySQL): step 4 on PostgreSQL (this crate's design there until the
//!    release handed over), step 2 on MySQL (this crate's design there), with those
//!    statements, which the bench's clients, re-acquiring at once, also send.
//! 7. **+ the queue, joined and looked at in one statement** (PostgreSQL): as 6, the join's
//!    `INSERT` also counting the waiters ahead in the same statement.
//! 8. **hand, NOTIFY, + the queue** (PostgreSQL): this crate's design there now, step 3 with
//!    the queue's statements of step 6, the hand-over's `UPDATE` also deleting the new
//!    holder's waiter row.
//!
//! On PostgreSQL the waiters' table is `UNLOGGED`, as this crate's queue tables are.
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example handoff_ladder -- URL [PROCESSES=8] [SECONDS=4]
//! ```
//!
//! `URL` is a `postgres://` or `mysql://` URL as `dlock` takes it (`?sslmode=disable` and the
//! like are passed to the driver; dlock's own options such as `table` are not accepted here).
//! It creates and finally drops the tables `dlock_handoff_ladder` and `dlock_handoff_ladder_w`;
//! the floor writes the default lease table, as `dlock bench` does. Linux only.

#[cfg(target_os = "linux")]
fn main() {
    ring::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("handoff_ladder needs Linux's abstract socket names");
}

#[cfg(target_os = "linux")]
mod ring {
    use std::io::Write as _;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use lockcore::LockName;
    use sqlx::mysql::MySqlConnection;
    use sqlx::postgres::{PgConnection, PgListener};
    use sqlx::{AssertSqlSafe, Connection};

    const TABLE: &str = "dlock_handoff_ladder";
    /// The environment variable that makes this program one process of the ring.
    const CHILD: &str = "DLOCK_HANDOFF_LADDER";
    const HOLD: Duration = Duration::from_millis(1);
    /// The last part of a hold, spun rather than slept (as the bench's `hold_for`).
    const SPIN: Duration = Duration::from_micros(200);
    /// How long a process waits for its turn before it reports the ring stalled.
    const STALL: Duration = Duration::from_secs(10);

    /// The steps, in the order the module docs give them.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Step {
        HandRing,
        HandRingLook,
        HandNotify,
        FreeNotifyGrant,
        FreeRingGrant,
        Queued,
        QueuedJoinLooks,
        HandNotifyQueued,
    }

    const STEPS: [Step; 8] = [
        Step::HandRing,
        Step::HandRingLook,
        Step::HandNotify,
        Step::FreeNotifyGrant,
        Step::FreeRingGrant,
        Step::Queued,
        Step::QueuedJoinLooks,
        Step::HandNotifyQueued,
    ];

    impl Step {
        fn label(self) -> &'static str {
            match self {
                Step::HandRing => "hand (flushed), ring",
                Step::HandRingLook => "hand (flushed), ring, look",
                Step::HandNotify => "hand (flushed) + NOTIFY",
                Step::FreeNotifyGrant => "free (no flush) + NOTIFY, grant (flushed)",
                Step::FreeRingGrant => "free (flushed), ring, grant (flushed)",
                Step::Queued => "+ the queue: 4 on PostgreSQL, 2 on MySQL",
                Step::QueuedJoinLooks => "+ the queue, the join looking too",
                Step::HandNotifyQueued => "hand (flushed) + NOTIFY, + the queue",
            }
        }

        /// The hand-over the step makes (on PostgreSQL when `pg`): its own, or for the queue's
        /// steps the one this crate makes there (4 on PostgreSQL, 2 on MySQL).
        fn hand(self, pg: bool) -> Hand {
            match self {
                Step::HandRing => Hand::Ring,
                Step::HandRingLook => Hand::RingLook,
                Step::HandNotify => Hand::Notify,
                Step::FreeNotifyGrant => Hand::FreeNotifyGrant,
                Step::FreeRingGrant => Hand::FreeRingGrant,
                Step::Queued | Step::QueuedJoinLooks if pg => Hand::FreeNotifyGrant,
                Step::Queued | Step::QueuedJoinLooks => Hand::RingLook,
                Step::HandNotifyQueued => Hand::Notify,
            }
        }

        /// Whether the step sends the queue's statements besides its hand-over.
        fn queued(self) -> bool {
            matches!(
                self,
                Step::Queued | Step::QueuedJoinLooks | Step::HandNotifyQueued
            )
        }

        /// Whether only PostgreSQL can run the step (NOTIFY, or its join's `RETURNING`).
        fn postgres_only(self) -> bool {
            matches!(self.hand(false), Hand::Notify | Hand::FreeNotifyGrant)
                || matches!(self, Step::QueuedJoinLooks | Step::HandNotifyQueued)
        }
    }

    /// How the row passes to the next process (steps 1 to 5).
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Hand {
        Ring,
        RingLook,
        Notify,
        FreeNotifyGrant,
        FreeRingGrant,
    }

    impl Hand {
        /// Whether it wakes the next process by NOTIFY rather than by a datagram.
        fn notifies(self) -> bool {
            matches!(self, Hand::Notify | Hand::FreeNotifyGrant)
        }
    }

    fn now_us() -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH);
        i64::try_from(since.unwrap_or_default().as_micros()).unwrap_or(i64::MAX)
    }

    /// A raw connection to the store under test.
    enum Conn {
        Pg(PgConnection),
        My(MySqlConnection),
    }

    impl Conn {
        async fn open(url: &str) -> Conn {
            if url.starts_with("postgres") {
                Conn::Pg(PgConnection::connect(url).await.expect("connect"))
            } else {
                Conn::My(MySqlConnection::connect(url).await.expect("connect"))
            }
        }

        fn is_pg(&self) -> bool {
            matches!(self, Conn::Pg(_))
        }

        /// Runs `sql` (written with `$1`, `$2`; turned into `?` for MySQL) with integer
        /// arguments; returns the rows it changed or returned.
        async fn run(&mut self, sql: &str, args: &[i64]) -> u64 {
            match self {
                Conn::Pg(c) => {
                    let mut q = sqlx::query(AssertSqlSafe(sql.to_owned()));
                    for a in args {
                        q = q.bind(*a);
                    }
                    if sql.starts_with("SELECT") || sql.starts_with("WITH") {
                        q.fetch_all(&mut *c).await.expect("statement").len() as u64
                    } else {
                        q.execute(&mut *c).await.expect("statement").rows_affected()
                    }
                }
                Conn::My(c) => {
                    // `?` binds by position: each `$n` in the text's order, even repeated.
                    let mut text = sql.to_owned();
                    let mut order = Vec::new();
                    while let Some(at) = text.find('$') {
                        let n = usize::from(text.as_bytes()[at + 1] - b'1');
                        order.push(args[n]);
                        text.replace_range(at..at + 2, "?");
                    }
                    let mut q = sqlx::query(AssertSqlSafe(text));
                    for a in order {
                        q = q.bind(a);
                    }
                    if sql.starts_with("SELECT") {
                        q.fetch_all(&mut *c).await.expect("statement").len() as u64
                    } else {
                        q.execute(&mut *c).await.expect("statement").rows_affected()
                    }
                }
            }
        }
    }

    pub fn main() {
        if let Ok(task) = std::env::var(CHILD) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            return runtime.block_on(child(&task));
        }
        let args: Vec<String> = std::env::args().skip(1).collect();
        let Some(url) = args.first().cloned() else {
            eprintln!("usage: handoff_ladder URL [PROCESSES=8] [SECONDS=4]");
            std::process::exit(2);
        };
        let processes: usize = args.get(1).map_or(8, |p| p.parse().expect("PROCESSES"));
        let seconds: u64 = args.get(2).map_or(4, |s| s.parse().expect("SECONDS"));
        assert!(processes >= 2, "a ring needs two processes");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(parent(url, processes, seconds));
    }

    async fn parent(url: String, processes: usize, seconds: u64) {
        let floor = floor_pair_us(&url).await;
        let limit = 1e6 / (HOLD.as_secs_f64() * 1e6 + floor);
        let mut c = Conn::open(&url).await;
        let pg = c.is_pg();
        let create = match pg {
            true => [
                format!(
                    "CREATE TABLE IF NOT EXISTS {TABLE} (name text PRIMARY KEY, owner bigint, fence bigint NOT NULL)"
                ),
                format!(
                    "CREATE UNLOGGED TABLE IF NOT EXISTS {TABLE}_w (ticket bigint GENERATED ALWAYS AS IDENTITY, \
                     name text NOT NULL, waiter bigint NOT NULL, PRIMARY KEY (name, ticket))"
                ),
            ],
            false => [
                format!(
                    "CREATE TABLE IF NOT EXISTS {TABLE} (name varchar(16) PRIMARY KEY, owner bigint, fence bigint NOT NULL) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {TABLE}_w (ticket bigint AUTO_INCREMENT PRIMARY KEY, \
                     name varchar(16) NOT NULL, waiter bigint NOT NULL, KEY (name, ticket)) ENGINE=InnoDB"
                ),
            ],
        };
        for statement in &create {
            c.run(statement, &[]).await;
        }
        println!(
            "{processes} processes, {seconds} s a step, hold 1 ms; floor pair p50 {floor:.0} µs, so the limit is {limit:.0}/s"
        );
        println!(
            "{:<44} {:>8} {:>9} {:>13} {:>13}",
            "step", "per s", "of limit", "hand-over p50", "p99"
        );
        for step in STEPS.into_iter().filter(|s| pg || !s.postgres_only()) {
            c.run(&format!("DELETE FROM {TABLE}"), &[]).await;
            c.run(&format!("DELETE FROM {TABLE}_w"), &[]).await;
            c.run(
                &format!("INSERT INTO {TABLE} (name, owner, fence) VALUES ('x', 0, 1)"),
                &[],
            )
            .await;
            let (count, mut handovers) = run_step(&url, step, processes, seconds);
            handovers.sort_unstable();
            let at = |q: f64| {
                handovers
                    .get(((handovers.len() as f64 - 1.0) * q) as usize)
                    .copied()
                    .unwrap_or(0)
            };
            let rate = count as f64 / seconds as f64;
            println!(
                "{:<44} {:>8.0} {:>9.3} {:>10} µs {:>10} µs",
                step.label(),
                rate,
                rate / limit,
                at(0.5),
                at(0.99)
            );
            std::io::stdout().flush().ok();
        }
        c.run(&format!("DROP TABLE {TABLE}, {TABLE}_w"), &[]).await;
    }

    /// The p50 of 500 pairs of the backend's raw floor, after 100 unmeasured.
    async fn floor_pair_us(url: &str) -> f64 {
        let floors = dlock_bench::floor::connect(url)
            .await
            .expect("connect the floor");
        let floor = floors.raw.expect("a SQL database on file has a raw floor");
        let name = LockName::new("dlock-handoff-ladder/floor").expect("name");
        let mut pairs = Vec::with_capacity(500);
        for i in 0..600 {
            let t = Instant::now();
            floor.pair(&name).await.expect("floor pair");
            if i >= 100 {
                pairs.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        pairs.sort_by(f64::total_cmp);
        pairs[pairs.len() / 2]
    }

    /// Runs one step's ring; returns the holds counted in the window and the hand-overs (µs).
    fn run_step(url: &str, step: Step, processes: usize, seconds: u64) -> (u64, Vec<u64>) {
        let exe = std::env::current_exe().expect("own program");
        // The processes start together 1.5 s from now and count holds for `seconds`.
        let start = now_us() + 1_500_000;
        let end = start + i64::try_from(seconds).unwrap_or(60) * 1_000_000;
        let ring = std::process::id();
        let children: Vec<_> = (0..processes)
            .map(|i| {
                let task = format!("{url} {step:?} {i} {processes} {start} {end} {ring}");
                Command::new(&exe)
                    .env(CHILD, task)
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start a ring process")
            })
            .collect();
        let (mut count, mut handovers) = (0, Vec::new());
        for child in children {
            let out = child.wait_with_output().expect("ring process");
            assert!(out.status.success(), "a ring process failed");
            let text = String::from_utf8_lossy(&out.stdout);
            let mut words = text
                .split_whitespace()
                .map(|w| w.parse::<u64>().expect("figure"));
            count += words.next().unwrap_or(0);
            handovers.extend(words);
        }
        (count, handovers)
    }

    fn address(ring: u32, i: usize) -> SocketAddr {
        SocketAddr::from_abstract_name(format!("dlock-handoff-ladder/{ring}/{i}")).expect("address")
    }

    /// One process of the ring: waits for its turn, holds, hands over, until the window ends.
    async fn child(task: &str) {
        let words: Vec<&str> = task.split(' ').collect();
        let [url, step, i, processes, start, end, ring] = words[..] else {
            panic!("bad task `{task}`");
        };
        let step = STEPS
            .into_iter()
            .find(|s| format!("{s:?}") == step)
            .expect("step");
        let (i, processes): (usize, usize) = (i.parse().expect("i"), processes.parse().expect("n"));
        let (start, end): (i64, i64) = (start.parse().expect("start"), end.parse().expect("end"));
        let ring: u32 = ring.parse().expect("ring");
        let next = (i + 1) % processes;
        let me = i64::try_from(i).expect("index");
        let next_id = i64::try_from(next).expect("index");
        let mut c = Conn::open(url).await;
        let pg = c.is_pg();
        let hand = step.hand(pg);
        let mut listener = match hand.notifies() {
            true => {
                let mut l = PgListener::connect(url).await.expect("listen");
                l.listen(TABLE).await.expect("listen");
                Some(l)
            }
            false => None,
        };
        let bell = UnixDatagram::bind_addr(&address(ring, i)).expect("bind");
        bell.set_nonblocking(true).expect("nonblocking");
        let bell = tokio::net::UnixDatagram::from_std(bell).expect("bell");
        let sender = UnixDatagram::unbound().expect("socket");

        let t = TABLE;
        let hand_over = format!("UPDATE {t} SET owner = $1, fence = fence + 1 WHERE name = 'x'");
        let hand_notify = format!(
            "WITH u AS (UPDATE {t} SET owner = $1, fence = fence + 1 WHERE name = 'x' RETURNING 1) \
             SELECT pg_notify('{t}', $1::text || ' ' || $2::text) FROM u"
        );
        // Step 8's hand-over: as `hand_notify`, deleting the new holder's waiter row too.
        let hand_notify_dequeue = format!(
            "WITH u AS (UPDATE {t} SET owner = $1, fence = fence + 1 WHERE name = 'x' RETURNING 1), \
             d AS (DELETE FROM {t}_w WHERE name = 'x' AND waiter = $1) \
             SELECT pg_notify('{t}', $1::text || ' ' || $2::text) FROM u"
        );
        let free_quick_notify = format!(
            "WITH q AS (SELECT set_config('synchronous_commit', 'off', true)), \
             u AS (UPDATE {t} SET owner = NULL WHERE name = 'x' RETURNING 1) \
             SELECT pg_notify('{t}', $1::text || ' ' || $2::text) FROM u, q"
        );
        let free = format!("UPDATE {t} SET owner = NULL WHERE name = 'x'");
        let grant = format!(
            "UPDATE {t} SET owner = $1, fence = fence + 1 WHERE name = 'x' AND owner IS NULL"
        );
        let look = format!("SELECT fence FROM {t} WHERE name = 'x' AND owner = $1");
        // The queue (step 6): join at the tail, look at who is ahead, leave once granted.
        let join = match pg {
            true => format!(
                "WITH q AS (SELECT set_config('synchronous_commit', 'off', true)) \
                 INSERT INTO {t}_w (name, waiter) SELECT 'x', $1 FROM q"
            ),
            false => format!("INSERT INTO {t}_w (name, waiter) VALUES ('x', $1)"),
        };
        let ahead = format!(
            "SELECT count(*) FROM {t}_w WHERE name = 'x' AND waiter <> $1 \
             AND ticket < (SELECT max(ticket) FROM {t}_w WHERE name = 'x' AND waiter = $1)"
        );
        let grant_leave = format!(
            "WITH g AS (UPDATE {t} SET owner = $1, fence = fence + 1 \
             WHERE name = 'x' AND owner IS NULL RETURNING 1), \
             d AS (DELETE FROM {t}_w WHERE name = 'x' AND waiter = $1) SELECT 1 FROM g"
        );
        let leave = format!("DELETE FROM {t}_w WHERE name = 'x' AND waiter = $1");
        let join_looks = format!(
            "WITH q AS (SELECT set_config('synchronous_commit', 'off', true)), \
             j AS (INSERT INTO {t}_w (name, waiter) SELECT 'x', $1 FROM q RETURNING ticket) \
             SELECT (SELECT count(*) FROM {t}_w WHERE name = 'x' AND waiter <> $1 \
             AND ticket < (SELECT ticket FROM j))"
        );

        let (mut count, mut handovers) = (0u64, Vec::new());
        // Process 0 starts with the row (its owner is 0) when the window opens.
        let mut first = i == 0;
        if first {
            let wait = start - now_us();
            if wait > 0 {
                tokio::time::sleep(Duration::from_micros(wait.unsigned_abs())).await;
            }
        }
        loop {
            if !std::mem::take(&mut first) {
                // Wait for the turn: a datagram or a notification naming this process.
                let turn = async {
                    match listener.as_mut() {
                        Some(l) => loop {
                            let n = l.recv().await.expect("notification");
                            let (to, at) = n.payload().split_once(' ').expect("payload");
                            if to == i.to_string() {
                                break at.to_owned();
                            }
                        },
                        None => {
                            let mut buf = [0u8; 32];
                            let n = bell.recv(&mut buf).await.expect("datagram");
                            String::from_utf8_lossy(&buf[..n]).into_owned()
                        }
                    }
                };
                let message = tokio::time::timeout(STALL, turn)
                    .await
                    .expect("the ring stalled: no turn came for 10 s");
                if message == "stop" {
                    stop_next(hand, &mut c, &sender, ring, next).await;
                    break;
                }
                let at: i64 = message.parse().expect("time");
                match hand {
                    Hand::Ring | Hand::Notify => {}
                    Hand::RingLook => {
                        assert_eq!(c.run(&look, &[me]).await, 1, "handed the row");
                    }
                    Hand::FreeNotifyGrant | Hand::FreeRingGrant => {
                        let grant = if step.queued() { &grant_leave } else { &grant };
                        assert_eq!(c.run(grant, &[me]).await, 1, "granted the row");
                    }
                }
                if step.queued() && !pg {
                    // Off the new holder's path, as this crate's MySQL client does it.
                    c.run(&leave, &[me]).await;
                }
                let now = now_us();
                if now >= end {
                    stop_next(hand, &mut c, &sender, ring, next).await;
                    break;
                }
                if now >= start {
                    count += 1;
                    handovers.push(u64::try_from(now - at).unwrap_or(0));
                }
            }
            // Hold as the bench does: sleep, then spin the last part.
            let until = Instant::now() + HOLD;
            std::thread::sleep(HOLD.saturating_sub(SPIN));
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            let at = now_us();
            match hand {
                Hand::Notify => {
                    let hand = match step.queued() {
                        true => &hand_notify_dequeue,
                        false => &hand_notify,
                    };
                    c.run(hand, &[next_id, at]).await;
                }
                Hand::FreeNotifyGrant => {
                    c.run(&free_quick_notify, &[next_id, at]).await;
                }
                Hand::Ring | Hand::RingLook => {
                    c.run(&hand_over, &[next_id]).await;
                    ring_next(&sender, ring, next, &at.to_string());
                }
                Hand::FreeRingGrant => {
                    c.run(&free, &[]).await;
                    ring_next(&sender, ring, next, &at.to_string());
                }
            }
            if step == Step::QueuedJoinLooks {
                c.run(&join_looks, &[me]).await;
            } else if step.queued() {
                // Re-acquiring at once: join the tail and look once.
                c.run(&join, &[me]).await;
                c.run(&ahead, &[me]).await;
            }
        }
        let mut out = count.to_string();
        for h in handovers {
            out.push(' ');
            out.push_str(&h.to_string());
        }
        println!("{out}");
    }

    fn ring_next(sender: &UnixDatagram, ring: u32, next: usize, message: &str) {
        // The next process may have stopped already: nobody to tell.
        let _ = sender.send_to_addr(message.as_bytes(), &address(ring, next));
    }

    /// Tells the next process to stop, by the channel `hand` wakes it by.
    async fn stop_next(hand: Hand, c: &mut Conn, sender: &UnixDatagram, ring: u32, next: usize) {
        if hand.notifies() {
            let sql = format!("SELECT pg_notify('{TABLE}', $1::text || ' stop')");
            c.run(&sql, &[i64::try_from(next).expect("index")]).await;
        } else {
            ring_next(sender, ring, next, "stop");
        }
    }
}
