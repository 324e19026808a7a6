//! What a transition reads ([`Input`]): the state, the stamped body, what coffer-auth derives
//! from the body ([`Grant`], derived ids) and what the enclave's own work made for it (a new
//! sub-organization's addresses, the auth proxy's key); and the readers every transition shares.

use serde_json::Value;

use crate::effect::{Change, Effect};
use crate::model::{CredentialKind, Millis, OrgState};

/// Why a stamped activity changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The stamped body cannot be read as its activity type, or asks for what its organization's
    /// state refuses (a missing record, an unexported key deleted without `deleteWithoutExport`).
    #[error("the stamped body is not a valid {activity_type}: {reason}")]
    Invalid { activity_type: String, reason: String },
}

/// A credential the stamped body grants, as `coffer_auth::grants::granted_credentials` computes
/// it (this crate parses no WebAuthn attestation and no OIDC token): passkeys and OAuth
/// identities are taken from here, each matched to its place in the body by organization, user
/// and type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    pub organization_id: String,
    pub user_id: String,
    pub credential_type: String,
    /// Lowercase hex, or an OAuth identity's hash.
    pub public_key: String,
}

/// Labels of [`Input::derive_id`], the same as `coffer_auth::envelope::{USER_ID,
/// SUB_ORGANIZATION_ID, WALLET_ID, WALLET_ACCOUNT_ID}`.
pub const USER_ID: &str = "user";
pub const SUB_ORGANIZATION_ID: &str = "sub-organization";
pub const WALLET_ID: &str = "wallet";
pub const WALLET_ACCOUNT_ID: &str = "wallet-account";
/// Labels of [`Input::derive_id`] for the other records a state change makes (the gateway's
/// handlers name them so too: `coffer_auth::envelope::derived_id` of the stamped body).
pub const POLICY_ID: &str = "policy";
pub const TAG_ID: &str = "tag";
pub const CONTRACT_INTERFACE_ID: &str = "smart-contract-interface";
pub const WEBHOOK_ENDPOINT_ID: &str = "webhook-endpoint";
pub const OAUTH2_CREDENTIAL_ID: &str = "oauth2-credential";
pub const SESSION_PROFILE_ID: &str = "session-profile";
pub const INVITATION_ID: &str = "invitation";
/// Label of [`Input::derive_id`] for the credentials the enclave issued for an activity itself
/// (enable_auth_proxy's key), by position.
pub const ISSUED_CREDENTIAL_ID: &str = "issued-credential";

/// The label of [`Input::derive_id`] for the credentials of `kind` the body lists for `user_id`
/// (the `n`th of them: index `n`): a credential's id is the body's, whichever process names it.
pub fn credential_id_label(kind: CredentialKind, user_id: &str) -> String {
    let kind = match kind {
        CredentialKind::ApiKey => "api-key",
        CredentialKind::Passkey => "passkey",
        CredentialKind::OauthIdentity => "oauth-identity",
        CredentialKind::Session => "session",
    };
    format!("credential/{kind}/{user_id}")
}

/// What a transition reads.
pub struct Input<'a> {
    pub state: &'a OrgState,
    pub activity_type: &'a str,
    /// The stamped body's parameters.
    pub params: &'a Value,
    /// The enclave's clock (an API key's expiry is counted from it).
    pub now_ms: Millis,
    /// `coffer_auth::envelope::derived_id(fingerprint, label, index)` of the stamped activity:
    /// the ids of the users ([`USER_ID`], by position in the body) and of the sub-organization
    /// ([`SUB_ORGANIZATION_ID`], index 0) the body creates.
    pub derive_id: &'a dyn Fn(&str, usize) -> String,
    /// Every credential the stamped body grants (`coffer_auth::grants::granted_credentials`).
    pub grants: &'a [Grant],
    /// A new sub-organization's wallet: the address of each account the body lists, in its
    /// order, as the enclave derived them from the wallet's sealed seed (none otherwise).
    pub wallet_addresses: &'a [String],
    /// Whether the enclave issued the auth proxy's key for this activity (enable_auth_proxy's
    /// first enabling: its certificate, checked genuine and this activity's own).
    pub auth_proxy_key_issued: bool,
}

impl Input<'_> {
    pub(crate) fn org(&self) -> String {
        self.state.organization.id.clone()
    }

    /// A change of this organization.
    pub(crate) fn change(&self, effect: Effect) -> Change {
        Change { organization_id: self.org(), effect }
    }

    pub(crate) fn invalid(&self, reason: impl Into<String>) -> TransitionError {
        TransitionError::Invalid { activity_type: self.activity_type.to_string(), reason: reason.into() }
    }

    pub(crate) fn text(&self, key: &str) -> Result<String, TransitionError> {
        text_of(self.params, key)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| self.invalid(format!("{key} is missing")))
    }

    pub(crate) fn opt_text(&self, key: &str) -> Option<String> {
        text_of(self.params, key)
    }

    /// A list of ids, each kept once (the handlers' `dedup`).
    pub(crate) fn texts(&self, key: &str) -> Vec<String> {
        dedup(raw_texts(self.params, key))
    }

    /// The id of the `index`th record labelled `label` (one of the `*_ID` labels) the stamped
    /// body makes, derived from it (no one names it); refused when the organization has it.
    pub(crate) fn derived_new_id(
        &self,
        label: &str,
        index: usize,
        taken: impl Fn(&str) -> bool,
    ) -> Result<String, TransitionError> {
        let id = (self.derive_id)(label, index);
        if id.is_empty() || taken(&id) {
            return Err(self.invalid(format!("the {label} the body makes exists already")));
        }
        Ok(id)
    }

    /// The id of the `n`th credential of `kind` the body lists for `user_id` in
    /// `organization_id` (derived from the body); refused when `taken` or already made in `out`.
    pub(crate) fn credential_id(
        &self,
        kind: CredentialKind,
        user_id: &str,
        n: usize,
        out: &[Change],
        taken: impl Fn(&str) -> bool,
    ) -> Result<String, TransitionError> {
        let id = (self.derive_id)(&credential_id_label(kind, user_id), n);
        let made = out.iter().any(|c| matches!(&c.effect, Effect::AddCredential { credential } if credential.id == id));
        if id.is_empty() || taken(&id) || made {
            return Err(self.invalid(format!("credential {id} the body makes exists already")));
        }
        Ok(id)
    }

    /// The public keys the body grants `user_id` of `organization_id` as `credential_type`, in
    /// body order; exactly `count` of them, or the body and its grants disagree.
    pub(crate) fn granted(
        &self,
        organization_id: &str,
        user_id: &str,
        credential_type: &str,
        count: usize,
    ) -> Result<Vec<String>, TransitionError> {
        let keys: Vec<String> = self
            .grants
            .iter()
            .filter(|g| {
                g.organization_id == organization_id && g.user_id == user_id && g.credential_type == credential_type
            })
            .map(|g| g.public_key.clone())
            .collect();
        if keys.len() != count {
            return Err(self.invalid(format!(
                "the body lists {count} {credential_type} credential(s) of user {user_id}, its grants {}",
                keys.len()
            )));
        }
        Ok(keys)
    }
}

pub(crate) fn text_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The objects of the list `key` of `v` (none when absent).
pub(crate) fn items<'v>(v: &'v Value, key: &str) -> &'v [Value] {
    v.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

/// The strings of the list `key` of `v`, as given (repeats kept).
pub(crate) fn raw_texts(v: &Value, key: &str) -> Vec<String> {
    items(v, key).iter().filter_map(Value::as_str).map(str::to_string).collect()
}

/// Keeps the first occurrence of each id.
pub(crate) fn dedup(ids: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(ids.len());
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// An integer as the handlers read one: a JSON number, or a decimal string (trimmed).
pub(crate) fn integer(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}
