//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against a
//! standalone ZooKeeper server and a 3-node ensemble, both started by the test kit and shared
//! by every case of this test binary (fault scenarios start private servers), and on the
//! standalone server again in Curator's and kazoo's layouts (`layout=curator|kazoo`). Every
//! client has its own session. How each fares in every fault scenario is declared once, in
//! `conformance_tests::catalog`, which `dlock compare` reads too.

use std::process::ExitCode;

use conformance_tests::Target;
use conformance_tests::catalog::{declare, declare_with_options};
use conformance_tests::kit::{ZkEnsemble, ZooKeeper};
use conformance_tests::spawn::SpawnName;
use tokio::sync::OnceCell;

/// A target on the kit's standalone server: `label`, in the chroot `/{chroot}`, with the URL
/// options `options` (`""`, or `layout=...`) on every URL, fault scenarios' included.
fn standalone(label: &str, chroot: &'static str, options: &'static str) -> Target {
    let connect = |url: String| async move { backend_zk::connect(&url).await };
    let target = Target::lazy(
        label,
        move || async move {
            let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
            let query = if options.is_empty() { "" } else { "?" };
            format!("{}/{chroot}{query}{options}", zk.url())
        },
        connect,
    );
    declare_with_options(SpawnName::Zk, target, options)
}

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_zk::connect(&url).await };
    let ensemble = Target::lazy(
        "zookeeper_ensemble",
        || async {
            static ENSEMBLE: OnceCell<ZkEnsemble> = OnceCell::const_new();
            let e = ENSEMBLE
                .get_or_init(|| async { ZkEnsemble::start(3).await.expect("kit ensemble") })
                .await;
            format!("{}/conformance", e.url())
        },
        connect,
    );
    conformance_tests::harness::main(
        vec![
            standalone("zookeeper", "conformance", ""),
            declare(SpawnName::ZkEnsemble, ensemble),
            standalone("zookeeper_curator", "conformance-curator", "layout=curator"),
            standalone("zookeeper_kazoo", "conformance-kazoo", "layout=kazoo"),
        ],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
