//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against
//! Redlock over 3 and over 5 independent masters, started by the test kit and shared by every
//! case of this test binary (fault scenarios start private servers, and break every node at
//! once). Every client has its own connections and subscribers. How Redlock fares in every
//! fault scenario is declared once, in `conformance_tests::catalog`, which `dlock compare`
//! reads too; faults of single nodes are Redlock's own, in `tests/faults.rs`.

use std::process::ExitCode;

use conformance_tests::Target;
use conformance_tests::catalog::declare;
use conformance_tests::kit::RedisSet;
use conformance_tests::spawn::SpawnName;

fn redlock(n: usize, name: SpawnName) -> Target {
    let connect = |url: String| async move { backend_redlock::connect(&url).await };
    let target = Target::lazy(
        &format!("redlock{n}"),
        move || async move {
            RedisSet::shared(n)
                .await
                .expect("kit redis-servers")
                .redlock_url()
        },
        connect,
    );
    declare(name, target)
}

fn main() -> ExitCode {
    conformance_tests::harness::main(
        vec![
            redlock(3, SpawnName::Redlock3),
            redlock(5, SpawnName::Redlock5),
        ],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
