//! Activities that change no key material: decided over the organization's authority state and,
//! when their proposed changes are exactly what the stamped body asks for, applied to it.

use coffer_auth::envelope::derived_id;
use coffer_auth::grants::granted_credentials;
use coffer_org_rules::model::CredentialKind;
use coffer_org_rules::subjects;
use coffer_org_rules::transition::{self, Grant, Input};
use coffer_org_rules::{Change, Credential, Effect};
use coffer_proto::v1 as pb;

use crate::admission::{refuse, Admission, Admitted};
use crate::decider::is_moved;
use crate::error::{EnclaveError, RefusalReason};

/// Most changes one activity may propose.
const MAX_CHANGES: usize = 10_000;

/// Decides the stamped activity over its organization's state and applies the proposal.
pub(super) fn apply_activity(
    hsm: &crate::hsm::Hsm,
    admission: &Admission,
    req: pb::ApplyActivityRequest,
) -> Result<pb::ApplyActivityResponse, EnclaveError> {
    let types: Vec<&str> =
        subjects::SUBJECTS.iter().map(|s| s.activity_type).filter(|t| !subjects::has_own_call(t)).collect();
    // The stamp is spent once the change is decided, checked and ready to stage: a refused change
    // spends nothing and leaves no allow in the decision log.
    let (a, unspent) = admission.authorize_unspent("apply_activity", req.auth.as_ref(), &types)?;
    // The activity to link in this call, when asked: checked before anything is applied.
    let log = req.auth.as_ref().and_then(|auth| auth.log.as_ref());
    let mut link = log.map(|log| a.link_request(log, false)).transpose()?;
    let rules = admission.rules();
    let mut unspent = Some(unspent);
    // Whether this call spent the stamp (not a twin's spend refused as a replay).
    let mut spent = false;
    if a.via_parent {
        return Err(refuse(
            &a,
            RefusalReason::OrganizationMismatch,
            "a parent organization's credential may not change a sub-organization",
        ));
    }
    // A sign-up with a verification token: the contact it verified, once (the token is spent
    // before the state changes; a sign-up that then fails needs a new code).
    if a.activity.activity_type == coffer_auth::grants::CREATE_SUB_ORGANIZATION
        && !coffer_auth::envelope::text(&a.activity.parameters, "verificationToken").is_empty()
    {
        crate::verification_token::check_signup(hsm, admission, &a)?;
    }
    let proposal: Vec<Change> = serde_json::from_slice(&req.proposal)
        .map_err(|e| EnclaveError::invalid(format!("the proposal is not a list of changes: {e}")))?;
    if proposal.len() > MAX_CHANGES {
        return Err(EnclaveError::invalid(format!("at most {MAX_CHANGES} changes per activity")));
    }
    // What coffer-auth derives from the stamped body: new users' and the sub-organization's ids,
    // and the passkeys and OAuth identities it grants (parsed from attestations and tokens).
    let fingerprint = a.activity.fingerprint.clone();
    let derive_id = move |label: &str, i: usize| derived_id(&fingerprint, label, i);
    let grants: Vec<Grant> = granted_credentials(&a.activity)?
        .into_iter()
        .map(|g| Grant {
            organization_id: g.organization_id,
            user_id: g.user_id,
            credential_type: g.credential_type,
            public_key: g.public_key,
        })
        .collect();
    // The credentials this enclave issued for the activity itself (checked once).
    let issued = issued_credentials(admission, &a, &proposal, &req.issued_certificates)?;
    // A new sub-organization's accounts: addresses the enclave sealed a key for (checked once).
    let (account_keys, wallet_seed) = (&req.sub_organization_account_keys, &req.sub_organization_wallet_seed);
    sub_organization_accounts(hsm, &a, &proposal, account_keys, wallet_seed)?;
    let organization = a.activity.organization_id.clone();
    // The organizations the change names: its own and those its proposal changes.
    let mut named: Vec<&str> = proposal.iter().chain(&issued).map(|c| c.organization_id.as_str()).collect();
    named.push(&organization);
    // Each attempt decides and checks the change on the state the changes staged before it leave
    // (one at a time per organization, under its lock; other organizations' changes are decided
    // meanwhile), stages it, and waits for its group commit; when the group fails (another
    // enclave moved the state), the change is decided again.
    let mut committed = false;
    let mut apply = || -> Result<pb::ApplyActivityResponse, EnclaveError> {
        for _attempt in 0..8 {
            let (pending, evaluation) = {
                let mut locked = rules.lock_organizations(named.iter().copied())?;
                let head = rules.head(&organization)?;
                let d = admission.decide_over(&a, head.loaded.clone())?;
                let input = Input {
                    state: &d.loaded.state,
                    activity_type: &a.activity.activity_type,
                    params: &a.activity.parameters,
                    proposal: &proposal,
                    now_ms: crate::admission::now_ms(),
                    derive_id: &derive_id,
                    grants: &grants,
                };
                if let Err(e) = transition::check(&input) {
                    return Err(refuse(&a, RefusalReason::TransitionMismatch, &e.to_string()));
                }
                let evaluation = d.evaluation.outcomes_json_text();
                let mut changes = proposal.clone();
                changes.extend(issued.iter().cloned());
                if changes.is_empty() {
                    if let Some(unspent) = unspent.take() {
                        admission.spend(&a, unspent)?;
                        spent = true;
                    }
                    let version = d.loaded.state.version;
                    let app_proofs = applied_proofs(hsm, &a, &proposal, version)?;
                    let log_link = crate::proofs::link_applied(hsm, admission, &a, link.take(), &app_proofs);
                    return Ok(pb::ApplyActivityResponse { version, evaluation, app_proofs, log_link });
                }
                let prepared = match rules.prepare_decided(&organization, &head, &changes) {
                    Ok(prepared) => prepared,
                    Err(e) if is_moved(&e) => continue,
                    Err(EnclaveError::Refused { reason, message, .. }) => return Err(refuse(&a, reason, &message)),
                    Err(other) => return Err(other),
                };
                // Decided, checked and applied to the heads: the stamp is spent now (a replay or a
                // full replay share is refused here, audited by `spend`, and nothing is staged). Its
                // commit is grouped with other requests', so the organizations' locks are let go
                // meanwhile; a change staged on them in between makes this one decided again, under
                // the locks throughout, its stamp spent.
                if let Some(unspent) = unspent.take() {
                    drop(locked);
                    admission.spend(&a, unspent)?;
                    spent = true;
                    locked = rules.lock_organizations(named.iter().copied())?;
                }
                let staged = rules.stage_prepared(prepared);
                drop(locked);
                match staged {
                    Ok(pending) => (pending, evaluation),
                    Err(e) if is_moved(&e) => continue,
                    Err(other) => return Err(other),
                }
            };
            match rules.committed(pending) {
                Ok(versions) => {
                    committed = true;
                    let version = versions.iter().find(|(org, _)| org == &organization).map_or(0, |(_, v)| *v);
                    let app_proofs = applied_proofs(hsm, &a, &proposal, version)?;
                    let log_link = crate::proofs::link_applied(hsm, admission, &a, link.take(), &app_proofs);
                    return Ok(pb::ApplyActivityResponse { version, evaluation, app_proofs, log_link });
                }
                Err(e) if is_moved(&e) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(EnclaveError::Busy {
            reason: RefusalReason::Unspecified,
            message: "the organization's authority state keeps changing: retry".into(),
        })
    };
    let answer = apply();
    // A change whose stamp was spent and that was not applied (the state kept moving, the store
    // failed): its allow no longer stands, so nothing can link it completed.
    if let Err(e) = &answer {
        if spent && !committed {
            a.failed_after_spend(e);
        }
    }
    answer
}

/// When the stamped body asks: the proof of the decision and of the changes applied, with the
/// organization's state version after them.
fn applied_proofs(
    hsm: &crate::hsm::Hsm,
    a: &Admitted,
    proposal: &[Change],
    version: u64,
) -> Result<Vec<pb::AppProof>, EnclaveError> {
    if !a.activity.generate_app_proofs {
        return Ok(Vec::new());
    }
    let changes = serde_json::to_value(proposal).map_err(|e| EnclaveError::Internal(e.to_string()))?;
    let result = serde_json::json!({
        "changesSha256": coffer_auth::proof::json_digest(&changes),
        "changes": proposal.len(),
        "stateVersionAfter": version.to_string(),
    });
    crate::proofs::of_call(hsm, a, result)
}

/// The accounts a `create_sub_organization` proposes for the sub-organization's wallet, each
/// checked against the wallet `CreateWallet` made for it: the address the proposal states must
/// be the one the wallet's sealed seed (`seed`) derives for that account of the body, and the
/// account's sealed key (`keys`, in the body's order) must open under the sub-organization's id
/// (derived from the body), the account's id and that address. So the sub-organization's state
/// (and what the enclave signs of it) records only addresses the enclave derived, of one wallet
/// whose seed and keys agree. Other activities bring no keys. (Which accounts and in what order
/// the transition then checks exactly: one `PutAccounts` of the sub-organization, the body's.)
fn sub_organization_accounts(
    hsm: &crate::hsm::Hsm,
    a: &Admitted,
    proposal: &[Change],
    keys: &[Vec<u8>],
    seed: &[u8],
) -> Result<(), EnclaveError> {
    let sub_organization = derived_id(&a.activity.fingerprint, transition::SUB_ORGANIZATION_ID, 0);
    let accounts: Vec<&coffer_org_rules::model::Account> = proposal
        .iter()
        .filter_map(|c| match &c.effect {
            Effect::PutAccounts { accounts } => Some(accounts),
            _ => None,
        })
        .flatten()
        .collect();
    if accounts.is_empty() && keys.is_empty() && seed.is_empty() {
        return Ok(());
    }
    let unproven = |why: &str| refuse(a, RefusalReason::BindingMismatch, why);
    let wallet = a.activity.parameters.get("wallet").unwrap_or(&serde_json::Value::Null);
    let specs = coffer_auth::envelope::items(wallet, "accounts");
    if a.activity.activity_type != coffer_auth::grants::CREATE_SUB_ORGANIZATION
        || accounts.len() != keys.len()
        || accounts.len() != specs.len()
    {
        return Err(unproven("the accounts proposed are not the sealed keys presented for them"));
    }
    let derived =
        super::keys::sub_organization_addresses(hsm, &sub_organization, &a.activity.fingerprint, wallet, seed)
            .map_err(|_| unproven("the sub-organization's wallet seed is not one the enclave sealed for it"))?;
    for (n, (account, blob)) in accounts.iter().zip(keys).enumerate() {
        if derived.get(n) != Some(&account.address) {
            return Err(unproven("a proposed account's address is not the one the wallet's seed derives"));
        }
        let sealed = pb::SealedRef {
            kind: pb::BlobKind::WalletAccountKey as i32,
            organization_id: sub_organization.clone(),
            resource_id: account.id.clone(),
            blob: blob.clone(),
            curve: coffer_auth::envelope::text(&specs[n], "curve").to_string(),
            address: account.address.clone(),
            address_format: account.address_format.clone(),
            ..Default::default()
        };
        if super::sealed_refs::open_key(hsm, &sealed, crate::hsm::BlobKind::WalletAccountKey).is_err() {
            return Err(unproven("a proposed account's address is not the one its sealed key was made for"));
        }
    }
    Ok(())
}

/// The credentials this enclave issued for the activity itself (enable_auth_proxy's key, made by
/// `EnableAuthProxy` before the activity's changes): each certificate must be genuine, issued for
/// this activity's fingerprint in its organization, to the auth proxy user the proposal creates.
fn issued_credentials(
    admission: &Admission,
    a: &Admitted,
    proposal: &[Change],
    certificates: &[Vec<u8>],
) -> Result<Vec<Change>, EnclaveError> {
    let mut out = Vec::new();
    for (n, bytes) in certificates.iter().enumerate() {
        let cert = admission.genuine_certificate(bytes).ok_or_else(|| {
            refuse(a, RefusalReason::CertificateInvalid, "an issued certificate is not one this enclave issued")
        })?;
        let new_user = proposal.iter().any(|c| {
            matches!(&c.effect, Effect::PutUser { user } if user.id == cert.user_id && c.organization_id == cert.organization_id)
        });
        if a.activity.activity_type != ENABLE_AUTH_PROXY
            || cert.issuing_fingerprint != a.activity.fingerprint
            || cert.organization_id != a.activity.organization_id
            || !new_user
        {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "an issued certificate is not this activity's own (enable_auth_proxy's key for its new user)",
            ));
        }
        out.push(Change {
            organization_id: cert.organization_id.clone(),
            effect: Effect::AddCredential {
                credential: Credential {
                    id: derived_id(&a.activity.fingerprint, ISSUED_CREDENTIAL_ID, n),
                    user_id: cert.user_id,
                    kind: CredentialKind::ApiKey,
                    credential_type: cert.credential_type,
                    public_key: cert.public_key,
                    expires_at_ms: cert.expires_at_ms,
                },
            },
        });
    }
    Ok(out)
}

const ENABLE_AUTH_PROXY: &str = "ACTIVITY_TYPE_ENABLE_AUTH_PROXY";
/// `derived_id` purpose of the ids of credentials the enclave issued for an activity.
const ISSUED_CREDENTIAL_ID: &str = "issued-credential";
