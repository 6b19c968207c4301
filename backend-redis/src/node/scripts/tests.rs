use super::*;

#[test]
fn keys_share_one_hash_tag() {
    let name = LockName::new("a/{b}:c").unwrap();
    let keys = Keys::new("dlock", &name);
    let slot = super::super::cluster::slot(keys.get(Key::Lock).as_bytes());
    for k in [Key::Fence, Key::Queue, Key::Alive, Key::Seq, Key::Readers]
        .into_iter()
        .chain(SEM_KEYS)
    {
        let k = keys.get(k);
        assert_eq!(super::super::cluster::slot(k.as_bytes()), slot, "{k}");
    }
    assert_eq!(keys.get(Key::Lock), "{dlock:a%2F%7Bb%7D%3Ac}:lock");
    assert_eq!(
        keys.get(Key::SemHolders),
        "{dlock:a%2F%7Bb%7D%3Ac}:sem:holders"
    );
    // No semaphore key is a lock key, nor matches the fence pattern `names()` scans for.
    let lock_keys: Vec<String> = [
        Key::Lock,
        Key::Fence,
        Key::Queue,
        Key::Alive,
        Key::Seq,
        Key::Readers,
    ]
    .map(|k| keys.get(k))
    .into();
    assert_eq!(keys.get(Key::Readers), "{dlock:a%2F%7Bb%7D%3Ac}:shared");
    assert_eq!(name_of_fence_key("dlock", &keys.get(Key::Readers)), None);
    for k in SEM_KEYS.map(|k| keys.get(k)) {
        assert!(!lock_keys.contains(&k), "{k}");
        assert_eq!(name_of_fence_key("dlock", &k), None, "{k}");
    }
}

#[test]
fn a_call_is_evalsha_with_keys_then_arguments() {
    let keys = Keys::new("p", &LockName::new("n").unwrap());
    let owner = OwnerId(0xab);
    let call = keys
        .call(&RELEASE, &[Key::Lock, Key::Queue])
        .owner_arg(owner)
        .arg(77u64)
        .arg("p:wake:");
    assert_eq!(
        words(&call),
        [
            "EVALSHA".to_owned(),
            RELEASE.sha.clone(),
            "2".to_owned(),
            "{p:n}:lock".to_owned(),
            "{p:n}:queue".to_owned(),
            owner.to_string(),
            "77".to_owned(),
            "p:wake:".to_owned(),
        ]
    );
    assert_eq!(call.first_key(), b"{p:n}:lock");
    let bare = Call::on(&INSPECT, &[]);
    assert_eq!(bare.first_key(), b"");
}

#[test]
fn a_min_token_is_an_argument_only_when_there_is_one() {
    let keys = Keys::new("p", &LockName::new("n").unwrap());
    let attempt = |min_token| {
        let call = keys.call(&TRY_FAST, &[Key::Lock, Key::Fence]);
        words(
            &call
                .owner_arg(OwnerId(1))
                .arg(5000u64)
                .min_token_arg(min_token),
        )
    };
    let none = attempt(0);
    assert_eq!(none.len(), 7, "{none:?}");
    assert_eq!(none.last().map(String::as_str), Some("5000"));
    let some = attempt(9_007);
    assert_eq!(some.len(), 8, "{some:?}");
    assert_eq!(some[..7], none[..]);
    assert_eq!(some.last().map(String::as_str), Some("9007"));
}

/// Every marker line (`--@common`, `--@head`) has been replaced by what it stands for; a marker
/// named in a comment stays as it is.
#[test]
fn every_marker_line_is_replaced() {
    for lua in all() {
        let left: Vec<&str> = lua
            .code
            .lines()
            .filter(|line| line.starts_with("--@"))
            .collect();
        assert!(left.is_empty(), "{left:?} left in:\n{}", lua.code);
    }
    assert!(
        RELEASE_PLAIN
            .code
            .contains("redis.call('MGET', KEYS[1], KEYS[2])")
    );
    assert!(
        RELEASE
            .code
            .contains("redis.call('MGET', KEYS[1], KEYS[2])")
    );
}

#[test]
fn scripts_have_distinct_hashes() {
    let mut shas: Vec<&str> = all().iter().map(|l| l.sha.as_str()).collect();
    shas.sort_unstable();
    shas.dedup();
    assert_eq!(shas.len(), all().len());
}

#[test]
fn fence_keys_map_back_to_their_names_under_their_prefix_only() {
    let name = LockName::new("orders/eu 1").unwrap();
    let key = Keys::new("app", &name).get(Key::Fence);
    assert_eq!(name_of_fence_key("app", &key), Some(name.clone()));
    assert_eq!(name_of_fence_key("ap", &key), None);
    assert_eq!(
        name_of_fence_key("app", &Keys::new("app", &name).get(Key::Lock)),
        None
    );
    // A longer prefix's keys match the pattern but do not decode as this prefix's names.
    let nested = Keys::new("app:x", &LockName::new("y").unwrap()).get(Key::Fence);
    assert_eq!(name_of_fence_key("app", &nested), None);
    assert_eq!(fence_pattern("app"), "{app:*}:fence");
    assert_eq!(fence_pattern("a*[b]?"), r"{a\*\[b\]\?:*}:fence");
}

/// The command a call sends: what `EVALSHA` receives.
fn words(call: &Call) -> Vec<String> {
    call.cmd()
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<not a plain argument>".to_owned(),
        })
        .collect()
}
