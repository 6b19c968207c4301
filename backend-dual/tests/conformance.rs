//! The shared suite against `dual://` over two in-process memory stores and over a kit
//! ZooKeeper server (first) and a kit Redis server (second), the pair a ZooKeeper → Redis
//! migration uses. The dual-only scenarios (one side unreachable, one side's connection lost)
//! are in `tests/faults.rs`; the migration phases in `tests/phases.rs`.

mod common;

use std::process::ExitCode;

use conformance_tests::catalog::declare;
use conformance_tests::kit::{Redis, ZooKeeper};
use conformance_tests::spawn::SpawnName;
use conformance_tests::{Expect, Kind, Target};

use common::dual_url;

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

    let zk_redis = declare(
        SpawnName::Dual,
        Target::lazy(
            "dual_zk_redis",
            || async {
                let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
                let redis = Redis::shared().await.expect("kit Redis");
                dual_url(&format!("{}/dual-ct", zk.url()), &redis.url(), "")
            },
            common::dual,
        ),
    );
    // The other way round: a second store that cannot carry a token minimum. Cases only; the
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
                         with a second store that cannot carry a token minimum",
                    ),
                )
            },
        );
    conformance_tests::harness::main(
        vec![memory, zk_redis, redis_zk],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
