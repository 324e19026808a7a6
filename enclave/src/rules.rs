//! The organization's rules, enforced where the keys are: each organization's authority state
//! read from the authority store (cached by version), stamping credentials checked live, the root
//! quorum and policies decided over it, and changes written only as the stamped body asks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use coffer_authority_state::decide::{self, PolicyIndex, Proposal, Vote};
use coffer_authority_state::model::{kinds, Millis};
use coffer_authority_state::{subjects, AuthorityState, Change, Credential, Effect};
use coffer_policy::decision::{Decision, Evaluation};

use crate::authority_store::{AuthorityStore, Entry, OrgChanges};
use crate::error::{EnclaveError, RefusalReason};

/// One organization's state as loaded, with its policies compiled.
#[derive(Debug)]
pub struct Loaded {
    pub state: AuthorityState,
    /// Shared with the next version when a change touched no policy.
    pub index: Arc<PolicyIndex>,
}

/// Most organizations whose state is kept in memory; past it the cache starts over.
const CACHE_ORGANIZATIONS: usize = 20_000;

/// A voter the enclave verified: the user, the certified credential, when the vote was stamped.
#[derive(Debug, Clone)]
pub struct VerifiedVote {
    pub user_id: String,
    pub public_key: String,
    pub credential_type: String,
    pub at_ms: Millis,
}

/// What the rules decided for an authorized request.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The state the decision read (of the policy organization).
    pub loaded: Arc<Loaded>,
    pub evaluation: Evaluation,
}

/// The enclave's view of every organization's authority state.
pub struct Rules {
    store: Arc<dyn AuthorityStore>,
    /// Whether a refusal of the rules refuses the call (`enforce_rules`), or is only logged while
    /// the state is being filled (shadow mode, see README "What the enclave does not decide yet").
    enforce: bool,
    cache: Mutex<HashMap<String, Arc<Loaded>>>,
    /// Serializes this enclave's changes (the store's compare-and-set orders them across enclaves).
    writing: Mutex<()>,
    /// Held by a state change from its last decision to its commit, so that this enclave's
    /// changes never invalidate each other's decisions (other enclaves' still can: retried).
    changing: Mutex<()>,
}

/// Whether a change writes or deletes a policy entry (the compiled index must follow).
fn writes_touch_policies(puts: &[Entry], deletes: &[(String, String)]) -> bool {
    puts.iter().any(|e| e.kind == kinds::POLICY) || deletes.iter().any(|(k, _)| k == kinds::POLICY)
}

/// The organization's state moved between a decision and its commit.
fn moved() -> EnclaveError {
    EnclaveError::Busy {
        reason: RefusalReason::Unspecified,
        message: "the organization's authority state changed during the decision: retry".into(),
    }
}

/// Whether `e` says the state moved under a decision (decide again on the new state).
pub fn is_moved(e: &EnclaveError) -> bool {
    matches!(e, EnclaveError::Busy { reason: RefusalReason::Unspecified, .. })
        || matches!(e, EnclaveError::AuthorityStore(crate::authority_store::StoreError::VersionMoved { .. }))
}

fn internal(what: &str) -> EnclaveError {
    EnclaveError::Internal(format!("authority state {what}"))
}

impl Rules {
    #[cfg(test)]
    fn commit_all(&self, changes: &[Change]) -> Result<Vec<(String, u64)>, EnclaveError> {
        self.commit(changes, None)
    }

    pub fn new(store: Arc<dyn AuthorityStore>) -> Self {
        Self {
            store,
            enforce: true,
            cache: Mutex::new(HashMap::new()),
            writing: Mutex::new(()),
            changing: Mutex::new(()),
        }
    }

    /// The same rules, enforcing (`true`, the default) or in shadow mode (`false`).
    pub fn enforcing(mut self, enforce: bool) -> Self {
        self.enforce = enforce;
        self
    }

    pub fn enforces(&self) -> bool {
        self.enforce
    }

    /// Builds an organization's first state from `changes` (`coffer-enclave
    /// import-authority-state`, trusting the gateway's records at that moment): `Ok(false)` when
    /// the enclave already has (or had) a state for it, which is never overwritten.
    pub fn import(&self, organization_id: &str, changes: &[Change]) -> Result<bool, EnclaveError> {
        if self.store.version(organization_id)?.is_some() {
            return Ok(false);
        }
        if changes.iter().any(|c| c.organization_id != organization_id)
            || !matches!(changes.first().map(|c| &c.effect), Some(Effect::CreateOrganization { .. }))
        {
            return Err(EnclaveError::invalid(format!(
                "{organization_id}: the changes must create this organization first and change nothing else"
            )));
        }
        self.commit(changes, None)?;
        Ok(true)
    }

    /// Adds a credential the operator certifies from the gateway's records (`certify-existing`,
    /// trusting the database at that moment) to its organization's state: `Ok(false)` when the
    /// state has no such organization or user, or already has the credential.
    pub fn adopt_credential(&self, organization_id: &str, credential: Credential) -> Result<bool, EnclaveError> {
        let Some(l) = self.load(organization_id)? else { return Ok(false) };
        if !l.state.users.contains_key(&credential.user_id) || l.state.credentials.contains_key(&credential.id) {
            return Ok(false);
        }
        let change =
            Change { organization_id: organization_id.to_string(), effect: Effect::AddCredential { credential } };
        self.commit(&[change], None)?;
        Ok(true)
    }

    /// Serializes this enclave's state changes from decision to commit ([`Rules::commit`] with
    /// the decided version checks what other enclaves did meanwhile).
    pub fn changing(&self) -> Result<std::sync::MutexGuard<'_, ()>, EnclaveError> {
        self.changing.lock().map_err(|_| internal("change lock poisoned"))
    }

    /// Records what the enclave itself did (keys made, sessions opened): committed, or in
    /// shadow mode, when the state cannot take it (an organization it does not have yet), logged.
    pub fn record(&self, changes: &[Change]) -> Result<(), EnclaveError> {
        match self.commit(changes, None) {
            Ok(_) => Ok(()),
            Err(e) if !self.enforce => {
                tracing::warn!(target: "coffer_audit", shadow = true, error = %e, "authority state not recorded");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub fn store(&self) -> &Arc<dyn AuthorityStore> {
        &self.store
    }

    /// The organization's current state (`None`: the enclave has none), read again from the
    /// store whenever its version moved (another enclave, or this one, changed it).
    pub fn load(&self, organization_id: &str) -> Result<Option<Arc<Loaded>>, EnclaveError> {
        if let Some(hit) = self.cached(organization_id)? {
            return Ok(hit);
        }
        // A commit of this enclave may be between the store and the cache: once it is done, the
        // cache has its state and nothing needs reading again.
        let _writing = self.writing.lock().map_err(|_| internal("write lock poisoned"))?;
        self.load_writing(organization_id)
    }

    /// The cached state when it is current (`Some(None)`: the store has no such organization),
    /// `None` when the store must be read.
    fn cached(&self, organization_id: &str) -> Result<Option<Option<Arc<Loaded>>>, EnclaveError> {
        let Some(version) = self.store.version(organization_id)? else { return Ok(Some(None)) };
        let cache = self.cache.lock().map_err(|_| internal("cache poisoned"))?;
        // Versions only grow and the cache holds only committed states: a cached version newer
        // than the one just read was committed after that read, and is as good.
        Ok(cache.get(organization_id).filter(|l| l.state.version >= version).map(|l| Some(l.clone())))
    }

    /// [`Rules::load`] with the write lock held: no commit of this enclave runs meanwhile.
    fn load_writing(&self, organization_id: &str) -> Result<Option<Arc<Loaded>>, EnclaveError> {
        if let Some(hit) = self.cached(organization_id)? {
            return Ok(hit);
        }
        let Some(head) = self.store.load(organization_id)? else { return Ok(None) };
        let state = AuthorityState::from_entries(
            head.version,
            head.entries.iter().map(|e| (e.kind.as_str(), e.id.as_str(), e.data.as_slice())),
        )
        .map_err(|e| EnclaveError::Internal(e.to_string()))?;
        if state.organization.id != organization_id {
            // Deleted (a version with no entries left), or entries of another organization.
            return Ok(None);
        }
        let loaded = Arc::new(Loaded { index: Arc::new(PolicyIndex::of(&state)), state });
        let mut cache = self.cache.lock().map_err(|_| internal("cache poisoned"))?;
        if cache.len() >= CACHE_ORGANIZATIONS {
            cache.clear();
        }
        cache.insert(organization_id.to_string(), loaded.clone());
        Ok(Some(loaded))
    }

    /// Decides a request stamped by `credential` for `activity_type` with `params`: the
    /// credential must be live in `policy_org`'s state, and the root quorum or the policies must
    /// allow it with the votes presented (the submitter's first).
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        policy_org: &str,
        activity_type: &str,
        params: &serde_json::Value,
        submitter: &VerifiedVote,
        voters: &[VerifiedVote],
        now_ms: Millis,
    ) -> Result<Decided, (RefusalReason, String)> {
        let loaded = match self.load(policy_org) {
            Ok(Some(l)) => l,
            Ok(None) => {
                return Err((
                    RefusalReason::OrganizationUnknown,
                    format!("the enclave has no authority state for organization {policy_org}"),
                ))
            }
            Err(e) => return Err((RefusalReason::Unspecified, e.to_string())),
        };
        let state = &loaded.state;
        let live = |v: &VerifiedVote| -> Option<Credential> {
            state.live_credential(&v.user_id, &v.public_key, &v.credential_type, now_ms).cloned()
        };
        let Some(own) = live(submitter) else {
            return Err((
                RefusalReason::CredentialRevoked,
                "the stamping credential is not live in the organization's authority state (deleted, expired or invalidated)"
                    .into(),
            ));
        };
        let subject = subjects::subject(activity_type).ok_or_else(|| {
            (RefusalReason::OperationMismatch, format!("{activity_type} is not an activity the enclave decides"))
        })?;
        // Votes whose credential is no longer live do not count.
        let counted: Vec<(Credential, Millis)> = voters.iter().filter_map(|v| live(v).map(|c| (c, v.at_ms))).collect();
        let mut votes = vec![Vote { user_id: &own.user_id, credential: &own, at_ms: submitter.at_ms }];
        votes.extend(counted.iter().map(|(c, at)| Vote { user_id: &c.user_id, credential: c, at_ms: *at }));
        let proposal = Proposal { subject, params, submitter: &own.user_id, votes, now_ms };
        let evaluation = decide::decide(state, &loaded.index, &proposal);
        match evaluation.decision {
            Decision::Allow => Ok(Decided { loaded: loaded.clone(), evaluation }),
            Decision::ConsensusNeeded => Err((
                RefusalReason::ConsensusNeeded,
                format!("{}: the approvals presented do not meet the required consensus", evaluation.reason),
            )),
            Decision::Deny => Err((
                RefusalReason::PolicyDenied,
                format!("{}: the organization's policies do not allow this activity", evaluation.reason),
            )),
        }
    }

    /// Applies `changes` (already checked) to the organizations they name, in one store
    /// transaction that fails if any of them moved since it was read; returns the new version of
    /// each organization, in first-appearance order.
    ///
    /// `decided_on`: the organization and version a decision read; when that organization moved
    /// since, nothing is written (the decision would be over an old state).
    pub fn commit(
        &self,
        changes: &[Change],
        decided_on: Option<(&str, u64)>,
    ) -> Result<Vec<(String, u64)>, EnclaveError> {
        let _writing = self.writing.lock().map_err(|_| internal("write lock poisoned"))?;
        if let Some((org, version)) = decided_on {
            if self.store.version(org)? != Some(version) {
                return Err(moved());
            }
        }
        let mut order: Vec<String> = Vec::new();
        let mut by_org: HashMap<String, Vec<&Effect>> = HashMap::new();
        for c in changes {
            if !by_org.contains_key(&c.organization_id) {
                order.push(c.organization_id.clone());
            }
            by_org.entry(c.organization_id.clone()).or_default().push(&c.effect);
        }
        let mut writes = Vec::new();
        let mut next_states = Vec::new();
        for org in &order {
            let effects = &by_org[org];
            let creating = matches!(effects.first(), Some(Effect::CreateOrganization { .. }));
            let (mut state, expected_version, base) = match (self.load_writing(org)?, creating) {
                (Some(_), true) => {
                    return Err(EnclaveError::refused(
                        RefusalReason::TransitionMismatch,
                        format!("organization {org} already exists"),
                    ))
                }
                // A cheap copy: the state's maps are persistent.
                (Some(l), false) => (l.state.clone(), l.state.version, Some(l.index.clone())),
                (None, true) => {
                    if self.store.version(org)?.is_some() {
                        // Ids are never reused: a deleted organization does not come back.
                        return Err(EnclaveError::refused(
                            RefusalReason::TransitionMismatch,
                            format!("organization {org} existed before"),
                        ));
                    }
                    (AuthorityState::default(), 0, None)
                }
                (None, false) => {
                    return Err(EnclaveError::refused(
                        RefusalReason::OrganizationUnknown,
                        format!("the enclave has no authority state for organization {org}"),
                    ))
                }
            };
            let before: Vec<(String, String)> = if effects.iter().any(|e| matches!(e, Effect::DeleteOrganization)) {
                state.entries().into_iter().map(|e| (e.kind.to_string(), e.id)).collect()
            } else {
                Vec::new()
            };
            let touched = state
                // `state` is this commit's own copy, dropped on error.
                .apply_all_unchecked(effects.iter().copied())
                .map_err(|e| EnclaveError::refused(RefusalReason::TransitionMismatch, e.to_string()))?;
            if let Some(Effect::CreateOrganization { organization }) = effects.first() {
                if &organization.id != org {
                    return Err(EnclaveError::refused(
                        RefusalReason::TransitionMismatch,
                        "a new organization's changes name another organization",
                    ));
                }
            }
            let mut keys: Vec<(String, String)> = before;
            keys.extend(touched.into_iter().map(|(k, id)| (k.to_string(), id)));
            keys.sort();
            keys.dedup();
            let deleted = effects.iter().any(|e| matches!(e, Effect::DeleteOrganization));
            let (mut puts, mut deletes) = (Vec::new(), Vec::new());
            for (kind, id) in keys {
                match state.entry(&kind, &id).filter(|_| !deleted) {
                    Some(e) => puts.push(Entry { kind: e.kind.to_string(), id: e.id, data: e.data }),
                    None => deletes.push((kind, id)),
                }
            }
            if deleted {
                deletes.push((kinds::ORGANIZATION.to_string(), kinds::ORGANIZATION.to_string()));
                deletes.sort();
                deletes.dedup();
            }
            // The compiled policies follow: only the written or deleted ones compile again.
            let index = match base {
                Some(base) if !writes_touch_policies(&puts, &deletes) => base,
                Some(base) => {
                    let changed = (puts.iter().map(|e| (e.kind.as_str(), e.id.as_str())))
                        .chain(deletes.iter().map(|(k, id)| (k.as_str(), id.as_str())))
                        .filter(|(k, _)| *k == kinds::POLICY)
                        .map(|(_, id)| id);
                    Arc::new(base.updated(&state, changed))
                }
                None => Arc::new(PolicyIndex::of(&state)),
            };
            writes.push(OrgChanges { organization_id: org.clone(), expected_version, puts, deletes });
            next_states.push((state, deleted, index));
        }
        let versions = self.store.apply(&writes)?;
        // The cache takes the new states as they were committed (a deleted organization goes).
        let mut fresh = Vec::new();
        for ((mut state, deleted, index), version) in next_states.into_iter().zip(&versions) {
            state.version = *version;
            fresh.push((deleted, Arc::new(Loaded { state, index })));
        }
        let mut cache = self.cache.lock().map_err(|_| internal("cache poisoned"))?;
        for (org, (deleted, loaded)) in order.iter().zip(fresh) {
            if deleted {
                cache.remove(org);
            } else {
                cache.insert(org.clone(), loaded);
            }
        }
        Ok(order.into_iter().zip(versions).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority_store::{SqliteAuthorityStore, StoreLimits};
    use coffer_authority_state::model::{CredentialKind, Organization, User};

    fn rules() -> Rules {
        Rules::new(Arc::new(SqliteAuthorityStore::open_in_memory(StoreLimits::default()).unwrap()))
    }

    fn change(org: &str, effect: Effect) -> Change {
        Change { organization_id: org.into(), effect }
    }

    fn bootstrap(r: &Rules, org: &str) {
        r.commit_all(&[
            change(
                org,
                Effect::CreateOrganization {
                    organization: Organization {
                        id: org.into(),
                        name: org.into(),
                        root_quorum_threshold: 1,
                        root_user_ids: vec!["root".into()],
                        ..Default::default()
                    },
                },
            ),
            change(
                org,
                Effect::PutUser { user: User { id: "root".into(), name: "root".into(), ..Default::default() } },
            ),
            change(
                org,
                Effect::AddCredential {
                    credential: Credential {
                        id: "k".into(),
                        user_id: "root".into(),
                        kind: CredentialKind::ApiKey,
                        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                        public_key: "02aa".into(),
                        expires_at_ms: 0,
                    },
                },
            ),
        ])
        .unwrap();
    }

    fn root_vote() -> VerifiedVote {
        VerifiedVote {
            user_id: "root".into(),
            public_key: "02aa".into(),
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            at_ms: 1,
        }
    }

    #[test]
    fn state_survives_a_new_rules_over_the_same_store_and_revocation_takes_effect() {
        let r = rules();
        bootstrap(&r, "o");
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        assert!(r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).is_ok());
        assert!(matches!(
            r.commit_all(&[change(
                "o",
                Effect::CreateOrganization { organization: Organization { id: "o".into(), ..Default::default() } }
            )]),
            Err(EnclaveError::Refused { reason: RefusalReason::TransitionMismatch, .. })
        ));
        r.commit_all(&[change(
            "o",
            Effect::RemoveCredentials { user_id: "root".into(), kind: CredentialKind::ApiKey, ids: vec!["k".into()] },
        )])
        .unwrap();
        let refused = r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err();
        assert_eq!(refused.0, RefusalReason::CredentialRevoked);
        let other = Rules::new(r.store().clone());
        assert_eq!(
            other.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err().0,
            RefusalReason::CredentialRevoked
        );
        assert_eq!(
            other.decide("nope", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err().0,
            RefusalReason::OrganizationUnknown
        );
    }

    #[test]
    fn a_deleted_organization_is_unknown_and_cannot_come_back() {
        let r = rules();
        bootstrap(&r, "o");
        r.commit_all(&[change("o", Effect::DeleteOrganization)]).unwrap();
        assert!(r.load("o").unwrap().is_none());
        let again = Effect::CreateOrganization { organization: Organization { id: "o".into(), ..Default::default() } };
        assert!(matches!(
            r.commit_all(&[change("o", again)]),
            Err(EnclaveError::Refused { reason: RefusalReason::TransitionMismatch, .. })
        ));
    }
}
