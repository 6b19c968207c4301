//! The wake-up registry's dispatch by payload, and its clean-up.

use super::*;

const A: &str = "000000000000000000000000000000aa";

/// A wakeup of `r`, enabled so that a notification from now on fires it.
fn arm(r: &Registration) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
    let mut f = Box::pin(r.notify().notified());
    f.as_mut().enable();
    f
}

/// Whether the wakeup `f` fired since it was enabled.
fn woken(f: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>) -> bool {
    use std::future::Future;
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    f.as_mut().poll(&mut cx).is_ready()
}

#[test]
fn payloads_parse_by_their_first_byte() {
    let head = |name| Payload::Head { waiter: A, name };
    for (payload, parsed) in [
        ("Njobs/1".to_owned(), Payload::Name("jobs/1")),
        (format!("W{A}jobs/1"), head("jobs/1")),
        // A name may itself start with N or W, or be anything but NUL.
        ("NW".to_owned(), Payload::Name("W")),
        (format!("W{A}N"), head("N")),
        // Too short for a waiter id and a name, or an older client's bare name.
        (format!("W{A}"), Payload::Unknown),
        ("jobs/1".to_owned(), Payload::Unknown),
        ("Wé".to_owned(), Payload::Unknown),
        ("Pjobs/1".to_owned(), Payload::Permits("jobs/1")),
        (
            format!("Q{A}jobs/1"),
            Payload::PermitHead {
                waiter: A,
                name: "jobs/1",
            },
        ),
        (format!("Q{A}"), Payload::Unknown),
        (
            format!("H{A}12,5000000,7,f00d,jobs/1"),
            Payload::HandOver {
                waiter: A,
                name: "jobs/1",
                grant: Grant {
                    fence: 12,
                    ttl: Duration::from_secs(5),
                    ttl_us: 5_000_000,
                    ticket: 7,
                },
                tag: "f00d",
            },
        ),
        // The name is the rest, commas and all.
        (
            format!("H{A}1,10000,2,f00d,a,b"),
            Payload::HandOver {
                waiter: A,
                name: "a,b",
                grant: Grant {
                    fence: 1,
                    ttl: Duration::from_millis(10),
                    ttl_us: 10_000,
                    ticket: 2,
                },
                tag: "f00d",
            },
        ),
        // A field missing or not a number, a negative ttl, no name.
        (format!("H{A}12,5000000,f00d,jobs/1"), Payload::Unknown),
        (format!("H{A}12,x,7,f00d,jobs/1"), Payload::Unknown),
        (format!("H{A}12,-1,7,f00d,jobs/1"), Payload::Unknown),
        (format!("H{A}12,5000000,7,f00d,"), Payload::Unknown),
        (format!("H{A}12,5000000,7,f00d"), Payload::Unknown),
        (format!("H{A}"), Payload::Unknown),
    ] {
        assert_eq!(Payload::parse(&payload), parsed, "{payload}");
    }
}

#[test]
fn a_head_payload_wakes_only_that_waiter_and_name_wide_listeners() {
    let w = Arc::<Waiters>::default();
    let a = OwnerId(0xaa);
    let b = OwnerId(0xbb);
    assert_eq!(a.to_string(), A);
    let ra = w.register("n", Some(a));
    let rb = w.register("n", Some(b));
    let any = w.register("n", None);
    let other = w.register("m", Some(a));
    let (mut fa, mut fb, mut fany, mut fother) = (arm(&ra), arm(&rb), arm(&any), arm(&other));
    w.wake(&format!("W{A}n"));
    assert!(woken(&mut fa), "the head was not woken");
    assert!(!woken(&mut fb), "a waiter behind the head was woken");
    assert!(woken(&mut fany), "a name-wide listener was not woken");
    assert!(!woken(&mut fother), "a waiter of another name was woken");

    let (mut fa, mut fb) = (arm(&ra), arm(&rb));
    w.wake("Nn");
    assert!(
        woken(&mut fa) && woken(&mut fb),
        "N did not wake every waiter"
    );
    assert!(!woken(&mut fother), "N woke another name");

    let mut fb = arm(&rb);
    w.wake("n");
    assert!(!woken(&mut fb), "an unknown payload woke someone");
    w.wake_all();
    assert!(
        woken(&mut fb) && woken(&mut fother),
        "wake_all missed a waiter"
    );
}

#[test]
fn a_permits_payload_wakes_only_the_semaphores_waiters() {
    let w = Arc::<Waiters>::default();
    let lock = w.register("n", Some(OwnerId(1)));
    let any = w.register("n", None);
    let permit_a = w.register(&permits_key("n"), Some(OwnerId(1)));
    let permit_b = w.register(&permits_key("n"), Some(OwnerId(2)));
    let other = w.register(&permits_key("m"), Some(OwnerId(3)));
    let (mut fl, mut fany) = (arm(&lock), arm(&any));
    let (mut fa, mut fb, mut fo) = (arm(&permit_a), arm(&permit_b), arm(&other));
    w.wake("Pn");
    assert!(woken(&mut fa) && woken(&mut fb), "P missed a permit waiter");
    assert!(!woken(&mut fo), "P woke another semaphore's waiter");
    assert!(
        !woken(&mut fl) && !woken(&mut fany),
        "P woke the lock's waiters"
    );
    let mut fa = arm(&permit_a);
    w.wake("Nn");
    w.wake(&format!("W{A}n"));
    assert!(!woken(&mut fa), "the lock's payloads woke a permit waiter");
}

#[test]
fn registrations_remove_their_entries_when_dropped() {
    let w = Arc::<Waiters>::default();
    let ra = w.register("n", Some(OwnerId(1)));
    let any1 = w.register("n", None);
    let any2 = w.register("n", None);
    drop(ra);
    assert!(
        w.map().contains_key("n"),
        "removed while name-wide listeners remain"
    );
    drop(any1);
    assert!(
        w.map().contains_key("n"),
        "removed while one listener remains"
    );
    let rb = w.register("n", Some(OwnerId(2)));
    drop(any2);
    assert!(w.map().contains_key("n"), "removed while a waiter remains");
    assert_eq!(w.map()["n"].queued.len(), 1);
    drop(rb);
    assert!(
        w.map().is_empty(),
        "the entry outlived its last registration"
    );
}

#[test]
fn wake_first_wakes_only_the_local_waiter_nearest_the_head() {
    let w = Arc::<Waiters>::default();
    let key = permits_key("n");
    let (a, b, c) = (OwnerId(1), OwnerId(2), OwnerId(3));
    // `a` registers first but joins the store's queue behind `b`; `c` has not joined yet.
    let ra = w.register(&key, Some(a));
    let rb = w.register(&key, Some(b));
    let rc = w.register(&key, Some(c));
    let lock = w.register("n", Some(OwnerId(4)));
    w.joined(&key, a, join(20, Instant::now()), None);
    w.joined(&key, b, join(10, Instant::now()), None);
    {
        let (mut fa, mut fb, mut fc, mut fl) = (arm(&ra), arm(&rb), arm(&rc), arm(&lock));
        w.wake_first(&key);
        assert!(
            woken(&mut fb),
            "the waiter with the smallest ticket was not woken"
        );
        assert!(
            !woken(&mut fa) && !woken(&mut fc),
            "a waiter behind the nearest was woken"
        );
        assert!(
            !woken(&mut fl),
            "the semaphore's wake-up woke the lock's waiter"
        );
    }

    // Once the head has gone (granted), the next one is nearest.
    drop(rb);
    {
        let (mut fa, mut fc) = (arm(&ra), arm(&rc));
        w.wake_first(&key);
        assert!(
            woken(&mut fa) && !woken(&mut fc),
            "the next in ticket order was not woken"
        );
    }

    // A waiter that has not joined counts as behind every joined one.
    drop(ra);
    let mut fc = arm(&rc);
    w.wake_first(&key);
    assert!(woken(&mut fc), "the only waiter left was not woken");

    // Nobody registered: nothing to wake, and no entry is made.
    w.wake_first(&permits_key("m"));
    assert!(!w.map().contains_key(&permits_key("m")));
}

/// The terms of a permit waiter in these tests.
fn terms(permits: u32) -> Terms {
    Terms {
        ttl: Duration::from_secs(30),
        min_token: 0,
        permits,
    }
}

#[test]
fn a_release_hands_a_permit_to_the_joined_waiter_nearest_the_head() {
    let w = Arc::<Waiters>::default();
    let key = permits_key("n");
    let (a, b) = (OwnerId(1), OwnerId(2));
    assert!(w.next(&key).is_none(), "nobody registered");
    let ra = w.register(&key, Some(a));
    let rb = w.register(&key, Some(b));
    assert!(w.next(&key).is_none(), "nobody has joined yet");
    w.joined(&key, a, join(20, Instant::now()), Some(terms(4)));
    w.joined(&key, b, join(10, Instant::now()), Some(terms(4)));
    let next = w.next(&key).expect("a joined waiter");
    assert_eq!((next.owner, next.ticket, next.terms.permits), (b, 10, 4));
    assert!(w.behind_another(&key, a) && !w.behind_another(&key, b));

    let (wa, wb) = (ra.into_wake(None), rb.into_wake(None));
    let delivered = DeliveredGrant {
        fence: 7,
        sent: Instant::now(),
        more: false,
        ttl: None,
    };
    {
        let mut fb = Box::pin(wb.notify.notified());
        fb.as_mut().enable();
        assert!(w.hand(&key, b, delivered));
        assert!(
            woken(&mut fb),
            "the waiter delivered a permit was not woken"
        );
    }
    assert_eq!(wb.take_delivered(), Some(delivered));
    assert_eq!(
        wb.take_delivered(),
        None,
        "a delivered permit is taken once"
    );
    assert_eq!(wa.take_delivered(), None, "another waiter got the permit");

    // A waiter that ends gives back what was handed to it before; after it ends, nothing can
    // be handed to it, and the releaser gives the permit back.
    assert!(w.hand(&key, a, delivered));
    assert_eq!(wa.end(), Some(delivered));
    assert!(
        !w.hand(&key, a, delivered),
        "delivered to a waiter that has ended"
    );
    assert_eq!(wb.end(), None);
    assert!(w.map().is_empty(), "entries left behind");
}

#[test]
fn a_waiter_listening_elsewhere_is_handed_permits_through_its_own_wake_up() {
    let hub = Arc::<Waiters>::default();
    let listener = Arc::<Waiters>::default();
    let key = permits_key("n");
    let a = OwnerId(1);
    // As PostgreSQL's waiters: woken by the listener's registry, handed permits by the hub.
    let wake = listener
        .register(&key, Some(a))
        .into_wake(None)
        .with_hand_over(&hub, &key, a);
    hub.joined(&key, a, join(3, Instant::now()), Some(terms(2)));
    assert_eq!(hub.next(&key).map(|n| n.owner), Some(a));
    let delivered = DeliveredGrant {
        fence: 1,
        sent: Instant::now(),
        more: false,
        ttl: None,
    };
    {
        let mut f = Box::pin(wake.notify.notified());
        f.as_mut().enable();
        assert!(hub.hand(&key, a, delivered));
        assert!(woken(&mut f), "the listener's wake-up did not fire");
    }
    assert_eq!(wake.take_delivered(), Some(delivered));
    drop(wake);
    assert!(hub.map().is_empty() && listener.map().is_empty());
}

/// A join with `ticket` sent `at`, with a fresh secret.
fn join(ticket: i64, at: Instant) -> Join {
    Join {
        ticket,
        at,
        secret: Secret::random(),
    }
}

/// The registration of lock waiter `a` on name `n` as PostgreSQL's listener makes it, joined
/// with ticket 7 by a join sent at `at`; and that join's secret.
fn joined_at(w: &Arc<Waiters>, a: OwnerId, at: Instant) -> (Wake, Secret) {
    let wake = w.register("n", Some(a)).into_wake(None);
    let join = join(7, at);
    w.joined("n", a, join, None);
    (wake, join.secret)
}

/// The `H` payload a hand-over of the lock `n` to `waiter` sends, tagged with `secret`.
fn hand_over_payload(
    waiter: OwnerId,
    fence: i64,
    ttl_us: i64,
    ticket: i64,
    secret: Secret,
) -> String {
    let fields = format!("{fence},{ttl_us},{ticket}");
    let tag = secret.tag(&format!("{fields},{waiter}"));
    format!("H{waiter}{fields},{tag},n")
}

#[test]
fn a_hand_over_notification_is_a_grant_for_the_join_it_names() {
    let w = Arc::<Waiters>::default();
    let a = OwnerId(0xaa);
    let at = Instant::now();
    let (wake, secret) = joined_at(&w, a, at);
    let any = w.register("n", None);
    let (mut f, mut fany) = (Box::pin(wake.notify.notified()), arm(&any));
    f.as_mut().enable();
    w.wake(&hand_over_payload(a, 12, 5_000_000, 7, secret));
    assert!(woken(&mut f), "the waiter delivered the lock was not woken");
    assert!(woken(&mut fany), "a name-wide listener was not woken");
    let grant = DeliveredGrant {
        fence: 12,
        sent: at,
        more: false,
        ttl: Some(Duration::from_secs(5)),
    };
    assert_eq!(
        wake.take_delivered(),
        Some(grant),
        "the lease starts at the join"
    );
    assert_eq!(wake.take_delivered(), None, "a grant is taken once");
}

/// Anyone who can connect may NOTIFY: a hand-over without the tag of the secret the waiter
/// stored in its row (none, a made-up one, another join's, or the right tag with a field
/// changed) only wakes it.
#[test]
fn a_hand_over_notification_without_the_waiters_tag_only_wakes() {
    let w = Arc::<Waiters>::default();
    let a = OwnerId(0xaa);
    let (wake, secret) = joined_at(&w, a, Instant::now());
    let genuine = hand_over_payload(a, 12, 5_000_000, 7, secret);
    let forged = [
        format!("H{a}12,5000000,7,,n"),
        format!("H{a}12,5000000,7,{},n", "0".repeat(64)),
        hand_over_payload(a, 12, 5_000_000, 7, Secret::random()),
        genuine.replacen("12,5000000", "13,5000000", 1),
        genuine.replacen("12,5000000", "12,9000000", 1),
    ];
    for payload in forged {
        let mut f = Box::pin(wake.notify.notified());
        f.as_mut().enable();
        w.wake(&payload);
        assert!(woken(&mut f), "not woken by {payload}");
        assert_eq!(wake.take_delivered(), None, "taken as a grant: {payload}");
    }
    w.wake(&genuine);
    assert!(wake.take_delivered().is_some(), "the store's own hand-over");
}

#[test]
fn a_hand_over_notification_for_another_join_only_wakes() {
    let w = Arc::<Waiters>::default();
    let a = OwnerId(0xaa);
    // Another ticket: an earlier row of this waiter, or another acquisition under the same
    // owner id.
    let (wake, secret) = joined_at(&w, a, Instant::now());
    let mut f = Box::pin(wake.notify.notified());
    f.as_mut().enable();
    w.wake(&hand_over_payload(a, 12, 5_000_000, 6, secret));
    assert!(woken(&mut f), "not woken");
    assert_eq!(wake.take_delivered(), None, "taken for another join");

    // Not joined yet (the join's reply is not here): its own attempt finds the row.
    let b = OwnerId(0xbb);
    let early = w.register("n", Some(b)).into_wake(None);
    w.wake(&hand_over_payload(b, 12, 5_000_000, 7, Secret::random()));
    assert_eq!(
        early.take_delivered(),
        None,
        "taken before the join was known"
    );

    // A join more than a tenth of the ttl ago would shorten the lease by as much.
    let c = OwnerId(0xcc);
    let long_ago = Instant::now()
        .checked_sub(Duration::from_millis(600))
        .expect("an instant 0.6 s ago");
    let (old, secret) = joined_at(&w, c, long_ago);
    w.wake(&hand_over_payload(c, 12, 5_000_000, 7, secret));
    assert_eq!(
        old.take_delivered(),
        None,
        "taken from a join 0.6 s before a 5 s lease"
    );
    w.wake(&hand_over_payload(c, 12, 7_000_000, 7, secret));
    assert!(
        old.take_delivered().is_some(),
        "0.6 s is within a tenth of 7 s"
    );
}
