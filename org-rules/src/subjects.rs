//! What each activity type is to the policy engine: its resource and action (spec 12.4) and
//! whether only the root quorum decides it. The gateway's operation registry is checked against
//! this table (gateway/src/ops/mod.rs), so the enclave and the gateway read one list.

/// An activity type's policy subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject {
    pub activity_type: &'static str,
    pub resource: &'static str,
    pub action: &'static str,
    pub root_quorum: bool,
}

const fn s(activity_type: &'static str, resource: &'static str, action: &'static str, root_quorum: bool) -> Subject {
    Subject { activity_type, resource, action, root_quorum }
}

/// Every activity type an organization can submit.
pub static SUBJECTS: &[Subject] = &[
    s("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "CREATE", false),
    s("ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS", "WALLET", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_WALLETS", "WALLET", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2", "PRIVATE_KEY", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_PRIVATE_KEYS", "PRIVATE_KEY", "DELETE", false),
    s("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "PRIVATE_KEY", "SIGN", false),
    s("ACTIVITY_TYPE_SIGN_RAW_PAYLOADS", "PRIVATE_KEY", "SIGN", false),
    s("ACTIVITY_TYPE_SIGN_TRANSACTION_V2", "PRIVATE_KEY", "SIGN", false),
    s("ACTIVITY_TYPE_EXPORT_WALLET", "WALLET", "EXPORT", false),
    s("ACTIVITY_TYPE_EXPORT_PRIVATE_KEY", "PRIVATE_KEY", "EXPORT", false),
    s("ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT", "WALLET", "EXPORT", false),
    s("ACTIVITY_TYPE_INIT_IMPORT_WALLET", "WALLET", "IMPORT", false),
    s("ACTIVITY_TYPE_IMPORT_WALLET", "WALLET", "IMPORT", false),
    s("ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY", "PRIVATE_KEY", "IMPORT", false),
    s("ACTIVITY_TYPE_IMPORT_PRIVATE_KEY", "PRIVATE_KEY", "IMPORT", false),
    s("ACTIVITY_TYPE_CREATE_USERS_V4", "USER", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_USER", "USER", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_USERS", "USER", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_API_KEYS_V2", "CREDENTIAL", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_API_KEYS", "CREDENTIAL", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_USER_TAG", "USER", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_USER_TAG", "USER", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_USER_TAGS", "USER", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG", "PRIVATE_KEY", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_PRIVATE_KEY_TAG", "PRIVATE_KEY", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS", "PRIVATE_KEY", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2", "CREDENTIAL", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_AUTHENTICATORS", "CREDENTIAL", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2", "CREDENTIAL", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS", "CREDENTIAL", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL", "AUTH", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL", "AUTH", "DELETE", false),
    s("ACTIVITY_TYPE_OAUTH2_AUTHENTICATE", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_OAUTH_LOGIN", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_STAMP_LOGIN", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_INIT_OTP_V3", "OTP", "CREATE", false),
    s("ACTIVITY_TYPE_VERIFY_OTP_V2", "OTP", "VERIFY", false),
    s("ACTIVITY_TYPE_OTP_LOGIN_V2", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_INIT_OTP_AUTH_V3", "OTP", "CREATE", false),
    s("ACTIVITY_TYPE_OTP_AUTH", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_EMAIL_AUTH_V3", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION", "AUTH", "CREATE", false),
    s("ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2", "RECOVERY", "CREATE", false),
    s("ACTIVITY_TYPE_RECOVER_USER", "RECOVERY", "UPDATE", false),
    s("ACTIVITY_TYPE_ENABLE_AUTH_PROXY", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_DISABLE_AUTH_PROXY", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_CREATE_POLICY_V3", "POLICY", "CREATE", false),
    s("ACTIVITY_TYPE_CREATE_POLICIES", "POLICY", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_POLICY_V2", "POLICY", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_POLICY", "POLICY", "DELETE", false),
    s("ACTIVITY_TYPE_DELETE_POLICIES", "POLICY", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE", "SMART_CONTRACT_INTERFACE", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE", "SMART_CONTRACT_INTERFACE", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT", "WEBHOOK_ENDPOINT", "CREATE", false),
    s("ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT", "WEBHOOK_ENDPOINT", "UPDATE", false),
    s("ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT", "WEBHOOK_ENDPOINT", "DELETE", false),
    s("ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_UPDATE_ROOT_QUORUM", "ORGANIZATION", "UPDATE", true),
    s("ACTIVITY_TYPE_CREATE_TVC_APP", "TVC_APP", "CREATE", false),
    s("ACTIVITY_TYPE_CREATE_TVC_DEPLOYMENT", "TVC_DEPLOYMENT", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_TVC_APP_AND_DEPLOYMENTS", "TVC_APP", "DELETE", false),
    s("ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", "ORGANIZATION", "CREATE", false),
    s("ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION", "ORGANIZATION", "DELETE", true),
    s("ACTIVITY_TYPE_APPROVE_ACTIVITY", "ACTIVITY", "APPROVE", false),
    s("ACTIVITY_TYPE_REJECT_ACTIVITY", "ACTIVITY", "REJECT", false),
];

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
/// votes): they record their own facts, and the gateway still decides them first.
pub const OWN_CALL_OPERATIONS: &[&str] = &[
    "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE",
    "ACTIVITY_TYPE_OAUTH_LOGIN",
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
    KEY_USES.contains(&activity_type) || OWN_CALL_OPERATIONS.contains(&activity_type)
}

/// State changes whose handler reaches out before `ApplyActivity` decides them: it calls the
/// enclave (a sub-organization's wallet, an OAuth 2.0 credential's certification, the auth
/// proxy's key) or the network (a webhook target's name resolved). The gateway decides them
/// first, so that nothing is made, and nothing probed, for a change the rules refuse.
pub const GATEWAY_DECIDES_FIRST: &[&str] = &[
    "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
    "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL",
    "ACTIVITY_TYPE_ENABLE_AUTH_PROXY",
    "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
    "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
];

/// Whether the enclave alone decides `activity_type` (the gateway evaluates no policy for it, on
/// submission or on a vote): a key use, decided by the call that does its work, or a state change
/// decided by `ApplyActivity` with nothing made before it (root-quorum-only ones included: the
/// enclave refuses a submitter outside the root quorum with its own typed reason).
pub fn decided_by_enclave_alone(activity_type: &str) -> bool {
    KEY_USES.contains(&activity_type)
        || (subject(activity_type).is_some()
            && !OWN_CALL_OPERATIONS.contains(&activity_type)
            && !GATEWAY_DECIDES_FIRST.contains(&activity_type))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn state_changes_with_nothing_made_before_apply_are_decided_by_the_enclave_alone() {
        for t in
            ["ACTIVITY_TYPE_CREATE_POLICY_V3", "ACTIVITY_TYPE_CREATE_USERS_V4", "ACTIVITY_TYPE_SIGN_TRANSACTION_V2"]
        {
            assert!(decided_by_enclave_alone(t), "{t}");
        }
        for t in GATEWAY_DECIDES_FIRST.iter().chain(OWN_CALL_OPERATIONS) {
            assert!(subject(t).is_some() && !decided_by_enclave_alone(t), "{t}");
        }
        assert!(decided_by_enclave_alone("ACTIVITY_TYPE_UPDATE_ROOT_QUORUM"), "root quorum only");
        assert!(!decided_by_enclave_alone("ACTIVITY_TYPE_NOT_ONE"));
    }
}
