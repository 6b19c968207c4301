//! Scenarios that pause a client past its ttl or kill a holder's process.

use super::*;

/// A client is paused past its ttl (its one runtime thread blocked, so keep-alive cannot run).
/// The store expires its lease, another client takes the lock with a higher token and writes;
/// when the paused client resumes, its guard no longer claims the lock, `lost()` resolves, its
/// late write is refused and its release says `NotHeld`.
pub async fn client_paused_past_ttl(ctx: Ctx) {
    paused_past_ttl(ctx, Primitive::Lock).await;
}

/// [`client_paused_past_ttl`] for a reader: a writer gets in only once the paused reader's
/// lease is over, with a higher token, so the reader's late action on what it guarded is
/// refused; the resumed reader's guard says it is lost and its release frees nothing.
pub async fn rw_reader_paused_past_ttl(ctx: Ctx) {
    paused_past_ttl(ctx, Primitive::Read).await;
}

/// A client holding `primitive` is paused past its ttl (see [`client_paused_past_ttl`]). The
/// one who then takes over: for the lock, another client's lock; for a permit, another client's
/// permit while a steady holder keeps the other one (so the taker must wait for the paused
/// permit to run out); for a read hold, a writer.
pub(crate) async fn paused_past_ttl(ctx: Ctx, primitive: Primitive) {
    let url = ctx.target().url().await;
    let name = ctx.name("paused-client");
    let fenced = Arc::new(FencedResource::new());
    let history = Arc::new(History::new());
    let (to_a, a_waits) = std::sync::mpsc::channel::<()>();
    let (a_got, got_a) = tokio::sync::oneshot::channel::<FencingToken>();
    let a_thread = {
        let (target, url, name, fenced, history) = (
            ctx.target().clone(),
            url.clone(),
            name.clone(),
            fenced.clone(),
            history.clone(),
        );
        std::thread::spawn(move || {
            let a = PausedClient {
                target,
                url,
                name,
                primitive,
                fenced,
                history,
            };
            a.run(a_got, a_waits)
        })
    };
    let token_a = within(60 * SEC, "A acquires", got_a)
        .await
        .expect("A's thread ended before acquiring");
    let steady = if primitive == Primitive::Permit {
        let s = ctx.connect(&url).await;
        let opts = held(10 * SEC);
        Some(first_hold(&s, &name, primitive, &opts, "the steady holder").await)
    } else {
        None
    };
    let b = ctx.connect(&url).await;
    let taker = match primitive {
        Primitive::Read => Primitive::Lock,
        other => other,
    };
    let opts = plain(10 * SEC, 30 * SEC);
    let (gb, b_at) = take_through_errors(&b, &name, taker, &opts, 60 * SEC, "B").await;
    let mut findings = Findings::default();
    if gb.fencing_token() <= token_a {
        findings.push(format!(
            "B's token {} is not above paused A's {}",
            gb.fencing_token(),
            token_a
        ));
    }
    findings.new_holder_writes(&fenced, gb.fencing_token(), 2);
    to_a.send(()).expect("A listens");
    let late = tokio::task::spawn_blocking(move || a_thread.join())
        .await
        .expect("join")
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    if late {
        findings.push("paused A's late write was accepted after B wrote");
    }
    history.push(hold_of(1, &gb, b_at, Some(Instant::now())));
    gb.release().await.expect("release");
    if let Some((s, s_at)) = steady {
        assert!(s.is_held(), "the steady holder lost its permit");
        history.push(hold_of(2, &s, s_at, Some(Instant::now())));
        s.release().await.expect("release");
        for v in crate::check_permits(&history.holds(), PERMITS as usize) {
            findings.push(v.to_string());
        }
    } else {
        findings.history(&history);
    }
    verdict(&ctx, findings);
}

/// Paused A of [`paused_past_ttl`]: on a runtime of its own with one thread.
struct PausedClient {
    target: Target,
    url: String,
    name: String,
    primitive: Primitive,
    fenced: Arc<FencedResource>,
    history: Arc<History>,
}

impl PausedClient {
    /// Takes its primitive, writes, reports its token, then blocks its only runtime thread
    /// until told to go on; returns whether its late write was accepted.
    fn run(
        self,
        got: tokio::sync::oneshot::Sender<FencingToken>,
        go_on: std::sync::mpsc::Receiver<()>,
    ) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("A's runtime");
        rt.block_on(async move {
            let a = self.target.connect(&self.url).await.expect("A connects");
            let (ga, at) = first_hold(&a, &self.name, self.primitive, &held(SEC), "A").await;
            self.fenced.write(ga.fencing_token(), 1).expect("A writes");
            let _ = got.send(ga.fencing_token());
            // Paused: nothing of A's runs until B has taken over.
            go_on.recv().expect("resumed");
            assert!(
                !ga.is_held(),
                "a paused guard still claims its hold after its ttl"
            );
            let late = self.fenced.write(ga.fencing_token(), 3).is_ok();
            let reason = within(30 * SEC, "A's lost()", ga.lost()).await;
            assert!(
                matches!(reason, LostReason::Expired | LostReason::Taken),
                "lost() said {reason:?}"
            );
            self.history.push(hold_of(0, &ga, at, None));
            assert_eq!(ga.release().await.expect("release"), Released::NotHeld);
            late
        })
    }
}

/// The first argument of a process started by [`holder_process_killed`]: only this makes a
/// program the holder, never its environment alone (which a user's shell may pass on). What
/// the holder is to do comes in the environment, so the store's URL stays out of the argument
/// list, which every user of the machine can read.
pub const CHILD_ARG: &str = "__dlock-fault-holder";
const CHILD_TARGET: &str = "DLOCK_CT_CHILD_TARGET";
const CHILD_URL: &str = "DLOCK_CT_CHILD_URL";
const CHILD_NAME: &str = "DLOCK_CT_CHILD_NAME";
const CHILD_TTL: Duration = Duration::from_secs(3);

/// In a process started by [`holder_process_killed`] (its first argument is [`CHILD_ARG`]):
/// the label of the target whose store it is to hold a lock in. `None` in every other process.
pub fn child_label() -> Option<String> {
    std::env::args_os().nth(1).filter(|a| a == CHILD_ARG)?;
    Some(std::env::var(CHILD_TARGET).expect("the holder's target label"))
}

/// In a test binary started by [`holder_process_killed`]: holds the lock it was told to,
/// prints its token and waits to be killed. `None` when this process is not such a child.
pub fn child_main(targets: &[Target]) -> Option<std::process::ExitCode> {
    let label = child_label()?;
    let url = std::env::var(CHILD_URL).expect("child url");
    let name = std::env::var(CHILD_NAME).expect("child lock name");
    let target = targets
        .iter()
        .find(|t| t.label() == label)
        .unwrap_or_else(|| panic!("no target {label} in this test binary"))
        .clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let c = target.connect(&url).await.expect("child connects");
        let guard = c
            .lock(&name, &AcquireOptions::new().ttl(CHILD_TTL))
            .await
            .expect("child acquires");
        println!("DLOCK_HELD {}", guard.fencing_token().0);
        use std::io::Write as _;
        std::io::stdout().flush().expect("flush");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(guard);
    });
    Some(std::process::ExitCode::SUCCESS)
}

/// Another OS process holds the lock (keep-alive on) and is killed -9. The lock frees, but not
/// before ttl − drift has passed since that process was started, and the next token is higher.
/// The child is this same program (a test binary, or `dlock compare`), started again with
/// [`CHILD_ARG`] and the store's URL in its environment (see [`child_main`]).
pub async fn holder_process_killed(ctx: Ctx) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let url = ctx.target().url().await;
    let name = ctx.name("held-by-another-process");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();
    let spawned_at = Instant::now();
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .arg(CHILD_ARG)
        .env(CHILD_TARGET, ctx.backend())
        .env(CHILD_URL, &url)
        .env(CHILD_NAME, &name)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the holder process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let child_token: u64 = within(60 * SEC, "the holder process", async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read")
                .expect("the holder process ended before holding the lock");
            if let Some((_, t)) = line.split_once("DLOCK_HELD ") {
                break t.trim().parse().expect("token");
            }
        }
    })
    .await;
    fenced
        .write(FencingToken(child_token), 1)
        .expect("the child's write");
    // The child's lease began after it was started, so it is valid at least until then +
    // ttl − drift: nobody may hold the lock before that.
    history.push(Hold {
        client: 0,
        name: name.clone(),
        token: child_token,
        acquired: spawned_at,
        valid_until: spawned_at + CHILD_TTL - lockcore::backend_support::default_drift(CHILD_TTL),
        ended: None,
    });
    let c = ctx.client().await;
    let opts = plain(5 * SEC, SEC).wait(Wait::No);
    assert!(
        try_answered(&c, &name, &opts).await.is_none(),
        "the lock is free while another process holds it"
    );
    child.kill().await.expect("kill -9 the holder process");
    let (guard, at) = within(60 * SEC, "the lock frees after the kill", async {
        loop {
            if let Some(g) = try_answered(&c, &name, &opts).await {
                break (g, Instant::now());
            }
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    findings.new_holder_writes(&fenced, guard.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, FencingToken(child_token));
    history.push(hold_of(1, &guard, at, Some(Instant::now())));
    guard.release().await.expect("release");
    findings.history(&history);
    verdict(&ctx, findings);
}
