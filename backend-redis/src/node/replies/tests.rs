use super::*;

#[test]
fn permit_replies_must_echo_the_owner_and_carry_a_count_mismatch() {
    let owner = OwnerId(7);
    let echo = Value::BulkString(owner.to_string().into_bytes());
    let granted = Value::Array(vec![Value::Int(1), Value::Int(5), echo.clone()]);
    assert_eq!(
        parse_permit(&granted, owner),
        Ok(PermitAnswer::Acquire(AttemptReply::Now(
            AcquireReply::Granted(5)
        )))
    );
    assert!(parse_permit(&granted, OwnerId(8)).is_err());
    let handed = Value::Array(vec![Value::Int(2), Value::Int(6), echo.clone()]);
    assert_eq!(
        parse_permit(&handed, owner),
        Ok(PermitAnswer::Acquire(AttemptReply::Handed(6)))
    );
    assert!(
        parse_permit(&handed, OwnerId(8)).is_err(),
        "a permit handed to another request is an error, never a grant"
    );
    let counted = Value::Array(vec![Value::Int(-1), Value::Int(3), echo]);
    assert_eq!(parse_permit(&counted, owner), Ok(PermitAnswer::Counted(3)));
    assert!(
        parse_permit(&counted, OwnerId(8)).is_err(),
        "a mismatch for another request is an error too"
    );
    assert_eq!(permit_member(owner, 42), format!("{owner}:42"));
}

#[test]
fn semaphore_inspect_lists_permits_by_token() {
    let member = |o: u128, t: u64| Value::BulkString(permit_member(OwnerId(o), t).into_bytes());
    let reply = Value::Array(vec![
        Value::Int(9),
        Value::Int(2),
        Value::Int(1),
        Value::Int(1),
        member(2, 9),
        Value::Int(100),
        member(1, 8),
        Value::Int(2500),
    ]);
    let r = parse_sem_inspect(&reply).unwrap();
    assert_eq!(r.fence, Some(9));
    assert_eq!(r.permits, 2);
    assert_eq!((r.live_waiters, r.queued), (1, 1));
    let tokens: Vec<u64> = r.holders.iter().map(|h| h.token).collect();
    assert_eq!(tokens, [8, 9], "oldest grant first");
    assert_eq!(r.holders[0].owner, OwnerId(1).to_string());
    assert_eq!(r.holders[0].remaining_ms, 2500);
    let never = Value::Array(vec![
        Value::Int(-1),
        Value::Int(0),
        Value::Int(0),
        Value::Int(0),
    ]);
    let r = parse_sem_inspect(&never).unwrap();
    assert_eq!((r.fence, r.holders.len()), (None, 0));
}

#[test]
fn inspect_reports_the_oldest_reader() {
    let bulk = |t: &str| Value::BulkString(t.as_bytes().to_vec());
    let reply = |member: &str| {
        Value::Array(vec![
            bulk(""),
            Value::Int(-2),
            Value::Int(12),
            Value::Int(1),
            Value::Int(1),
            Value::Int(2),
            bulk(member),
            Value::Int(2500),
        ])
    };
    let member = permit_member(OwnerId(3), 11);
    let r = parse_inspect(&reply(&member)).unwrap();
    assert_eq!(r.holder, None);
    assert_eq!(r.readers, 2);
    assert_eq!(
        r.oldest_reader,
        Some(PermitReply {
            owner: OwnerId(3).to_string(),
            token: 11,
            remaining_ms: 2500
        })
    );
    let r = parse_inspect(&reply("")).unwrap();
    assert_eq!(r.oldest_reader, None);
    assert!(parse_inspect(&reply("no-token")).is_err());
}

#[test]
fn owner_hex_matches_the_display_form() {
    for owner in [
        OwnerId(0),
        OwnerId(u128::MAX),
        OwnerId(1 << 100),
        OwnerId(0xab),
    ] {
        assert_eq!(owner_hex(owner).as_slice(), owner.to_string().as_bytes());
    }
}

#[test]
fn acquire_reply_must_echo_the_owner() {
    let owner = OwnerId(7);
    let other = OwnerId(8);
    let granted = Value::Array(vec![
        Value::Int(1),
        Value::Int(42),
        Value::BulkString(owner.to_string().into_bytes()),
    ]);
    assert_eq!(
        parse_acquire(&granted, owner),
        Ok(AcquireReply::Granted(42))
    );
    assert!(parse_acquire(&granted, other).is_err());
}

#[test]
fn fast_try_reply_grants_only_with_the_owner_and_refuses_with_the_fence() {
    let owner = OwnerId(7);
    let granted = Value::BulkString(format!("{owner}:42").into_bytes());
    assert_eq!(
        parse_try_fast(&granted, owner),
        Ok(Some(AcquireReply::Granted(42)))
    );
    assert!(parse_try_fast(&granted, OwnerId(8)).is_err());
    for bad in [
        format!("{owner}:0"),
        format!("{owner}:"),
        format!("{owner}42"),
        format!("{owner}:4x"),
        "short:42".to_owned(),
    ] {
        let reply = Value::BulkString(bad.clone().into_bytes());
        assert!(parse_try_fast(&reply, owner).is_err(), "{bad}");
    }
    // The old two-element grant is not a grant.
    let old = Value::Array(vec![
        Value::Int(42),
        Value::BulkString(owner.to_string().into_bytes()),
    ]);
    assert!(parse_try_fast(&old, owner).is_err());
    // Held: the counter comes back as GET returns it (a bulk string), or 0 if never set.
    let held = Value::Array(vec![Value::Int(0), Value::BulkString(b"17".to_vec())]);
    assert_eq!(
        parse_try_fast(&held, owner),
        Ok(Some(AcquireReply::Waiting {
            pttl: -1,
            rank: -1,
            fence: 17
        }))
    );
    let never = Value::Array(vec![Value::Int(0), Value::Int(0)]);
    assert!(matches!(
        parse_try_fast(&never, owner),
        Ok(Some(AcquireReply::Waiting { fence: 0, .. }))
    ));
    assert_eq!(parse_try_fast(&Value::Int(-1), owner), Ok(None));
    assert!(parse_try_fast(&Value::Int(0), owner).is_err());
}
