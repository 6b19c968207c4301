//! Digest credentials and ACLs, against a kit ZooKeeper: with credentials every node dlock
//! makes is creator-only, and every existing node it uses as a parent (the base node, a lock's
//! or a semaphore's node) is refused when another identity may do more than read it, in each
//! layout. Without credentials everything is world-open. Each test uses chroots of its own on
//! the shared server.

use std::time::Duration;

use backend_zk::zookeeper_client as zk;
use backend_zk::{ZkConfig, ZkLock};
use conformance_tests::kit::ZooKeeper;
use lockcore::{AcquireOptions, Error, KeepAlive, LockExt, LockName, Released};

mod common;

use common::{SEC, client, dyn_lock, unique};

/// The three layouts, as the URL's query and a label.
const LAYOUTS: [&str; 3] = ["layout=dlock", "layout=curator", "layout=kazoo"];

/// The digest credentials the tests' application uses, as `user:password`.
const ALICE: &str = "alice:s3cret";

async fn refused_connect(url: &str) -> Error {
    match ZkLock::connect(&ZkConfig::parse(url).expect("url")).await {
        Ok(_) => panic!("{url}: connected; expected the ACL check to refuse it"),
        Err(e) => e,
    }
}

fn try_opts() -> AcquireOptions {
    AcquireOptions::new()
        .ttl(30 * SEC)
        .keep_alive(KeepAlive::Off)
}

/// A plain session, anonymous or authenticated as `user:password`.
async fn raw(zk: &ZooKeeper, auth: Option<&str>) -> zk::Client {
    let mut connector = zk::Client::connector();
    if let Some(auth) = auth {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    connector
        .connect(&zk.connect_string())
        .await
        .expect("raw session")
}

/// The base node of `chroot` in `layout`: `{chroot}/dlock` in dlock's, the chroot in the others.
fn base_of(chroot: &str, layout: &str) -> String {
    if layout == "layout=dlock" {
        format!("/{chroot}/dlock")
    } else {
        format!("/{chroot}")
    }
}

/// Makes `path` and its missing ancestors PERSISTENT and world-open, as a client without an ACL
/// of its own (Curator's and kazoo's default) makes them.
async fn world_open(session: &zk::Client, path: &str) {
    session
        .mkdir(
            path,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap_or_else(|e| panic!("make {path} world-open: {e}"));
}

fn world(perms: zk::Permission) -> zk::Acl {
    zk::Acl::new(perms, zk::AuthId::anyone())
}

/// The creator (the session's digest identity) with `perms`.
fn creator(perms: zk::Permission) -> zk::Acl {
    zk::Acl::new(perms, zk::AuthId::authed())
}

async fn set_acl(session: &zk::Client, path: &str, acl: &[zk::Acl]) {
    session
        .set_acl(path, acl, None)
        .await
        .unwrap_or_else(|e| panic!("setAcl {path}: {e}"));
}

/// The ACL of `path` as `scheme:id:perms` entries, with the digest hash left out.
async fn acl_of(session: &zk::Client, path: &str) -> Vec<String> {
    let (acl, _) = session
        .get_acl(path)
        .await
        .unwrap_or_else(|e| panic!("getAcl {path}: {e}"));
    acl.iter()
        .map(|a| {
            let id = a.id().split_once(':').map_or(a.id(), |(user, _)| user);
            format!("{}:{id}:{}", a.scheme(), a.permission())
        })
        .collect()
}

/// Asserts `e` is the refusal of the node at `path`, whose ACL lets everyone do everything.
fn assert_refused(e: &Error, path: &str, acl: &str, what: &str) {
    let text = e.to_string();
    assert!(
        matches!(e, Error::AccessDenied { .. }),
        "{what}: expected access denied, got {text}"
    );
    for part in [
        format!("{path} has ACL {acl}"),
        format!("setAcl {path} auth::cdrwa"),
    ] {
        assert!(text.contains(&part), "{what}: {part:?} missing in: {text}");
    }
    assert!(!text.contains("s3cret"), "{what}: password in {text}");
}

/// Polls until `parent` has exactly `n` children (the limit only stops a hang).
async fn wait_for_children(session: &zk::Client, parent: &str, n: usize, what: &str) {
    tokio::time::timeout(30 * SEC, async {
        loop {
            let children = session.list_children(parent).await.expect("list");
            if children.len() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: {parent} never had {n} children"));
}

/// With credentials every node is created creator-only: another identity, or an anonymous
/// session, can neither delete the holder's node nor take the lock. A client with other
/// credentials is refused as it connects: it may not even read the base node's ACL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_identities_cannot_delete_or_take() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let chroot = unique("acl-others");
    let host = zk.connect_string();
    let alice = client(&format!("zk://{ALICE}@{host}/{chroot}")).await;
    let e = refused_connect(&format!("zk://mallory:other@{host}/{chroot}")).await;
    let text = e.to_string();
    assert!(matches!(e, Error::AccessDenied { .. }), "{text}");
    assert!(
        text.contains(&format!("may not read the ACL of /{chroot}/dlock")),
        "{text}"
    );
    let anonymous = client(&format!("zk://{host}/{chroot}")).await;
    let name = unique("acl");
    let g = dyn_lock(&alice)
        .lock(&name, &try_opts())
        .await
        .expect("alice acquires");
    let parent = alice.parent_path(&LockName::new(&name).unwrap());
    let children = alice
        .zk_client()
        .list_children(&parent)
        .await
        .expect("alice lists her nodes");
    assert_eq!(children.len(), 1);
    let node = format!("{parent}/{}", children[0]);
    let observer = alice.zk_client();
    assert_eq!(acl_of(&observer, &node).await, ["digest:alice:ALL"]);
    for (who, auth) in [("mallory", Some("mallory:other")), ("anonymous", None)] {
        match raw(zk, auth).await.delete(&node, None).await {
            Err(zk::Error::NoAuth) => {}
            r => panic!("{who} deleting alice's lock node: expected NoAuth, got {r:?}"),
        }
    }
    match dyn_lock(&anonymous).try_lock(&name, &try_opts()).await {
        Err(Error::AccessDenied { .. }) => {}
        Ok(Some(_)) => panic!("anonymous took alice's lock"),
        r => panic!("anonymous try_lock: expected access denied, got {r:?}"),
    }
    assert!(g.is_held());
    let info = dyn_lock(&alice)
        .inspect(&LockName::new(&name).unwrap())
        .await
        .expect("inspect")
        .expect("known");
    assert_eq!(info.holder, Some(g.lease().owner().to_string()));
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

/// An anonymous client made the base node world-open: a client with credentials refuses it at
/// connect, in every layout, naming the node and its ACL; once the base is limited to the
/// credentials (as the error says), it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn world_open_base_node_is_refused() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let anonymous = raw(zk, None).await;
    let alice = raw(zk, Some(ALICE)).await;
    for layout in LAYOUTS {
        let chroot = unique("acl-base");
        let base = base_of(&chroot, layout);
        world_open(&anonymous, &base).await;
        let url = format!("zk://{ALICE}@{host}/{chroot}?{layout}");
        let e = refused_connect(&url).await;
        assert_refused(&e, &base, "world:anyone:cdrwa", layout);
        set_acl(&alice, &base, &[creator(zk::Permission::ALL)]).await;
        let fixed = client(&url).await;
        let g = dyn_lock(&fixed)
            .try_lock("orders", &try_opts())
            .await
            .expect("lock under the fixed base")
            .expect("free");
        g.release().await.expect("release");
    }
}

/// An anonymous client holds a lock, so its node (made world-open) stands; the base node was
/// then limited to the application's credentials. A client with those credentials refuses the
/// lock's node, in every layout, and leaves no node of its own in it. Once the lock's node
/// lets others only read, it is used: the anonymous holder is seen as the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn world_open_lock_node_is_refused() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let alice = raw(zk, Some(ALICE)).await;
    for layout in LAYOUTS {
        let chroot = unique("acl-lock");
        let name = unique("orders");
        let open = client(&format!("zk://{host}/{chroot}?{layout}")).await;
        let held = dyn_lock(&open)
            .try_lock(&name, &try_opts())
            .await
            .expect("anonymous lock")
            .expect("free");
        let parent = open.parent_path(&LockName::new(&name).unwrap());
        set_acl(
            &alice,
            &base_of(&chroot, layout),
            &[creator(zk::Permission::ALL)],
        )
        .await;
        let locks = client(&format!("zk://{ALICE}@{host}/{chroot}?{layout}")).await;
        match dyn_lock(&locks).try_lock(&name, &try_opts()).await {
            Err(e) => assert_refused(&e, &parent, "world:anyone:cdrwa", layout),
            Ok(got) => panic!(
                "{layout}: the world-open {parent} was used (held by another: {})",
                got.is_none()
            ),
        }
        // The refused attempt's node is gone again: only the anonymous holder's is left.
        wait_for_children(&alice, &parent, 1, layout).await;
        set_acl(
            &alice,
            &parent,
            &[creator(zk::Permission::ALL), world(zk::Permission::READ)],
        )
        .await;
        let again = dyn_lock(&locks)
            .try_lock(&name, &try_opts())
            .await
            .unwrap_or_else(|e| panic!("{layout}: world READ + creator ALL refused: {e}"));
        assert!(again.is_none(), "{layout}: the anonymous holder holds");
        wait_for_children(&alice, &parent, 1, layout).await;
        // Its release is now refused by the server (no DELETE for it): its session ends it.
        drop(held);
        drop(open);
    }
}

/// With credentials, the base node and every lock's node dlock makes are creator-only
/// (`digest:alice` with all permissions), and dlock uses them; without, they are world-open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_made_with_credentials_are_creator_only_and_used() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let observer = raw(zk, Some(ALICE)).await;
    for layout in LAYOUTS {
        for (auth, expected) in [
            (format!("{ALICE}@"), "digest:alice:ALL"),
            (String::new(), "world:anyone:ALL"),
        ] {
            let what = format!("{layout}, {expected}");
            let chroot = unique("acl-made");
            let locks = client(&format!("zk://{auth}{host}/{chroot}?{layout}")).await;
            let name = unique("a/b");
            for round in 0..2 {
                let g = dyn_lock(&locks)
                    .try_lock(&name, &try_opts())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: round {round}: {e}"))
                    .expect("free");
                let parent = locks.parent_path(&LockName::new(&name).unwrap());
                for path in [base_of(&chroot, layout), parent] {
                    assert_eq!(acl_of(&observer, &path).await, [expected], "{what}: {path}");
                }
                assert_eq!(g.release().await.expect("release"), Released::Released);
            }
        }
    }
}

/// Existing lock nodes made by someone else with the same credentials: creator-only, or
/// creator-only plus world READ, are used; one that grants any other identity DELETE,
/// CREATE, WRITE or ADMIN is refused; and so is one whose digest entry the server hides
/// (without ADMIN for these credentials).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_lock_nodes_are_judged_by_their_acl() {
    use zk::Permission as P;
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let alice = raw(zk, Some(ALICE)).await;
    let mallory = |p: P| zk::Acl::new(p, zk::AuthId::new("digest", "mallory:AAAA"));
    let cases: Vec<(&str, Vec<zk::Acl>, bool)> = vec![
        ("creator only", vec![creator(P::ALL)], true),
        (
            "creator and world read",
            vec![creator(P::ALL), world(P::READ)],
            true,
        ),
        (
            "world delete",
            vec![creator(P::ALL), world(P::READ | P::DELETE)],
            false,
        ),
        (
            "world create",
            vec![creator(P::ALL), world(P::CREATE)],
            false,
        ),
        ("world write", vec![creator(P::ALL), world(P::WRITE)], false),
        (
            "another digest admin",
            vec![creator(P::ALL), mallory(P::ADMIN)],
            false,
        ),
        (
            "an ip address",
            vec![
                creator(P::ALL),
                zk::Acl::new(P::DELETE, zk::AuthId::new("ip", "127.0.0.1")),
            ],
            false,
        ),
        (
            "creator without admin",
            vec![creator(P::READ | P::WRITE | P::CREATE | P::DELETE)],
            false,
        ),
    ];
    for layout in LAYOUTS {
        let chroot = unique("acl-existing");
        let locks = client(&format!("zk://{ALICE}@{host}/{chroot}?{layout}")).await;
        for (what, acl, used) in &cases {
            let what = format!("{layout}, {what}");
            let name = unique("lock");
            let parent = locks.parent_path(&LockName::new(&name).unwrap());
            alice
                .create(
                    &parent,
                    &[],
                    &zk::CreateMode::Persistent.with_acls(zk::Acls::from(&acl[..])),
                )
                .await
                .unwrap_or_else(|e| panic!("{what}: create {parent}: {e}"));
            let got = dyn_lock(&locks).try_lock(&name, &try_opts()).await;
            match (got, used) {
                (Ok(Some(g)), true) => {
                    g.release().await.expect("release");
                }
                (Err(e), false) => {
                    let text = e.to_string();
                    assert!(matches!(e, Error::AccessDenied { .. }), "{what}: {text}");
                    assert!(
                        text.contains(&format!("{parent} has ACL ")),
                        "{what}: {text}"
                    );
                    if what.ends_with("without admin") {
                        assert!(text.contains("hides digest ids"), "{what}: {text}");
                    }
                }
                (got, _) => panic!(
                    "{what}: expected {}, got {:?}",
                    if *used { "the lock" } else { "a refusal" },
                    got.map(|g| g.is_some())
                ),
            }
        }
    }
}

/// A lock's node dlock checked and used is deleted and made again world-open (by a client
/// with the same credentials but no ACL of its own, as a Curator or kazoo client makes
/// nodes): the next acquire on the same client checks the new node and refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_node_made_again_is_checked_again() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let alice = raw(zk, Some(ALICE)).await;
    for layout in LAYOUTS {
        let chroot = unique("acl-again");
        let locks = client(&format!("zk://{ALICE}@{host}/{chroot}?{layout}")).await;
        let name = unique("lock");
        let parent = locks.parent_path(&LockName::new(&name).unwrap());
        let g = dyn_lock(&locks)
            .try_lock(&name, &try_opts())
            .await
            .expect("lock")
            .expect("free");
        g.release().await.expect("release");
        // (An empty CONTAINER may be gone already.)
        match alice.delete(&parent, None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => panic!("{layout}: delete {parent}: {e}"),
        }
        world_open(&alice, &parent).await;
        match dyn_lock(&locks).try_lock(&name, &try_opts()).await {
            Err(e) => assert_refused(&e, &parent, "world:anyone:cdrwa", layout),
            Ok(_) => panic!("{layout}: the world-open {parent} made again was used"),
        }
    }
}

/// A semaphore's node that holds its permits (dlock's `s-{name}`, Curator's `{name}/leases`,
/// kazoo's `{name}`), made world-open by an anonymous client before the base node was limited
/// to the credentials, is refused, and the refused request leaves no permit node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn world_open_semaphore_node_is_refused() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let host = zk.connect_string();
    let anonymous = raw(zk, None).await;
    let alice = raw(zk, Some(ALICE)).await;
    for layout in LAYOUTS {
        let chroot = unique("acl-sem");
        let name = unique("pool");
        let base = base_of(&chroot, layout);
        let leases = match layout {
            "layout=dlock" => format!("{base}/s-{name}"),
            "layout=curator" => format!("{base}/{name}/leases"),
            _ => format!("{base}/{name}"),
        };
        world_open(&anonymous, &leases).await;
        set_acl(&alice, &base, &[creator(zk::Permission::ALL)]).await;
        let locks = client(&format!("zk://{ALICE}@{host}/{chroot}?{layout}")).await;
        let got = dyn_lock(&locks)
            .try_acquire_permit(&LockName::new(&name).unwrap(), 2, &try_opts())
            .await;
        match got {
            Err(e) => assert_refused(&e, &leases, "world:anyone:cdrwa", layout),
            Ok(p) => panic!("{layout}: the world-open {leases} was used: {p:?}"),
        }
        wait_for_children(&alice, &leases, 0, layout).await;
    }
}
