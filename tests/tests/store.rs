//! The store's conformance suite: every test runs on SQLite and on PostgreSQL (a private server
//! started by `deploy/postgres-private.sh`), and the races between two gateways run as two stores
//! on one database.

use std::sync::Arc;

use coffer_gateway::store::*;
use coffer_tests::postgres;

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// A database of its own for one test: a SQLite file in a directory removed on drop, or a fresh
/// PostgreSQL database.
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
            let dir = std::env::temp_dir().join(format!("coffer-store-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            Database { url: format!("sqlite://{}", dir.join("t.db").display()), dir: Some(dir) }
        }
        Backend::Postgres => Database { url: postgres::server().fresh_database(), dir: None },
    }
}

/// One store (one gateway's) on a fresh database holding organization `o1`.
fn store(backend: Backend) -> (Database, Arc<dyn Store>) {
    let db = database(backend);
    let s = open(&db.url).unwrap();
    s.apply(&[Write::InsertOrganization(org("o1"))]).unwrap();
    (db, s)
}

/// Two stores on one database: what two gateways see.
fn two_stores(backend: Backend) -> (Database, Arc<dyn Store>, Arc<dyn Store>) {
    let (db, a) = store(backend);
    let b = open(&db.url).unwrap();
    (db, a, b)
}

/// Runs each named test on both backends.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(super::Backend::Sqlite)
            })*
        }
        mod postgresql {
            $(#[test]
            fn $name() {
                super::$name(super::Backend::Postgres)
            })*
        }
    };
}

conformance!(
    every_table_of_an_organization_is_purged_or_kept_on_deletion_by_decision,
    same_fingerprint_commits_once,
    failed_write_rolls_back_everything,
    delete_requires_export_unless_told,
    import_target_is_used_once,
    records_unique_names_replace_and_delete,
    concurrent_commits_share_batches_and_fail_alone,
    activity_pages_are_keyset_pages_in_sql,
    webhook_outbox_rows_are_due_skipped_attempted_and_dropped,
    migrations_are_idempotent_and_a_newer_schema_is_refused,
    two_gateways_record_one_fingerprint_once,
    two_gateways_keep_names_unique,
    two_gateways_move_a_consensus_activity_once,
    two_gateways_claim_an_idempotency_key_once,
    sub_organization_deletion_keeps_activities_and_purges_the_rest,
    stamp_context_reads_what_the_separate_lookups_read,
    two_gateways_deriving_in_one_wallet_keep_its_account_order,
    two_gateways_claim_each_due_webhook_delivery_once,
);

fn org(id: &str) -> Organization {
    Organization {
        id: id.into(),
        name: "o".into(),
        parent_id: None,
        root_quorum_threshold: 1,
        root_user_ids: vec!["u".into()],
        created_at: 1,
        updated_at: 1,
    }
}

fn activity(fp: &str) -> ActivityRecord {
    ActivityRecord {
        id: uuid::Uuid::new_v4().to_string(),
        organization_id: "o1".into(),
        activity_type: "ACTIVITY_TYPE_X".into(),
        status: "ACTIVITY_STATUS_COMPLETED".into(),
        fingerprint: fp.into(),
        intent: serde_json::json!({}),
        result: serde_json::json!({}),
        votes: serde_json::json!([]),
        failure: None,
        created_at: now_nanos(),
        updated_at: now_nanos(),
        app_proofs: Vec::new(),
    }
}

fn wallet(id: &str, name: &str) -> Wallet {
    Wallet {
        id: id.into(),
        organization_id: "o1".into(),
        name: name.into(),
        exported: false,
        imported: false,
        sealed_seed: vec![1, 2, 3],
        created_at: 1,
        updated_at: 1,
    }
}

fn every_table_of_an_organization_is_purged_or_kept_on_deletion_by_decision(backend: Backend) {
    let (_db, s) = store(backend);
    let tables: Vec<String> = s.organization_footprint("o1").unwrap().into_iter().map(|(t, _)| t).collect();
    let unclassified: Vec<&String> = tables
        .iter()
        .filter(|t| !PURGED_ON_DELETION.contains(&t.as_str()) && !KEPT_ON_DELETION.contains(&t.as_str()))
        .collect();
    assert!(unclassified.is_empty(), "tables a sub-organization deletion neither purges nor keeps: {unclassified:?}");
    for t in PURGED_ON_DELETION.iter().chain(KEPT_ON_DELETION) {
        assert!(tables.iter().any(|x| x == t), "{t} is not a table with an organization_id");
    }
}

fn same_fingerprint_commits_once(backend: Backend) {
    let (_db, s) = store(backend);
    let first = activity("sha256:aa");
    assert!(matches!(s.commit(&first, &[Write::InsertWallet(wallet("w1", "a"))]).unwrap(), Committed::New(_)));
    let again = activity("sha256:aa");
    match s.commit(&again, &[Write::InsertWallet(wallet("w2", "b"))]).unwrap() {
        Committed::Existing(a) => assert_eq!(a.id, first.id),
        other => panic!("expected existing, got {other:?}"),
    }
    // The second activity's effects were not applied.
    assert_eq!(s.wallets("o1").unwrap().len(), 1);
}

fn failed_write_rolls_back_everything(backend: Backend) {
    let (_db, s) = store(backend);
    s.commit(&activity("sha256:1"), &[Write::InsertWallet(wallet("w1", "a"))]).unwrap();
    // Second wallet is fine, then a name clash: neither the wallet nor the activity lands.
    let err = s
        .commit(
            &activity("sha256:2"),
            &[Write::InsertWallet(wallet("w2", "b")), Write::InsertWallet(wallet("w3", "a"))],
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Unique(ref m) if m == "wallet name must be unique"), "{err:?}");
    assert_eq!(s.wallets("o1").unwrap().len(), 1);
    assert!(matches!(s.activity_by_fingerprint("sha256:2"), Err(StoreError::NotFound)));
}

fn delete_requires_export_unless_told(backend: Backend) {
    let (_db, s) = store(backend);
    s.commit(&activity("sha256:1"), &[Write::InsertWallet(wallet("w1", "a"))]).unwrap();
    let err = s
        .commit(&activity("sha256:2"), &[Write::DeleteWallets { ids: vec!["w1".into()], require_exported: true }])
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(ref m) if m.starts_with("wallet account has not been exported")));
    assert_eq!(s.wallets("o1").unwrap().len(), 1);
    s.commit(&activity("sha256:3"), &[Write::MarkWalletExported("w1".into())]).unwrap();
    s.commit(&activity("sha256:4"), &[Write::DeleteWallets { ids: vec!["w1".into()], require_exported: true }])
        .unwrap();
    assert!(s.wallets("o1").unwrap().is_empty());
}

fn import_target_is_used_once(backend: Backend) {
    let (_db, s) = store(backend);
    let t = ImportTarget { organization_id: "o1".into(), user_id: "u".into(), sealed_key: vec![9], created_at: 1 };
    s.apply(&[Write::PutImportTarget(t.clone())]).unwrap();
    assert_eq!(s.import_target("o1", "u").unwrap().sealed_key, vec![9]);
    let take = Write::TakeImportTarget { organization_id: "o1".into(), user_id: "u".into(), sealed_key: vec![9] };
    s.apply(std::slice::from_ref(&take)).unwrap();
    assert!(matches!(s.apply(&[take]), Err(StoreError::Conflict(_))));
}

fn records_unique_names_replace_and_delete(backend: Backend) {
    let (_db, s) = store(backend);
    let rec = |id: &str, name: &str| Record {
        organization_id: "o1".into(),
        kind: "policy".into(),
        id: id.into(),
        name: name.into(),
        data: serde_json::json!({"n": name}),
        created_at: 1,
        updated_at: 1,
    };
    s.apply(&[Write::PutRecord(rec("p1", "a"))]).unwrap();
    let err = s.apply(&[Write::PutRecord(rec("p2", "a"))]).unwrap_err();
    assert!(matches!(err, StoreError::Unique(ref m) if m.contains("policy name must be unique")), "{err:?}");
    s.apply(&[Write::PutRecord(rec("p1", "b"))]).unwrap();
    assert_eq!(s.record("o1", "policy", "p1").unwrap().data, serde_json::json!({"n": "b"}));
    assert_eq!(s.records("o1", "policy").unwrap().len(), 1);
    let del = |ids: Vec<&str>| Write::DeleteRecords {
        organization_id: "o1".into(),
        kind: "policy".into(),
        ids: ids.into_iter().map(String::from).collect(),
    };
    // Deleting a missing record fails the whole transaction: p1 survives.
    assert!(matches!(s.apply(&[del(vec!["p1", "nope"])]), Err(StoreError::Conflict(_))));
    assert!(s.record("o1", "policy", "p1").is_ok());
    s.apply(&[del(vec!["p1"])]).unwrap();
    assert!(matches!(s.record("o1", "policy", "p1"), Err(StoreError::NotFound)));
}

/// Group commit, forced rather than hoped for. The committer answers a group's commits (on its own
/// thread) only after the group's one transaction has committed, so a commit's callback that
/// blocks holds the committer. A first commit's callback is held while 64 threads, released
/// together by a barrier, queue their commits (`commit_then` returns once queued) and meet at a
/// second barrier; then it is let go, and the committer takes all 64 waiting into one group. Each
/// of the 64 callbacks counts the activities the store holds: 58 (the first, and the 57 of the
/// group that commit) in every one of them, which holds only if all were committed together
/// before any was answered. Committed one by one, the first answered would see 2. Every 8th
/// reuses a wallet name: those 7 fail alone, inside the group, and the others still land.
fn concurrent_commits_share_batches_and_fail_alone(backend: Backend) {
    use std::sync::{mpsc, Barrier};
    let (_db, s) = store(backend);
    let filter = ActivityFilter { limit: 100, ..Default::default() };
    let (entered_tx, entered) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    s.commit_then(
        activity("sha256:first"),
        Vec::new(),
        Box::new(move |r| {
            entered_tx.send(matches!(r, Ok(Committed::New(_)))).unwrap();
            release.recv().unwrap();
        }),
    );
    assert!(entered.recv().unwrap(), "the first commit lands, and its callback now holds the committer");
    let (start, queued) = (Arc::new(Barrier::new(64)), Arc::new(Barrier::new(65)));
    let (done_tx, done) = mpsc::channel();
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let (s, start, queued, done_tx, filter) =
                (s.clone(), start.clone(), queued.clone(), done_tx.clone(), filter.clone());
            std::thread::spawn(move || {
                start.wait();
                let name = if i % 8 == 0 { "dup".to_string() } else { format!("w{i}") };
                let reader = s.clone();
                s.commit_then(
                    activity(&format!("sha256:{i}")),
                    vec![Write::InsertWallet(wallet(&format!("id{i}"), &name))],
                    Box::new(move |r| {
                        let seen = reader.activities("o1", &filter).map(|a| a.len());
                        drop(reader);
                        done_tx.send((i, r, seen)).unwrap();
                    }),
                );
                queued.wait();
            })
        })
        .collect();
    drop(done_tx);
    queued.wait();
    release_tx.send(()).unwrap();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let results: Vec<_> = done.iter().collect();
    assert_eq!(results.len(), 64);
    let ok = results.iter().filter(|(_, r, _)| matches!(r, Ok(Committed::New(_)))).count();
    let unique = results.iter().filter(|(_, r, _)| matches!(r, Err(StoreError::Unique(_)))).count();
    // One "dup" wins, seven lose; every other commit lands.
    assert_eq!((ok, unique), (57, 7));
    for (i, _, seen) in &results {
        assert_eq!(seen.as_ref().ok(), Some(&58), "commit {i} was answered before its group had all committed");
    }
    assert_eq!(s.wallets("o1").unwrap().len(), 57);
    assert_eq!(s.activities("o1", &filter).unwrap().len(), 58);
}

fn activity_pages_are_keyset_pages_in_sql(backend: Backend) {
    let (_db, s) = store(backend);
    let mut all = Vec::new();
    for i in 0..40i64 {
        let mut a = activity(&format!("sha256:p{i}"));
        a.id = format!("a{i:02}");
        // Pairs share a timestamp, so the id breaks ties.
        a.created_at = 1_000 + i / 2;
        a.status = if i % 3 == 0 { "ACTIVITY_STATUS_FAILED" } else { "ACTIVITY_STATUS_COMPLETED" }.into();
        s.commit(&a, &[]).unwrap();
        all.push(a);
    }
    all.sort_by(|x, y| (y.created_at, &y.id).cmp(&(x.created_at, &x.id)));
    let ids = |v: Vec<ActivityRecord>| v.into_iter().map(|a| a.id).collect::<Vec<_>>();
    let expect = |f: &ActivityFilter| {
        let mut items: Vec<&ActivityRecord> =
            all.iter().filter(|a| f.statuses.is_empty() || f.statuses.contains(&a.status)).collect();
        if let Some(pos) = f.after.as_ref().and_then(|c| all.iter().position(|a| &a.id == c)) {
            let cut = &all[pos];
            items.retain(|a| (a.created_at, &a.id) < (cut.created_at, &cut.id));
        }
        if let Some(pos) = f.before.as_ref().and_then(|c| all.iter().position(|a| &a.id == c)) {
            let cut = &all[pos];
            items.retain(|a| (a.created_at, &a.id) > (cut.created_at, &cut.id));
            let skip = items.len().saturating_sub(f.limit);
            items.drain(..skip);
        }
        items.truncate(f.limit);
        items.into_iter().map(|a| a.id.clone()).collect::<Vec<_>>()
    };
    let failed = vec!["ACTIVITY_STATUS_FAILED".to_string()];
    for (statuses, after, before, limit) in [
        (vec![], None, None, 10),
        (vec![], Some("a21"), None, 10),
        (vec![], Some("a20"), None, 100),
        (vec![], None, Some("a10"), 5),
        (vec![], None, Some("a38"), 5),
        (vec![], Some("a30"), Some("a10"), 4),
        (failed.clone(), Some("a33"), None, 3),
        (failed.clone(), None, Some("a03"), 3),
        (vec![], Some("unknown"), None, 3),
    ] {
        let f = ActivityFilter {
            statuses,
            types: vec![],
            limit,
            after: after.map(String::from),
            before: before.map(String::from),
        };
        let got = ids(s.activities("o1", &f).unwrap());
        assert_eq!(got, expect(&f), "{after:?} {before:?} {limit}");
        assert!(!got.is_empty());
    }
    // Walking `after` cursors visits every activity once, newest first.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let f = ActivityFilter { limit: 7, after: after.clone(), ..Default::default() };
        let page = ids(s.activities("o1", &f).unwrap());
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        seen.extend(page);
    }
    assert_eq!(seen, all.iter().map(|a| a.id.clone()).collect::<Vec<_>>());
    let typed = ActivityFilter { limit: 100, types: vec!["ACTIVITY_TYPE_NONE".into()], ..Default::default() };
    assert!(s.activities("o1", &typed).unwrap().is_empty());
}

/// A never attempted delivery of activity `a1` of `o1`, due at `due` (and created then).
fn pending(id: &str, endpoint: &str, due: Nanos) -> WebhookDelivery {
    WebhookDelivery {
        id: id.into(),
        organization_id: "o1".into(),
        endpoint_id: endpoint.into(),
        activity_organization_id: "o1".into(),
        activity_id: "a1".into(),
        event_type: "ACTIVITY_UPDATES".into(),
        body: "{}".into(),
        status: DELIVERY_PENDING.into(),
        attempts: 0,
        next_attempt_at: due,
        last_status_code: None,
        last_error: None,
        created_at: due,
        updated_at: 1,
        leased_by: None,
        top_level_id: "t1".into(),
    }
}

fn webhook_outbox_rows_are_due_skipped_attempted_and_dropped(backend: Backend) {
    let (_db, s) = store(backend);
    let row = |id: &str, endpoint: &str, due: Nanos| WebhookDelivery { created_at: 1, ..pending(id, endpoint, due) };
    s.apply(&[
        Write::EnqueueWebhookDelivery(row("d1", "slow", 10)),
        Write::EnqueueWebhookDelivery(row("d2", "slow", 11)),
        Write::EnqueueWebhookDelivery(row("d3", "fast", 12)),
        Write::EnqueueWebhookDelivery(row("d4", "fast", 99)),
    ])
    .unwrap();
    let ids = |v: Vec<WebhookDelivery>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
    let lease = 1_000;
    let claim_skipping = |now: Nanos, limit: usize, skip: &DueSkip| {
        ids(s.claim_due_webhook_deliveries(now, (lease, "gw-a"), limit, skip).unwrap())
    };
    let claim = |now: Nanos, limit: usize, endpoints: &[String]| {
        claim_skipping(now, limit, &DueSkip { endpoints: endpoints.to_vec(), top_levels: vec![] })
    };
    assert_eq!(claim(50, 1, &[]), ["d1"], "oldest due first, the limit");
    let busy_top_level = DueSkip { endpoints: vec![], top_levels: vec!["t1".into()] };
    assert!(claim_skipping(50, 10, &busy_top_level).is_empty(), "a busy top-level organization is skipped");
    assert_eq!(claim(50, 10, &["slow".into()]), ["d3"], "a busy endpoint is skipped");
    let claimed = s.claim_due_webhook_deliveries(50, (lease, "gw-a"), 10, &DueSkip::default()).unwrap();
    assert_eq!(
        claimed.iter().map(|d| (d.id.as_str(), d.body.as_str(), d.leased_by.as_deref())).collect::<Vec<_>>(),
        [("d2", "{}", Some("gw-a"))]
    );
    assert!(claim(50, 10, &[]).is_empty(), "claimed ones are leased");
    // Before sending, the holder renews its leases; another gateway renews nothing of them.
    let all = ["d1".to_string(), "d2".into(), "d3".into()];
    assert!(s.renew_webhook_leases(&all, (lease, "gw-b")).unwrap().is_empty());
    let mut renewed = s.renew_webhook_leases(&all, (lease, "gw-a")).unwrap();
    renewed.sort();
    assert_eq!(renewed, all);
    assert_eq!(claim(100, 10, &[]), ["d4"], "due later");
    let attempt = |status: &str, next: Nanos| WebhookAttempt {
        at: 20,
        status_code: Some(503),
        error: Some("HTTP 503".into()),
        duration_ms: 3,
        status: status.into(),
        next_attempt_at: next,
    };
    s.record_webhook_attempt("d1", &attempt(DELIVERY_PENDING, 70)).unwrap();
    // Waiting for its retry, d1 is nobody's: another gateway's restart does not make it due.
    assert_eq!(s.release_webhook_leases(50, "gw-b").unwrap(), 0, "gw-a's leases are not gw-b's");
    // A restart under the same name releases what it held (d2, d3, d4), not a waiting retry (d1).
    assert_eq!(s.release_webhook_leases(50, "gw-a").unwrap(), 3);
    assert_eq!(
        ids(s.claim_due_webhook_deliveries(50, (lease, "gw-b"), 10, &DueSkip::default()).unwrap()),
        ["d2", "d3", "d4"]
    );
    assert_eq!(s.release_webhook_leases(50, "gw-a").unwrap(), 0, "now gw-b's");
    assert_eq!(claim(80, 10, &[]), ["d1"], "retried when due");
    s.record_webhook_attempt("d2", &attempt(DELIVERY_FAILED, 20)).unwrap();
    let listed = s.webhook_deliveries("o1", "slow", 10).unwrap();
    let d1 = listed.iter().find(|d| d.id == "d1").unwrap();
    // Its retry, due at 70, was claimed at 80 until the lease's end.
    assert_eq!((d1.attempts, d1.last_status_code, d1.next_attempt_at), (1, Some(503), lease));
    assert_eq!(listed.iter().find(|d| d.id == "d2").unwrap().status, DELIVERY_FAILED);
    // A finished delivery takes no more attempts.
    s.record_webhook_attempt("d2", &attempt(DELIVERY_DELIVERED, 20)).unwrap();
    assert_eq!(s.webhook_deliveries("o1", "slow", 10).unwrap().iter().find(|d| d.id == "d2").unwrap().attempts, 1);
    // Deleting the endpoint drops what is still pending, keeps what is settled.
    s.apply(&[Write::DropWebhookDeliveries { organization_id: "o1".into(), endpoint_id: "slow".into() }]).unwrap();
    assert_eq!(ids(s.webhook_deliveries("o1", "slow", 10).unwrap()), ["d2"]);
}

fn migrations_are_idempotent_and_a_newer_schema_is_refused(backend: Backend) {
    let (db, s) = store(backend);
    drop(s);
    let again = open(&db.url).unwrap();
    assert_eq!(again.organization("o1").unwrap(), org("o1"));
    // A database a newer build migrated: this build must not write to it.
    match backend {
        Backend::Sqlite => {
            let c = rusqlite::Connection::open(db.url.trim_start_matches("sqlite://")).unwrap();
            c.execute("INSERT INTO schema_migrations (version) VALUES (999)", []).unwrap();
        }
        Backend::Postgres => {
            let url = db.url.clone();
            std::thread::spawn(move || {
                let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
                c.batch_execute("INSERT INTO schema_migrations (version) VALUES (999)").unwrap();
            })
            .join()
            .unwrap();
        }
    }
    let err = open(&db.url).err().expect("a newer schema is refused").to_string();
    assert!(err.contains("version 999, newer than this build"), "{err}");
}

/// Runs `f(i, store)` on `n` threads, alternating between the two stores, all at once.
fn race<T: Send + 'static>(
    a: &Arc<dyn Store>,
    b: &Arc<dyn Store>,
    n: usize,
    f: impl Fn(usize, &dyn Store) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let start = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (s, f, start) = (if i % 2 == 0 { a.clone() } else { b.clone() }, f.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                f(i, s.as_ref())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn two_gateways_record_one_fingerprint_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    // The same request reaches both gateways 16 times at once: one record, one wallet, and every
    // answer names that record.
    let results = race(&a, &b, 16, |i, s| {
        let mut act = activity("sha256:same");
        act.id = format!("attempt-{i}");
        s.commit(&act, &[Write::InsertWallet(wallet(&format!("w{i}"), "shared name"))])
    });
    let mut new = Vec::new();
    let mut existing = Vec::new();
    for r in results {
        match r.unwrap() {
            Committed::New(x) => new.push(x.id),
            Committed::Existing(x) => existing.push(x.id),
        }
    }
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(existing.iter().all(|id| *id == new[0]), "{existing:?} vs {new:?}");
    assert_eq!(a.wallets("o1").unwrap().len(), 1);
    assert_eq!(b.activity_by_fingerprint("sha256:same").unwrap().id, new[0]);
}

fn two_gateways_keep_names_unique(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    let results = race(&a, &b, 16, |i, s| {
        s.commit(&activity(&format!("sha256:n{i}")), &[Write::InsertWallet(wallet(&format!("w{i}"), "one name"))])
    });
    let ok = results.iter().filter(|r| matches!(r, Ok(Committed::New(_)))).count();
    let taken =
        results.iter().filter(|r| matches!(r, Err(StoreError::Unique(m)) if m == "wallet name must be unique")).count();
    assert_eq!((ok, taken), (1, 15), "{results:?}");
    assert_eq!(b.wallets("o1").unwrap().len(), 1);
    // No activity of a loser was recorded either.
    let all = a.activities("o1", &ActivityFilter { limit: 100, ..Default::default() }).unwrap();
    assert_eq!(all.len(), 1);
}

fn two_gateways_move_a_consensus_activity_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    let mut pending = activity("sha256:pending");
    pending.id = "pending".into();
    pending.status = "ACTIVITY_STATUS_CONSENSUS_NEEDED".into();
    a.commit(&pending, &[]).unwrap();
    // Sixteen approvals of the activity as it stood with no votes: only one may complete it.
    let results = race(&a, &b, 16, |i, s| {
        s.commit(
            &activity(&format!("sha256:vote{i}")),
            &[Write::UpdateConsensusActivity {
                organization_id: "o1".into(),
                id: "pending".into(),
                expected_votes: 0,
                status: "ACTIVITY_STATUS_COMPLETED".into(),
                result: serde_json::json!({"by": i}),
                votes: serde_json::json!([{"id": format!("vote{i}")}]),
                failure: None,
                updated_at: now_nanos(),
                app_proofs: Vec::new(),
            }],
        )
    });
    let won: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_ok()).map(|(i, _)| i).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    assert!(results
        .iter()
        .filter(|r| r.is_err())
        .all(|r| matches!(r, Err(StoreError::Conflict(m)) if m == CONSENSUS_MOVED)));
    let done = b.activity("o1", "pending").unwrap();
    assert_eq!(done.status, "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(done.result, serde_json::json!({"by": won[0]}));
    assert_eq!(done.votes.as_array().unwrap().len(), 1);
}

fn two_gateways_claim_an_idempotency_key_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    let results = race(&a, &b, 16, |i, s| {
        let act = activity(&format!("sha256:idem{i}"));
        let id = act.id.clone();
        let claim = Write::InsertIdempotencyKey {
            organization_id: "o1".into(),
            key: "retry-me".into(),
            intent_hash: format!("h{i}"),
            activity_id: id.clone(),
            created_at: 1,
        };
        s.commit(&act, &[claim]).map(|_| id)
    });
    let won: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    assert!(results.iter().filter(|r| r.is_err()).all(|r| matches!(r, Err(StoreError::Unique(_)))));
    assert_eq!(&a.idempotency_key("o1", "retry-me").unwrap().1, won[0]);
}

/// Deletes the sub-organization `sub` of `o1` by an activity submitted in `submitted_in`.
fn delete_sub_organization(s: &dyn Store, submitted_in: &str) -> ActivityRecord {
    let mut deletion = activity("sha256:delete");
    deletion.organization_id = submitted_in.into();
    let delete = Write::DeleteSubOrganization {
        organization_id: "sub".into(),
        parent_id: "o1".into(),
        activity_id: deletion.id.clone(),
        require_exported: true,
        deleted_at: now_nanos(),
    };
    s.commit(&deletion, &[delete]).unwrap();
    deletion
}

fn sub_organization_deletion_keeps_activities_and_purges_the_rest(backend: Backend) {
    let (_db, s) = store(backend);
    let mut sub = org("sub");
    sub.parent_id = Some("o1".into());
    s.apply(&[Write::InsertOrganization(sub)]).unwrap();
    let mut signed = activity("sha256:signed");
    signed.organization_id = "sub".into();
    let mut w = wallet("sw", "sub wallet");
    w.organization_id = "sub".into();
    w.exported = true;
    s.commit(&signed, &[Write::InsertWallet(w)]).unwrap();
    let deletion = delete_sub_organization(s.as_ref(), "sub");
    assert!(matches!(s.organization("sub"), Err(StoreError::NotFound)));
    assert_eq!(s.deleted_organization("sub").unwrap().id, "sub");
    // The sub-organization's own history stays; the deletion is on the parent's record.
    assert_eq!(s.activity("sub", &signed.id).unwrap().fingerprint, "sha256:signed");
    assert_eq!(s.activity("o1", &deletion.id).unwrap().fingerprint, "sha256:delete");
    let footprint: std::collections::BTreeMap<String, i64> =
        s.organization_footprint("sub").unwrap().into_iter().collect();
    for table in PURGED_ON_DELETION {
        assert_eq!(footprint[*table], 0, "{table} still holds rows of the deleted organization");
    }
    assert_eq!(footprint["activities"], 1);
}

fn user_in(org: &str, id: &str) -> User {
    User {
        id: id.into(),
        organization_id: org.into(),
        name: id.into(),
        email: None,
        phone_number: None,
        contacts_verified: false,
        created_at: 1,
        updated_at: 1,
    }
}

fn api_key_in(org: &str, user: &str, public_key: &str) -> ApiKey {
    ApiKey {
        id: format!("{org}-{public_key}"),
        organization_id: org.into(),
        user_id: user.into(),
        name: public_key.into(),
        public_key: public_key.into(),
        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
        expiration_seconds: Some(60),
        created_at: 2,
        updated_at: 3,
        certificate: vec![7, 8],
    }
}

/// The one-statement lookup of an API-key request agrees with the separate lookups: the
/// organization's own key before its parent's, the fingerprint and the parent's records seen,
/// and not found for an unknown organization, an unknown key and a deleted organization.
fn stamp_context_reads_what_the_separate_lookups_read(backend: Backend) {
    let (_db, s) = store(backend);
    let mut sub = org("sub");
    sub.parent_id = Some("o1".into());
    s.apply(&[
        Write::InsertUser(user_in("o1", "u1")),
        Write::InsertApiKey(api_key_in("o1", "u1", "pk1")),
        Write::InsertOrganization(sub),
        Write::InsertUser(user_in("sub", "u2")),
        Write::InsertApiKey(api_key_in("sub", "u2", "pk2")),
    ])
    .unwrap();
    const KIND: &str = "webhook_endpoint";

    let own = s.stamp_context("o1", "pk1", Some("sha256:new"), KIND).unwrap();
    assert_eq!(own.organization, s.organization("o1").unwrap());
    assert_eq!(own.api_key, s.api_key_by_public_key("o1", "pk1").unwrap());
    assert_eq!(own.user, Some(s.user("o1", "u1").unwrap()));
    assert!(!own.via_parent && !own.fingerprint_taken && !own.has_records_of_kind);

    s.commit(&activity("sha256:new"), &[]).unwrap();
    assert!(s.stamp_context("o1", "pk1", Some("sha256:new"), KIND).unwrap().fingerprint_taken);
    assert!(!s.stamp_context("o1", "pk1", None, KIND).unwrap().fingerprint_taken);

    // The parent's key acts in the sub-organization; the sub-organization's own key is its own.
    let parents = s.stamp_context("sub", "pk1", None, KIND).unwrap();
    assert_eq!((parents.organization.id.as_str(), parents.api_key.organization_id.as_str()), ("sub", "o1"));
    assert!(parents.via_parent);
    assert_eq!(parents.user.map(|u| u.id), Some("u1".to_string()));
    let subs = s.stamp_context("sub", "pk2", None, KIND).unwrap();
    assert!(!subs.via_parent);
    assert_eq!(subs.user.map(|u| u.id), Some("u2".to_string()));
    // The same public key in both: the sub-organization's own wins.
    s.apply(&[Write::InsertApiKey(api_key_in("sub", "u2", "pk1"))]).unwrap();
    let both = s.stamp_context("sub", "pk1", None, KIND).unwrap();
    assert_eq!((both.api_key.organization_id.as_str(), both.via_parent), ("sub", false));

    // A record of the kind in the parent counts for the sub-organization, not the other way.
    let record = |org: &str| Record {
        organization_id: org.into(),
        kind: KIND.into(),
        id: format!("{org}-endpoint"),
        name: format!("{org}-endpoint"),
        data: serde_json::json!({}),
        created_at: 1,
        updated_at: 1,
    };
    s.apply(&[Write::PutRecord(record("sub"))]).unwrap();
    assert!(s.stamp_context("sub", "pk2", None, KIND).unwrap().has_records_of_kind);
    assert!(!s.stamp_context("o1", "pk1", None, KIND).unwrap().has_records_of_kind);
    s.apply(&[Write::PutRecord(record("o1"))]).unwrap();
    assert!(s.stamp_context("o1", "pk1", None, KIND).unwrap().has_records_of_kind);
    assert!(!s.stamp_context("o1", "pk1", None, "policy").unwrap().has_records_of_kind);

    for (org, key) in [("nope", "pk1"), ("o1", "pk2"), ("o1", "unknown")] {
        assert!(matches!(s.stamp_context(org, key, None, KIND), Err(StoreError::NotFound)), "{org} {key}");
    }
    delete_sub_organization(s.as_ref(), "o1");
    assert!(matches!(s.stamp_context("sub", "pk1", None, KIND), Err(StoreError::NotFound)));
}

/// Accounts derived into one wallet through two gateways at once each get a place of their own
/// in the wallet's order: paging one account at a time by cursor finds every one exactly once
/// (two accounts sharing a place would hide one of them from the next page).
fn two_gateways_deriving_in_one_wallet_keep_its_account_order(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    a.commit(&activity("sha256:wallet"), &[Write::InsertWallet(wallet("w", "w"))]).unwrap();
    let n = 16;
    for round in 0..4 {
        let results = race(&a, &b, n, move |i, s| {
            let account = WalletAccount {
                id: format!("acct-{round}-{i}"),
                organization_id: "o1".into(),
                wallet_id: "w".into(),
                curve: "CURVE_SECP256K1".into(),
                path_format: "PATH_FORMAT_BIP32".into(),
                path: format!("m/44'/60'/0'/0/{}", round * n + i),
                address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
                address: format!("0x{round}{i}"),
                public_key: format!("pk{round}-{i}"),
                sealed_key: vec![],
                created_at: 5,
                updated_at: 5,
            };
            s.commit(&activity(&format!("sha256:derive-{round}-{i}")), &[Write::InsertAccounts(vec![account])])
        });
        assert!(results.iter().all(|r| matches!(r, Ok(Committed::New(_)))), "{results:?}");
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = Page { limit: 1, before: None, after: after.clone() };
        let Some(account) = a.accounts_page("o1", Some("w"), &page).unwrap().pop() else { break };
        after = Some(account.id.clone());
        seen.push(account.id);
    }
    let distinct: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), distinct.len()), (4 * n, 4 * n), "paged: {seen:?}");
}

/// Two gateways' delivery workers polling one outbox at once: every due delivery is claimed,
/// and by exactly one of them.
fn two_gateways_claim_each_due_webhook_delivery_once(backend: Backend) {
    let (_db, a, b) = two_stores(backend);
    let n = 40;
    let rows: Vec<Write> = (0..n)
        .map(|i| Write::EnqueueWebhookDelivery(pending(&format!("d{i:02}"), &format!("e{}", i % 3), i)))
        .collect();
    a.apply(&rows).unwrap();
    let claims = race(&a, &b, 8, |_, s| {
        let mut mine = Vec::new();
        loop {
            let got = s.claim_due_webhook_deliveries(100, (1_000, "gw"), 3, &DueSkip::default()).unwrap();
            if got.is_empty() {
                return mine;
            }
            mine.extend(got.into_iter().map(|d| d.id));
        }
    });
    let mut all: Vec<String> = claims.into_iter().flatten().collect();
    all.sort();
    let expected: Vec<String> = (0..n).map(|i| format!("d{i:02}")).collect();
    assert_eq!(all, expected, "each delivery claimed once");
}
