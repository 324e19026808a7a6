//! What each activity does to authority state, from its stamped parameters: the gateway
//! proposes the changes its records will get, and [`check`] requires them to be exactly the
//! ones the stamped body asks for (the gateway chooses only the new records' ids).

use serde_json::Value;

use crate::effect::{Change, Effect, TagKind};
use crate::model::{AuthorityState, Credential, CredentialKind, Millis, Policy, Tag};

/// Why a proposal is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The stamped body asks for something else than the proposal does.
    #[error("the proposed changes are not what the stamped body asks for: {0}")]
    Mismatch(String),
    /// The stamped body cannot be read as its activity type.
    #[error("the stamped body is not a valid {activity_type}: {reason}")]
    Invalid { activity_type: String, reason: String },
}

/// What a transition reads.
pub struct Input<'a> {
    pub state: &'a AuthorityState,
    pub activity_type: &'a str,
    pub params: &'a Value,
    pub proposal: &'a [Change],
    pub now_ms: Millis,
}

impl Input<'_> {
    fn org(&self) -> String {
        self.state.organization.id.clone()
    }

    fn change(&self, effect: Effect) -> Change {
        Change { organization_id: self.org(), effect }
    }

    fn invalid(&self, reason: impl Into<String>) -> TransitionError {
        TransitionError::Invalid { activity_type: self.activity_type.to_string(), reason: reason.into() }
    }

    fn text(&self, key: &str) -> Result<String, TransitionError> {
        self.params
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| self.invalid(format!("{key} is missing")))
    }

    fn opt_text(&self, key: &str) -> Option<String> {
        self.params.get(key).and_then(Value::as_str).map(str::to_string)
    }

    fn texts(&self, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in self.params.get(key).and_then(Value::as_array).into_iter().flatten() {
            if let Some(s) = v.as_str() {
                if !out.iter().any(|o| o == s) {
                    out.push(s.to_string());
                }
            }
        }
        out
    }

    /// The id the proposal gives the record made by its `n`th change: the gateway names new
    /// records; an id already in use is refused.
    fn new_id(&self, n: usize, taken: impl Fn(&str) -> bool) -> Result<String, TransitionError> {
        let id = self.proposal.get(n).and_then(|c| proposed_id(&c.effect)).unwrap_or_default();
        if id.is_empty() || id.len() > 128 || taken(&id) {
            return Err(TransitionError::Mismatch(format!("change {n} does not name a new record")));
        }
        Ok(id)
    }
}

/// The id of the record an effect creates, as proposed.
fn proposed_id(e: &Effect) -> Option<String> {
    Some(match e {
        Effect::PutPolicy { policy } => policy.id.clone(),
        Effect::AddCredential { credential } => credential.id.clone(),
        Effect::PutUser { user } => user.id.clone(),
        Effect::PutTag { tag, .. } => tag.id.clone(),
        Effect::PutContractInterface { interface } => interface.id.clone(),
        Effect::PutWebhookEndpoint { endpoint } => endpoint.id.clone(),
        Effect::PutOauth2Credential { credential } => credential.id.clone(),
        Effect::CreateOrganization { organization } => organization.id.clone(),
        _ => return None,
    })
}

type Transition = fn(&Input<'_>) -> Result<Vec<Change>, TransitionError>;

/// The activity types whose transitions are written here, and nothing else changes authority
/// state through [`check`] (key operations record their own facts in the enclave).
fn transition(activity_type: &str) -> Option<Transition> {
    Some(match activity_type {
        "ACTIVITY_TYPE_CREATE_POLICY_V3" => create_policy,
        "ACTIVITY_TYPE_CREATE_POLICIES" => create_policies,
        "ACTIVITY_TYPE_UPDATE_POLICY_V2" => update_policy,
        "ACTIVITY_TYPE_DELETE_POLICY" => {
            |i| Ok(vec![i.change(Effect::DeletePolicies { ids: vec![i.text("policyId")?] })])
        }
        "ACTIVITY_TYPE_DELETE_POLICIES" => |i| Ok(vec![i.change(Effect::DeletePolicies { ids: i.texts("policyIds") })]),
        "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM" => update_root_quorum,
        "ACTIVITY_TYPE_DELETE_USERS" => |i| Ok(vec![i.change(Effect::DeleteUsers { ids: i.texts("userIds") })]),
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2" => create_api_keys,
        "ACTIVITY_TYPE_DELETE_API_KEYS" => |i| {
            let effect = Effect::RemoveCredentials {
                user_id: i.text("userId")?,
                kind: CredentialKind::ApiKey,
                ids: i.texts("apiKeyIds"),
            };
            Ok(vec![i.change(effect)])
        },
        "ACTIVITY_TYPE_CREATE_USER_TAG" => |i| create_tag(i, TagKind::User, "userTagName", "userIds"),
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG" => {
            |i| create_tag(i, TagKind::PrivateKey, "privateKeyTagName", "privateKeyIds")
        }
        "ACTIVITY_TYPE_DELETE_USER_TAGS" => {
            |i| Ok(vec![i.change(Effect::DeleteTags { kind: TagKind::User, ids: i.texts("userTagIds") })])
        }
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS" => {
            |i| Ok(vec![i.change(Effect::DeleteTags { kind: TagKind::PrivateKey, ids: i.texts("privateKeyTagIds") })])
        }
        _ => return None,
    })
}

/// Whether [`check`] knows what `activity_type` does to authority state.
pub fn known(activity_type: &str) -> bool {
    transition(activity_type).is_some()
}

/// Checks that `proposal` is exactly what the stamped activity asks of its organization's
/// state. An activity type without a transition here may propose nothing.
pub fn check(input: &Input<'_>) -> Result<(), TransitionError> {
    let expected = match transition(input.activity_type) {
        Some(t) => t(input)?,
        None => Vec::new(),
    };
    if expected != input.proposal {
        return Err(TransitionError::Mismatch(format!(
            "{} asks for {} change(s), {} proposed",
            input.activity_type,
            expected.len(),
            input.proposal.len()
        )));
    }
    Ok(())
}

fn policy_from(i: &Input<'_>, id: String, p: &Value) -> Result<Policy, TransitionError> {
    let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let name = text("policyName");
    if name.is_empty() {
        return Err(i.invalid("policyName is missing"));
    }
    Ok(Policy {
        id,
        name,
        effect: text("effect"),
        condition: text("condition"),
        consensus: text("consensus"),
        time: text("time"),
    })
}

fn create_policy(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let id = i.new_id(0, |id| i.state.policies.contains_key(id))?;
    Ok(vec![i.change(Effect::PutPolicy { policy: policy_from(i, id, i.params)? })])
}

fn create_policies(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let list = i.params.get("policies").and_then(Value::as_array).ok_or_else(|| i.invalid("policies is missing"))?;
    let mut out = Vec::new();
    for (n, p) in list.iter().enumerate() {
        let id = i.new_id(n, |id| {
            i.state.policies.contains_key(id)
                || out.iter().any(|c: &Change| proposed_id(&c.effect).as_deref() == Some(id))
        })?;
        out.push(i.change(Effect::PutPolicy { policy: policy_from(i, id, p)? }));
    }
    Ok(out)
}

fn update_policy(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let id = i.text("policyId")?;
    let mut p = i.state.policies.get(&id).cloned().ok_or_else(|| i.invalid(format!("policy {id} does not exist")))?;
    if let Some(v) = i.opt_text("policyName") {
        p.name = v;
    }
    if let Some(v) = i.opt_text("policyEffect") {
        p.effect = v;
    }
    if let Some(v) = i.opt_text("policyCondition") {
        p.condition = v;
    }
    if let Some(v) = i.opt_text("policyConsensus") {
        p.consensus = v;
    }
    if let Some(v) = i.opt_text("time") {
        p.time = v;
    }
    Ok(vec![i.change(Effect::PutPolicy { policy: p })])
}

fn update_root_quorum(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let threshold = i.params.get("threshold").and_then(|t| t.as_i64().or_else(|| t.as_str()?.parse().ok()));
    let threshold = threshold.ok_or_else(|| i.invalid("threshold is not an integer"))?;
    Ok(vec![i.change(Effect::SetRootQuorum { threshold, user_ids: i.texts("userIds") })])
}

/// The credential type an API key of `curve_type` is certified as.
pub fn api_key_type(curve_type: &str) -> Option<&'static str> {
    Some(match curve_type {
        "API_KEY_CURVE_P256" => "CREDENTIAL_TYPE_API_KEY_P256",
        "API_KEY_CURVE_SECP256K1" => "CREDENTIAL_TYPE_API_KEY_SECP256K1",
        "API_KEY_CURVE_ED25519" => "CREDENTIAL_TYPE_API_KEY_ED25519",
        _ => return None,
    })
}

/// `expirationSeconds` as the gateway reads it (a decimal string or a number).
fn expiration_seconds(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.trim().parse().ok())
}

/// The API keys of one user the body lists, as credentials with the proposal's ids. A key's
/// expiry is the proposal's when it is within a minute of `now + expirationSeconds`.
fn api_key_credentials(
    i: &Input<'_>,
    user_id: &str,
    keys: &[Value],
    first: usize,
) -> Result<Vec<Change>, TransitionError> {
    let mut out = Vec::new();
    for (n, k) in keys.iter().enumerate() {
        let text = |f: &str| k.get(f).and_then(Value::as_str).unwrap_or_default();
        let credential_type = api_key_type(text("curveType"))
            .ok_or_else(|| i.invalid(format!("apiKeys[{n}].curveType is not a curve")))?;
        let id = i.new_id(first + n, |id| i.state.credentials.contains_key(id))?;
        let proposed = match i.proposal.get(first + n).map(|c| &c.effect) {
            Some(Effect::AddCredential { credential }) => credential.expires_at_ms,
            _ => 0,
        };
        let expires_at_ms = match k.get("expirationSeconds").and_then(expiration_seconds) {
            None => 0,
            Some(s) => {
                let at = (i.now_ms.max(0) as u64).saturating_add(s.saturating_mul(1000));
                if proposed.abs_diff(at) <= 60_000 {
                    proposed
                } else {
                    at
                }
            }
        };
        out.push(i.change(Effect::AddCredential {
            credential: Credential {
                id,
                user_id: user_id.to_string(),
                kind: CredentialKind::ApiKey,
                credential_type: credential_type.to_string(),
                public_key: text("publicKey").to_ascii_lowercase(),
                expires_at_ms,
            },
        }));
    }
    Ok(out)
}

fn create_api_keys(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let user_id = i.text("userId")?;
    let keys = i.params.get("apiKeys").and_then(Value::as_array).cloned().unwrap_or_default();
    api_key_credentials(i, &user_id, &keys, 0)
}

fn create_tag(i: &Input<'_>, kind: TagKind, name_key: &str, members_key: &str) -> Result<Vec<Change>, TransitionError> {
    let taken = |id: &str| match kind {
        TagKind::User => i.state.user_tags.contains_key(id),
        TagKind::PrivateKey => i.state.private_key_tags.contains_key(id),
    };
    let id = i.new_id(0, taken)?;
    let name = i.text(name_key)?;
    let mut out = vec![i.change(Effect::PutTag { kind, tag: Tag { id: id.clone(), name } })];
    let members = i.texts(members_key);
    if !members.is_empty() {
        out.push(i.change(Effect::UpdateTag { kind, id, new_name: None, add: members, remove: Vec::new() }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{Organization, User};

    fn state() -> AuthorityState {
        let mut s = AuthorityState::new(Organization {
            id: "o".into(),
            root_quorum_threshold: 1,
            root_user_ids: vec!["r".into()],
            ..Default::default()
        });
        s.apply(&Effect::PutUser { user: User { id: "r".into(), ..Default::default() } }).unwrap();
        s
    }

    fn run(s: &AuthorityState, ty: &str, params: Value, proposal: Vec<Effect>) -> Result<(), TransitionError> {
        let proposal: Vec<Change> =
            proposal.into_iter().map(|effect| Change { organization_id: "o".into(), effect }).collect();
        check(&Input { state: s, activity_type: ty, params: &params, proposal: &proposal, now_ms: 0 })
    }

    fn policy(id: &str, effect: &str) -> Effect {
        Effect::PutPolicy {
            policy: Policy {
                id: id.into(),
                name: "n".into(),
                effect: effect.into(),
                condition: "true".into(),
                consensus: String::new(),
                time: String::new(),
            },
        }
    }

    #[test]
    fn a_proposal_must_be_what_the_body_asks() {
        let s = state();
        let body = json!({"policyName": "n", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""});
        let ty = "ACTIVITY_TYPE_CREATE_POLICY_V3";
        assert_eq!(run(&s, ty, body.clone(), vec![policy("p1", "EFFECT_ALLOW")]), Ok(()));
        assert!(matches!(
            run(&s, ty, body.clone(), vec![policy("p1", "EFFECT_DENY")]),
            Err(TransitionError::Mismatch(_))
        ));
        assert!(matches!(run(&s, ty, body.clone(), vec![]), Err(TransitionError::Mismatch(_))));
        assert!(matches!(
            run(
                &s,
                ty,
                body,
                vec![policy("p1", "EFFECT_ALLOW"), Effect::SetRootQuorum { threshold: 1, user_ids: vec![] }]
            ),
            Err(TransitionError::Mismatch(_))
        ));
        // A type with no transition proposes nothing.
        assert_eq!(run(&s, "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", json!({}), vec![]), Ok(()));
        assert!(run(&s, "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", json!({}), vec![policy("p", "EFFECT_ALLOW")]).is_err());
    }

    #[test]
    fn an_api_key_is_the_one_in_the_body() {
        let s = state();
        let ty = "ACTIVITY_TYPE_CREATE_API_KEYS_V2";
        let body = json!({"userId": "r", "apiKeys": [{"apiKeyName": "k", "publicKey": "02AB", "curveType": "API_KEY_CURVE_P256"}]});
        let key = |pk: &str, user: &str| Effect::AddCredential {
            credential: Credential {
                id: "k1".into(),
                user_id: user.into(),
                kind: CredentialKind::ApiKey,
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                public_key: pk.into(),
                expires_at_ms: 0,
            },
        };
        assert_eq!(run(&s, ty, body.clone(), vec![key("02ab", "r")]), Ok(()));
        assert!(run(&s, ty, body.clone(), vec![key("02cd", "r")]).is_err(), "another key");
        assert!(run(&s, ty, body, vec![key("02ab", "x")]).is_err(), "another user");
    }
}
