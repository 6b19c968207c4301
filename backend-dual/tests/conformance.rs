//! The shared suite against `dual://` over two in-process memory stores and over a kit
//! ZooKeeper server (first) and a kit Redis server (second), the pair a ZooKeeper → Redis
//! migration uses. The dual-only scenarios (one side unreachable, one side's connection lost)
//! are in `tests/faults.rs`; the migration phases in `tests/phases.rs`.

mod common;

use std::process::ExitCode;

use conformance_tests::kit::{Redis, ZooKeeper};
use conformance_tests::{Expect, Kind, Persistence, Spawned, Target};

use common::{Both, dual_url};

const SESSION: Expect = Expect::NotApplicable(
    "the first store is ZooKeeper, whose locks end with the session (Expiry::Session), not at a \
     server-side ttl; dual's own one-side faults are in backend-dual/tests/faults.rs",
);

const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn main() -> ExitCode {
    let memory = Target::new(
        "dual_memory",
        dual_url("memory://dual-ct-first", "memory://dual-ct-second", ""),
        common::dual,
    )
    .fault("client_paused_past_ttl", Expect::Safe)
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    .fault(
        "holder_process_killed",
        Expect::NotApplicable("in-process stores: another process cannot share them"),
    )
    .without_server("both stores are in-process memory; there is no server to break");

    let zk_redis = Target::lazy(
        "dual_zk_redis",
        || async {
            let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
            let redis = Redis::shared().await.expect("kit Redis");
            dual_url(&format!("{}/dual-ct", zk.url()), &redis.url(), "")
        },
        common::dual,
    )
    .spawn_with(|persistence| async move {
        let zk = ZooKeeper::start().await?;
        let redis = match persistence {
            Persistence::Durable => Redis::start_with(DURABLE).await?,
            Persistence::None => Redis::start().await?,
        };
        Ok(Spawned {
            url: dual_url(
                &format!("{}/faults?session_timeout=4s", zk.url()),
                &redis.url(),
                "",
            ),
            server: Box::new(Both { zk, redis }),
            keep: None,
        })
    })
    .fault("server_killed_and_restarted", Expect::Safe)
    // Redis restarts empty, its counter back at 0, but a dual token is at least the first
    // store's czxid, which ZooKeeper keeps: the next token is still above the old holder's.
    .fault(
        "server_killed_and_restarted_without_persistence",
        Expect::Safe,
    )
    .fault("server_paused_past_ttl", SESSION)
    .fault("holder_replies_blackholed_past_ttl", SESSION)
    .fault("holder_requests_blackholed_past_ttl", SESSION)
    .fault("holder_process_killed", SESSION)
    .fault("client_paused_past_ttl", SESSION)
    // Both stores have semaphores: a permit is held on both, its token at least ZooKeeper's
    // czxid, which survives the restart.
    .fault("sem_server_killed_and_restarted", Expect::Safe)
    .fault("rw_reader_server_killed_and_restarted", Expect::Safe)
    .fault("sem_holder_blackholed_past_ttl", SESSION)
    .fault(
        "store_connections_killed",
        Expect::NotApplicable(
            "ZooKeeper cannot end client connections from the server side; dual's lost \
             connections are cut with the kit's proxy in backend-dual/tests/faults.rs",
        ),
    );
    // The other way round: a second store that cannot carry a token floor. Cases only; the
    // fault scenarios run on the ZooKeeper-first pair above.
    let redis_zk = conformance_tests::registry()
        .iter()
        .filter(|c| c.kind == Kind::Fault)
        .fold(
            Target::lazy(
                "dual_redis_zk",
                || async {
                    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
                    let redis = Redis::shared().await.expect("kit Redis");
                    dual_url(
                        &format!("{}?prefix=dual-ct-reverse", redis.url()),
                        &format!("{}/dual-ct-reverse", zk.url()),
                        "",
                    )
                },
                common::dual,
            ),
            |t, c| {
                t.fault(
                    c.name,
                    Expect::NotApplicable(
                        "the fault scenarios run on dual_zk_redis; this pair checks the cases \
                         with a second store that cannot carry a token floor",
                    ),
                )
            },
        );
    conformance_tests::harness::main(
        vec![memory, zk_redis, redis_zk],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
