//! Activities that change no key material: decided over the organization's authority state, their
//! changes computed from the stamped body alone, applied to it and answered.

use coffer_auth::envelope::derived_id;
use coffer_auth::grants::granted_credentials;
use coffer_org_rules::model::CredentialKind;
use coffer_org_rules::subjects;
use coffer_org_rules::transition::{self, Grant, Input, ISSUED_CREDENTIAL_ID};
use coffer_org_rules::{Change, Credential, Effect};
use coffer_proto::v1 as pb;

use super::invitations;
use crate::admission::{refuse, Admission, Admitted};
use crate::decider::is_moved;
use crate::error::{EnclaveError, RefusalReason};

/// Most changes one activity may make (a body is at most 1 MiB; 60,000 users of a few bytes each
/// would otherwise be one commit and a 10 MB answer).
const MAX_CHANGES: usize = 10_000;

/// Decides the stamped activity over its organization's state, computes its changes from the
/// stamped body and applies them.
/// The messages it leaves in `mails` (the invitations it made) are sent by the caller.
pub(super) fn apply_activity(
    hsm: &crate::hsm::Hsm,
    admission: &Admission,
    otp: &super::otp::OtpService,
    req: pb::ApplyActivityRequest,
    mails: &mut Vec<(lettre::Message, String)>,
) -> Result<pb::ApplyActivityResponse, EnclaveError> {
    let types: Vec<&str> =
        subjects::SUBJECTS.iter().map(|s| s.activity_type).filter(|t| !subjects::has_own_call(t)).collect();
    // An invitation's acceptance is stamped by the key it brings, standing for the invitation
    // once its code checks.
    let attested = invitations::acceptance_identity(hsm, admission, req.auth.as_ref())?;
    // The stamp is spent in the transaction that commits the change (or, for a change that changes
    // nothing, once it is decided): a refused change spends nothing and leaves no allow in the
    // decision log, and a change is never committed without its stamp spent, nor a stamp spent
    // for a change that was not.
    let (a, unspent) =
        admission.authorize_unspent(crate::admission::APPLY_ACTIVITY, req.auth.as_ref(), &types, attested.as_ref())?;
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
    // A new email or phone number with a verification token: the contact it verified, once.
    if crate::verification_token::CONTACT_UPDATES.iter().any(|(t, _, _)| *t == a.activity.activity_type)
        && !coffer_auth::envelope::text(&a.activity.parameters, "verificationToken").is_empty()
    {
        crate::verification_token::check_contact(hsm, admission, &a)?;
    }
    // Invitations are mailed: there must be a transport to mail them with.
    if a.activity.activity_type == invitations::CREATE_INVITATIONS && !otp.mailer.configured() {
        return Err(refuse(
            &a,
            RefusalReason::TransitionRefused,
            "invitations are mailed: they need the enclave's mail transport ([otp] smtp_url or mail_dir)",
        ));
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
    let issued = issued_credentials(admission, &a, &req.issued_certificates)?;
    // A new sub-organization's accounts: the addresses the enclave derives from the wallet's
    // sealed seed, each the address its sealed key was made for (checked once).
    let (account_keys, wallet_seed) = (&req.sub_organization_account_keys, &req.sub_organization_wallet_seed);
    let wallet_addresses = sub_organization_addresses(hsm, &a, account_keys, wallet_seed)?;
    let organization = a.activity.organization_id.clone();
    // The organizations the change may name: its own, and the sub-organization it creates.
    let sub_organization = (a.activity.activity_type == coffer_auth::grants::CREATE_SUB_ORGANIZATION)
        .then(|| derived_id(&a.activity.fingerprint, transition::SUB_ORGANIZATION_ID, 0));
    let named: Vec<&str> = std::iter::once(organization.as_str()).chain(sub_organization.as_deref()).collect();
    // The changes the stamped body asks of `state`.
    let expected_over = |state: &coffer_org_rules::OrgState| {
        transition::expected(&Input {
            state,
            activity_type: &a.activity.activity_type,
            params: &a.activity.parameters,
            now_ms: crate::admission::now_ms(),
            derive_id: &derive_id,
            grants: &grants,
            wallet_addresses: &wallet_addresses,
            auth_proxy_key_issued: !issued.is_empty(),
        })
    };
    // Invitations are mailed: each counted against the send limits once the body is checked on
    // the organization's state as it is (outside its lock), before anything is committed; decided
    // again below, the same body is counted once.
    if a.activity.activity_type == invitations::CREATE_INVITATIONS {
        let loaded = rules
            .load(&organization)?
            .ok_or_else(|| refuse(&a, RefusalReason::OrganizationUnknown, "the organization has no authority state"))?;
        let asked =
            expected_over(&loaded.state).map_err(|e| refuse(&a, RefusalReason::TransitionRefused, &e.to_string()))?;
        invitations::charge(admission, &otp.settings, &a, &asked)?;
    }
    // Each attempt decides and checks the change on the state the changes staged before it leave
    // (one at a time per organization, under its lock; other organizations' changes are decided
    // meanwhile), stages it with its stamp, and waits for its group commit, which spends the stamp
    // and applies the change in one transaction; when the group fails (another enclave moved the
    // state, or a change this one was staged on was refused its stamp), it is decided again.
    let mut committed = false;
    let mut apply = || -> Result<pb::ApplyActivityResponse, EnclaveError> {
        for _attempt in 0..8 {
            let (pending, evaluation, changes) = {
                let mut locked = rules.lock_organizations(named.iter().copied())?;
                let head = rules.head(&organization)?;
                let d = admission.decide_over(&a, head.loaded.clone())?;
                let asked = match expected_over(&d.loaded.state) {
                    Ok(asked) => asked,
                    Err(e) => return Err(refuse(&a, RefusalReason::TransitionRefused, &e.to_string())),
                };
                if asked.len() > MAX_CHANGES {
                    let why =
                        format!("the body makes {} changes, more than the {MAX_CHANGES} one activity may", asked.len());
                    return Err(refuse(&a, RefusalReason::TransitionRefused, &why));
                }
                // Its link states the records it made as made here: now, when it is linked in this
                // call (before anything is spent), or later, by what its allow records.
                let made = transition::made_ids(&a.activity.activity_type, &asked);
                match &link {
                    Some(link) => link.states_made(&made).map_err(|e| match e {
                        EnclaveError::Refused { reason, message, .. } => refuse(&a, reason, &message),
                        other => other,
                    })?,
                    // A change that nothing before this call made is linked in this call or not
                    // made: the log would never show it (`RecordActivity` refuses to link it
                    // completed afterwards).
                    None if subjects::linked_in_its_call(&a.activity.activity_type) => {
                        return Err(refuse(
                            &a,
                            RefusalReason::BindingMismatch,
                            "a state change is linked in the call that applies it: the authorization names no \
                             activity to link",
                        ))
                    }
                    None => {}
                }
                unspent = unspent.take().map(|u| u.with_made(&made));
                let changes = with_issued(&a, asked, &issued)?;
                if let Some(c) = changes.iter().find(|c| !named.contains(&c.organization_id.as_str())) {
                    return Err(EnclaveError::Internal(format!("a change names organization {}", c.organization_id)));
                }
                let evaluation = d.evaluation.outcomes_json_text();
                if changes.is_empty() {
                    if let Some(unspent) = unspent.take() {
                        admission.spend(&a, unspent)?;
                        spent = true;
                    }
                    let version = d.loaded.state.version;
                    let app_proofs = applied_proofs(hsm, &a, &changes, version)?;
                    let log_link = crate::proofs::link_applied(hsm, admission, &a, link.take(), &app_proofs);
                    return Ok(pb::ApplyActivityResponse {
                        version,
                        evaluation,
                        changes: b"[]".to_vec(),
                        app_proofs,
                        log_link,
                        email_events: Vec::new(),
                    });
                }
                let prepared = match rules.prepare_decided(&organization, &head, &changes) {
                    Ok(prepared) => prepared,
                    Err(e) if is_moved(&e) => continue,
                    Err(EnclaveError::Refused { reason, message, .. }) => return Err(refuse(&a, reason, &message)),
                    Err(other) => return Err(other),
                };
                // Decided, checked and applied to the heads: staged with its stamp, which the group
                // commit spends with it (a replay or a full replay share fails this change alone,
                // and nothing of it is kept). A change of two organizations (a new
                // sub-organization, a sign-up's) spends its stamp first, in a commit of its own: a
                // refusal in the group would move every change staged on its parent, other
                // tenants' sign-ups included. Its commit is grouped with other requests', so the
                // organizations' locks are let go meanwhile; a change staged on them in between
                // makes this one decided again, its stamp spent.
                let spend_in_group = match unspent.take() {
                    Some(alone) if named.len() > 1 => {
                        drop(locked);
                        admission.spend(&a, alone)?;
                        spent = true;
                        locked = rules.lock_organizations(named.iter().copied())?;
                        None
                    }
                    Some(in_group) => {
                        let spend = in_group.to_spend();
                        unspent = Some(in_group);
                        Some(spend)
                    }
                    None => None,
                };
                let staged = rules.stage_prepared_spending(prepared, spend_in_group);
                drop(locked);
                match staged {
                    Ok(pending) => (pending, evaluation, changes),
                    Err(e) if is_moved(&e) => continue,
                    Err(other) => {
                        // A twin of a stamp staged or lately committed is refused as the replay it is.
                        admission.unspent_within(&a, &other);
                        return Err(other);
                    }
                }
            };
            match rules.committed(pending) {
                Ok(versions) => {
                    committed = true;
                    if let Some(unspent) = unspent.take() {
                        admission.spent_within(&a, unspent);
                        spent = true;
                    }
                    coffer_process::crash_point::here("enclave-after-state-commit");
                    destroy_deleted_native_keys(hsm, &changes);
                    mails.extend(invitations::messages(hsm, &otp.settings, &changes));
                    let version = versions.iter().find(|(org, _)| org == &organization).map_or(0, |(_, v)| *v);
                    let app_proofs = applied_proofs(hsm, &a, &changes, version)?;
                    let log_link = crate::proofs::link_applied(hsm, admission, &a, link.take(), &app_proofs);
                    let changes = serde_json::to_vec(&changes).map_err(|e| EnclaveError::Internal(e.to_string()))?;
                    return Ok(pb::ApplyActivityResponse {
                        version,
                        evaluation,
                        changes,
                        app_proofs,
                        log_link,
                        email_events: Vec::new(),
                    });
                }
                Err(e) if is_moved(&e) => continue,
                Err(other) => {
                    admission.unspent_within(&a, &other);
                    return Err(other);
                }
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

/// Destroys the HSM-native keys of the private keys `changes` deleted, and of the organizations
/// they deleted (committed: nothing uses them any more). A key the module does not hold was not
/// native; a failure is logged, and the enclave's next start removes what nothing holds
/// ([`crate::service::remove_unheld_native_keys`]).
fn destroy_deleted_native_keys(hsm: &crate::hsm::Hsm, changes: &[Change]) {
    for change in changes {
        if matches!(change.effect, Effect::DeleteOrganization) {
            match hsm.destroy_native_keys_of(&change.organization_id) {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    n,
                    organization = change.organization_id.as_str(),
                    "HSM-native keys destroyed with their organization"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, organization = change.organization_id.as_str(), "HSM-native keys of a deleted organization were not destroyed")
                }
            }
            continue;
        }
        let Effect::DeletePrivateKeys { ids } = &change.effect else { continue };
        for id in ids {
            let label = crate::hsm::native_label(id);
            match hsm.destroy_native_key(&label) {
                Ok(true) => tracing::info!(key = label.as_str(), "HSM-native key destroyed with its private key"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, key = label.as_str(), "an HSM-native key was not destroyed"),
            }
        }
    }
}

/// When the stamped body asks: the proof of the decision and of the changes applied, with the
/// organization's state version after them.
fn applied_proofs(
    hsm: &crate::hsm::Hsm,
    a: &Admitted,
    applied: &[Change],
    version: u64,
) -> Result<Vec<pb::AppProof>, EnclaveError> {
    if !a.activity.generate_app_proofs {
        return Ok(Vec::new());
    }
    let changes = serde_json::to_value(applied).map_err(|e| EnclaveError::Internal(e.to_string()))?;
    let result = serde_json::json!({
        "changesSha256": coffer_auth::proof::json_digest(&changes),
        "changes": applied.len(),
        "stateVersionAfter": version.to_string(),
    });
    crate::proofs::of_call(hsm, a, result)
}

/// The addresses of a new sub-organization's accounts, in the body's order: derived from the
/// wallet `CreateWallet` made for it (`seed`, opened under the sub-organization's and the wallet's
/// ids, both derived from the body), and each account's sealed key (`keys`, in the body's order)
/// must open under the sub-organization's id, the account's derived id and that address. So the
/// sub-organization's state (and what the enclave signs of it) records only addresses the
/// enclave derived, of one wallet whose seed and keys agree. Other activities bring no keys.
fn sub_organization_addresses(
    hsm: &crate::hsm::Hsm,
    a: &Admitted,
    keys: &[Vec<u8>],
    seed: &[u8],
) -> Result<Vec<String>, EnclaveError> {
    let unproven = |why: &str| refuse(a, RefusalReason::BindingMismatch, why);
    let wallet = a.activity.parameters.get("wallet").filter(|w| !w.is_null());
    let specs = wallet.map(|w| coffer_auth::envelope::items(w, "accounts")).unwrap_or_default();
    let creating = a.activity.activity_type == coffer_auth::grants::CREATE_SUB_ORGANIZATION;
    if specs.is_empty() || !creating {
        // A sub-organization's wallet without accounts needs no key (its seed is not read).
        if keys.is_empty() && (creating || seed.is_empty()) {
            return Ok(Vec::new());
        }
        return Err(unproven("sealed keys were sent for an activity that makes no sub-organization accounts"));
    }
    if keys.len() != specs.len() {
        return Err(unproven("the sealed keys are not one for each account the body lists"));
    }
    let sub_organization = derived_id(&a.activity.fingerprint, transition::SUB_ORGANIZATION_ID, 0);
    let wallet = wallet.unwrap_or(&serde_json::Value::Null);
    let addresses =
        super::keys::sub_organization_addresses(hsm, &sub_organization, &a.activity.fingerprint, wallet, seed)
            .map_err(|_| unproven("the sub-organization's wallet seed is not one the enclave sealed for it"))?;
    for (n, (address, blob)) in addresses.iter().zip(keys).enumerate() {
        let sealed = pb::SealedRef {
            kind: pb::BlobKind::WalletAccountKey as i32,
            organization_id: sub_organization.clone(),
            resource_id: derived_id(&a.activity.fingerprint, transition::WALLET_ACCOUNT_ID, n),
            blob: blob.clone(),
            curve: coffer_auth::envelope::text(&specs[n], "curve").to_string(),
            address: address.clone(),
            address_format: coffer_auth::envelope::text(&specs[n], "addressFormat").to_string(),
            ..Default::default()
        };
        if super::sealed_refs::open_key(hsm, &sealed, crate::hsm::BlobKind::WalletAccountKey).is_err() {
            return Err(unproven("an account's sealed key is not the one made for the address its seed derives"));
        }
    }
    Ok(addresses)
}

/// The credentials this enclave issued for the activity itself (enable_auth_proxy's key, made by
/// `EnableAuthProxy` before the activity's changes): each certificate must be genuine, issued for
/// this activity's fingerprint in its organization (checked here), to the auth proxy user the
/// activity creates ([`with_issued`]).
fn issued_credentials(
    admission: &Admission,
    a: &Admitted,
    certificates: &[Vec<u8>],
) -> Result<Vec<Change>, EnclaveError> {
    // enable_auth_proxy issues one key: a second (the same one again, say) would be a credential
    // of the proxy's user its organization never sees to delete.
    if certificates.len() > 1 {
        return Err(refuse(a, RefusalReason::BindingMismatch, "at most one issued certificate per activity"));
    }
    let mut out = Vec::new();
    for (n, bytes) in certificates.iter().enumerate() {
        let cert = admission.genuine_certificate(bytes).ok_or_else(|| {
            refuse(a, RefusalReason::CertificateInvalid, "an issued certificate is not one this enclave issued")
        })?;
        if a.activity.activity_type != ENABLE_AUTH_PROXY
            || cert.issuing_fingerprint != a.activity.fingerprint
            || cert.organization_id != a.activity.organization_id
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

/// The changes the body asks for, then the issued credentials, each of which must be for a user
/// those changes create.
fn with_issued(a: &Admitted, mut asked: Vec<Change>, issued: &[Change]) -> Result<Vec<Change>, EnclaveError> {
    for c in issued {
        let Effect::AddCredential { credential } = &c.effect else { continue };
        let new_user = asked.iter().any(|made| {
            matches!(&made.effect, Effect::PutUser { user } if user.id == credential.user_id && made.organization_id == c.organization_id)
        });
        if !new_user {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "an issued certificate is not this activity's own (enable_auth_proxy's key for its new user)",
            ));
        }
    }
    asked.extend(issued.iter().cloned());
    Ok(asked)
}

const ENABLE_AUTH_PROXY: &str = "ACTIVITY_TYPE_ENABLE_AUTH_PROXY";
