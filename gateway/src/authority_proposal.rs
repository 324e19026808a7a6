//! The changes an activity's writes make to the organization's authority state, as the enclave's
//! `ApplyActivity` checks them against the stamped body (one arm per kind of write).

use coffer_authority_state::model::{CredentialKind, Policy};
use coffer_authority_state::{Change, Credential, Effect};
use serde_json::Value;

use crate::record_kinds::POLICY;
use crate::stamps::stamp::SESSION_CREDENTIAL_TYPES;
use crate::store::Write;

/// The proposal of `writes` for `organization_id`'s authority state.
pub fn proposal(organization_id: &str, writes: &[Write]) -> Vec<Change> {
    let change = |effect| Change { organization_id: organization_id.to_string(), effect };
    let mut out = Vec::new();
    for w in writes {
        match w {
            // Session keys come certified by the enclave's CreateSession, which records them.
            Write::InsertApiKey(k) if !SESSION_CREDENTIAL_TYPES.contains(&k.credential_type.as_str()) => {
                out.push(Change {
                    organization_id: k.organization_id.clone(),
                    effect: Effect::AddCredential {
                        credential: Credential {
                            id: k.id.clone(),
                            user_id: k.user_id.clone(),
                            kind: CredentialKind::ApiKey,
                            credential_type: k.credential_type.clone(),
                            public_key: k.public_key.clone(),
                            expires_at_ms: k
                                .expiration_seconds
                                .map_or(0, |s| (k.created_at / 1_000_000).max(0) as u64 + s.saturating_mul(1000)),
                        },
                    },
                })
            }
            Write::DeleteApiKeys { user_id, ids, .. } => out.push(change(Effect::RemoveCredentials {
                user_id: user_id.clone(),
                kind: CredentialKind::ApiKey,
                ids: ids.clone(),
            })),
            Write::DeleteUsers { ids, .. } => out.push(change(Effect::DeleteUsers { ids: ids.clone() })),
            Write::SetRootQuorum { threshold, user_ids, .. } => {
                out.push(change(Effect::SetRootQuorum { threshold: *threshold, user_ids: user_ids.clone() }))
            }
            Write::PutRecordChecked { record: r, .. } | Write::PutRecord(r) if r.kind == POLICY => {
                let text = |k: &str| r.data.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                out.push(change(Effect::PutPolicy {
                    policy: Policy {
                        id: r.id.clone(),
                        name: r.name.clone(),
                        effect: text("effect"),
                        condition: text("condition"),
                        consensus: text("consensus"),
                        time: text("time"),
                    },
                }))
            }
            Write::DeleteRecords { kind, ids, .. } if kind == POLICY => {
                out.push(change(Effect::DeletePolicies { ids: ids.clone() }))
            }
            _ => {}
        }
    }
    out
}
