//! The semaphore's reading of the routines' rows and of the state row.

use super::*;

#[test]
fn the_hand_over_routines_row_reads_as_what_the_release_did() {
    let row = |[a, b, c]: [Option<i64>; 3]| {
        Handover::by_call(&Reply::with_row([a, b, c, None, None, None]))
    };
    assert_eq!(row([Some(0), None, None]), Handover::default());
    let not_handed = row([Some(1), None, None]);
    assert!(not_handed.freed && not_handed.fence.is_none());
    assert_eq!(
        row([Some(1), Some(9), Some(2)]),
        Handover {
            freed: true,
            fence: Some(9),
            free: 2
        }
    );
}

#[test]
fn the_grant_routines_row_reads_as_the_transactions_outcome() {
    let row = |cols: [Option<i64>; 6]| granted_by_call(&Reply::with_row(cols)).ok();
    let granted = row([Some(0), Some(41), None, None, None, None]);
    assert_eq!(granted, Some(Grant::Granted(41)));
    let full = row([Some(1), None, Some(0), Some(1500), Some(4), None]);
    let holder_left = Some(Duration::from_micros(1500));
    assert_eq!(
        full,
        Some(Grant::Blocked {
            ahead: 0,
            holder_left
        })
    );
    let behind = row([Some(1), None, Some(2), None, Some(4), None]);
    let ahead = Grant::Blocked {
        ahead: 2,
        holder_left: None,
    };
    assert_eq!(behind, Some(ahead));
    assert_eq!(
        row([Some(2), None, None, None, Some(3), None]),
        Some(Grant::Mismatch(3))
    );
    // A grant without its fence, or an outcome the routine never gives, is an error.
    assert_eq!(row([Some(0), None, None, None, None, None]), None);
    assert_eq!(row([Some(7), None, None, None, None, None]), None);
}

#[test]
fn judge_reads_the_state_row_in_order() {
    let row = |cols: [Option<i64>; 6]| Reply::with_row(cols);
    // Idle: free.
    let idle = row([None, Some(0), Some(0), None, None, Some(0)]);
    assert_eq!(judge(&idle, 2), Judged::Free { expired: false });
    // Our own permit from a first try wins over anything but another count.
    let mine = row([Some(2), Some(9), Some(9), Some(7), None, None]);
    assert_eq!(judge(&mine, 2), Judged::Mine);
    let mine_other = row([Some(3), Some(9), Some(9), Some(7), None, None]);
    assert_eq!(judge(&mine_other, 2), Judged::Mismatch(3));
    // Another count recorded.
    let other = row([Some(3), Some(1), Some(0), None, None, None]);
    assert_eq!(judge(&other, 2), Judged::Mismatch(3));
    // Full: blocked until the first holder runs out.
    let full = row([Some(2), Some(2), Some(0), None, Some(1500), Some(1)]);
    assert_eq!(
        judge(&full, 2),
        Judged::Blocked {
            ahead: 0,
            holder_left: Some(Duration::from_micros(1500))
        }
    );
    // Room, but a waiter ahead.
    let behind = row([Some(2), Some(1), Some(1), None, Some(1500), Some(0)]);
    assert_eq!(
        judge(&behind, 2),
        Judged::Blocked {
            ahead: 1,
            holder_left: None
        }
    );
    let room = row([Some(2), Some(1), Some(0), None, Some(1500), Some(4)]);
    assert_eq!(judge(&room, 2), Judged::Free { expired: true });
}
