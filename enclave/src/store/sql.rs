//! The authority store's SQL, written once for SQLite and PostgreSQL over `coffer-sql`'s [`Db`]:
//! states and their versions, the activity log's heads and links, sealed service keys and the
//! decision log. What the backends do differently (the replay window's counting, durability,
//! connections) is theirs; every statement here runs as written on both.

use coffer_sql::{args, Arg, Db, SqlRow};

use super::interface::{
    check_changes, version_of, ActivityLink, BallotKept, DecisionRecord, Entry, KekRecord, KeptBallot, LatestDecision,
    LinkedActivity, NativeKeyCounted, NativeKeyRow, OrgChanges, OrgHead, StoreError, MAX_BALLOTS_PER_ORGANIZATION,
    OUTCOME_ALLOW, OUTCOME_REFUSE, REASON_CONSENSUS_NEEDED, REASON_VOTE_REJECTED,
};

/// Most rows one statement binds when a call names many (links of one log group): a few
/// statement texts per connection, far below both drivers' parameter limits.
const ROWS_PER_STATEMENT: usize = 64;

/// `(?a, ?b, …), (…)`: `rows` groups of `per_row` numbered placeholders from `?first` on.
fn value_rows(rows: usize, per_row: usize, first: usize) -> String {
    (0..rows)
        .map(|r| {
            let marks: Vec<String> = (0..per_row).map(|c| format!("?{}", first + r * per_row + c)).collect();
            format!("({})", marks.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `?a, ?b, …`: `n` numbered placeholders from `?first` on.
fn marks(n: usize, first: usize) -> String {
    (first..first + n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ")
}

/// An organization's version and entries in one statement, one snapshot (none: one row of NULLs).
pub fn load<D: Db>(db: &mut D, org: &str) -> Result<Option<OrgHead>, StoreError> {
    let rows = db.query(
        "SELECT h.version, e.kind, e.id, e.data FROM org_heads h
         LEFT JOIN entries e ON e.organization_id = h.organization_id
         WHERE h.organization_id = ?1 ORDER BY e.kind, e.id",
        args![org],
        |r| {
            let entry = match r.opt_text(1)? {
                Some(kind) => Some(Entry { kind, id: r.text(2)?, data: r.bytes(3)? }),
                None => None,
            };
            Ok::<_, StoreError>((r.int(0)?, entry))
        },
    )?;
    let Some(version) = rows.first().map(|(v, _)| *v) else { return Ok(None) };
    let entries = rows.into_iter().filter_map(|(_, e)| e).collect();
    Ok(Some(OrgHead { version: version_of(version)?, entries }))
}

pub fn version<D: Db>(db: &mut D, org: &str) -> Result<Option<u64>, StoreError> {
    let v = db.query_opt("SELECT version FROM org_heads WHERE organization_id = ?1", args![org], |r| {
        Ok::<_, StoreError>(r.int(0)?)
    })?;
    v.map(version_of).transpose()
}

/// The migrations of `migrations` a store at schema version `applied` has yet to apply; a store
/// newer than this enclave (or with a version out of range) is refused.
pub fn pending_migrations<'a>(applied: i64, migrations: &'a [&'a str]) -> Result<&'a [&'a str], StoreError> {
    let applied = usize::try_from(applied).map_err(|_| StoreError::Corrupt(format!("schema version {applied}")))?;
    migrations.get(applied..).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "schema version {applied} is newer than this enclave's ({}): run the newer enclave",
            migrations.len()
        ))
    })
}

pub fn organizations<D: Db>(db: &mut D) -> Result<Vec<String>, StoreError> {
    db.query("SELECT organization_id FROM org_heads ORDER BY organization_id", &[], |r| Ok::<_, StoreError>(r.text(0)?))
}

/// Applies every change, each a compare-and-set on its organization's version (a row lock on the
/// head, or the insert that must not collide); inside the caller's transaction, which a
/// [`StoreError::VersionMoved`] rolls back whole.
pub fn apply<D: Db>(db: &mut D, changes: &[OrgChanges]) -> Result<Vec<u64>, StoreError> {
    check_changes(changes)?;
    let mut versions = Vec::with_capacity(changes.len());
    for c in changes {
        let next = c.expected_version + 1;
        let set = if c.expected_version == 0 {
            db.execute(
                "INSERT INTO org_heads (organization_id, version) VALUES (?1, 1) ON CONFLICT DO NOTHING",
                args![c.organization_id],
            )?
        } else {
            db.execute(
                "UPDATE org_heads SET version = ?3 WHERE organization_id = ?1 AND version = ?2",
                args![c.organization_id, c.expected_version as i64, next as i64],
            )?
        };
        if set == 0 {
            return Err(StoreError::VersionMoved {
                organization_id: c.organization_id.clone(),
                expected: c.expected_version,
                found: version(db, &c.organization_id)?,
            });
        }
        for e in &c.puts {
            db.execute(
                "INSERT INTO entries (organization_id, kind, id, data) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (organization_id, kind, id) DO UPDATE SET data = excluded.data",
                args![c.organization_id, e.kind, e.id, e.data],
            )?;
        }
        for (kind, id) in &c.deletes {
            db.execute(
                "DELETE FROM entries WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                args![c.organization_id, kind, id],
            )?;
        }
        versions.push(next);
    }
    Ok(versions)
}

pub fn log_head<D: Db>(db: &mut D, org: &str) -> Result<Option<(u64, String)>, StoreError> {
    let row = db.query_opt("SELECT links, head FROM log_heads WHERE organization_id = ?1", args![org], |r| {
        Ok::<_, StoreError>((r.int(0)?, r.text(1)?))
    })?;
    row.map(|(n, h)| Ok((version_of(n)?, h))).transpose()
}

/// Moves `org`'s log head from `expected` links to `links`, runs `spend_stamps` (the links'
/// stamps, spent by the backend), and records each activity linked, in the caller's transaction.
/// The head moved meanwhile, or an activity already linked (or linked twice in `linked`):
/// [`StoreError::VersionMoved`] with `found: None`, and the caller rolls back.
pub fn advance_log<D: Db>(
    db: &mut D,
    org: &str,
    expected: u64,
    links: u64,
    head: &str,
    linked: &[LinkedActivity<'_>],
    spend_stamps: impl FnOnce(&mut D) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let moved = || StoreError::VersionMoved { organization_id: org.to_string(), expected, found: None };
    let (from, to) = (expected as i64, links as i64);
    let set = if expected == 0 {
        db.execute(
            "INSERT INTO log_heads (organization_id, links, head) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            args![org, to, head],
        )?
    } else {
        db.execute(
            "UPDATE log_heads SET links = ?3, head = ?4 WHERE organization_id = ?1 AND links = ?2",
            args![org, from, to, head],
        )?
    };
    if set == 0 {
        return Err(moved());
    }
    // Once per fingerprint and once per id within the group too (the statement below does not
    // see its own rows on PostgreSQL).
    for (i, l) in linked.iter().enumerate() {
        if linked[..i].iter().any(|e| e.fingerprint == l.fingerprint || e.activity_id == l.activity_id) {
            return Err(moved());
        }
    }
    spend_stamps(db)?;
    let mut taken = 0;
    for chunk in linked.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO log_links (organization_id, fingerprint, status, activity_id, seq, activity_digest)
             SELECT ?1, t.column1, t.column2, t.column3, CAST(t.column4 AS BIGINT), t.column5
             FROM (VALUES {}) AS t
             WHERE NOT EXISTS (SELECT 1 FROM log_links l WHERE l.organization_id = ?1 AND l.fingerprint = t.column1)
               AND NOT EXISTS (SELECT 1 FROM log_links l WHERE l.organization_id = ?1 AND l.activity_id = t.column3)
             ON CONFLICT DO NOTHING",
            value_rows(chunk.len(), 5, 2)
        );
        let seqs: Vec<i64> = chunk.iter().map(|l| l.seq as i64).collect();
        let mut bound = vec![Arg::Text(org)];
        for (l, seq) in chunk.iter().zip(&seqs) {
            bound.extend([
                Arg::Text(l.fingerprint),
                Arg::Text(l.status),
                Arg::Text(l.activity_id),
                Arg::Int(*seq),
                Arg::Text(l.activity_digest),
            ]);
        }
        taken += db.execute(&sql, &bound)?;
    }
    if taken != linked.len() as u64 {
        return Err(moved());
    }
    Ok(())
}

/// For each (fingerprint, activity id): whether the log links that fingerprint or that id.
pub fn linked<D: Db>(db: &mut D, org: &str, activities: &[(&str, &str)]) -> Result<Vec<bool>, StoreError> {
    let mut found: Vec<(String, String)> = Vec::new();
    for chunk in activities.chunks(ROWS_PER_STATEMENT) {
        // Two lookups, each on its index (one OR would scan the organization's links).
        let n = chunk.len();
        let sql = format!(
            "SELECT fingerprint, activity_id FROM log_links WHERE organization_id = ?1 AND fingerprint IN ({})
             UNION ALL
             SELECT fingerprint, activity_id FROM log_links WHERE organization_id = ?1 AND activity_id IN ({})",
            marks(n, 2),
            marks(n, 2 + n)
        );
        let mut bound = vec![Arg::Text(org)];
        bound.extend(chunk.iter().map(|(f, _)| Arg::Text(f)));
        bound.extend(chunk.iter().map(|(_, a)| Arg::Text(a)));
        found.extend(db.query(&sql, &bound, |r| Ok::<_, StoreError>((r.text(0)?, r.text(1)?)))?);
    }
    Ok(activities.iter().map(|(f, a)| found.iter().any(|(ff, aa)| ff == f || aa == a)).collect())
}

pub fn link_of<D: Db>(
    db: &mut D,
    org: &str,
    fingerprint: &str,
    status: &str,
) -> Result<Option<ActivityLink>, StoreError> {
    db.query_opt(
        "SELECT activity_id, activity_digest FROM log_links
         WHERE organization_id = ?1 AND fingerprint = ?2 AND status = ?3",
        args![org, fingerprint, status],
        |r| Ok::<_, StoreError>(ActivityLink { activity_id: r.text(0)?, activity_digest: r.text(1)? }),
    )
}

pub fn sealed_service_key<D: Db>(db: &mut D, label: &str) -> Result<Option<Vec<u8>>, StoreError> {
    db.query_opt("SELECT blob FROM sealed_service_keys WHERE label = ?1", args![label], |r| {
        Ok::<_, StoreError>(r.bytes(0)?)
    })
}

/// Keeps `blob` under `label` unless one is kept already; answers the one kept.
pub fn keep_sealed_service_key<D: Db>(db: &mut D, label: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
    db.execute(
        "INSERT INTO sealed_service_keys (label, blob) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        args![label, blob],
    )?;
    sealed_service_key(db, label)?.ok_or_else(|| StoreError::Invalid(format!("sealed service key {label} vanished")))
}

/// Adds `n` to the seals reserved under `kek_label`; answers the new total.
pub fn reserve_seals<D: Db>(db: &mut D, kek_label: &str, n: u64) -> Result<u64, StoreError> {
    let n = i64::try_from(n).map_err(|_| StoreError::Invalid(format!("{n} seals at once")))?;
    db.execute(
        "INSERT INTO kek_seals (kek_label, reserved) VALUES (?1, ?2)
         ON CONFLICT (kek_label) DO UPDATE SET reserved = kek_seals.reserved + excluded.reserved",
        args![kek_label, n],
    )?;
    let total = db.query_one("SELECT reserved FROM kek_seals WHERE kek_label = ?1", args![kek_label], |r| {
        Ok::<_, StoreError>(r.int(0)?)
    })?;
    u64::try_from(total).map_err(|_| StoreError::Corrupt(format!("{total} seals reserved under {kek_label}")))
}

/// Every sealed service key: (label, blob), by label.
pub fn sealed_service_keys<D: Db>(db: &mut D) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    db.query("SELECT label, blob FROM sealed_service_keys ORDER BY label", args![], |r| {
        Ok::<_, StoreError>((r.text(0)?, r.bytes(1)?))
    })
}

/// Replaces the sealed service key `label` with `new` if it is still `old`; answers whether it
/// did.
pub fn replace_sealed_service_key<D: Db>(db: &mut D, label: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError> {
    Ok(db.execute("UPDATE sealed_service_keys SET blob = ?3 WHERE label = ?1 AND blob = ?2", args![label, old, new])?
        == 1)
}

/// The KEKs recorded (those made by rotation, and any destroyed), oldest first.
pub fn keks<D: Db>(db: &mut D) -> Result<Vec<KekRecord>, StoreError> {
    db.query("SELECT version, made_ms, destroyed_ms, object_id FROM keks ORDER BY version", args![], |r| {
        let version = r.int(0)?;
        let version = u32::try_from(version).map_err(|_| StoreError::Corrupt(format!("KEK version {version}")))?;
        Ok::<_, StoreError>(KekRecord {
            version,
            made_ms: r.int(1)?,
            destroyed_ms: r.opt_int(2)?,
            object_id: r.opt_bytes(3)?,
        })
    })
}

/// The seals reserved under each KEK label.
pub fn seals_reserved<D: Db>(db: &mut D) -> Result<Vec<(String, u64)>, StoreError> {
    db.query("SELECT kek_label, reserved FROM kek_seals ORDER BY kek_label", args![], |r| {
        Ok::<_, StoreError>((r.text(0)?, r.int(1)?.max(0) as u64))
    })
}

/// Records KEK `version` as made at `made_ms` if it is the next one (one more than the newest
/// recorded, or 2 when only the first exists); answers whether it did.
pub fn add_kek<D: Db>(db: &mut D, version: u32, made_ms: i64, object_id: &[u8]) -> Result<bool, StoreError> {
    let newest =
        db.query_one("SELECT COALESCE(MAX(version), 1) FROM keks", args![], |r| Ok::<_, StoreError>(r.int(0)?))?;
    if i64::from(version) != newest + 1 {
        return Ok(false);
    }
    // Two enclaves recording at once: the second finds the row there.
    Ok(db.execute(
        "INSERT INTO keks (version, made_ms, object_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        args![i64::from(version), made_ms, object_id],
    )? == 1)
}

/// Records KEK `version` as destroyed at `at_ms` (the first KEK gets a row of its own).
pub fn kek_destroyed<D: Db>(db: &mut D, version: u32, at_ms: i64) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO keks (version, made_ms, destroyed_ms) VALUES (?1, 0, ?2)
         ON CONFLICT (version) DO UPDATE SET destroyed_ms = excluded.destroyed_ms",
        args![i64::from(version), at_ms],
    )?;
    Ok(())
}

/// Counts the HSM-native key `label` of `org`, charged to the top-level organization
/// `charged_to`, if the token holds fewer than `total` and `charged_to` fewer than
/// `per_organization`. (On PostgreSQL enclaves counting at once may pass a bound by a few: a
/// safety bound.)
pub fn add_native_key<D: Db>(
    db: &mut D,
    key: &NativeKeyRow,
    total: u64,
    per_organization: u64,
) -> Result<NativeKeyCounted, StoreError> {
    let count = |db: &mut D, sql: &str, args: &[Arg<'_>]| -> Result<u64, StoreError> {
        Ok(db.query_one(sql, args, |r| Ok::<_, StoreError>(r.int(0)?))?.max(0) as u64)
    };
    if count(db, "SELECT COUNT(*) FROM native_keys WHERE label = ?1", args![key.label])? > 0 {
        return Ok(NativeKeyCounted::Exists);
    }
    if count(db, "SELECT COUNT(*) FROM native_keys", args![])? >= total {
        return Ok(NativeKeyCounted::TokenFull);
    }
    if count(db, "SELECT COUNT(*) FROM native_keys WHERE charged_to = ?1", args![key.charged_to])? >= per_organization {
        return Ok(NativeKeyCounted::OrganizationFull);
    }
    let added = db.execute(
        "INSERT INTO native_keys (label, organization_id, charged_to, made_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT DO NOTHING",
        args![key.label, key.organization_id, key.charged_to, key.made_ms],
    )?;
    Ok(if added == 1 { NativeKeyCounted::Counted } else { NativeKeyCounted::Exists })
}

/// The HSM-native keys counted, of `org` only when given, oldest first.
pub fn native_keys<D: Db>(db: &mut D, org: Option<&str>) -> Result<Vec<NativeKeyRow>, StoreError> {
    let row = |r: &dyn SqlRow| {
        Ok::<_, StoreError>(NativeKeyRow {
            label: r.text(0)?,
            organization_id: r.text(1)?,
            charged_to: r.text(2)?,
            made_ms: r.int(3)?,
        })
    };
    match org {
        Some(org) => db.query(
            "SELECT label, organization_id, charged_to, made_ms FROM native_keys WHERE organization_id = ?1 ORDER BY made_ms",
            args![org],
            row,
        ),
        None => db.query("SELECT label, organization_id, charged_to, made_ms FROM native_keys ORDER BY made_ms", args![], row),
    }
}

/// Stops counting the HSM-native key `label`.
pub fn remove_native_key<D: Db>(db: &mut D, label: &str) -> Result<(), StoreError> {
    db.execute("DELETE FROM native_keys WHERE label = ?1", args![label])?;
    Ok(())
}

/// Whether the replay window holds `key` live, or the log links `fingerprint` in any status.
pub fn spent<D: Db>(db: &mut D, key: &[u8; 32], now_ms: i64, org: &str, fingerprint: &str) -> Result<bool, StoreError> {
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM replay WHERE key = ?1 AND expires_ms > ?2)
             OR EXISTS (SELECT 1 FROM log_links WHERE organization_id = ?3 AND fingerprint = ?4)",
        args![key, now_ms, org, fingerprint],
        |r| Ok::<_, StoreError>(r.flag(0)?),
    )
}

/// Appends one decision.
pub fn insert_decision<D: Db>(db: &mut D, d: &DecisionRecord) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO decisions (at_ms, organization_id, operation, fingerprint, activity_type, user_id, outcome, reason,
                                result_digest)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        args![
            d.at_ms,
            d.organization_id,
            d.operation,
            d.fingerprint,
            d.activity_type,
            d.user_id,
            d.outcome,
            d.reason,
            d.result_digest
        ],
    )?;
    Ok(())
}

/// Deletes at most `batch` decisions made before `before_ms`, oldest first; how many it deleted.
pub fn prune_decisions<D: Db>(db: &mut D, before_ms: i64, batch: i64) -> Result<u64, StoreError> {
    Ok(db.execute(
        "DELETE FROM decisions WHERE seq IN (SELECT seq FROM decisions WHERE at_ms < ?1 ORDER BY at_ms LIMIT ?2)",
        args![before_ms, batch],
    )?)
}

/// The decision that stands for an activity: a key use's allow with the result it made, over
/// anything later; then a state change's allow (its `made:` record names the records it made)
/// or a failure of `ApplyActivity` recorded after it (the change was not applied), the later
/// of the two, over any refusal (a twin refused after the change was applied does not undo
/// it); else the latest.
pub fn decided<D: Db>(db: &mut D, organization: &str, fingerprint: &str) -> Result<LatestDecision, StoreError> {
    let latest = db.query_opt(
        "SELECT outcome, result_digest FROM decisions WHERE organization_id = ?1 AND fingerprint = ?2
         ORDER BY CASE
             WHEN result_digest <> '' AND result_digest NOT LIKE 'made:%' THEN 2
             WHEN result_digest LIKE 'made:%' OR (outcome = 'failed' AND operation = 'apply_activity') THEN 1
             ELSE 0 END DESC, seq DESC LIMIT 1",
        args![organization, fingerprint],
        |r| Ok::<_, StoreError>((r.text(0)?, r.text(1)?)),
    )?;
    Ok(LatestDecision::of(latest))
}

pub fn waited_for_votes<D: Db>(
    db: &mut D,
    organization: &str,
    fingerprint: &str,
    activity_type: &str,
) -> Result<bool, StoreError> {
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM decisions WHERE organization_id = ?1 AND fingerprint = ?2
                        AND outcome = ?3 AND reason = ?4 AND activity_type = ?5)",
        args![organization, fingerprint, OUTCOME_REFUSE, REASON_CONSENSUS_NEEDED, activity_type],
        |r| Ok::<_, StoreError>(r.flag(0)?),
    )
}

/// The users whose rejection of the activity `fingerprint` of `organization` the enclave kept,
/// as the decision log records them (refusals `REFUSAL_REASON_VOTE_REJECTED`).
pub fn vote_rejecters<D: Db>(db: &mut D, organization: &str, fingerprint: &str) -> Result<Vec<String>, StoreError> {
    db.query(
        "SELECT DISTINCT user_id FROM decisions WHERE organization_id = ?1 AND fingerprint = ?2
                                             AND outcome = ?3 AND reason = ?4",
        args![organization, fingerprint, OUTCOME_REFUSE, REASON_VOTE_REJECTED],
        |r| Ok::<_, StoreError>(r.text(0)?),
    )
}

fn decision_of(r: &dyn SqlRow) -> Result<DecisionRecord, StoreError> {
    Ok(DecisionRecord {
        at_ms: r.int(0)?,
        organization_id: r.text(1)?,
        operation: r.text(2)?,
        fingerprint: r.text(3)?,
        activity_type: r.text(4)?,
        user_id: r.text(5)?,
        outcome: r.text(6)?,
        reason: r.text(7)?,
        result_digest: r.text(8)?,
    })
}

pub fn decisions<D: Db>(db: &mut D, since_ms: i64, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    db.query(
        "SELECT at_ms, organization_id, operation, fingerprint, activity_type, user_id, outcome, reason, result_digest
         FROM decisions WHERE at_ms >= ?1 ORDER BY at_ms, seq LIMIT ?2",
        args![since_ms, limit],
        decision_of,
    )
}

/// Most expired ballots one prune deletes.
const PRUNE_BALLOTS_BATCH: i64 = 64;

/// Deletes a batch of ballots past their expiry (of any organization).
pub fn prune_ballots<D: Db>(db: &mut D, now_ms: i64) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM ballots WHERE (organization_id, fingerprint, user_id) IN
             (SELECT organization_id, fingerprint, user_id FROM ballots WHERE expires_ms < ?1 LIMIT ?2)",
        args![now_ms, PRUNE_BALLOTS_BATCH],
    )?;
    Ok(())
}

/// Keeps `b` unless its user voted otherwise on the activity, it has `max` other voters (its
/// organization [`MAX_BALLOTS_PER_ORGANIZATION`] unexpired ballots: a first rejection of an
/// activity is kept past that, so that a veto is never refused), or it is a rejection of an
/// activity allowed already; a rejection new to the activity is recorded as `rejected_line` in
/// the decision log, in the same transaction. The caller holds the activity's vote lock
/// (PostgreSQL).
pub fn keep_ballot<D: Db>(
    db: &mut D,
    b: &KeptBallot,
    max: usize,
    now_ms: i64,
    rejected_line: &DecisionRecord,
) -> Result<BallotKept, StoreError> {
    if b.rejected && ever_allowed(db, &b.organization_id, &b.fingerprint)? {
        return Ok(BallotKept::Ran);
    }
    let (others, own, rejections) = db.query_one(
        "SELECT count(*), coalesce(max(CASE WHEN user_id = ?3 THEN rejected + 1 ELSE 0 END), 0),
                coalesce(max(rejected), 0)
         FROM ballots WHERE organization_id = ?1 AND fingerprint = ?2 AND expires_ms >= ?4",
        args![b.organization_id, b.fingerprint, b.user_id, now_ms],
        |r| Ok::<_, StoreError>((r.int(0)?, r.int(1)?, r.int(2)?)),
    )?;
    let rejected = i64::from(b.rejected);
    if own != 0 && own - 1 != rejected {
        return Ok(BallotKept::VotedOtherwise);
    }
    if own == 0 {
        let first_rejection = b.rejected && rejections == 0;
        if usize::try_from(others).unwrap_or(usize::MAX) >= max && !first_rejection {
            return Ok(BallotKept::Full);
        }
        let kept = db.query_one(
            "SELECT count(*) FROM ballots WHERE organization_id = ?1 AND expires_ms >= ?2",
            args![b.organization_id, now_ms],
            |r| Ok::<_, StoreError>(r.int(0)?),
        )?;
        if kept >= MAX_BALLOTS_PER_ORGANIZATION && !first_rejection {
            return Ok(BallotKept::Full);
        }
    }
    db.execute(
        "INSERT INTO ballots (organization_id, fingerprint, user_id, rejected, stamped, at_ms, expires_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (organization_id, fingerprint, user_id)
         DO UPDATE SET stamped = excluded.stamped, at_ms = excluded.at_ms, expires_ms = excluded.expires_ms",
        args![b.organization_id, b.fingerprint, b.user_id, rejected, b.stamped, b.at_ms, b.expires_ms],
    )?;
    if b.rejected && own == 0 {
        insert_decision(db, rejected_line)?;
    }
    Ok(BallotKept::Kept)
}

/// Whether the decision log has an allow of the activity `fingerprint` of `org` (whatever came
/// after it).
fn ever_allowed<D: Db>(db: &mut D, org: &str, fingerprint: &str) -> Result<bool, StoreError> {
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM decisions WHERE organization_id = ?1 AND fingerprint = ?2 AND outcome = ?3)",
        args![org, fingerprint, OUTCOME_ALLOW],
        |r| Ok::<_, StoreError>(r.flag(0)?),
    )
}

/// Whether a vote the store keeps rejected the activity `allowed` allows: its stamp is then not
/// spent. The caller holds the activity's vote lock (PostgreSQL).
pub fn rejected_by_vote<D: Db>(db: &mut D, allowed: &DecisionRecord) -> Result<bool, StoreError> {
    // A spend that runs nothing (a link stating the activity failed or rejected) is never refused.
    if allowed.fingerprint.is_empty() || allowed.outcome != OUTCOME_ALLOW {
        return Ok(false);
    }
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM ballots WHERE organization_id = ?1 AND fingerprint = ?2 AND rejected = 1)",
        args![allowed.organization_id, allowed.fingerprint],
        |r| Ok::<_, StoreError>(r.flag(0)?),
    )
}

/// The unexpired ballots of one activity, oldest first.
pub fn ballots<D: Db>(db: &mut D, org: &str, fingerprint: &str, now_ms: i64) -> Result<Vec<KeptBallot>, StoreError> {
    db.query(
        "SELECT user_id, rejected, stamped, at_ms, expires_ms FROM ballots
         WHERE organization_id = ?1 AND fingerprint = ?2 AND expires_ms >= ?3 ORDER BY at_ms, user_id",
        args![org, fingerprint, now_ms],
        |r| {
            Ok::<_, StoreError>(KeptBallot {
                organization_id: org.to_string(),
                fingerprint: fingerprint.to_string(),
                user_id: r.text(0)?,
                rejected: r.int(1)? != 0,
                stamped: r.bytes(2)?,
                at_ms: r.int(3)?,
                expires_ms: r.int(4)?,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_migrations_a_store_has_not_applied_are_pending_and_a_newer_store_is_refused() {
        let all = ["a", "b", "c"];
        assert_eq!(pending_migrations(0, &all).unwrap(), ["a", "b", "c"]);
        assert_eq!(pending_migrations(2, &all).unwrap(), ["c"]);
        assert!(pending_migrations(3, &all).unwrap().is_empty());
        assert!(matches!(pending_migrations(4, &all), Err(StoreError::Corrupt(e)) if e.contains("newer")));
        assert!(matches!(pending_migrations(-1, &all), Err(StoreError::Corrupt(_))));
    }
}
