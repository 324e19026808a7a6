//! The authority state changes the gateway's record writes stand for: what its records of an
//! activity say the enclave changed, checked against the changes the enclave computed and
//! applied ([`follows`]), and what a gateway database's records amount to when its organizations
//! are brought to the enclave (`orgs::authority_state_lines`). One arm per [`Write`] variant,
//! whatever activity produced it.
//!
//! Project the handler's writes before `certify_credentials` fills in certificates: an API key
//! that already carries one is a key the enclave issued itself (a session key, the auth proxy's
//! key), which the enclave records on its own and the projection leaves out.

use coffer_org_rules::effect::{Change, Effect, TagKind};
use coffer_org_rules::model::{
    self as authority, AddressEntry, ContractInterface, Credential, CredentialKind, Named, Policy, Tag,
};
use coffer_org_rules::transition::oauth2_credential_value;
use serde_json::Value;

use crate::record_kinds as kinds;
use crate::store::{ApiKey, Record, Write};

/// The changes `writes` make to authority state, in order. `organization_id` is the activity's
/// organization, for the writes that do not name one.
pub fn of_writes(organization_id: &str, writes: &[Write]) -> Vec<Change> {
    let mut out = Vec::new();
    for w in writes {
        project(organization_id, w, &mut out);
    }
    out
}

/// The sub-organization of a `create_sub_organization` whose body marks it as the auth proxy's
/// sign-up (`marked`: `coffer_org_rules::transition::marks_auth_proxy_signup` of the body, the
/// rule the enclave's transition reads) is made marked: the mark lives in the authority state
/// only, not in the gateway's database.
pub fn mark_auth_proxy_signup(activity_type: &str, marked: bool, changes: &mut [Change]) {
    if activity_type != coffer_auth::grants::CREATE_SUB_ORGANIZATION || !marked {
        return;
    }
    for c in changes {
        if let Effect::CreateOrganization { organization } = &mut c.effect {
            organization.auth_proxy_signup = true;
        }
    }
}

/// An `update_auth_proxy_config` whose body sets `appName` (`app_name`:
/// `coffer_org_rules::transition::auth_proxy_app_name` of the body, the rule the enclave's
/// transition reads) sets the name after its record's change: the enclave holds the proxy's
/// sends to the name in its authority state, not to the gateway's record.
pub fn set_auth_proxy_app_name(
    activity_type: &str,
    organization_id: &str,
    app_name: Option<String>,
    changes: &mut Vec<Change>,
) {
    if activity_type != UPDATE_AUTH_PROXY_CONFIG {
        return;
    }
    if let Some(app_name) = app_name {
        changes.push(change(organization_id, Effect::SetAuthProxyAppName { app_name }));
    }
}

/// The accounts of a new sub-organization's wallet among an activity's `writes` (the accounts of
/// no organization but `organization_id`, the activity's own), in the order the handler wrote
/// them: the body's.
pub fn sub_organization_accounts<'w>(
    organization_id: &'w str,
    writes: &'w [Write],
) -> impl Iterator<Item = &'w crate::store::WalletAccount> + 'w {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::InsertAccounts(accounts) => Some(accounts),
            _ => None,
        })
        .flatten()
        .filter(move |a| a.organization_id != organization_id)
}

/// Whether the gateway's records of an activity (`ours`, [`of_writes`]) follow the changes the
/// enclave applied (`applied`, less the credentials it issued for the activity itself, which
/// come last): the same changes in the same order, an API key's expiry within a minute (each
/// process counts it from its own clock). `Err` holds the first change that differs.
pub fn follows(ours: &[Change], applied: &[Change], issued: usize) -> Result<(), usize> {
    let applied = &applied[..applied.len().saturating_sub(issued)];
    let same = |(a, b): &(&Change, &Change)| match (&a.effect, &b.effect) {
        (Effect::AddCredential { credential: x }, Effect::AddCredential { credential: y }) => {
            a.organization_id == b.organization_id
                && x.expires_at_ms.abs_diff(y.expires_at_ms) <= 60_000
                && (x.expires_at_ms == 0) == (y.expires_at_ms == 0)
                && Credential { expires_at_ms: 0, ..x.clone() } == Credential { expires_at_ms: 0, ..y.clone() }
        }
        _ => a == b,
    };
    match ours.iter().zip(applied).position(|pair| !same(&pair)) {
        Some(n) => Err(n),
        None if ours.len() != applied.len() => Err(ours.len().min(applied.len())),
        None => Ok(()),
    }
}

const UPDATE_AUTH_PROXY_CONFIG: &str = "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG";

fn change(organization_id: &str, effect: Effect) -> Change {
    Change { organization_id: organization_id.to_string(), effect }
}

/// When an API key stops authenticating, in Unix milliseconds (0: never), as the stamp check
/// reads it: `created_at + expiration_seconds`.
fn expires_at_ms(k: &ApiKey) -> u64 {
    k.expiration_seconds
        .map_or(0, |e| (k.created_at / 1_000_000).saturating_add((e as i64).saturating_mul(1000)).max(1) as u64)
}

fn tag_kind(kind: &str) -> Option<TagKind> {
    match kind {
        kinds::USER_TAG => Some(TagKind::User),
        kinds::PRIVATE_KEY_TAG => Some(TagKind::PrivateKey),
        _ => None,
    }
}

fn project(org: &str, w: &Write, out: &mut Vec<Change>) {
    let credential = |id: &str, user_id: &str, kind, credential_type: &str, public_key: String| Effect::AddCredential {
        credential: Credential {
            id: id.to_string(),
            user_id: user_id.to_string(),
            kind,
            credential_type: credential_type.to_string(),
            public_key,
            expires_at_ms: 0,
        },
    };
    match w {
        Write::RenameOrganization { id, name, .. } => {
            out.push(change(id, Effect::SetOrganizationName { name: name.clone() }))
        }
        Write::InsertOrganization(o) => out.push(change(
            &o.id,
            Effect::CreateOrganization {
                organization: authority::Organization {
                    id: o.id.clone(),
                    name: o.name.clone(),
                    parent_id: o.parent_id.clone(),
                    root_quorum_threshold: o.root_quorum_threshold,
                    root_user_ids: o.root_user_ids.clone(),
                    ..Default::default()
                },
            },
        )),
        Write::InsertUser(u) => out.push(change(
            &u.organization_id,
            Effect::PutUser {
                user: authority::User {
                    id: u.id.clone(),
                    name: u.name.clone(),
                    email: u.email.clone().unwrap_or_default(),
                    phone_number: u.phone_number.clone().unwrap_or_default(),
                    tag_ids: Vec::new(),
                    contacts_verified: u.contacts_verified,
                },
            },
        )),
        // Certified already: issued by the enclave, which records it itself.
        Write::InsertApiKey(k) if !k.certificate.is_empty() => {}
        Write::InsertApiKey(k) => out.push(change(
            &k.organization_id,
            Effect::AddCredential {
                credential: Credential {
                    id: k.id.clone(),
                    user_id: k.user_id.clone(),
                    kind: CredentialKind::ApiKey,
                    credential_type: k.credential_type.clone(),
                    public_key: k.public_key.clone(),
                    expires_at_ms: expires_at_ms(k),
                },
            },
        )),
        Write::SetCertificate { .. } => {}
        Write::InsertWallet(wallet) => out.push(change(
            &wallet.organization_id,
            Effect::PutWallet {
                wallet: authority::Wallet {
                    id: wallet.id.clone(),
                    label: wallet.name.clone(),
                    imported: wallet.imported,
                    exported: wallet.exported,
                },
            },
        )),
        Write::InsertAccounts(accounts) => {
            if let Some(first) = accounts.first() {
                let accounts = accounts
                    .iter()
                    .map(|a| authority::Account {
                        id: a.id.clone(),
                        wallet_id: a.wallet_id.clone(),
                        address: a.address.clone(),
                        address_format: a.address_format.clone(),
                        exported: false,
                    })
                    .collect();
                out.push(change(&first.organization_id, Effect::PutAccounts { accounts }));
            }
        }
        Write::InsertPrivateKeys(keys) => out.extend(keys.iter().map(|k| {
            change(
                &k.organization_id,
                Effect::PutPrivateKey {
                    private_key: authority::PrivateKey {
                        id: k.id.clone(),
                        label: k.name.clone(),
                        tags: k.tags.clone(),
                        imported: k.imported,
                        exported: k.exported,
                        addresses: k
                            .addresses
                            .iter()
                            .map(|a| AddressEntry { format: a.format.clone(), address: a.address.clone() })
                            .collect(),
                    },
                },
            )
        })),
        Write::MarkWalletExported(id) => out.push(change(org, Effect::MarkWalletExported { id: id.clone() })),
        Write::MarkPrivateKeyExported(id) => out.push(change(org, Effect::MarkPrivateKeyExported { id: id.clone() })),
        Write::MarkAccountExported(id) => out.push(change(org, Effect::MarkAccountExported { id: id.clone() })),
        Write::DeleteWallets { ids, .. } => out.push(change(org, Effect::DeleteWallets { ids: ids.clone() })),
        Write::DeletePrivateKeys { ids, .. } => out.push(change(org, Effect::DeletePrivateKeys { ids: ids.clone() })),
        Write::MarkContactsVerified { organization_id, id } => {
            out.push(change(organization_id, Effect::MarkContactsVerified { id: id.clone() }))
        }
        Write::RenameWallet { id, name, .. } => {
            out.push(change(org, Effect::RenameWallet { id: id.clone(), label: name.clone() }))
        }
        Write::DeleteAccounts { organization_id, ids, .. } => {
            out.push(change(organization_id, Effect::DeleteAccounts { ids: ids.clone() }))
        }
        Write::PutRecord(record) | Write::PutRecordChecked { record, .. } => out.extend(put_record(record)),
        Write::DeleteRecords { organization_id, kind, ids } => out.extend(delete_records(organization_id, kind, ids)),
        // One-time code records are not authority state: the enclave keeps what decides.
        Write::PutImportTarget(_)
        | Write::TakeImportTarget { .. }
        | Write::PruneRecords { .. }
        | Write::InsertEmailEvents(_)
        | Write::PruneEmailEvents { .. } => {}
        Write::UpdateUser { organization_id, id, name, email, phone_number, tag_ids, .. } => out.push(change(
            organization_id,
            Effect::UpdateUser {
                id: id.clone(),
                name: name.clone(),
                email: email.clone(),
                phone_number: phone_number.clone(),
                tag_ids: tag_ids.clone(),
            },
        )),
        Write::DeleteUsers { organization_id, ids } => {
            out.push(change(organization_id, Effect::DeleteUsers { ids: ids.clone() }))
        }
        Write::DeleteApiKeys { organization_id, user_id, ids } => out.push(change(
            organization_id,
            Effect::RemoveCredentials { user_id: user_id.clone(), kind: CredentialKind::ApiKey, ids: ids.clone() },
        )),
        Write::UpdateTag { organization_id, kind, id, new_name, add, remove, .. } => {
            if let Some(kind) = tag_kind(kind) {
                let effect = Effect::UpdateTag {
                    kind,
                    id: id.clone(),
                    new_name: new_name.clone(),
                    add: add.clone(),
                    remove: remove.clone(),
                };
                out.push(change(organization_id, effect));
            }
        }
        Write::DeleteTags { organization_id, kind, ids } => {
            if let Some(kind) = tag_kind(kind) {
                out.push(change(organization_id, Effect::DeleteTags { kind, ids: ids.clone() }));
            }
        }
        Write::InsertAuthenticators(list) => out.extend(list.iter().map(|a| {
            let public_key = a.public_key.clone();
            let effect = credential(
                &a.id,
                &a.user_id,
                CredentialKind::Passkey,
                coffer_auth::webauthn::CREDENTIAL_TYPE,
                public_key,
            );
            change(&a.organization_id, effect)
        })),
        Write::DeleteAuthenticators { organization_id, user_id, ids } => out.push(change(
            organization_id,
            Effect::RemoveCredentials { user_id: user_id.clone(), kind: CredentialKind::Passkey, ids: ids.clone() },
        )),
        Write::InsertOauthProviders(list) => out.extend(list.iter().map(|p| {
            let identity = crate::oidc_tokens::identity_hash(&p.issuer, &p.subject, &p.audience);
            let effect = credential(
                &p.id,
                &p.user_id,
                CredentialKind::OauthIdentity,
                coffer_auth::grants::OAUTH_PROVIDER,
                identity,
            );
            change(&p.organization_id, effect)
        })),
        Write::DeleteOauthProviders { organization_id, user_id, ids } => out.push(change(
            organization_id,
            Effect::RemoveCredentials {
                user_id: user_id.clone(),
                kind: CredentialKind::OauthIdentity,
                ids: ids.clone(),
            },
        )),
        Write::SetRootQuorum { organization_id, threshold, user_ids, .. } => out
            .push(change(organization_id, Effect::SetRootQuorum { threshold: *threshold, user_ids: user_ids.clone() })),
        Write::RequireRecordSet { .. } => {}
        Write::DeleteSubOrganization { organization_id, .. } => {
            out.push(change(organization_id, Effect::DeleteOrganization))
        }
        Write::UpdateConsensusActivity { .. }
        | Write::InsertPolicyEvaluation(_)
        | Write::InsertIdempotencyKey { .. }
        | Write::InsertLogLink { .. }
        | Write::EnqueueWebhookDelivery(_)
        | Write::DropWebhookDeliveries { .. } => {}
    }
}

/// A record's change, by kind: the records authority state keeps (policies, tags, contract
/// interfaces, webhook endpoints, OAuth 2.0 credentials, features, the auth proxy's flag).
fn put_record(r: &Record) -> Option<Change> {
    let text = |k: &str| r.data.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let effect = match r.kind.as_str() {
        kinds::POLICY => Effect::PutPolicy {
            policy: Policy {
                id: r.id.clone(),
                name: r.name.clone(),
                effect: text("effect"),
                condition: text("condition"),
                consensus: text("consensus"),
                time: text("time"),
            },
        },
        kinds::USER_TAG | kinds::PRIVATE_KEY_TAG => {
            Effect::PutTag { kind: tag_kind(&r.kind)?, tag: Tag { id: r.id.clone(), name: r.name.clone() } }
        }
        kinds::SMART_CONTRACT_INTERFACE => Effect::PutContractInterface {
            interface: ContractInterface {
                id: r.id.clone(),
                address: text("smartContractAddress"),
                interface_type: text("type"),
                body: text("smartContractInterface"),
            },
        },
        kinds::WEBHOOK_ENDPOINT => {
            Effect::PutWebhookEndpoint { endpoint: Named { id: r.id.clone(), value: text("url") } }
        }
        kinds::OAUTH2_CREDENTIAL => Effect::PutOauth2Credential {
            credential: Named {
                id: r.id.clone(),
                value: oauth2_credential_value(&text("provider"), &text("clientId")),
            },
        },
        kinds::FEATURE => Effect::SetFeature { name: r.id.clone(), value: text("value") },
        kinds::SESSION_PROFILE => {
            Effect::PutSessionProfile { id: r.id.clone(), profile: serde_json::from_value(r.data.clone()).ok()? }
        }
        kinds::INVITATION => {
            Effect::PutInvitation { id: r.id.clone(), invitation: serde_json::from_value(r.data.clone()).ok()? }
        }
        kinds::IP_ALLOWLIST => Effect::PutIpAllowlist {
            key: crate::ip_allowlists::key_of(&r.id).to_string(),
            allowlist: serde_json::from_value(r.data.clone()).ok()?,
        },
        kinds::AUTH_PROXY => {
            Effect::SetAuthProxy { enabled: r.data.get("enabled").and_then(Value::as_bool).unwrap_or(false) }
        }
        // Parent certificates and TVC records decide nothing the enclave decides.
        _ => return None,
    };
    Some(change(&r.organization_id, effect))
}

/// Deleted records' changes, by kind (see [`put_record`]).
fn delete_records(org: &str, kind: &str, ids: &[String]) -> Vec<Change> {
    let ids = ids.to_vec();
    let effect = match kind {
        kinds::POLICY => Effect::DeletePolicies { ids },
        kinds::USER_TAG | kinds::PRIVATE_KEY_TAG => match tag_kind(kind) {
            Some(kind) => Effect::DeleteTags { kind, ids },
            None => return Vec::new(),
        },
        kinds::SMART_CONTRACT_INTERFACE => Effect::DeleteContractInterfaces { ids },
        kinds::WEBHOOK_ENDPOINT => Effect::DeleteWebhookEndpoints { ids },
        kinds::OAUTH2_CREDENTIAL => Effect::DeleteOauth2Credentials { ids },
        kinds::FEATURE => return ids.into_iter().map(|name| change(org, Effect::RemoveFeature { name })).collect(),
        kinds::AUTH_PROXY => Effect::SetAuthProxy { enabled: false },
        kinds::INVITATION => {
            return ids.into_iter().map(|id| change(org, Effect::RemoveInvitation { id })).collect();
        }
        kinds::IP_ALLOWLIST => {
            let remove = |id: String| Effect::RemoveIpAllowlist { key: crate::ip_allowlists::key_of(&id).to_string() };
            return ids.into_iter().map(|id| change(org, remove(id))).collect();
        }
        _ => return Vec::new(),
    };
    vec![change(org, effect)]
}

#[cfg(test)]
mod tests;
