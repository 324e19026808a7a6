//! The enclave's authority store (`coffer_enclave::store`) on both backends: every test
//! runs on an SQLite file and on PostgreSQL (the private server of `deploy/postgres-private.sh`),
//! each with two stores on one database, which is what two enclaves sharing a store see.

use std::sync::Arc;

use coffer_enclave::store::*;
use coffer_tests::postgres as pg_server;

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// A database of its own for one test; a SQLite file's directory is removed on drop.
struct Database {
    url: String,
    dir: Option<std::path::PathBuf>,
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn database(backend: Backend) -> Database {
    match backend {
        Backend::Sqlite => {
            let dir = std::env::temp_dir().join(format!("coffer-authority-{}", uuid::Uuid::new_v4()));
            Database { url: format!("sqlite://{}", dir.join("authority.sqlite").display()), dir: Some(dir) }
        }
        Backend::Postgres => Database { url: pg_server::server().fresh_database(), dir: None },
    }
}

fn limits(capacity: u64, per_organization: u64) -> StoreLimits {
    StoreLimits { replay_capacity: capacity, replay_per_organization: per_organization, decision_retention_ms: 0 }
}

/// Two stores (two enclaves) on one fresh database.
fn two_stores(backend: Backend, l: StoreLimits) -> (Database, Arc<dyn EnclaveStore>, Arc<dyn EnclaveStore>) {
    let db = database(backend);
    let settings = StoreSettings { url: db.url.clone(), password_file: None, limits: l };
    let a = open(&settings).unwrap();
    let b = open(&settings).unwrap();
    (db, a, b)
}

fn entry(kind: &str, id: &str, data: &[u8]) -> Entry {
    Entry { kind: kind.into(), id: id.into(), data: data.to_vec() }
}

fn change(org: &str, expected_version: u64, puts: Vec<Entry>, deletes: &[(&str, &str)]) -> OrgChanges {
    OrgChanges {
        organization_id: org.into(),
        expected_version,
        puts,
        deletes: deletes.iter().map(|(k, i)| (k.to_string(), i.to_string())).collect(),
    }
}

fn versions_compare_and_set(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    assert_eq!(a.version("o1").unwrap(), None);
    assert_eq!(
        a.apply(&[change("o1", 0, vec![entry("user", "u1", b"1"), entry("policy", "p", b"x")], &[])]).unwrap(),
        [1]
    );
    // Created already: the other enclave's create loses, typed.
    match b.apply(&[change("o1", 0, vec![], &[])]) {
        Err(StoreError::VersionMoved { organization_id, expected: 0, found: Some(1) }) => {
            assert_eq!(organization_id, "o1")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(b.version("o1").unwrap(), Some(1));
    assert_eq!(b.apply(&[change("o1", 1, vec![entry("user", "u1", b"2")], &[("policy", "p")])]).unwrap(), [2]);
    assert!(matches!(a.apply(&[change("o1", 1, vec![], &[])]), Err(StoreError::VersionMoved { found: Some(2), .. })));
    assert_eq!(a.load("o1").unwrap().unwrap(), OrgHead { version: 2, entries: vec![entry("user", "u1", b"2")] });
    // One transaction: o2 is created only if o1 is still at 2, and it is not.
    assert!(matches!(
        a.apply(&[change("o2", 0, vec![entry("k", "1", b"x")], &[]), change("o1", 7, vec![], &[])]),
        Err(StoreError::VersionMoved { expected: 7, .. })
    ));
    assert_eq!(a.load("o2").unwrap(), None, "nothing of a failed apply is applied");
    assert_eq!(a.apply(&[change("o2", 0, vec![], &[]), change("o1", 2, vec![], &[("user", "u1")])]).unwrap(), [1, 3]);
    // An organization emptied keeps its version: versions are never reused.
    assert_eq!(b.load("o1").unwrap().unwrap(), OrgHead { version: 3, entries: vec![] });
    assert!(matches!(a.apply(&[change("o1", 0, vec![], &[])]), Err(StoreError::VersionMoved { found: Some(3), .. })));
    assert_eq!(b.organizations().unwrap(), ["o1", "o2"]);
    assert!(matches!(
        a.apply(&[change("o3", 0, vec![], &[]), change("o3", 0, vec![], &[])]),
        Err(StoreError::Invalid(_))
    ));
}

fn concurrent_changes_apply_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    a.apply(&[change("o", 0, vec![], &[])]).unwrap();
    // Each enclave bumps o from the version it read, 20 times, in two threads: every success is
    // a distinct version, and the final version counts them all.
    let run = |s: Arc<dyn EnclaveStore>, who: &'static str| {
        std::thread::spawn(move || {
            let mut won = Vec::new();
            for i in 0..20 {
                loop {
                    let v = s.version("o").unwrap().unwrap();
                    match s.apply(&[change("o", v, vec![entry("n", &format!("{who}{i}"), b"")], &[])]) {
                        Ok(nv) => {
                            won.push(nv[0]);
                            break;
                        }
                        Err(StoreError::VersionMoved { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            won
        })
    };
    let (ta, tb) = (run(a.clone(), "a"), run(b.clone(), "b"));
    let mut all = [ta.join().unwrap(), tb.join().unwrap()].concat();
    all.sort();
    assert_eq!(all, (2..=41).collect::<Vec<u64>>());
    assert_eq!(a.load("o").unwrap().unwrap().entries.len(), 40);
}

fn the_replay_window_is_shared_with_a_quota_per_organization(backend: Backend) {
    let (_db, a, b) = two_stores(backend, limits(6, 2));
    let now = 1_000_000;
    let key = |n: u8| [n; 32];
    assert_eq!(a.remember("o1", key(1), now + 300_000, now).unwrap(), Remembered::Fresh);
    assert_eq!(
        b.remember("o1", key(1), now + 300_000, now).unwrap(),
        Remembered::Replayed,
        "seen by the other enclave"
    );
    assert_eq!(b.remember("o1", key(2), now + 300_000, now).unwrap(), Remembered::Fresh);
    // Either enclave reads a key as spent until it expires; an unknown key is not.
    assert!(a.spent(key(2), now, "o1", "none").unwrap() && b.spent(key(1), now, "o1", "none").unwrap());
    assert!(!a.spent(key(9), now, "o1", "none").unwrap());
    assert!(!b.spent(key(1), now + 300_000, "o1", "none").unwrap(), "expired");
    assert_eq!(a.remember("o1", key(3), now + 300_000, now).unwrap(), Remembered::OrganizationQuotaFull);
    assert_eq!(b.remember("o1", key(3), now + 300_000, now).unwrap(), Remembered::OrganizationQuotaFull);
    // Another organization is not affected.
    assert_eq!(b.remember("o2", key(4), now + 300_000, now).unwrap(), Remembered::Fresh);
    assert_eq!(a.remember("o2", key(5), now + 300_000, now).unwrap(), Remembered::Fresh);
    // Once o1's entries expire they are pruned and o1 goes on; an expired key is new again.
    let later = now + 300_001;
    assert_eq!(a.remember("o1", key(3), later + 300_000, later).unwrap(), Remembered::Fresh);
    assert_eq!(b.remember("o1", key(1), later + 300_000, later).unwrap(), Remembered::Fresh);
    assert_eq!(b.remember("o1", key(6), later + 300_000, later).unwrap(), Remembered::OrganizationQuotaFull);
    // A scope with a quota of its own (the auth proxy's sign-ups): 3 here, across both enclaves,
    // whatever the window's per-organization quota (2).
    for n in 10..13 {
        let store = if n % 2 == 0 { &a } else { &b };
        assert_eq!(store.remember_within("signups/o1", key(n), later + 10, later, 3).unwrap(), Remembered::Fresh);
    }
    assert_eq!(b.remember_within("signups/o1", key(10), later + 10, later, 3).unwrap(), Remembered::Replayed);
    assert_eq!(
        a.remember_within("signups/o1", key(13), later + 10, later, 3).unwrap(),
        Remembered::OrganizationQuotaFull
    );
}

/// A sign-up's request is charged to its top-level organization's share and to each lane of
/// its share (its own, all sign-ups'), in one transaction with its allow: a full lane refuses it
/// and records nothing of it (no entry, no allow), whoever's share has room; expired entries
/// free the lanes.
fn lanes_of_a_share_are_charged_together_or_not_at_all(backend: Backend) {
    let (_db, a, b) = two_stores(backend, limits(100, 10));
    let now = 2_000_000;
    let expires = now + 300_000;
    let key = |n: u8| [n; 32];
    let lane = |scope: &str, quota: u64| ReplayLane { scope: scope.into(), quota };
    let share = |sub: &str| ReplayShare {
        organization: "top".into(),
        lanes: vec![lane(&format!("replay/signup/{sub}"), 2), lane("replay/signups-of/top", 3)],
    };
    let allow = |fp: &str| DecisionRecord {
        at_ms: now,
        organization_id: "o".into(),
        operation: "sign".into(),
        fingerprint: fp.into(),
        activity_type: "ACTIVITY_TYPE_CREATE_USER_TAG".into(),
        user_id: "u".into(),
        outcome: OUTCOME_ALLOW.into(),
        reason: String::new(),
        result_digest: String::new(),
    };
    let remember = |store: &Arc<dyn EnclaveStore>, sub: &str, n: u8, at: i64| {
        store.remember_allowed(&share(sub), key(n), at + 300_000, at, &allow(&format!("f{n}"))).unwrap()
    };
    assert_eq!(remember(&a, "s1", 1, now), Remembered::Fresh);
    assert_eq!(remember(&b, "s1", 1, now), Remembered::Replayed, "the same stamp, at the other enclave");
    assert_eq!(remember(&b, "s1", 2, now), Remembered::Fresh);
    // s1's lane (2) is full: refused, and nothing of it is kept.
    assert_eq!(remember(&a, "s1", 3, now), Remembered::OrganizationQuotaFull);
    assert!(!b.spent(key(3), now, "o", "none").unwrap(), "no entry of a refused request");
    assert_eq!(b.decided("o", "f3").unwrap().logged, LoggedDecision::Nothing, "no allow of a refused request");
    assert_eq!(a.decided("o", "f2").unwrap().logged, LoggedDecision::Authorized);
    // s2 has a lane of its own, but all sign-ups' (3) fills with its first.
    assert_eq!(remember(&b, "s2", 4, now), Remembered::Fresh);
    assert_eq!(remember(&a, "s2", 5, now), Remembered::OrganizationQuotaFull);
    // The top-level organization's own requests are charged to its share (10) alone: 3 spent.
    for n in 6..13 {
        let own = a.remember_allowed(&ReplayShare::of("top"), key(n), expires, now, &allow(&format!("f{n}")));
        assert_eq!(own.unwrap(), Remembered::Fresh, "{n}");
    }
    assert_eq!(
        b.remember_allowed(&ReplayShare::of("top"), key(13), expires, now, &allow("f13")).unwrap(),
        Remembered::OrganizationQuotaFull,
        "the share holds the lanes' entries too"
    );
    // Once they expire, every lane is free again.
    let later = expires + 1;
    assert_eq!(remember(&b, "s1", 3, later), Remembered::Fresh);
    assert_eq!(remember(&a, "s2", 5, later), Remembered::Fresh);
}

/// A scoped quota holds exactly under concurrency: 16 threads of two enclaves each try to count
/// 4 entries at once in a scope of quota 3 (a code's attempts); exactly 3 are fresh.
fn scoped_quotas_hold_under_concurrency(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let now = 7_000_000;
    let start = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16u8)
        .map(|t| {
            let (store, start) = (if t % 2 == 0 { a.clone() } else { b.clone() }, start.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..4u8)
                    .filter(|i| {
                        let key = [t * 4 + i + 1; 32];
                        store.remember_within("otp-attempts/x", key, now + 60_000, now, 3).unwrap() == Remembered::Fresh
                    })
                    .count()
            })
        })
        .collect();
    let fresh: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(fresh, 3, "a quota of 3 let {fresh} through");
}

fn the_window_has_a_capacity(backend: Backend) {
    let (_db, a, _b) = two_stores(backend, limits(3, 10));
    let now = 5_000;
    for n in 0..3u8 {
        assert_eq!(a.remember(&format!("o{n}"), [n; 32], now + 100, now).unwrap(), Remembered::Fresh);
    }
    assert_eq!(a.remember("o9", [9; 32], now + 100, now).unwrap(), Remembered::WindowFull);
    // Expired entries make room again.
    assert_eq!(a.remember("o9", [9; 32], now + 500, now + 101).unwrap(), Remembered::Fresh);
}

fn decisions_are_logged_for_every_enclave(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let d = |at: i64, fp: &str, outcome: &str| DecisionRecord {
        at_ms: at,
        organization_id: "o".into(),
        operation: "sign".into(),
        fingerprint: fp.into(),
        activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".into(),
        user_id: "u".into(),
        outcome: outcome.into(),
        reason: if outcome == OUTCOME_REFUSE { "REFUSAL_REASON_BINDING_MISMATCH".into() } else { String::new() },
        // A key use's allow records its result ("k…" here); a state change's none.
        result_digest: if outcome == OUTCOME_ALLOW && fp.starts_with('k') {
            format!("digest-of-{fp}")
        } else {
            String::new()
        },
    };
    a.record_decision(&d(10, "f1", OUTCOME_ALLOW)).unwrap();
    b.record_decision(&d(11, "f1", OUTCOME_DONE)).unwrap();
    b.record_decision(&d(11, "f2", OUTCOME_REFUSE)).unwrap();
    a.record_decision(&d(12, "f3", OUTCOME_FAILED)).unwrap();
    assert_eq!(b.decided("o", "f1").unwrap().logged, LoggedDecision::Authorized);
    assert_eq!(a.decided("o", "f2").unwrap().logged, LoggedDecision::Refused, "a refusal authorizes nothing");
    assert_eq!(a.decided("o", "f3").unwrap().logged, LoggedDecision::Refused, "nor does a failure alone");
    assert_eq!(a.decided("p", "f1").unwrap().logged, LoggedDecision::Nothing, "another organization's");
    // The latest decision counts: allowed, then refused (a state change refused after its stamp
    // was spent) is no authorization; refused, then allowed (approved after waiting) is one.
    b.record_decision(&d(13, "f1", OUTCOME_REFUSE)).unwrap();
    assert_eq!(a.decided("o", "f1").unwrap().logged, LoggedDecision::Refused, "refused after its allow");
    a.record_decision(&d(14, "f2", OUTCOME_ALLOW)).unwrap();
    assert_eq!(b.decided("o", "f2").unwrap().logged, LoggedDecision::Authorized, "allowed after a refusal");
    assert_eq!(b.decided("o", "f1").unwrap().result_digest, "", "the refusal has none");
    // A key use's allow, with its result, decides over a refusal of the same stamp that raced
    // in after it (the work was done), for any enclave on the store.
    a.record_decision(&d(15, "k1", OUTCOME_ALLOW)).unwrap();
    b.record_decision(&d(16, "k1", OUTCOME_REFUSE)).unwrap();
    let latest = b.decided("o", "k1").unwrap();
    assert_eq!((latest.logged, latest.result_digest.as_str()), (LoggedDecision::Authorized, "digest-of-k1"));
    let all = a.decisions(0, 100).unwrap();
    assert_eq!(all.len(), 8);
    assert_eq!(all[0], d(10, "f1", OUTCOME_ALLOW));
    assert_eq!(all.iter().map(|d| d.at_ms).collect::<Vec<_>>(), [10, 11, 11, 12, 13, 14, 15, 16]);
    assert_eq!(b.decisions(11, 1).unwrap().len(), 1);
    assert_eq!(b.decisions(12, 10).unwrap()[0].fingerprint, "f3");
    // Waited for votes: a refusal for want of approvals, at any time, for any enclave; not
    // another refusal, nor another organization's.
    const SIGN: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
    assert!(!a.waited_for_votes("o", "f2", SIGN).unwrap(), "refused for another reason");
    let waiting = DecisionRecord { reason: REASON_CONSENSUS_NEEDED.into(), ..d(17, "w1", OUTCOME_REFUSE) };
    a.record_decision(&waiting).unwrap();
    b.record_decision(&d(18, "w1", OUTCOME_ALLOW)).unwrap();
    assert!(b.waited_for_votes("o", "w1", SIGN).unwrap(), "it waited, then ran");
    assert!(!b.waited_for_votes("p", "w1", SIGN).unwrap());
    assert!(!b.waited_for_votes("o", "w1", "ACTIVITY_TYPE_CREATE_POLICY_V3").unwrap(), "as another type");
}

/// Decisions older than the retention are pruned by the next request that comes after the
/// prune is due, newer ones kept; a backlog goes in batches (more than one batch: every old one
/// is gone after a few requests).
fn old_decisions_are_pruned_in_batches(backend: Backend) {
    let l = StoreLimits { decision_retention_ms: 1_000, ..StoreLimits::default() };
    let (_db, a, _b) = two_stores(backend, l);
    let d = |at: i64, fp: String| DecisionRecord {
        at_ms: at,
        organization_id: "o".into(),
        operation: "sign".into(),
        fingerprint: fp,
        activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".into(),
        user_id: "u".into(),
        outcome: OUTCOME_REFUSE.into(),
        reason: "REFUSAL_REASON_POLICY_DENIED".into(),
        result_digest: String::new(),
    };
    // The first remember prunes at once (the prune is due from the start) and schedules the next.
    assert_eq!(a.remember("o", [0; 32], 10, 0).unwrap(), Remembered::Fresh);
    let old = 12_345;
    for n in 0..old {
        a.record_decision(&d(1, format!("old-{n}"))).unwrap();
    }
    // Ten minutes on (the prune's period): the old ones go, a batch per request.
    let later = 600_000 + 1_000_000;
    a.record_decision(&d(later, "new".into())).unwrap();
    let logged = |a: &Arc<dyn EnclaveStore>| a.decisions(0, 100_000).unwrap().len();
    assert_eq!(logged(&a), old + 1);
    for (n, key) in (1u8..=3).enumerate() {
        assert_eq!(a.remember("o", [key; 32], later + 10, later + n as i64).unwrap(), Remembered::Fresh);
    }
    assert_eq!(logged(&a), 1, "every decision past the retention is pruned, the recent one kept");
    assert_eq!(a.decided("o", "new").unwrap().logged, LoggedDecision::Refused);
}

fn sealed_service_keys_are_kept_once_for_every_enclave(backend: Backend) {
    use coffer_enclave::hsm::SealedKeyShelf;
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    assert_eq!(a.sealed_service_key("coffer-webhook-signer-v1").unwrap(), None);
    assert_eq!(a.keep_sealed_service_key("coffer-webhook-signer-v1", b"first").unwrap(), b"first");
    // A second enclave initialising at the same time keeps the first key, not its own.
    assert_eq!(b.keep_sealed_service_key("coffer-webhook-signer-v1", b"second").unwrap(), b"first");
    assert_eq!(b.sealed_service_key("coffer-webhook-signer-v1").unwrap().as_deref(), Some(&b"first"[..]));
    let shelf = coffer_enclave::service_key_shelf::ServiceKeyShelf(b.clone());
    assert_eq!(shelf.keep_sealed_service_key("coffer-cert-mac-v1", &[0, 1, 255]).unwrap(), [0, 1, 255]);
    assert_eq!(shelf.sealed_service_key("coffer-cert-mac-v1").unwrap().as_deref(), Some(&[0u8, 1, 255][..]));
    assert_eq!(a.sealed_service_key("coffer-tls-fetcher-v1").unwrap(), None);
}

/// Votes kept on a waiting activity (issue 40, step 7): one per user, read by every enclave,
/// replaced only by a vote of the same selection, at most as many as the activity takes, and
/// gone once the activity can no longer be voted on.
fn ballots_are_kept_once_per_user_until_they_expire(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let line = DecisionRecord {
        organization_id: "o1".into(),
        fingerprint: "sha256:f".into(),
        user_id: "bob".into(),
        outcome: OUTCOME_REFUSE.into(),
        reason: REASON_VOTE_REJECTED.into(),
        ..Default::default()
    };
    let ballot = |user: &str, rejected: bool, stamped: &[u8], expires_ms: i64| KeptBallot {
        organization_id: "o1".into(),
        fingerprint: "sha256:f".into(),
        user_id: user.into(),
        rejected,
        stamped: stamped.to_vec(),
        at_ms: 1_000,
        expires_ms,
    };
    assert_eq!(a.keep_ballot(&ballot("alice", false, b"a1", 10_000), 2, 1_000, &line).unwrap(), BallotKept::Kept);
    // alice again: the same selection replaces her vote, a rejection is refused.
    assert_eq!(b.keep_ballot(&ballot("alice", false, b"a2", 10_000), 2, 1_000, &line).unwrap(), BallotKept::Kept);
    assert_eq!(
        b.keep_ballot(&ballot("alice", true, b"a3", 10_000), 2, 1_000, &line).unwrap(),
        BallotKept::VotedOtherwise
    );
    assert_eq!(a.keep_ballot(&ballot("bob", true, b"b1", 20_000), 2, 1_000, &line).unwrap(), BallotKept::Kept);
    assert_eq!(a.keep_ballot(&ballot("carol", false, b"c1", 10_000), 2, 1_000, &line).unwrap(), BallotKept::Full);
    let kept = b.ballots("o1", "sha256:f", 1_000).unwrap();
    let seen: Vec<(&str, bool, &[u8])> =
        kept.iter().map(|k| (k.user_id.as_str(), k.rejected, k.stamped.as_slice())).collect();
    assert_eq!(seen, vec![("alice", false, &b"a2"[..]), ("bob", true, &b"b1"[..])]);
    assert!(a.ballots("o1", "sha256:other", 1_000).unwrap().is_empty());
    assert!(a.ballots("o2", "sha256:f", 1_000).unwrap().is_empty());
    // Past alice's expiry: only bob's is read, and the next vote kept prunes hers.
    assert_eq!(a.ballots("o1", "sha256:f", 15_000).unwrap().len(), 1);
    assert_eq!(a.keep_ballot(&ballot("carol", false, b"c1", 20_000), 2, 15_000, &line).unwrap(), BallotKept::Kept);
    let users: Vec<String> = b.ballots("o1", "sha256:f", 0).unwrap().into_iter().map(|k| k.user_id).collect();
    assert_eq!(users, ["bob", "carol"]);
    // bob's rejection is in the decision log, once, whatever he sends again.
    assert_eq!(a.keep_ballot(&ballot("bob", true, b"b2", 20_000), 2, 15_000, &line).unwrap(), BallotKept::Kept);
    assert_eq!(b.vote_rejecters("o1", "sha256:f").unwrap(), ["bob"]);
    let lines = a.decisions(0, 100).unwrap();
    assert_eq!(lines.iter().filter(|d| d.reason == REASON_VOTE_REJECTED).count(), 1, "{lines:?}");
    // A first rejection is kept past the activity's cap (a veto is never refused); a second one
    // is not.
    let on_h = |user: &str, rejected: bool| KeptBallot {
        fingerprint: "sha256:h".into(),
        ..ballot(user, rejected, b"h", 20_000)
    };
    assert_eq!(a.keep_ballot(&on_h("alice", false), 1, 15_000, &line).unwrap(), BallotKept::Kept);
    assert_eq!(a.keep_ballot(&on_h("bob", true), 1, 15_000, &line).unwrap(), BallotKept::Kept);
    assert_eq!(a.keep_ballot(&on_h("carol", true), 1, 15_000, &line).unwrap(), BallotKept::Full);

    // bob's kept rejection: a stamp of the activity is not spent, whichever way (an allow with
    // its replay entry, or a spend inside a log's or a change's transaction), on either store.
    let spend = |k: u8, fingerprint: &str| {
        let mut s = stamp_spend(k, "o1", 15_000, 400_000);
        s.allowed.fingerprint = fingerprint.into();
        s
    };
    let f = spend(1, "sha256:f");
    let remembered = b.remember_allowed(&f.share, f.key, f.expires_ms, f.now_ms, &f.allowed).unwrap();
    assert_eq!(remembered, Remembered::Rejected);
    let linked = LinkedActivity {
        fingerprint: "sha256:f",
        status: "ACTIVITY_STATUS_COMPLETED",
        activity_id: "a-f",
        activity_digest: "d",
        seq: 1,
        spend: Some(&f),
    };
    let moved = a.advance_log("o1", 0, 1, "h1", &[linked]);
    assert!(matches!(moved, Err(StoreError::NotSpent(ref r)) if r == &[(0, Remembered::Rejected)]), "{moved:?}");
    // An activity allowed (then failed, say) can no longer be rejected.
    let mut failed = spend(3, "sha256:f");
    failed.allowed.outcome = OUTCOME_FAILED.into();
    let linked = LinkedActivity {
        fingerprint: "sha256:f",
        status: "ACTIVITY_STATUS_REJECTED",
        activity_id: "a-f",
        activity_digest: "d",
        seq: 1,
        spend: Some(&failed),
    };
    a.advance_log("o1", 0, 1, "h1", &[linked]).expect("a link stating it rejected spends what runs nothing");
    let g = spend(2, "sha256:g");
    assert_eq!(a.remember_allowed(&g.share, g.key, g.expires_ms, g.now_ms, &g.allowed).unwrap(), Remembered::Fresh);
    let mut late = ballot("dan", true, b"d1", 20_000);
    late.fingerprint = "sha256:g".into();
    assert_eq!(b.keep_ballot(&late, 2, 15_000, &line).unwrap(), BallotKept::Ran);
}

/// Seals under a KEK are counted for every enclave on the store, per KEK.
fn seals_are_counted_per_kek_for_every_enclave(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    assert_eq!(a.reserve_seals("coffer-kek-v1", 1024).unwrap(), 1024);
    assert_eq!(b.reserve_seals("coffer-kek-v1", 1024).unwrap(), 2048);
    assert_eq!(b.reserve_seals("coffer-kek-v2", 1024).unwrap(), 1024);
    assert_eq!(a.reserve_seals("coffer-kek-v1", 0).unwrap(), 2048);
    assert_eq!(a.reserve_seals("coffer-kek-v1", 1 << 32).unwrap(), (1 << 32) + 2048);
}

/// The activity log's head moves by compare-and-set, and an activity is linked at most once in
/// each status, whichever enclave links it: a move with one already linked is not made at all.
fn an_activity_is_linked_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let link = |fingerprint: &'static str, activity_id: &'static str, status: &'static str, seq: u64| LinkedActivity {
        fingerprint,
        status,
        activity_id,
        activity_digest: fingerprint,
        seq,
        spend: None,
    };
    let (done, failed) = ("ACTIVITY_STATUS_COMPLETED", "ACTIVITY_STATUS_FAILED");
    a.advance_log("o", 0, 2, "h2", &[link("f1", "a1", done, 1), link("f2", "a2", failed, 2)]).unwrap();
    let asked = [("f1", "x"), ("x", "a2"), ("f3", "a3")];
    assert_eq!(b.linked("o", &asked).unwrap(), [true, true, false], "by fingerprint or by id");
    assert_eq!(b.linked("other", &[("f1", "a1")]).unwrap(), [false]);
    // f1 again in another status, or a3 under a2's id, beside a new one: nothing moves, nothing
    // of f4 is kept (issue 40, E7: a completed activity relinked as failed, another one's id).
    for again in [link("f1", "a1", failed, 4), link("f3", "a2", done, 4)] {
        let moved = b.advance_log("o", 2, 4, "h4", &[link("f4", "a4", done, 3), again]);
        assert!(matches!(moved, Err(StoreError::VersionMoved { found: Some(2), .. })), "{moved:?}");
    }
    assert_eq!(a.linked("o", &[("f4", "a4")]).unwrap(), [false]);
    assert_eq!(a.log_head("o").unwrap(), Some((2, "h2".to_string())));
    // A stale expected head is refused the same way; the right one moves.
    assert!(matches!(
        b.advance_log("o", 1, 3, "h3", &[link("f4", "a4", done, 3)]),
        Err(StoreError::VersionMoved { .. })
    ));
    b.advance_log("o", 2, 3, "h3", &[link("f4", "a4", done, 3)]).unwrap();
    assert_eq!(a.linked("o", &[("f4", "a4"), ("f1", "a1")]).unwrap(), [true, true]);
    // The same fingerprint and id in another organization are another activity.
    a.advance_log("other", 0, 1, "x1", &[link("f1", "a1", done, 1)]).unwrap();
    // What each link is of, as the webhook check reads it (issue 40, E7).
    let of = |org: &str, f: &str, status: &str| b.link_of(org, f, status).unwrap();
    let f4 = ActivityLink { activity_id: "a4".into(), activity_digest: "f4".into() };
    assert_eq!(of("o", "f4", done), Some(f4));
    assert_eq!(of("o", "f4", failed), None);
    assert_eq!(of("nobody", "f4", done), None);

    // A group of more links than one statement binds is linked whole, and read back whole; a
    // fingerprint or an id twice in one group moves nothing.
    let names: Vec<(String, String)> = (0..150).map(|i| (format!("g{i}"), format!("b{i}"))).collect();
    fn group<'a>(names: &'a [(String, String)], first: u64, done: &'static str) -> Vec<LinkedActivity<'a>> {
        names
            .iter()
            .enumerate()
            .map(|(i, (f, id))| LinkedActivity {
                fingerprint: f,
                status: done,
                activity_id: id,
                activity_digest: f,
                seq: first + i as u64,
                spend: None,
            })
            .collect()
    }
    let mut twice = group(&names[..100], 1, done);
    twice[99].activity_id = twice[3].activity_id;
    let moved = a.advance_log("big", 0, 100, "hb", &twice);
    assert!(matches!(moved, Err(StoreError::VersionMoved { found: None, .. })), "{moved:?}");
    let mut twice = group(&names[..100], 1, done);
    twice[70].fingerprint = twice[2].fingerprint;
    assert!(a.advance_log("big", 0, 100, "hb", &twice).is_err());
    a.advance_log("big", 0, 150, "hb", &group(&names, 1, done)).unwrap();
    let mut asked: Vec<(&str, &str)> = names.iter().map(|(f, id)| (f.as_str(), id.as_str())).collect();
    asked.push(("g-none", "b-none"));
    let found = b.linked("big", &asked).unwrap();
    assert_eq!(found.len(), 151);
    assert!(found[..150].iter().all(|l| *l) && !found[150], "every link of the group, and no other");
    assert_eq!(b.link_of("big", "g149", done).unwrap().map(|l| l.activity_id), Some("b149".to_string()));
}

/// The stamp `k` of `org` to spend at `now_ms` until `expires_ms`, with its allow (fingerprint
/// `f{k}`).
fn stamp_spend(k: u8, org: &str, now_ms: i64, expires_ms: i64) -> Spend {
    Spend {
        share: ReplayShare::of(org),
        key: [k; 32],
        expires_ms,
        now_ms,
        allowed: DecisionRecord {
            at_ms: now_ms,
            organization_id: org.into(),
            fingerprint: format!("f{k}"),
            outcome: OUTCOME_ALLOW.into(),
            ..Default::default()
        },
    }
}

/// A link's stamp is spent in the transaction that moves the log (issue 40, one commit per
/// activity): a link whose stamp the window refuses (spent already, its share full) moves
/// nothing and spends nothing, the others' stamps included; without it, the rest is linked and
/// spent together, each allow recorded.
fn a_link_spends_its_stamp_in_its_transaction(backend: Backend) {
    let limits = StoreLimits { replay_per_organization: 3, ..StoreLimits::default() };
    let (_db, a, b) = two_stores(backend, limits);
    let (now, expires) = (1_000_000, 2_000_000);
    let spend = |k: u8, org: &str| stamp_spend(k, org, now, expires);
    let (s1, s2, s3) = (spend(1, "o"), spend(2, "o"), spend(3, "o"));
    let link = |f: &'static str, id: &'static str, seq: u64, spend: &'static Spend| LinkedActivity {
        fingerprint: f,
        status: "ACTIVITY_STATUS_COMPLETED",
        activity_id: id,
        activity_digest: f,
        seq,
        spend: Some(spend),
    };
    let (s1, s2, s3): (&'static Spend, &'static Spend, &'static Spend) =
        (Box::leak(Box::new(s1)), Box::leak(Box::new(s2)), Box::leak(Box::new(s3)));
    assert_eq!(b.remember("o", [2; 32], expires, now).unwrap(), Remembered::Fresh);
    let refused = a.advance_log("o", 0, 2, "h2", &[link("f1", "a1", 1, s1), link("f2", "a2", 2, s2)]);
    match refused {
        Err(StoreError::NotSpent(r)) => assert_eq!(r, [(1, Remembered::Replayed)]),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.log_head("o").unwrap(), None, "nothing moved");
    assert!(!b.spent([1; 32], now, "o", "f1").unwrap(), "the other link's stamp is not spent either");
    assert_eq!(b.decided("o", "f1").unwrap().logged, LoggedDecision::Nothing);
    a.advance_log("o", 0, 1, "h1", &[link("f1", "a1", 1, s1)]).unwrap();
    assert!(b.spent([1; 32], now, "nobody", "none").unwrap(), "spent with its link");
    assert_eq!(b.decided("o", "f1").unwrap().logged, LoggedDecision::Authorized, "its allow with it");
    assert_eq!(b.linked("o", &[("f1", "a1")]).unwrap(), [true]);
    // The organization's share holds 3 entries ([2; 32] and [1; 32] so far): one more fits, the
    // next is refused as its share full.
    b.advance_log("o", 1, 2, "h2", &[link("f3", "a3", 2, s3)]).unwrap();
    let s4: &'static Spend = Box::leak(Box::new(spend(4, "o")));
    match a.advance_log("o", 2, 3, "h3", &[link("f4", "a4", 3, s4)]) {
        Err(StoreError::NotSpent(r)) => assert_eq!(r, [(0, Remembered::OrganizationQuotaFull)]),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.log_head("o").unwrap().map(|(n, _)| n), Some(2));
    // A spend refused after its lane took its entry undoes that entry at once: it counts against
    // no later spend of the same call (both sign-ups' lane holds one entry).
    let lane = ReplayLane { scope: "lane:signups".into(), quota: 1 };
    let laned = |k: u8, org: &str| Spend {
        share: ReplayShare { organization: org.into(), lanes: vec![lane.clone()] },
        ..spend(k, org)
    };
    let (s5, s6): (&'static Spend, &'static Spend) =
        (Box::leak(Box::new(laned(5, "o"))), Box::leak(Box::new(laned(6, "p"))));
    match a.advance_log("o", 2, 4, "h4", &[link("f5", "a5", 3, s5), link("f6", "a6", 4, s6)]) {
        Err(StoreError::NotSpent(r)) => assert_eq!(r, [(0, Remembered::OrganizationQuotaFull)], "only the first"),
        other => panic!("{other:?}"),
    }
    a.advance_log("o", 2, 3, "h3", &[link("f6", "a6", 3, s6)]).unwrap();
    assert!(b.spent([6; 32], now, "nobody", "none").unwrap());
}

/// A state change's stamp is spent in the transaction that applies it (issue 40, one commit per
/// activity): a stamp the window refuses applies nothing and spends nothing, the others' stamps
/// included, and is named by its caller's number; without it, the changes and every stamp
/// commit together, each allow recorded.
fn a_change_spends_its_stamp_in_its_transaction(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let (now, expires) = (1_000_000, 2_000_000);
    let spend = |k: u8, org: &str| stamp_spend(k, org, now, expires);
    let (s1, s2) = (spend(1, "o"), spend(2, "p"));
    assert_eq!(b.remember("p", [2; 32], expires, now).unwrap(), Remembered::Fresh);
    let changes = [change("o", 0, vec![entry("user", "u1", b"1")], &[]), change("p", 0, vec![], &[])];
    match a.apply_spending(&changes, &[(7, &s1), (9, &s2)]) {
        Err(StoreError::NotSpent(r)) => assert_eq!(r, [(9, Remembered::Replayed)]),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.version("o").unwrap(), None, "nothing applied");
    assert!(!b.spent([1; 32], now, "nobody", "none").unwrap(), "the other stamp is not spent either");
    assert_eq!(b.decided("o", "f1").unwrap().logged, LoggedDecision::Nothing);
    assert_eq!(a.apply_spending(&changes[..1], &[(0, &s1)]).unwrap(), [1]);
    assert!(b.spent([1; 32], now, "nobody", "none").unwrap(), "spent with its change");
    assert_eq!(b.decided("o", "f1").unwrap().logged, LoggedDecision::Authorized, "its allow with it");
    assert_eq!(b.load("o").unwrap().unwrap().entries.len(), 1);
    // A moved version spends nothing.
    let s3 = spend(3, "o");
    let stale = [change("o", 0, vec![entry("user", "u2", b"2")], &[])];
    assert!(matches!(a.apply_spending(&stale, &[(0, &s3)]), Err(StoreError::VersionMoved { .. })));
    assert!(!b.spent([3; 32], now, "nobody", "none").unwrap());
    // A stamp spent at or past its expiry is not (its expired entry would be replaced as if
    // absent: spent twice, by two enclaves deciding it in its last moments).
    let late = Spend { now_ms: expires, ..spend(4, "o") };
    let next = [change("o", 1, vec![entry("user", "u3", b"3")], &[])];
    match a.apply_spending(&next, &[(0, &late)]) {
        Err(StoreError::NotSpent(r)) => assert_eq!(r, [(0, Remembered::Replayed)]),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.version("o").unwrap(), Some(1), "nothing applied");
    assert_eq!(a.remember("o", [4; 32], expires, expires).unwrap(), Remembered::Replayed);
    assert_eq!(a.remember("o", [4; 32], expires, expires - 1).unwrap(), Remembered::Fresh, "nothing was kept");
}

/// What stands for a state change in the decision log (issue 40, from a helper's review): its
/// allow, whose `made:` record names the records it made, over any refusal recorded after it (a
/// twin refused once the change was applied does not undo it); a failure of the apply recorded
/// after it stands over it (the change was not applied).
fn an_applied_changes_allow_stands_over_a_later_refusal(backend: Backend) {
    let (_db, a, _b) = two_stores(backend, StoreLimits::default());
    let d = |fp: &str, operation: &str, outcome: &str, digest: &str| DecisionRecord {
        at_ms: 10,
        organization_id: "o".into(),
        operation: operation.into(),
        fingerprint: fp.into(),
        activity_type: "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT".into(),
        user_id: "u".into(),
        outcome: outcome.into(),
        reason: String::new(),
        result_digest: digest.into(),
    };
    let made = "made:/endpointId;abc";
    a.record_decision(&d("applied", "apply_activity", OUTCOME_ALLOW, made)).unwrap();
    a.record_decision(&d("applied", "apply_activity", OUTCOME_REFUSE, "")).unwrap();
    let stands = a.decided("o", "applied").unwrap();
    assert_eq!((stands.logged, stands.result_digest.as_str()), (LoggedDecision::Authorized, made));
    a.record_decision(&d("failed", "apply_activity", OUTCOME_ALLOW, made)).unwrap();
    a.record_decision(&d("failed", "apply_activity", OUTCOME_FAILED, "")).unwrap();
    a.record_decision(&d("failed", "apply_activity", OUTCOME_REFUSE, "")).unwrap();
    assert_eq!(a.decided("o", "failed").unwrap().logged, LoggedDecision::Refused, "failed after its spend");
}

/// Two enclaves' group commits that spend stamps of the same organizations in other orders never
/// deadlock (on PostgreSQL a deadlock fails one group, which runs again after `deadlock_timeout`):
/// each transaction takes the window's count rows in one order. An SQLite store has one writer.
fn groups_spending_in_other_orders_do_not_deadlock(backend: Backend) {
    let (_db, a, b) = two_stores(backend, StoreLimits::default());
    let (now, expires) = (1_000_000, 2_000_000);
    let threads: Vec<_> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(t, store)| {
            std::thread::spawn(move || {
                let mut deadlocked = 0;
                for i in 0..30u8 {
                    // Every stamp's first byte is 0: each organization's spends update one count row.
                    let spend = |org: &str, n: u8| {
                        let mut s = stamp_spend(0, org, now, expires);
                        s.key[1..4].copy_from_slice(&[t as u8, i, n]);
                        s
                    };
                    let orgs = if t == 0 { ["o", "p"] } else { ["p", "o"] };
                    let (first, second) = (spend(orgs[0], 0), spend(orgs[1], 1));
                    match store.apply_spending(&[], &[(0, &first), (1, &second)]) {
                        Ok(_) => {}
                        Err(StoreError::Conflict(_)) => deadlocked += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                deadlocked
            })
        })
        .collect();
    let deadlocked: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(deadlocked, 0, "groups ran again after a deadlock");
}

/// An operator command that reads the store (`reconcile`) opens it only where one exists: a
/// missing SQLite file, or a database without the store's schema, is refused and left as it was
/// (issue 41: it used to make an empty store and report on it).
fn only_an_existing_store_is_opened_where_one_must_exist(backend: Backend) {
    let db = database(backend);
    let settings = StoreSettings { url: db.url.clone(), password_file: None, limits: StoreLimits::default() };
    let refused = open_existing(&settings).err().expect("no store there yet").to_string();
    assert!(refused.contains("no authority store") && refused.contains("never creates one"), "{refused}");
    // Nothing was made: a second try is refused the same way.
    assert!(open_existing(&settings).is_err(), "the refused open created a store");
    open(&settings).unwrap();
    open_existing(&settings).unwrap();
}

fn unsupported_urls_are_refused_without_their_password(_backend: Backend) {
    let settings = StoreSettings { url: "mysql://enclave:hunter2@db/x".into(), ..Default::default() };
    let err = open(&settings).err().expect("refused").to_string();
    assert!(err.contains("unsupported") && !err.contains("hunter2"), "{err}");
    assert_eq!(redact("postgres://enclave:hunter2@%2Ftmp/a"), "postgres://enclave@%2Ftmp/a");
}

/// Runs each named test on both backends.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(super::Backend::Sqlite);
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                super::$name(super::Backend::Postgres);
            })*
        }
    };
}

conformance!(
    an_applied_changes_allow_stands_over_a_later_refusal,
    ballots_are_kept_once_per_user_until_they_expire,
    seals_are_counted_per_kek_for_every_enclave,
    groups_spending_in_other_orders_do_not_deadlock,
    sealed_service_keys_are_kept_once_for_every_enclave,
    versions_compare_and_set,
    concurrent_changes_apply_once,
    the_replay_window_is_shared_with_a_quota_per_organization,
    lanes_of_a_share_are_charged_together_or_not_at_all,
    scoped_quotas_hold_under_concurrency,
    the_window_has_a_capacity,
    decisions_are_logged_for_every_enclave,
    an_activity_is_linked_once,
    a_link_spends_its_stamp_in_its_transaction,
    a_change_spends_its_stamp_in_its_transaction,
    only_an_existing_store_is_opened_where_one_must_exist,
    old_decisions_are_pruned_in_batches,
    unsupported_urls_are_refused_without_their_password,
);
