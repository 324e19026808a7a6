//! Each organization's activity log as this enclave appends to it: appends are group committed
//! (the caller that finds none running leads one group: per organization, one compare-and-set of
//! the head in the authority store and one signature, on the group's last link), in front of the
//! store's compare-and-set that orders appends across enclaves.

use std::sync::Mutex;

use coffer_auth::proof::{self, LogLink};
use coffer_proto::v1 as pb;

use crate::bounded_cache::BoundedCache;
use crate::error::{EnclaveError, RefusalReason};
use crate::group_commit::{self, Reply, Turn};
use crate::store::{EnclaveStore, LinkedActivity, Remembered, Spend, StoreError};

/// What one append records: the activity, as the enclave checked it, and the stamp its link
/// spends (a key use's, spent with its link in one transaction).
#[derive(Debug, Clone)]
pub struct Entry {
    pub organization_id: String,
    pub activity_id: String,
    pub fingerprint: String,
    pub activity_type: String,
    pub status: String,
    pub activity_digest: String,
    pub spend: Option<Spend>,
}

/// Makes the proof of a link: signed when the flag says so, else with an empty signature (a link
/// inside a group, covered by the group's signed last link).
pub type Signer<'a> = &'a dyn Fn(&LogLink, bool) -> Result<pb::AppProof, EnclaveError>;

/// An appended link: its proof and position.
pub type Appended = (pb::AppProof, u64);

struct Job {
    entry: Entry,
    reply: Reply<Result<Appended, AppendFailure>>,
}

/// Why an append was not made.
#[derive(Debug, Clone)]
enum AppendFailure {
    /// The log has a link of this activity in this status already.
    AlreadyLinked,
    /// Its stamp could not be spent (what the replay window found).
    NotSpent(Remembered),
    /// The group failed (the message says how).
    Failed(String),
}

/// The appends waiting for a group, and each organization's head as this enclave last wrote it.
pub struct ActivityLog {
    waiting: Mutex<group_commit::Queue<Job>>,
    /// Each organization's head as this enclave last moved it, least recently used out.
    heads: BoundedCache<(u64, String)>,
}

impl Default for ActivityLog {
    fn default() -> Self {
        Self { waiting: Mutex::default(), heads: BoundedCache::new(HEADS_BYTES) }
    }
}

/// How many times a group recomputes an organization's links after another enclave appended first.
const APPEND_TRIES: usize = 8;
/// Most appends one group takes.
const MAX_GROUP: usize = 512;
/// What the heads kept in memory may weigh together: about 40,000 of [`HEAD_BYTES`].
const HEADS_BYTES: usize = 8 << 20;
/// Estimated bytes of one kept head: the organization's id, the 64-digit head, the map's links.
const HEAD_BYTES: usize = 200;

fn poisoned<T>(_: T) -> EnclaveError {
    EnclaveError::Internal("activity log poisoned".into())
}

impl ActivityLog {
    /// Appends `entry` to its organization's log and returns its link: waits for the group it
    /// joins, or leads one. `sign` makes the links' proofs (whoever leads signs the group's).
    pub fn append(&self, store: &dyn EnclaveStore, entry: Entry, sign: Signer<'_>) -> Result<Appended, EnclaveError> {
        let (reply, answer) = group_commit::channel();
        let lead = group_commit::join(&self.waiting, Job { entry, reply }).map_err(poisoned)?;
        group_commit::wait(
            &answer,
            lead,
            || self.lead_one_group(store, sign).map_err(AppendFailure::Failed),
            || AppendFailure::Failed("the activity log's group was abandoned".to_string()),
        )
        .map_err(|failure| match failure {
            AppendFailure::AlreadyLinked => EnclaveError::refused(
                RefusalReason::Replayed,
                "the activity log has a link of this activity in this status already",
            ),
            AppendFailure::NotSpent(remembered) => crate::error::not_spent(remembered),
            AppendFailure::Failed(message) => EnclaveError::Busy { reason: RefusalReason::Unspecified, message },
        })
    }

    /// Appends the first group waiting, then hands the lead to the owner of the first append
    /// still waiting, or gives it up.
    fn lead_one_group(&self, store: &dyn EnclaveStore, sign: Signer<'_>) -> Result<(), String> {
        group_commit::lead_one(
            &self.waiting,
            MAX_GROUP,
            |batch| self.append_batch(store, batch, sign),
            |next| {
                let _ = next.reply.send(Turn::Lead);
            },
        )
        .map_err(|_| "activity log poisoned".to_string())
    }

    /// Appends a batch, per organization in the order the appends came, and answers each.
    fn append_batch(&self, store: &dyn EnclaveStore, batch: Vec<Job>, sign: Signer<'_>) {
        let mut groups: Vec<(String, Vec<Job>)> = Vec::new();
        for job in batch {
            match groups.iter_mut().find(|(org, _)| *org == job.entry.organization_id) {
                Some((_, jobs)) => jobs.push(job),
                None => groups.push((job.entry.organization_id.clone(), vec![job])),
            }
        }
        for (organization_id, jobs) in groups {
            let entries: Vec<&Entry> = jobs.iter().map(|j| &j.entry).collect();
            match self.append_group(store, &organization_id, &entries, sign) {
                Ok(appended) => {
                    for (job, a) in jobs.into_iter().zip(appended) {
                        let _ = job.reply.send(Turn::Answer(a));
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for job in jobs {
                        let _ = job.reply.send(Turn::Answer(Err(AppendFailure::Failed(message.clone()))));
                    }
                }
            }
        }
    }

    /// One organization's part of a group: its links chained onto the head, the last one signed,
    /// and the head moved past them all in one compare-and-set, with the stamps the links spend.
    /// An activity is linked once, in one status (so a finished activity cannot be linked again as
    /// failed, nor another one under its id): an entry of a fingerprint or id the log has already
    /// (or that comes twice) gets [`AppendFailure::AlreadyLinked`]; one whose stamp cannot be
    /// spent, [`AppendFailure::NotSpent`], and the others are linked without it.
    fn append_group(
        &self,
        store: &dyn EnclaveStore,
        organization_id: &str,
        all: &[&Entry],
        sign: Signer<'_>,
    ) -> Result<Vec<Result<Appended, AppendFailure>>, EnclaveError> {
        let mut not_spent: Vec<Option<Remembered>> = vec![None; all.len()];
        for _ in 0..APPEND_TRIES {
            let asked: Vec<(&str, &str)> =
                all.iter().map(|e| (e.fingerprint.as_str(), e.activity_id.as_str())).collect();
            let linked_before = store.linked(organization_id, &asked)?;
            // Nor twice in one group: an earlier entry of the same fingerprint or id is the one.
            let fresh: Vec<bool> = asked
                .iter()
                .enumerate()
                .map(|(i, (f, a))| !linked_before[i] && !asked[..i].iter().any(|(ff, aa)| ff == f || aa == a))
                .collect();
            let answer = |appended: &mut dyn Iterator<Item = Appended>| -> Vec<Result<Appended, AppendFailure>> {
                fresh
                    .iter()
                    .zip(&not_spent)
                    .map(|(fresh, unspent)| match (fresh, unspent) {
                        (_, Some(r)) => Err(AppendFailure::NotSpent(*r)),
                        (true, None) => appended.next().ok_or(AppendFailure::AlreadyLinked),
                        (false, None) => Err(AppendFailure::AlreadyLinked),
                    })
                    .collect()
            };
            // Linked now: the entries fresh and not refused a spend (by place in `all`).
            let places: Vec<usize> = (0..all.len()).filter(|i| fresh[*i] && not_spent[*i].is_none()).collect();
            if places.is_empty() {
                return Ok(answer(&mut std::iter::empty()));
            }
            let entries: Vec<&Entry> = places.iter().map(|i| all[*i]).collect();
            let cached = self.heads.get(organization_id);
            let (start, mut head) = match cached {
                Some(h) => h,
                None => store.log_head(organization_id)?.unwrap_or_else(|| (0, proof::genesis(organization_id))),
            };
            let mut appended = Vec::with_capacity(entries.len());
            for (i, e) in entries.iter().enumerate() {
                let seq = start + 1 + i as u64;
                let link = LogLink {
                    organization_id: organization_id.to_string(),
                    seq: seq.to_string(),
                    activity_id: e.activity_id.clone(),
                    fingerprint: e.fingerprint.clone(),
                    activity_type: e.activity_type.clone(),
                    status: e.status.clone(),
                    activity_digest: e.activity_digest.clone(),
                    previous: head.clone(),
                    head: proof::next_head(&head, seq, &e.activity_id, &e.activity_digest),
                };
                head = link.head.clone();
                // Signed before the head moves: a link the store took is one the enclave signed
                // (itself, or through the group's last link).
                appended.push((sign(&link, i + 1 == entries.len())?, seq));
            }
            let links = start + entries.len() as u64;
            let linked: Vec<LinkedActivity<'_>> = entries
                .iter()
                .zip(&appended)
                .map(|(e, (_, seq))| LinkedActivity {
                    fingerprint: &e.fingerprint,
                    status: &e.status,
                    activity_id: &e.activity_id,
                    activity_digest: &e.activity_digest,
                    seq: *seq,
                    spend: e.spend.as_ref(),
                })
                .collect();
            match store.advance_log(organization_id, start, links, &head, &linked) {
                Ok(()) => {
                    self.heads.insert(organization_id, (links, head), HEAD_BYTES);
                    return Ok(answer(&mut appended.into_iter()));
                }
                // Nothing moved: linked again without them.
                Err(StoreError::NotSpent(refused)) => {
                    for (i, remembered) in refused {
                        if let Some(place) = places.get(i) {
                            not_spent[*place] = Some(remembered);
                        }
                    }
                }
                Err(StoreError::VersionMoved { .. } | StoreError::Conflict(_)) => self.heads.remove(organization_id),
                Err(e) => {
                    self.heads.remove(organization_id);
                    return Err(e.into());
                }
            }
        }
        Err(EnclaveError::Busy {
            reason: RefusalReason::Unspecified,
            message: "the activity log kept moving; retry".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::{SqliteEnclaveStore, StoreLimits};

    /// 8 threads append 400 links to two organizations at once: every link gets its own place,
    /// each organization's links chain from its genesis to the head the store keeps, and every
    /// group's last link is the signed one.
    #[test]
    fn concurrent_appends_chain_once_each_and_sign_each_groups_last_link() {
        use p256::ecdsa::signature::Signer as _;
        let store: Arc<dyn EnclaveStore> =
            Arc::new(SqliteEnclaveStore::open_in_memory(StoreLimits::default()).unwrap());
        let log = Arc::new(ActivityLog::default());
        let key = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
        let point: [u8; 65] = key.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (store, log, key) = (store.clone(), log.clone(), key.clone());
                std::thread::spawn(move || {
                    let sign = |link: &LogLink, signed: bool| {
                        let payload = link.payload(1);
                        let sig: p256::ecdsa::Signature = key.sign(payload.as_bytes());
                        let mut p = proof::app_proof(&point, payload, &sig.to_bytes().into());
                        if !signed {
                            p.signature.clear();
                        }
                        Ok(pb::AppProof {
                            scheme: p.scheme,
                            public_key: p.public_key,
                            proof_payload: p.proof_payload,
                            signature: p.signature,
                        })
                    };
                    (0..50)
                        .map(|i| {
                            let entry = Entry {
                                organization_id: format!("org-{}", t % 2),
                                activity_id: format!("a-{t}-{i}"),
                                fingerprint: format!("f-{t}-{i}"),
                                activity_type: "T".into(),
                                status: "ACTIVITY_STATUS_COMPLETED".into(),
                                activity_digest: format!("{t}{i}"),
                                spend: None,
                            };
                            log.append(store.as_ref(), entry, &sign).unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<Appended> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(all.len(), 400);
        for org in ["org-0", "org-1"] {
            let mut links: Vec<(LogLink, bool)> = all
                .iter()
                .map(|(p, _)| {
                    let v: serde_json::Value = serde_json::from_str(&p.proof_payload).unwrap();
                    (LogLink::from_payload(&v).unwrap(), !p.signature.is_empty())
                })
                .filter(|(l, _)| l.organization_id == org)
                .collect();
            links.sort_by_key(|(l, _)| l.seq().unwrap());
            assert_eq!(links.len(), 200);
            let mut previous = proof::genesis(org);
            for (i, (l, _)) in links.iter().enumerate() {
                assert_eq!(l.seq().unwrap(), i as u64 + 1);
                assert_eq!(l.previous, previous);
                assert_eq!(l.head, proof::next_head(&previous, i as u64 + 1, &l.activity_id, &l.activity_digest));
                previous = l.head.clone();
            }
            assert_eq!(store.log_head(org).unwrap(), Some((200, previous)));
            assert!(links.last().unwrap().1, "the last link of the log is signed");
        }
        all.retain(|(p, _)| !p.signature.is_empty());
        assert!(!all.is_empty());
    }

    /// Links that spend their stamps, appended at once from 4 threads, every fifth stamp spent
    /// already: each of those is refused as a replay and leaves no link and no allow; every other
    /// link is made, its stamp spent and its allow recorded with it.
    #[test]
    fn a_link_spends_its_stamp_or_neither_is_kept() {
        use crate::store::{DecisionRecord, ReplayShare, OUTCOME_ALLOW};
        let store: Arc<dyn EnclaveStore> =
            Arc::new(SqliteEnclaveStore::open_in_memory(StoreLimits::default()).unwrap());
        let log = Arc::new(ActivityLog::default());
        let (now, expires) = (1_000_000, 2_000_000);
        let key = |t: usize, i: usize| -> [u8; 32] {
            let mut k = [0u8; 32];
            k[0] = t as u8;
            k[1] = i as u8;
            k
        };
        let spent_before = |i: usize| i.is_multiple_of(5);
        for t in 0..4 {
            for i in (0..40).filter(|i| spent_before(*i)) {
                assert_eq!(store.remember("o", key(t, i), expires, now).unwrap(), Remembered::Fresh);
            }
        }
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (store, log) = (store.clone(), log.clone());
                std::thread::spawn(move || {
                    let sign = |_: &LogLink, _: bool| Ok(pb::AppProof::default());
                    (0..40)
                        .map(|i| {
                            let fingerprint = format!("f-{t}-{i}");
                            let allowed = DecisionRecord {
                                at_ms: now,
                                organization_id: "o".into(),
                                fingerprint: fingerprint.clone(),
                                outcome: OUTCOME_ALLOW.into(),
                                ..Default::default()
                            };
                            let spend = Spend {
                                share: ReplayShare::of("o"),
                                key: key(t, i),
                                expires_ms: expires,
                                now_ms: now,
                                allowed,
                            };
                            let entry = Entry {
                                organization_id: "o".into(),
                                activity_id: format!("a-{t}-{i}"),
                                fingerprint,
                                activity_type: "T".into(),
                                status: "ACTIVITY_STATUS_COMPLETED".into(),
                                activity_digest: format!("{t}-{i}"),
                                spend: Some(spend),
                            };
                            (i, log.append(store.as_ref(), entry, &sign))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut linked = 0;
        for (t, answers) in threads.into_iter().enumerate() {
            for (i, answer) in answers.join().unwrap() {
                let fingerprint = format!("f-{t}-{i}");
                let decided = store.decided("o", &fingerprint).unwrap().logged;
                let in_log = store.linked("o", &[(&fingerprint, "none")]).unwrap()[0];
                if spent_before(i) {
                    let refused = answer.unwrap_err();
                    assert_eq!(refused.refusal_reason(), Some(RefusalReason::Replayed), "{refused}");
                    assert!(!in_log, "a link whose stamp was spent already is not made");
                    assert_eq!(decided, crate::store::LoggedDecision::Nothing, "nor its allow recorded");
                } else {
                    answer.unwrap();
                    linked += 1;
                    assert!(in_log);
                    assert_eq!(decided, crate::store::LoggedDecision::Authorized, "the allow, with its link");
                    assert!(store.spent(key(t, i), now, "other", "none").unwrap(), "the stamp, with its link");
                }
            }
        }
        assert_eq!(linked, 4 * 32);
        assert_eq!(store.log_head("o").unwrap().map(|(n, _)| n), Some(128));
    }
}
