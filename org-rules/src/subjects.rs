//! What each activity type is to the policy engine and the activity log: its resource and action
//! (spec 12.4), whether only the root quorum decides it, and the API's names of its intent and
//! result. The gateway's operation registry is checked against this table (gateway/src/ops/mod.rs),
//! so the enclave and the gateway read one list.

/// An activity type's policy subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject {
    pub activity_type: &'static str,
    pub resource: &'static str,
    pub action: &'static str,
    pub root_quorum: bool,
    /// The member of an activity's `intent` that holds its parameters, as the API names it.
    pub intent_key: &'static str,
    /// The member of an activity's `result` that holds its result, as the API names it.
    pub result_key: &'static str,
}

const fn s(
    activity_type: &'static str,
    resource: &'static str,
    action: &'static str,
    root_quorum: bool,
    intent_key: &'static str,
    result_key: &'static str,
) -> Subject {
    Subject { activity_type, resource, action, root_quorum, intent_key, result_key }
}

/// Every activity type an organization can submit.
pub static SUBJECTS: &[Subject] = &[
    s("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "CREATE", false, "createWalletIntent", "createWalletResult"),
    s(
        "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS",
        "WALLET",
        "CREATE",
        false,
        "createWalletAccountsIntent",
        "createWalletAccountsResult",
    ),
    s("ACTIVITY_TYPE_DELETE_WALLETS", "WALLET", "DELETE", false, "deleteWalletsIntent", "deleteWalletsResult"),
    s("ACTIVITY_TYPE_UPDATE_WALLET", "WALLET", "UPDATE", false, "updateWalletIntent", "updateWalletResult"),
    s(
        "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS",
        "WALLET",
        "DELETE",
        false,
        "deleteWalletAccountsIntent",
        "deleteWalletAccountsResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2",
        "PRIVATE_KEY",
        "CREATE",
        false,
        "createPrivateKeysIntentV2",
        "createPrivateKeysResultV2",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEYS",
        "PRIVATE_KEY",
        "DELETE",
        false,
        "deletePrivateKeysIntent",
        "deletePrivateKeysResult",
    ),
    s(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        "PRIVATE_KEY",
        "SIGN",
        false,
        "signRawPayloadIntentV2",
        "signRawPayloadResult",
    ),
    s(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS",
        "PRIVATE_KEY",
        "SIGN",
        false,
        "signRawPayloadsIntent",
        "signRawPayloadsResult",
    ),
    s(
        "ACTIVITY_TYPE_SIGN_TRANSACTION_V2",
        "PRIVATE_KEY",
        "SIGN",
        false,
        "signTransactionIntentV2",
        "signTransactionResult",
    ),
    s("ACTIVITY_TYPE_EXPORT_WALLET", "WALLET", "EXPORT", false, "exportWalletIntent", "exportWalletResult"),
    s(
        "ACTIVITY_TYPE_EXPORT_PRIVATE_KEY",
        "PRIVATE_KEY",
        "EXPORT",
        false,
        "exportPrivateKeyIntent",
        "exportPrivateKeyResult",
    ),
    s(
        "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT",
        "WALLET",
        "EXPORT",
        false,
        "exportWalletAccountIntent",
        "exportWalletAccountResult",
    ),
    s(
        "ACTIVITY_TYPE_INIT_IMPORT_WALLET",
        "WALLET",
        "IMPORT",
        false,
        "initImportWalletIntent",
        "initImportWalletResult",
    ),
    s("ACTIVITY_TYPE_IMPORT_WALLET", "WALLET", "IMPORT", false, "importWalletIntent", "importWalletResult"),
    s(
        "ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY",
        "PRIVATE_KEY",
        "IMPORT",
        false,
        "initImportPrivateKeyIntent",
        "initImportPrivateKeyResult",
    ),
    s(
        "ACTIVITY_TYPE_IMPORT_PRIVATE_KEY",
        "PRIVATE_KEY",
        "IMPORT",
        false,
        "importPrivateKeyIntent",
        "importPrivateKeyResult",
    ),
    s("ACTIVITY_TYPE_CREATE_USERS_V4", "USER", "CREATE", false, "createUsersIntentV4", "createUsersResult"),
    s(
        "ACTIVITY_TYPE_CREATE_API_ONLY_USERS",
        "USER",
        "CREATE",
        false,
        "createApiOnlyUsersIntent",
        "createApiOnlyUsersResult",
    ),
    s("ACTIVITY_TYPE_UPDATE_USER", "USER", "UPDATE", false, "updateUserIntent", "updateUserResult"),
    s("ACTIVITY_TYPE_UPDATE_USER_NAME", "USER", "UPDATE", false, "updateUserNameIntent", "updateUserNameResult"),
    s("ACTIVITY_TYPE_UPDATE_USER_EMAIL", "USER", "UPDATE", false, "updateUserEmailIntent", "updateUserEmailResult"),
    s(
        "ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER",
        "USER",
        "UPDATE",
        false,
        "updateUserPhoneNumberIntent",
        "updateUserPhoneNumberResult",
    ),
    s("ACTIVITY_TYPE_DELETE_USERS", "USER", "DELETE", false, "deleteUsersIntent", "deleteUsersResult"),
    s(
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2",
        "CREDENTIAL",
        "CREATE",
        false,
        "createApiKeysIntentV2",
        "createApiKeysResult",
    ),
    s("ACTIVITY_TYPE_DELETE_API_KEYS", "CREDENTIAL", "DELETE", false, "deleteApiKeysIntent", "deleteApiKeysResult"),
    s("ACTIVITY_TYPE_CREATE_USER_TAG", "USER", "CREATE", false, "createUserTagIntent", "createUserTagResult"),
    s("ACTIVITY_TYPE_UPDATE_USER_TAG", "USER", "UPDATE", false, "updateUserTagIntent", "updateUserTagResult"),
    s("ACTIVITY_TYPE_DELETE_USER_TAGS", "USER", "DELETE", false, "deleteUserTagsIntent", "deleteUserTagsResult"),
    s(
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG",
        "PRIVATE_KEY",
        "CREATE",
        false,
        "createPrivateKeyTagIntent",
        "createPrivateKeyTagResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_PRIVATE_KEY_TAG",
        "PRIVATE_KEY",
        "UPDATE",
        false,
        "updatePrivateKeyTagIntent",
        "updatePrivateKeyTagResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS",
        "PRIVATE_KEY",
        "DELETE",
        false,
        "deletePrivateKeyTagsIntent",
        "deletePrivateKeyTagsResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2",
        "CREDENTIAL",
        "CREATE",
        false,
        "createAuthenticatorsIntentV2",
        "createAuthenticatorsResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_AUTHENTICATORS",
        "CREDENTIAL",
        "DELETE",
        false,
        "deleteAuthenticatorsIntent",
        "deleteAuthenticatorsResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2",
        "CREDENTIAL",
        "CREATE",
        false,
        "createOauthProvidersIntentV2",
        "createOauthProvidersResultV2",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS",
        "CREDENTIAL",
        "DELETE",
        false,
        "deleteOauthProvidersIntent",
        "deleteOauthProvidersResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
        "AUTH",
        "CREATE",
        false,
        "createOauth2CredentialIntent",
        "createOauth2CredentialResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL",
        "AUTH",
        "UPDATE",
        false,
        "updateOauth2CredentialIntent",
        "updateOauth2CredentialResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL",
        "AUTH",
        "DELETE",
        false,
        "deleteOauth2CredentialIntent",
        "deleteOauth2CredentialResult",
    ),
    s(
        "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE",
        "AUTH",
        "CREATE",
        false,
        "oauth2AuthenticateIntent",
        "oauth2AuthenticateResult",
    ),
    s("ACTIVITY_TYPE_OAUTH_LOGIN", "AUTH", "CREATE", false, "oauthLoginIntent", "oauthLoginResult"),
    s("ACTIVITY_TYPE_STAMP_LOGIN", "AUTH", "CREATE", false, "stampLoginIntent", "stampLoginResult"),
    s(
        "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2",
        "AUTH",
        "CREATE",
        false,
        "createReadWriteSessionIntentV2",
        "createReadWriteSessionResultV2",
    ),
    s("ACTIVITY_TYPE_INIT_OTP_V3", "OTP", "CREATE", false, "initOtpIntentV3", "initOtpResultV2"),
    s("ACTIVITY_TYPE_VERIFY_OTP_V2", "OTP", "VERIFY", false, "verifyOtpIntentV2", "verifyOtpResult"),
    s("ACTIVITY_TYPE_OTP_LOGIN_V2", "AUTH", "CREATE", false, "otpLoginIntentV2", "otpLoginResult"),
    s("ACTIVITY_TYPE_OAUTH", "AUTH", "CREATE", false, "oauthIntent", "oauthResult"),
    s("ACTIVITY_TYPE_VERIFY_OTP", "OTP", "VERIFY", false, "verifyOtpIntent", "verifyOtpResult"),
    s("ACTIVITY_TYPE_OTP_LOGIN", "AUTH", "CREATE", false, "otpLoginIntent", "otpLoginResult"),
    s("ACTIVITY_TYPE_INIT_OTP_AUTH_V3", "OTP", "CREATE", false, "initOtpAuthIntentV3", "initOtpAuthResultV2"),
    s("ACTIVITY_TYPE_OTP_AUTH", "AUTH", "CREATE", false, "otpAuthIntent", "otpAuthResult"),
    s("ACTIVITY_TYPE_EMAIL_AUTH_V3", "AUTH", "CREATE", false, "emailAuthIntentV3", "emailAuthResult"),
    s(
        "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION",
        "AUTH",
        "CREATE",
        false,
        "createReadOnlySessionIntent",
        "createReadOnlySessionResult",
    ),
    s(
        "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2",
        "RECOVERY",
        "CREATE",
        false,
        "initUserEmailRecoveryIntentV2",
        "initUserEmailRecoveryResult",
    ),
    s("ACTIVITY_TYPE_RECOVER_USER", "RECOVERY", "UPDATE", false, "recoverUserIntent", "recoverUserResult"),
    s(
        "ACTIVITY_TYPE_ENABLE_AUTH_PROXY",
        "ORGANIZATION",
        "UPDATE",
        true,
        "enableAuthProxyIntent",
        "enableAuthProxyResult",
    ),
    s(
        "ACTIVITY_TYPE_DISABLE_AUTH_PROXY",
        "ORGANIZATION",
        "UPDATE",
        true,
        "disableAuthProxyIntent",
        "disableAuthProxyResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG",
        "ORGANIZATION",
        "UPDATE",
        true,
        "updateAuthProxyConfigIntent",
        "updateAuthProxyConfigResult",
    ),
    s("ACTIVITY_TYPE_CREATE_POLICY_V3", "POLICY", "CREATE", false, "createPolicyIntentV3", "createPolicyResult"),
    s("ACTIVITY_TYPE_CREATE_POLICIES", "POLICY", "CREATE", false, "createPoliciesIntent", "createPoliciesResult"),
    s("ACTIVITY_TYPE_UPDATE_POLICY_V2", "POLICY", "UPDATE", false, "updatePolicyIntentV2", "updatePolicyResultV2"),
    s("ACTIVITY_TYPE_DELETE_POLICY", "POLICY", "DELETE", false, "deletePolicyIntent", "deletePolicyResult"),
    s("ACTIVITY_TYPE_DELETE_POLICIES", "POLICY", "DELETE", false, "deletePoliciesIntent", "deletePoliciesResult"),
    s(
        "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE",
        "SMART_CONTRACT_INTERFACE",
        "CREATE",
        false,
        "createSmartContractInterfaceIntent",
        "createSmartContractInterfaceResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE",
        "SMART_CONTRACT_INTERFACE",
        "DELETE",
        false,
        "deleteSmartContractInterfaceIntent",
        "deleteSmartContractInterfaceResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        "WEBHOOK_ENDPOINT",
        "CREATE",
        false,
        "createWebhookEndpointIntent",
        "createWebhookEndpointResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
        "WEBHOOK_ENDPOINT",
        "UPDATE",
        false,
        "updateWebhookEndpointIntent",
        "updateWebhookEndpointResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT",
        "WEBHOOK_ENDPOINT",
        "DELETE",
        false,
        "deleteWebhookEndpointIntent",
        "deleteWebhookEndpointResult",
    ),
    s(
        "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        "ORGANIZATION",
        "UPDATE",
        true,
        "setOrganizationFeatureIntent",
        "setOrganizationFeatureResult",
    ),
    s(
        "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE",
        "ORGANIZATION",
        "UPDATE",
        true,
        "removeOrganizationFeatureIntent",
        "removeOrganizationFeatureResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM",
        "ORGANIZATION",
        "UPDATE",
        true,
        "updateRootQuorumIntent",
        "updateRootQuorumResult",
    ),
    s(
        "ACTIVITY_TYPE_UPDATE_ORGANIZATION_NAME",
        "ORGANIZATION",
        "UPDATE",
        true,
        "updateOrganizationNameIntent",
        "updateOrganizationNameResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_INVITATIONS",
        "INVITATION",
        "CREATE",
        false,
        "createInvitationsIntent",
        "createInvitationsResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_INVITATION",
        "INVITATION",
        "DELETE",
        false,
        "deleteInvitationIntent",
        "deleteInvitationResult",
    ),
    // Decided by the invitation and its acceptance code, not by policies (decide.rs).
    s(
        "ACTIVITY_TYPE_ACCEPT_INVITATION_V2",
        "INVITATION",
        "ACCEPT",
        false,
        "acceptInvitationIntentV2",
        "acceptInvitationResult",
    ),
    // SESSION_PROFILE / CREATE: the kind is in the hosted service's table, the resource inferred.
    s(
        "ACTIVITY_TYPE_CREATE_SESSION_PROFILE",
        "SESSION_PROFILE",
        "CREATE",
        false,
        "createSessionProfileIntent",
        "createSessionProfileResult",
    ),
    // Not in the hosted service's policy table: Coffer's choice, the root quorum's, as the
    // organization's name (README "IP allowlists").
    s("ACTIVITY_TYPE_SET_IP_ALLOWLIST", "ORGANIZATION", "UPDATE", true, "setIpAllowlistIntent", "setIpAllowlistResult"),
    s(
        "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST",
        "ORGANIZATION",
        "UPDATE",
        true,
        "removeIpAllowlistIntent",
        "removeIpAllowlistResult",
    ),
    s("ACTIVITY_TYPE_CREATE_TVC_APP", "TVC_APP", "CREATE", false, "createTvcAppIntent", "createTvcAppResult"),
    s(
        "ACTIVITY_TYPE_CREATE_TVC_DEPLOYMENT",
        "TVC_DEPLOYMENT",
        "CREATE",
        false,
        "createTvcDeploymentIntent",
        "createTvcDeploymentResult",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_TVC_APP_AND_DEPLOYMENTS",
        "TVC_APP",
        "DELETE",
        false,
        "deleteTvcAppAndDeploymentsIntent",
        "deleteTvcAppAndDeploymentsResult",
    ),
    s(
        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
        "ORGANIZATION",
        "CREATE",
        false,
        "createSubOrganizationIntentV8",
        "createSubOrganizationResultV8",
    ),
    s(
        "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION",
        "ORGANIZATION",
        "DELETE",
        true,
        "deleteSubOrganizationIntent",
        "deleteSubOrganizationResult",
    ),
    s("ACTIVITY_TYPE_APPROVE_ACTIVITY", "ACTIVITY", "APPROVE", false, "approveActivityIntent", "approveActivityResult"),
    s("ACTIVITY_TYPE_REJECT_ACTIVITY", "ACTIVITY", "REJECT", false, "rejectActivityIntent", "rejectActivityResult"),
];

/// Parameters an activity record keeps only as [`REDACTED`] (otp_auth's typed code): they reach
/// the enclave in the stamped body, and no stored, served or logged copy of the activity. (A
/// contact's verification token is recorded: it is spent for every use by the change that
/// carries it, and was good only with its key's word.)
const SECRET_PARAMETERS: &[(&str, &[&str])] = &[("ACTIVITY_TYPE_OTP_AUTH", &["otpCode"])];

/// What a secret parameter is recorded as.
pub const REDACTED: &str = "<redacted>";

/// The parameters of `activity_type` its record keeps only as [`REDACTED`].
pub fn secret_parameters(activity_type: &str) -> &'static [&'static str] {
    let activity_type = current_version(activity_type);
    SECRET_PARAMETERS.iter().find(|(t, _)| *t == activity_type).map_or(&[], |(_, p)| p)
}

/// An activity's stamped parameters as its record keeps them (its intent): each of its
/// [`secret_parameters`] present is [`REDACTED`].
pub fn recorded_parameters(activity_type: &str, mut parameters: serde_json::Value) -> serde_json::Value {
    if let Some(m) = parameters.as_object_mut() {
        for k in secret_parameters(activity_type) {
            if let Some(v) = m.get_mut(*k) {
                *v = serde_json::Value::String(REDACTED.into());
            }
        }
    }
    parameters
}

/// Older versions of an activity type that current official clients still send, each with the
/// version it is run as (`@turnkey/core` 2.7.1's `otpLogin` and `verifyOtp` send the first
/// versions' types with the current versions' parameters). Each keeps its own subject (its intent
/// and result keys, and the type policies see); the operation it asks for is the current one's.
pub const OLDER_VERSIONS: &[(&str, &str)] = &[
    ("ACTIVITY_TYPE_OTP_LOGIN", "ACTIVITY_TYPE_OTP_LOGIN_V2"),
    ("ACTIVITY_TYPE_VERIFY_OTP", "ACTIVITY_TYPE_VERIFY_OTP_V2"),
];

/// The version `activity_type` is run as: the current version of an [`OLDER_VERSIONS`] type,
/// else `activity_type` itself. Every check of what operation a type asks for reads this.
pub fn current_version(activity_type: &str) -> &str {
    OLDER_VERSIONS.iter().find(|(older, _)| *older == activity_type).map_or(activity_type, |(_, current)| current)
}

/// The subject of `activity_type`, if it is one Coffer runs.
pub fn subject(activity_type: &str) -> Option<&'static Subject> {
    SUBJECTS.iter().find(|s| s.activity_type == activity_type)
}

/// The activities the enclave alone decides: each uses or makes a key in the one enclave call
/// that does its work (signing, exports, wallet, account and key creation, imports), which
/// decides it and answers with the outcomes it read (the gateway evaluates no policy for them).
pub const KEY_USES: &[&str] = &[
    "ACTIVITY_TYPE_CREATE_WALLET",
    "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS",
    "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2",
    "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
    "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS",
    "ACTIVITY_TYPE_SIGN_TRANSACTION_V2",
    "ACTIVITY_TYPE_EXPORT_WALLET",
    "ACTIVITY_TYPE_EXPORT_PRIVATE_KEY",
    "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT",
    "ACTIVITY_TYPE_INIT_IMPORT_WALLET",
    "ACTIVITY_TYPE_IMPORT_WALLET",
    "ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY",
    "ACTIVITY_TYPE_IMPORT_PRIVATE_KEY",
];

/// The other activities with an enclave call of their own (sessions, logins, one-time codes,
/// votes): they record their own facts, and their call decides them (votes excepted, which no
/// policy decides).
pub const OWN_CALL_OPERATIONS: &[&str] = &[
    "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE",
    "ACTIVITY_TYPE_OAUTH_LOGIN",
    "ACTIVITY_TYPE_OAUTH",
    "ACTIVITY_TYPE_STAMP_LOGIN",
    "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2",
    "ACTIVITY_TYPE_INIT_OTP_V3",
    "ACTIVITY_TYPE_VERIFY_OTP_V2",
    "ACTIVITY_TYPE_OTP_LOGIN_V2",
    "ACTIVITY_TYPE_INIT_OTP_AUTH_V3",
    "ACTIVITY_TYPE_OTP_AUTH",
    "ACTIVITY_TYPE_EMAIL_AUTH_V3",
    "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2",
    "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION",
    "ACTIVITY_TYPE_APPROVE_ACTIVITY",
    "ACTIVITY_TYPE_REJECT_ACTIVITY",
];

/// Whether `activity_type`'s enclave call is its own ([`KEY_USES`], [`OWN_CALL_OPERATIONS`]):
/// the gateway never sends it to the enclave's `ApplyActivity`, which refuses it.
/// (enable_auth_proxy makes its key with `EnableAuthProxy`, then goes through `ApplyActivity`.)
pub fn has_own_call(activity_type: &str) -> bool {
    let activity_type = current_version(activity_type);
    KEY_USES.contains(&activity_type) || OWN_CALL_OPERATIONS.contains(&activity_type)
}

/// Whether `activity_type` is a login, a session or a one-time code (an operation of its own
/// call that is neither a key use nor a vote): done by its own call, linked afterwards by
/// `RecordActivity`, as completed only if that call did not fail after its allow, and as failed
/// only if it did (or was refused).
pub fn is_login_operation(activity_type: &str) -> bool {
    let activity_type = current_version(activity_type);
    OWN_CALL_OPERATIONS.contains(&activity_type)
        && !["ACTIVITY_TYPE_APPROVE_ACTIVITY", "ACTIVITY_TYPE_REJECT_ACTIVITY"].contains(&activity_type)
}

/// The enclave operation that does a login, session or one-time code of `activity_type` (the
/// name its call is authorized, and its replay entry spent, under); `None` for other types.
pub fn login_operation(activity_type: &str) -> Option<&'static str> {
    match current_version(activity_type) {
        "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE" => Some("oauth2_authenticate"),
        "ACTIVITY_TYPE_INIT_OTP_V3" | "ACTIVITY_TYPE_INIT_OTP_AUTH_V3" => Some("init_otp"),
        "ACTIVITY_TYPE_VERIFY_OTP_V2" => Some("verify_otp"),
        "ACTIVITY_TYPE_OAUTH_LOGIN"
        | "ACTIVITY_TYPE_OAUTH"
        | "ACTIVITY_TYPE_STAMP_LOGIN"
        | "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2"
        | "ACTIVITY_TYPE_OTP_LOGIN_V2"
        | "ACTIVITY_TYPE_OTP_AUTH"
        | "ACTIVITY_TYPE_EMAIL_AUTH_V3"
        | "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2"
        | "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION" => Some("create_session"),
        _ => None,
    }
}

/// State changes whose handler calls the enclave before `ApplyActivity` (a sub-organization's
/// wallet, an OAuth 2.0 credential's certification, the auth proxy's key) or reaches the network
/// (a webhook target's name resolved, after the enclave's `DecideActivity` allowed it). The first
/// enclave call decides them, as every activity; they are linked in the log after they finish
/// (`RecordActivity`), since the calls before `ApplyActivity` may have made app proofs.
pub const CALLS_BEFORE_APPLY: &[&str] = &[
    "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
    "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_ENABLE_AUTH_PROXY",
    "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
    "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
];

/// Whether `activity_type` is linked completed in the log only by the enclave call that does it
/// (`RecordActivity` refuses it completed): a key use, or a state change `ApplyActivity` does
/// with nothing made before it.
pub fn linked_in_its_call(activity_type: &str) -> bool {
    let activity_type = current_version(activity_type);
    KEY_USES.contains(&activity_type)
        || (subject(activity_type).is_some()
            && !OWN_CALL_OPERATIONS.contains(&activity_type)
            && !CALLS_BEFORE_APPLY.contains(&activity_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_version_is_run_as_its_current_version_and_keeps_its_own_names() {
        for (older, current) in OLDER_VERSIONS {
            let (o, c) = (subject(older).unwrap(), subject(current).unwrap());
            assert_eq!((o.resource, o.action, o.root_quorum), (c.resource, c.action, c.root_quorum), "{older}");
            assert_ne!(o.intent_key, c.intent_key, "{older}");
            assert_eq!(current_version(older), *current);
            assert_eq!(login_operation(older), login_operation(current), "{older}");
            assert_eq!(has_own_call(older), has_own_call(current), "{older}");
            assert_eq!(linked_in_its_call(older), linked_in_its_call(current), "{older}");
            assert!(!OLDER_VERSIONS.iter().any(|(o, _)| o == current), "{current} is older still");
        }
        assert_eq!(current_version("ACTIVITY_TYPE_OTP_AUTH"), "ACTIVITY_TYPE_OTP_AUTH");
        assert_eq!(login_operation("ACTIVITY_TYPE_VERIFY_OTP"), Some("verify_otp"));
    }

    #[test]
    fn every_login_operation_has_its_operation_and_no_other_type_has_one() {
        for t in OWN_CALL_OPERATIONS {
            assert_eq!(login_operation(t).is_some(), is_login_operation(t), "{t}");
        }
        for t in KEY_USES {
            assert_eq!(login_operation(t), None, "{t}");
        }
    }

    #[test]
    fn every_key_use_has_its_own_call_and_a_subject() {
        for t in KEY_USES {
            assert!(has_own_call(t), "{t} is sent to ApplyActivity");
            assert!(subject(t).is_some(), "{t} has no subject");
        }
        assert!(KEY_USES.iter().all(|t| !OWN_CALL_OPERATIONS.contains(t)));
        assert!(!KEY_USES.contains(&"ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2"), "sessions are decided twice yet");
    }

    #[test]
    fn state_changes_with_nothing_made_before_apply_are_linked_in_their_call() {
        for t in
            ["ACTIVITY_TYPE_CREATE_POLICY_V3", "ACTIVITY_TYPE_CREATE_USERS_V4", "ACTIVITY_TYPE_SIGN_TRANSACTION_V2"]
        {
            assert!(linked_in_its_call(t), "{t}");
        }
        for t in CALLS_BEFORE_APPLY.iter().chain(OWN_CALL_OPERATIONS) {
            assert!(!linked_in_its_call(t), "{t}");
        }
        for t in CALLS_BEFORE_APPLY {
            assert!(subject(t).is_some(), "{t}");
        }
        assert!(linked_in_its_call("ACTIVITY_TYPE_UPDATE_ROOT_QUORUM"), "root quorum only");
        assert!(!linked_in_its_call("ACTIVITY_TYPE_NOT_ONE"));
    }
}
