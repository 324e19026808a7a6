//! Transitions of the organization's records and settings: policies, the root quorum, tags,
//! smart contract interfaces, webhook endpoints, OAuth 2.0 credentials, features and the auth
//! proxy. Each reads its values from the body (or, for an update, the state it changes) as the
//! gateway's handler writes them.

use serde_json::Value;

use super::input::{
    integer, raw_texts, Input, TransitionError, CONTRACT_INTERFACE_ID, OAUTH2_CREDENTIAL_ID, POLICY_ID,
    SESSION_PROFILE_ID, TAG_ID, USER_ID, WEBHOOK_ENDPOINT_ID,
};
use crate::effect::{Change, Effect, TagKind};
use crate::model::{
    ContractInterface, CredentialKind, IpAllowlist, IpRule, Named, Policy, SessionProfile, Tag, User,
    ORGANIZATION_ALLOWLIST,
};

type Changes = Result<Vec<Change>, TransitionError>;

fn policy_from(i: &Input<'_>, id: String, p: &Value) -> Result<Policy, TransitionError> {
    let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let name = text("policyName");
    if name.trim().is_empty() {
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

pub(crate) fn create_policy(i: &Input<'_>) -> Changes {
    let id = i.derived_new_id(POLICY_ID, 0, |id| i.state.policies.contains_key(id))?;
    Ok(vec![i.change(Effect::PutPolicy { policy: policy_from(i, id, i.params)? })])
}

pub(crate) fn create_policies(i: &Input<'_>) -> Changes {
    let list = i.params.get("policies").and_then(Value::as_array).ok_or_else(|| i.invalid("policies is missing"))?;
    let mut out = Vec::new();
    for (n, p) in list.iter().enumerate() {
        let id = i.derived_new_id(POLICY_ID, n, |id| i.state.policies.contains_key(id))?;
        out.push(i.change(Effect::PutPolicy { policy: policy_from(i, id, p)? }));
    }
    Ok(out)
}

pub(crate) fn update_policy(i: &Input<'_>) -> Changes {
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

pub(crate) fn delete_policy(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeletePolicies { ids: vec![i.text("policyId")?] })])
}

/// `delete_policies`: the ids as given (the gateway refuses repeats).
pub(crate) fn delete_policies(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeletePolicies { ids: raw_texts(i.params, "policyIds") })])
}

pub(crate) fn update_root_quorum(i: &Input<'_>) -> Changes {
    let threshold = integer(i.params.get("threshold")).filter(|t| *t >= 1);
    let threshold = threshold.ok_or_else(|| i.invalid("threshold is not a positive integer"))?;
    let user_ids = raw_texts(i.params, "userIds");
    if threshold as u64 > user_ids.len() as u64 {
        return Err(i.invalid("threshold is more than the number of quorum users"));
    }
    Ok(vec![i.change(Effect::SetRootQuorum { threshold, user_ids })])
}

pub(crate) fn delete_users(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeleteUsers { ids: i.texts("userIds") })])
}

fn tag_exists(i: &Input<'_>, kind: TagKind, id: &str) -> bool {
    match kind {
        TagKind::User => i.state.user_tags.contains_key(id),
        TagKind::PrivateKey => i.state.private_key_tags.contains_key(id),
    }
}

/// `create_user_tag` / `create_private_key_tag`: the tag, then its members (the gateway writes
/// the membership update even when the body lists none).
pub(crate) fn create_tag(i: &Input<'_>, kind: TagKind, name_key: &str, members_key: &str) -> Changes {
    let id = i.derived_new_id(TAG_ID, 0, |id| tag_exists(i, kind, id))?;
    let name = i.text(name_key)?;
    Ok(vec![
        i.change(Effect::PutTag { kind, tag: Tag { id: id.clone(), name } }),
        i.change(Effect::UpdateTag { kind, id, new_name: None, add: i.texts(members_key), remove: Vec::new() }),
    ])
}

/// `update_user_tag` / `update_private_key_tag`: members added and removed (each once), then
/// the new name.
pub(crate) fn update_tag(
    i: &Input<'_>,
    kind: TagKind,
    keys: [&str; 4], // id, new name, add, remove
) -> Changes {
    let [id_key, name_key, add_key, remove_key] = keys;
    let id = i.text(id_key)?;
    if !tag_exists(i, kind, &id) {
        return Err(i.invalid(format!("tag {id} does not exist")));
    }
    let (add, remove) = (i.texts(add_key), i.texts(remove_key));
    if let Some(both) = add.iter().find(|a| remove.contains(a)) {
        return Err(i.invalid(format!("{both} is both added to and removed from the tag")));
    }
    Ok(vec![i.change(Effect::UpdateTag { kind, id, new_name: i.opt_text(name_key), add, remove })])
}

pub(crate) fn delete_tags(i: &Input<'_>, kind: TagKind, key: &str) -> Changes {
    Ok(vec![i.change(Effect::DeleteTags { kind, ids: i.texts(key) })])
}

pub(crate) fn create_smart_contract_interface(i: &Input<'_>) -> Changes {
    let id = i.derived_new_id(CONTRACT_INTERFACE_ID, 0, |id| i.state.contract_interfaces.contains_key(id))?;
    let interface = ContractInterface {
        id,
        address: i.text("smartContractAddress")?,
        interface_type: i.text("type")?,
        body: i.text("smartContractInterface")?,
    };
    Ok(vec![i.change(Effect::PutContractInterface { interface })])
}

pub(crate) fn delete_smart_contract_interface(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeleteContractInterfaces { ids: vec![i.text("smartContractInterfaceId")?] })])
}

pub(crate) fn create_webhook_endpoint(i: &Input<'_>) -> Changes {
    let id = i.derived_new_id(WEBHOOK_ENDPOINT_ID, 0, |id| i.state.webhook_endpoints.contains_key(id))?;
    Ok(vec![i.change(Effect::PutWebhookEndpoint { endpoint: Named { id, value: i.text("url")? } })])
}

/// `update_webhook_endpoint`: the body's URL, or the endpoint's own when it gives none.
pub(crate) fn update_webhook_endpoint(i: &Input<'_>) -> Changes {
    let id = i.text("endpointId")?;
    let current =
        i.state.webhook_endpoints.get(&id).ok_or_else(|| i.invalid(format!("webhook endpoint {id} does not exist")))?;
    let value = i.opt_text("url").unwrap_or_else(|| current.value.clone());
    Ok(vec![i.change(Effect::PutWebhookEndpoint { endpoint: Named { id, value } })])
}

pub(crate) fn delete_webhook_endpoint(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeleteWebhookEndpoints { ids: vec![i.text("endpointId")?] })])
}

/// What an OAuth 2.0 credential names: `provider/clientId` (the gateway record's name).
pub fn oauth2_credential_value(provider: &str, client_id: &str) -> String {
    format!("{provider}/{client_id}")
}

pub(crate) fn create_oauth2_credential(i: &Input<'_>) -> Changes {
    let id = i.derived_new_id(OAUTH2_CREDENTIAL_ID, 0, |id| i.state.oauth2_credentials.contains_key(id))?;
    let value = oauth2_credential_value(&i.text("provider")?, &i.text("clientId")?);
    Ok(vec![i.change(Effect::PutOauth2Credential { credential: Named { id, value } })])
}

/// `update_oauth2_credential`: an empty provider or client id keeps the credential's own.
pub(crate) fn update_oauth2_credential(i: &Input<'_>) -> Changes {
    let id = i.text("oauth2CredentialId")?;
    let current = i
        .state
        .oauth2_credentials
        .get(&id)
        .ok_or_else(|| i.invalid(format!("oauth2 credential {id} does not exist")))?;
    // Providers are `OAUTH2_PROVIDER_*`: the first `/` ends the provider.
    let (provider, client_id) = current.value.split_once('/').unwrap_or((current.value.as_str(), ""));
    let given = |k: &str, old: &str| i.opt_text(k).filter(|v| !v.is_empty()).unwrap_or_else(|| old.to_string());
    let value = oauth2_credential_value(&given("provider", provider), &given("clientId", client_id));
    Ok(vec![i.change(Effect::PutOauth2Credential { credential: Named { id, value } })])
}

pub(crate) fn delete_oauth2_credential(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::DeleteOauth2Credentials { ids: vec![i.text("oauth2CredentialId")?] })])
}

pub(crate) fn set_organization_feature(i: &Input<'_>) -> Changes {
    let name = i.text("name")?;
    Ok(vec![i.change(Effect::SetFeature { name, value: i.opt_text("value").unwrap_or_default() })])
}

/// `update_organization_name`: a name (`fields::name`).
pub(crate) fn update_organization_name(i: &Input<'_>) -> Changes {
    let name = i.text("organizationName")?;
    crate::fields::name("organizationName", &name).map_err(|reason| i.invalid(reason))?;
    Ok(vec![i.change(Effect::SetOrganizationName { name })])
}

/// The most rules one IP allowlist holds, and the most allowlists (the organization's and its API
/// keys') one organization holds.
pub const MAX_IP_RULES: usize = 100;
pub const MAX_IP_ALLOWLISTS: usize = 100;

/// The key of the list `publicKey` names (lowercase hex), or the organization's own when absent.
pub fn ip_allowlist_key(params: &Value) -> String {
    match params.get("publicKey").and_then(Value::as_str).filter(|k| !k.trim().is_empty()) {
        None => ORGANIZATION_ALLOWLIST.to_string(),
        Some(key) => key.trim().trim_start_matches("0x").to_ascii_lowercase(),
    }
}

/// The list a `setIpAllowlistIntent` sets, with its key ([`ip_allowlist_key`]), given the one it
/// replaces: each rule a CIDR (IPv4 or IPv6) with an optional label, at most [`MAX_IP_RULES`];
/// `onEvaluationError` `ALLOW` or `DENY` (default); `enabled` only for the organization's list
/// (default: as it was, else off: setting rules enforces nothing until asked), an API key's
/// being enforced whenever the organization's is. One rule for the enclave's transition and the
/// gateway's record.
pub fn ip_allowlist(params: &Value, existing: Option<&IpAllowlist>) -> Result<(String, IpAllowlist), String> {
    let key = ip_allowlist_key(params);
    let rules = super::input::items(params, "rules");
    if rules.len() > MAX_IP_RULES {
        return Err(format!("rules: at most {MAX_IP_RULES}"));
    }
    let mut parsed = Vec::with_capacity(rules.len());
    for (n, r) in rules.iter().enumerate() {
        let cidr = super::input::text_of(r, "cidr").unwrap_or_default();
        if cidr.trim().parse::<ipnet::IpNet>().is_err() {
            return Err(format!("rules[{n}].cidr is not a CIDR (such as 203.0.113.0/24 or 2001:db8::/32): {cidr:?}"));
        }
        let label = super::input::text_of(r, "label").unwrap_or_default();
        if !label.is_empty() {
            crate::fields::name(&format!("rules[{n}].label"), &label)?;
        }
        parsed.push(IpRule { cidr: cidr.trim().to_string(), label });
    }
    let on_evaluation_error = match params.get("onEvaluationError").and_then(Value::as_str).unwrap_or_default() {
        "" | "DENY" => "DENY",
        "ALLOW" => "ALLOW",
        other => return Err(format!("onEvaluationError is ALLOW or DENY, not {other:?}")),
    };
    let enabled = match params.get("enabled").and_then(Value::as_bool) {
        _ if key != ORGANIZATION_ALLOWLIST => true,
        Some(e) => e,
        None => existing.is_some_and(|l| l.enabled),
    };
    Ok((key, IpAllowlist { enabled, on_evaluation_error: on_evaluation_error.to_string(), rules: parsed }))
}

/// `set_ip_allowlist` ([`ip_allowlist`]): only a top-level organization has lists (its
/// sub-organizations' requests are not evaluated); an API key's list names an API key of the
/// organization; at most [`MAX_IP_ALLOWLISTS`].
pub(crate) fn set_ip_allowlist(i: &Input<'_>) -> Changes {
    if i.state.organization.parent_id.is_some() {
        return Err(i.invalid("IP allowlists belong to a top-level organization: a sub-organization has none"));
    }
    let lists = &i.state.organization.ip_allowlists;
    let key = ip_allowlist_key(i.params);
    let (key, allowlist) = ip_allowlist(i.params, lists.get(&key)).map_err(|reason| i.invalid(reason))?;
    let api_key = |k: &str| i.state.credentials.values().any(|c| c.kind == CredentialKind::ApiKey && c.public_key == k);
    if key != ORGANIZATION_ALLOWLIST && !api_key(&key) {
        return Err(i.invalid(format!("publicKey {key} is not an API key of this organization")));
    }
    if !lists.contains_key(&key) && lists.len() >= MAX_IP_ALLOWLISTS {
        return Err(i.invalid(format!("an organization has at most {MAX_IP_ALLOWLISTS} IP allowlists")));
    }
    Ok(vec![i.change(Effect::PutIpAllowlist { key, allowlist })])
}

/// The most session profiles one organization holds (they are never deleted).
pub const MAX_SESSION_PROFILES: usize = 100;
/// The longest a session profile's sessions may be asked to live (`expirationSeconds`): a year.
pub const MAX_SESSION_PROFILE_SECONDS: u64 = 365 * 24 * 3600;

/// The profile a `createSessionProfileIntent` makes: a name (`fields::name`), a scope that
/// parses as a policy condition (bounded as one), an optional lifetime of 1 s to
/// [`MAX_SESSION_PROFILE_SECONDS`], notes of at most 1,024 characters. One rule for the
/// enclave's transition and the gateway's record.
pub fn session_profile(params: &Value) -> Result<SessionProfile, String> {
    let text = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let name = text("sessionProfileName");
    crate::fields::name("sessionProfileName", &name)?;
    let scope = text("scope");
    if scope.trim().is_empty() {
        return Err("scope is missing".into());
    }
    coffer_policy::parse_condition(&scope).map_err(|e| format!("invalid scope: {e}"))?;
    let expiration_seconds = match params.get("expirationSeconds").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match super::users::expiration_seconds(v) {
            Some(s) if (1..=MAX_SESSION_PROFILE_SECONDS).contains(&s) => Some(s),
            _ => return Err(format!("expirationSeconds is not 1 to {MAX_SESSION_PROFILE_SECONDS}")),
        },
    };
    let notes = text("notes");
    if notes.chars().count() > 1024 {
        return Err("notes: at most 1024 characters".into());
    }
    Ok(SessionProfile { name, scope, expiration_seconds, notes })
}

/// `create_session_profile` ([`session_profile`]), its id derived from the body; at most
/// [`MAX_SESSION_PROFILES`].
pub(crate) fn create_session_profile(i: &Input<'_>) -> Changes {
    let profiles = &i.state.organization.session_profiles;
    if profiles.len() >= MAX_SESSION_PROFILES {
        return Err(i.invalid(format!("an organization has at most {MAX_SESSION_PROFILES} session profiles")));
    }
    let profile = session_profile(i.params).map_err(|reason| i.invalid(reason))?;
    let id = i.derived_new_id(SESSION_PROFILE_ID, 0, |id| profiles.contains_key(id))?;
    Ok(vec![i.change(Effect::PutSessionProfile { id, profile })])
}

/// `remove_ip_allowlist`: the organization's list or an API key's (`publicKey`), which must exist.
pub(crate) fn remove_ip_allowlist(i: &Input<'_>) -> Changes {
    let key = ip_allowlist_key(i.params);
    if !i.state.organization.ip_allowlists.contains_key(&key) {
        return Err(i.invalid("no such IP allowlist"));
    }
    Ok(vec![i.change(Effect::RemoveIpAllowlist { key })])
}

pub(crate) fn remove_organization_feature(i: &Input<'_>) -> Changes {
    Ok(vec![i.change(Effect::RemoveFeature { name: i.text("name")? })])
}

/// Coffer's own feature: the organization's new private keys (P-256, and secp256k1 where the
/// module makes such keys) are made and used in the HSM and never leave it.
pub const HSM_NATIVE_KEYS_FEATURE: &str = "FEATURE_NAME_COFFER_HSM_NATIVE_KEYS";
/// The feature `enable_auth_proxy` sets and `disable_auth_proxy` removes.
pub const AUTH_PROXY_FEATURE: &str = "FEATURE_NAME_AUTH_PROXY";
/// The policy `enable_auth_proxy` makes for the proxy's user (gateway/src/ops/proxy_config.rs).
pub const AUTH_PROXY_POLICY_NAME: &str = "Coffer auth proxy: login activities";
/// What it lets the proxy's user submit: code exchanges, OAuth and one-time code logins, sign-ups.
pub const AUTH_PROXY_POLICY_CONDITION: &str = "activity.type == 'ACTIVITY_TYPE_OAUTH2_AUTHENTICATE' || activity.type == 'ACTIVITY_TYPE_OAUTH_LOGIN' || activity.type == 'ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8' || activity.type == 'ACTIVITY_TYPE_INIT_OTP_V3' || activity.type == 'ACTIVITY_TYPE_VERIFY_OTP_V2' || activity.type == 'ACTIVITY_TYPE_OTP_LOGIN_V2'";
/// The user `enable_auth_proxy` makes.
pub const AUTH_PROXY_USER_NAME: &str = "Auth Proxy";

/// The auth proxy policy's consensus: only its user.
pub fn auth_proxy_policy_consensus(user_id: &str) -> String {
    format!("approvers.any(user, user.id == '{user_id}')")
}

/// `enable_auth_proxy`. The first time (no auth proxy policy yet, and the enclave issued the
/// proxy's key for this activity), the proxy's user (its id derived from the body, without
/// credentials: the enclave records the proxy's key itself) and the policy that lets it submit
/// login activities; then, as on every enabling, the flag and the feature.
pub(crate) fn enable_auth_proxy(i: &Input<'_>) -> Changes {
    if i.state.organization.auth_proxy_enabled {
        return Err(i.invalid("the auth proxy is already enabled"));
    }
    let mut out = Vec::new();
    let first = !i.state.policies.values().any(|p| p.name == AUTH_PROXY_POLICY_NAME);
    if first && i.auth_proxy_key_issued {
        let user_id = i.derived_new_id(USER_ID, 0, |id| i.state.users.contains_key(id))?;
        out.push(i.change(Effect::PutUser {
            user: User { id: user_id.clone(), name: AUTH_PROXY_USER_NAME.into(), ..Default::default() },
        }));
        let policy = Policy {
            id: i.derived_new_id(POLICY_ID, 0, |id| i.state.policies.contains_key(id))?,
            name: AUTH_PROXY_POLICY_NAME.into(),
            effect: "EFFECT_ALLOW".into(),
            condition: AUTH_PROXY_POLICY_CONDITION.into(),
            consensus: auth_proxy_policy_consensus(&user_id),
            time: String::new(),
        };
        out.push(i.change(Effect::PutPolicy { policy }));
    }
    out.push(i.change(Effect::SetAuthProxy { enabled: true }));
    out.push(i.change(Effect::SetFeature { name: AUTH_PROXY_FEATURE.into(), value: String::new() }));
    Ok(out)
}

pub(crate) fn disable_auth_proxy(i: &Input<'_>) -> Changes {
    if !i.state.organization.auth_proxy_enabled {
        return Err(i.invalid("the auth proxy is not enabled"));
    }
    let mut out = vec![i.change(Effect::SetAuthProxy { enabled: false })];
    if i.state.organization.features.contains_key(AUTH_PROXY_FEATURE) {
        out.push(i.change(Effect::RemoveFeature { name: AUTH_PROXY_FEATURE.into() }));
    }
    Ok(out)
}

/// `update_auth_proxy_config`: its record is written back with the flag as it is, and an
/// `appName` in the body (checked by [`auth_proxy_app_name`]) becomes the app name the proxy's
/// codes carry, which the enclave holds the proxy's sends to.
pub(crate) fn update_auth_proxy_config(i: &Input<'_>) -> Changes {
    let mut out = vec![i.change(Effect::SetAuthProxy { enabled: i.state.organization.auth_proxy_enabled })];
    if let Some(app_name) = auth_proxy_app_name(i.params).map_err(|reason| i.invalid(reason))? {
        out.push(i.change(Effect::SetAuthProxyAppName { app_name }));
    }
    Ok(out)
}

/// The longest auth proxy `appName` (characters): a brand, which a subject line carries.
pub const AUTH_PROXY_APP_NAME_MAX_CHARS: usize = 64;
/// The app name of the auth proxy's codes when its configuration sets none.
pub const DEFAULT_AUTH_PROXY_APP_NAME: &str = "Coffer";

/// `appName` of an `update_auth_proxy_config` body: `None` when absent (or null), else the
/// trimmed name (empty: back to none), at most [`AUTH_PROXY_APP_NAME_MAX_CHARS`] characters and
/// no control characters; a reason otherwise.
pub fn auth_proxy_app_name(params: &Value) -> Result<Option<String>, String> {
    let name = match params.get("appName") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.trim(),
        Some(_) => return Err("appName: a string".into()),
    };
    if name.chars().count() > AUTH_PROXY_APP_NAME_MAX_CHARS || name.chars().any(char::is_control) {
        return Err(format!("appName: at most {AUTH_PROXY_APP_NAME_MAX_CHARS} characters, no control characters"));
    }
    Ok(Some(name.to_string()))
}

/// The app name the auth proxy of `organization` sends its codes under: its configuration's, as
/// the authority state holds it, else [`DEFAULT_AUTH_PROXY_APP_NAME`].
pub fn proxy_app_name(organization: &crate::model::Organization) -> &str {
    match organization.auth_proxy_app_name.as_str() {
        "" => DEFAULT_AUTH_PROXY_APP_NAME,
        name => name,
    }
}
