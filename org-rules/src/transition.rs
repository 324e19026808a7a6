//! What each activity does to authority state, computed from its stamped parameters alone
//! ([`expected`]): the enclave applies these changes and returns them, and the gateway's records
//! follow them. Every new record's id is derived from the stamped body; a new sub-organization's
//! addresses and the auth proxy's key come from the enclave's own work.

mod input;
mod invitations;
mod records;
mod results;
mod users;

pub use input::{
    credential_id_label, Grant, Input, TransitionError, CONTRACT_INTERFACE_ID, INVITATION_ID, ISSUED_CREDENTIAL_ID,
    OAUTH2_CREDENTIAL_ID, POLICY_ID, SESSION_PROFILE_ID, SUB_ORGANIZATION_ID, TAG_ID, USER_ID, WALLET_ACCOUNT_ID,
    WALLET_ID, WEBHOOK_ENDPOINT_ID,
};
pub use invitations::{
    invitation, ACCESS_TYPES, INVITATION_CREATED, MAX_INVITATIONS_PER_ACTIVITY, MAX_INVITATION_TAGS,
    MAX_OPEN_INVITATIONS, WEB_ONLY,
};
pub use records::{
    auth_proxy_app_name, auth_proxy_policy_consensus, ip_allowlist, ip_allowlist_key, oauth2_credential_value,
    proxy_app_name, session_profile, AUTH_PROXY_APP_NAME_MAX_CHARS, AUTH_PROXY_FEATURE, AUTH_PROXY_POLICY_CONDITION,
    AUTH_PROXY_POLICY_NAME, AUTH_PROXY_USER_NAME, DEFAULT_AUTH_PROXY_APP_NAME, HSM_NATIVE_KEYS_FEATURE,
    MAX_IP_ALLOWLISTS, MAX_IP_RULES, MAX_SESSION_PROFILES, MAX_SESSION_PROFILE_SECONDS,
};
pub use results::made_ids;
pub use users::{
    api_key_type, API_ONLY_CURVE, MAX_API_KEY_EXPIRATION_SECONDS, OAUTH_CREDENTIAL_TYPE, WEBAUTHN_CREDENTIAL_TYPE,
};

use crate::effect::{Change, TagKind};
use crate::model::CredentialKind;

type Transition = fn(&Input<'_>) -> Result<Vec<Change>, TransitionError>;

/// The activity types with a transition: the ones whose handlers change authority state. Key
/// operations (wallets, private keys, exports, imports) and logins record their own facts in
/// the enclave; any other type changes nothing here.
pub const TYPES: &[&str] = &[
    "ACTIVITY_TYPE_CREATE_POLICY_V3",
    "ACTIVITY_TYPE_CREATE_POLICIES",
    "ACTIVITY_TYPE_UPDATE_POLICY_V2",
    "ACTIVITY_TYPE_DELETE_POLICY",
    "ACTIVITY_TYPE_DELETE_POLICIES",
    "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM",
    "ACTIVITY_TYPE_CREATE_USERS_V4",
    "ACTIVITY_TYPE_CREATE_API_ONLY_USERS",
    "ACTIVITY_TYPE_UPDATE_USER",
    "ACTIVITY_TYPE_UPDATE_ORGANIZATION_NAME",
    "ACTIVITY_TYPE_SET_IP_ALLOWLIST",
    "ACTIVITY_TYPE_CREATE_SESSION_PROFILE",
    "ACTIVITY_TYPE_CREATE_INVITATIONS",
    "ACTIVITY_TYPE_DELETE_INVITATION",
    "ACTIVITY_TYPE_ACCEPT_INVITATION_V2",
    "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST",
    "ACTIVITY_TYPE_UPDATE_USER_NAME",
    "ACTIVITY_TYPE_UPDATE_USER_EMAIL",
    "ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER",
    "ACTIVITY_TYPE_DELETE_USERS",
    "ACTIVITY_TYPE_CREATE_API_KEYS_V2",
    "ACTIVITY_TYPE_DELETE_API_KEYS",
    "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2",
    "ACTIVITY_TYPE_RECOVER_USER",
    "ACTIVITY_TYPE_DELETE_AUTHENTICATORS",
    "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2",
    "ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS",
    "ACTIVITY_TYPE_CREATE_USER_TAG",
    "ACTIVITY_TYPE_UPDATE_USER_TAG",
    "ACTIVITY_TYPE_DELETE_USER_TAGS",
    "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG",
    "ACTIVITY_TYPE_UPDATE_PRIVATE_KEY_TAG",
    "ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS",
    "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE",
    "ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE",
    "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
    "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
    "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT",
    "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
    "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE",
    "ACTIVITY_TYPE_ENABLE_AUTH_PROXY",
    "ACTIVITY_TYPE_DISABLE_AUTH_PROXY",
    "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG",
    "ACTIVITY_TYPE_DELETE_WALLETS",
    "ACTIVITY_TYPE_UPDATE_WALLET",
    "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS",
    "ACTIVITY_TYPE_DELETE_PRIVATE_KEYS",
    "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
    "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION",
];

fn transition(activity_type: &str) -> Option<Transition> {
    use records as r;
    use users as u;
    Some(match activity_type {
        "ACTIVITY_TYPE_CREATE_POLICY_V3" => r::create_policy,
        "ACTIVITY_TYPE_CREATE_POLICIES" => r::create_policies,
        "ACTIVITY_TYPE_UPDATE_POLICY_V2" => r::update_policy,
        "ACTIVITY_TYPE_DELETE_POLICY" => r::delete_policy,
        "ACTIVITY_TYPE_DELETE_POLICIES" => r::delete_policies,
        "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM" => r::update_root_quorum,
        "ACTIVITY_TYPE_CREATE_USERS_V4" => u::create_users,
        "ACTIVITY_TYPE_CREATE_API_ONLY_USERS" => u::create_api_only_users,
        "ACTIVITY_TYPE_UPDATE_USER" => u::update_user,
        "ACTIVITY_TYPE_UPDATE_ORGANIZATION_NAME" => r::update_organization_name,
        "ACTIVITY_TYPE_SET_IP_ALLOWLIST" => r::set_ip_allowlist,
        "ACTIVITY_TYPE_CREATE_SESSION_PROFILE" => r::create_session_profile,
        "ACTIVITY_TYPE_CREATE_INVITATIONS" => invitations::create_invitations,
        "ACTIVITY_TYPE_DELETE_INVITATION" => invitations::delete_invitation,
        "ACTIVITY_TYPE_ACCEPT_INVITATION_V2" => invitations::accept_invitation,
        "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST" => r::remove_ip_allowlist,
        "ACTIVITY_TYPE_UPDATE_USER_NAME" => |i| u::update_user_field(i, "userName"),
        "ACTIVITY_TYPE_UPDATE_USER_EMAIL" => |i| u::update_user_field(i, "userEmail"),
        "ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER" => |i| u::update_user_field(i, "userPhoneNumber"),
        "ACTIVITY_TYPE_DELETE_USERS" => r::delete_users,
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2" => u::create_api_keys,
        "ACTIVITY_TYPE_DELETE_API_KEYS" => |i| u::remove_credentials(i, CredentialKind::ApiKey, "apiKeyIds"),
        "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2" => u::create_authenticators,
        "ACTIVITY_TYPE_RECOVER_USER" => u::recover_user,
        "ACTIVITY_TYPE_DELETE_AUTHENTICATORS" => {
            |i| u::remove_credentials(i, CredentialKind::Passkey, "authenticatorIds")
        }
        "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2" => u::create_oauth_providers,
        "ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS" => {
            |i| u::remove_credentials(i, CredentialKind::OauthIdentity, "providerIds")
        }
        "ACTIVITY_TYPE_CREATE_USER_TAG" => |i| r::create_tag(i, TagKind::User, "userTagName", "userIds"),
        "ACTIVITY_TYPE_UPDATE_USER_TAG" => {
            |i| r::update_tag(i, TagKind::User, ["userTagId", "newUserTagName", "addUserIds", "removeUserIds"])
        }
        "ACTIVITY_TYPE_DELETE_USER_TAGS" => |i| r::delete_tags(i, TagKind::User, "userTagIds"),
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG" => {
            |i| r::create_tag(i, TagKind::PrivateKey, "privateKeyTagName", "privateKeyIds")
        }
        "ACTIVITY_TYPE_UPDATE_PRIVATE_KEY_TAG" => |i| {
            let keys = ["privateKeyTagId", "newPrivateKeyTagName", "addPrivateKeyIds", "removePrivateKeyIds"];
            r::update_tag(i, TagKind::PrivateKey, keys)
        },
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS" => |i| r::delete_tags(i, TagKind::PrivateKey, "privateKeyTagIds"),
        "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE" => r::create_smart_contract_interface,
        "ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE" => r::delete_smart_contract_interface,
        "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT" => r::create_webhook_endpoint,
        "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT" => r::update_webhook_endpoint,
        "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT" => r::delete_webhook_endpoint,
        "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL" => r::create_oauth2_credential,
        "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL" => r::update_oauth2_credential,
        "ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL" => r::delete_oauth2_credential,
        "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE" => r::set_organization_feature,
        "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE" => r::remove_organization_feature,
        "ACTIVITY_TYPE_ENABLE_AUTH_PROXY" => r::enable_auth_proxy,
        "ACTIVITY_TYPE_DISABLE_AUTH_PROXY" => r::disable_auth_proxy,
        "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG" => r::update_auth_proxy_config,
        "ACTIVITY_TYPE_DELETE_WALLETS" => u::delete_wallets,
        "ACTIVITY_TYPE_UPDATE_WALLET" => u::update_wallet,
        "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS" => u::delete_wallet_accounts,
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEYS" => u::delete_private_keys,
        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8" => u::create_sub_organization,
        "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION" => u::delete_sub_organization,
        _ => return None,
    })
}

pub use users::{marks_auth_proxy_signup, verifies_contacts, AUTH_PROXY_SIGNUP};

/// Whether [`expected`] knows what `activity_type` does to authority state.
pub fn known(activity_type: &str) -> bool {
    transition(activity_type).is_some()
}

/// The changes the stamped activity asks of its organization's state, in order. An activity
/// type without a transition asks for none.
pub fn expected(input: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    match transition(input.activity_type) {
        Some(t) => t(input),
        None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests;
