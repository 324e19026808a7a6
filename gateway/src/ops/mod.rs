//! The operation registry: every submit and query endpoint, one line each, and their handlers
//! grouped one file per resource family.

pub mod activities;
pub mod allowlists;
pub mod approvals;
pub mod authenticators;
pub mod contracts;
pub mod credentials;
pub mod email_events;
pub mod invitations;
pub mod keys;
pub mod lookup;
pub mod oauth;
pub mod oauth2;
pub mod organization;
pub mod otp;
pub mod params;
pub mod policies;
pub mod proofs;
pub mod proxy_config;
pub mod sealed;
pub mod session_profiles;
pub mod sessions;
pub mod signing;
pub mod suborgs;
pub mod tags;
pub mod transfer;
pub mod tvc;
pub mod users;
pub mod wallets;
pub mod webhooks;

use crate::activity::registry::{Operation, Query, Registry};
use crate::{activity_handler, query_handler};

macro_rules! op {
    ($path:literal, $ty:literal, $intent:literal, $result:literal, $res:literal / $act:literal, $h:path) => {
        Operation {
            path: $path,
            activity_type: $ty,
            intent_key: $intent,
            result_key: $result,
            resource: $res,
            action: $act,
            root_quorum: false,
            precheck: None,
            parent_may_act: false,
            handler: activity_handler!($h),
        }
    };
    (root_quorum $path:literal, $ty:literal, $intent:literal, $result:literal, $res:literal / $act:literal, $h:path) => {
        Operation { root_quorum: true, ..op!($path, $ty, $intent, $result, $res / $act, $h) }
    };
    (login $path:literal, $ty:literal, $intent:literal, $result:literal, $res:literal / $act:literal, $h:path) => {
        Operation { parent_may_act: true, ..op!($path, $ty, $intent, $result, $res / $act, $h) }
    };
    (checked_by $check:path, $path:literal, $ty:literal, $intent:literal, $result:literal, $res:literal / $act:literal, $h:path) => {
        Operation { precheck: Some($check), ..op!($path, $ty, $intent, $result, $res / $act, $h) }
    };
}

/// Every submit endpoint: path, type, intent key, result key, policy resource/action, handler.
pub static ACTIVITIES: &[Operation] = &[
    op!(
        "create_wallet",
        "ACTIVITY_TYPE_CREATE_WALLET",
        "createWalletIntent",
        "createWalletResult",
        "WALLET" / "CREATE",
        wallets::create_wallet
    ),
    op!(
        "create_wallet_accounts",
        "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS",
        "createWalletAccountsIntent",
        "createWalletAccountsResult",
        "WALLET" / "CREATE",
        wallets::create_wallet_accounts
    ),
    op!(
        "delete_wallets",
        "ACTIVITY_TYPE_DELETE_WALLETS",
        "deleteWalletsIntent",
        "deleteWalletsResult",
        "WALLET" / "DELETE",
        wallets::delete_wallets
    ),
    op!(
        "update_wallet",
        "ACTIVITY_TYPE_UPDATE_WALLET",
        "updateWalletIntent",
        "updateWalletResult",
        "WALLET" / "UPDATE",
        wallets::update_wallet
    ),
    op!(
        "delete_wallet_accounts",
        "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS",
        "deleteWalletAccountsIntent",
        "deleteWalletAccountsResult",
        "WALLET" / "DELETE",
        wallets::delete_wallet_accounts
    ),
    op!(
        "create_private_keys",
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2",
        "createPrivateKeysIntentV2",
        "createPrivateKeysResultV2",
        "PRIVATE_KEY" / "CREATE",
        keys::create_private_keys
    ),
    op!(
        "delete_private_keys",
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEYS",
        "deletePrivateKeysIntent",
        "deletePrivateKeysResult",
        "PRIVATE_KEY" / "DELETE",
        keys::delete_private_keys
    ),
    op!(
        checked_by signing::check_payloads,
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        "signRawPayloadIntentV2",
        "signRawPayloadResult",
        "PRIVATE_KEY" / "SIGN",
        signing::sign_raw_payload
    ),
    op!(
        checked_by signing::check_payloads,
        "sign_raw_payloads",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS",
        "signRawPayloadsIntent",
        "signRawPayloadsResult",
        "PRIVATE_KEY" / "SIGN",
        signing::sign_raw_payloads
    ),
    op!(
        checked_by signing::check_transaction,
        "sign_transaction",
        "ACTIVITY_TYPE_SIGN_TRANSACTION_V2",
        "signTransactionIntentV2",
        "signTransactionResult",
        "PRIVATE_KEY" / "SIGN",
        signing::sign_transaction
    ),
    op!(
        "export_wallet",
        "ACTIVITY_TYPE_EXPORT_WALLET",
        "exportWalletIntent",
        "exportWalletResult",
        "WALLET" / "EXPORT",
        transfer::export_wallet
    ),
    op!(
        "export_private_key",
        "ACTIVITY_TYPE_EXPORT_PRIVATE_KEY",
        "exportPrivateKeyIntent",
        "exportPrivateKeyResult",
        "PRIVATE_KEY" / "EXPORT",
        transfer::export_private_key
    ),
    op!(
        "export_wallet_account",
        "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT",
        "exportWalletAccountIntent",
        "exportWalletAccountResult",
        "WALLET" / "EXPORT",
        transfer::export_wallet_account
    ),
    op!(
        "init_import_wallet",
        "ACTIVITY_TYPE_INIT_IMPORT_WALLET",
        "initImportWalletIntent",
        "initImportWalletResult",
        "WALLET" / "IMPORT",
        transfer::init_import_wallet
    ),
    op!(
        "import_wallet",
        "ACTIVITY_TYPE_IMPORT_WALLET",
        "importWalletIntent",
        "importWalletResult",
        "WALLET" / "IMPORT",
        transfer::import_wallet
    ),
    op!(
        "init_import_private_key",
        "ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY",
        "initImportPrivateKeyIntent",
        "initImportPrivateKeyResult",
        "PRIVATE_KEY" / "IMPORT",
        transfer::init_import_private_key
    ),
    op!(
        "import_private_key",
        "ACTIVITY_TYPE_IMPORT_PRIVATE_KEY",
        "importPrivateKeyIntent",
        "importPrivateKeyResult",
        "PRIVATE_KEY" / "IMPORT",
        transfer::import_private_key
    ),
    op!(
        "create_users",
        "ACTIVITY_TYPE_CREATE_USERS_V4",
        "createUsersIntentV4",
        "createUsersResult",
        "USER" / "CREATE",
        users::create_users
    ),
    op!(
        "create_api_only_users",
        "ACTIVITY_TYPE_CREATE_API_ONLY_USERS",
        "createApiOnlyUsersIntent",
        "createApiOnlyUsersResult",
        "USER" / "CREATE",
        users::create_api_only_users
    ),
    op!(
        "update_user",
        "ACTIVITY_TYPE_UPDATE_USER",
        "updateUserIntent",
        "updateUserResult",
        "USER" / "UPDATE",
        users::update_user
    ),
    op!(
        "update_user_name",
        "ACTIVITY_TYPE_UPDATE_USER_NAME",
        "updateUserNameIntent",
        "updateUserNameResult",
        "USER" / "UPDATE",
        users::update_user_name
    ),
    op!(
        "update_user_email",
        "ACTIVITY_TYPE_UPDATE_USER_EMAIL",
        "updateUserEmailIntent",
        "updateUserEmailResult",
        "USER" / "UPDATE",
        users::update_user_email
    ),
    op!(
        "update_user_phone_number",
        "ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER",
        "updateUserPhoneNumberIntent",
        "updateUserPhoneNumberResult",
        "USER" / "UPDATE",
        users::update_user_phone_number
    ),
    op!(
        "delete_users",
        "ACTIVITY_TYPE_DELETE_USERS",
        "deleteUsersIntent",
        "deleteUsersResult",
        "USER" / "DELETE",
        users::delete_users
    ),
    op!(
        "create_api_keys",
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2",
        "createApiKeysIntentV2",
        "createApiKeysResult",
        "CREDENTIAL" / "CREATE",
        users::create_api_keys
    ),
    op!(
        "delete_api_keys",
        "ACTIVITY_TYPE_DELETE_API_KEYS",
        "deleteApiKeysIntent",
        "deleteApiKeysResult",
        "CREDENTIAL" / "DELETE",
        users::delete_api_keys
    ),
    op!(
        "create_user_tag",
        "ACTIVITY_TYPE_CREATE_USER_TAG",
        "createUserTagIntent",
        "createUserTagResult",
        "USER" / "CREATE",
        tags::create_user_tag
    ),
    op!(
        "update_user_tag",
        "ACTIVITY_TYPE_UPDATE_USER_TAG",
        "updateUserTagIntent",
        "updateUserTagResult",
        "USER" / "UPDATE",
        tags::update_user_tag
    ),
    op!(
        "delete_user_tags",
        "ACTIVITY_TYPE_DELETE_USER_TAGS",
        "deleteUserTagsIntent",
        "deleteUserTagsResult",
        "USER" / "DELETE",
        tags::delete_user_tags
    ),
    op!(
        "create_private_key_tag",
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG",
        "createPrivateKeyTagIntent",
        "createPrivateKeyTagResult",
        "PRIVATE_KEY" / "CREATE",
        tags::create_private_key_tag
    ),
    op!(
        "update_private_key_tag",
        "ACTIVITY_TYPE_UPDATE_PRIVATE_KEY_TAG",
        "updatePrivateKeyTagIntent",
        "updatePrivateKeyTagResult",
        "PRIVATE_KEY" / "UPDATE",
        tags::update_private_key_tag
    ),
    op!(
        "delete_private_key_tags",
        "ACTIVITY_TYPE_DELETE_PRIVATE_KEY_TAGS",
        "deletePrivateKeyTagsIntent",
        "deletePrivateKeyTagsResult",
        "PRIVATE_KEY" / "DELETE",
        tags::delete_private_key_tags
    ),
    op!(
        "create_authenticators",
        "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2",
        "createAuthenticatorsIntentV2",
        "createAuthenticatorsResult",
        "CREDENTIAL" / "CREATE",
        authenticators::create_authenticators
    ),
    op!(
        "delete_authenticators",
        "ACTIVITY_TYPE_DELETE_AUTHENTICATORS",
        "deleteAuthenticatorsIntent",
        "deleteAuthenticatorsResult",
        "CREDENTIAL" / "DELETE",
        authenticators::delete_authenticators
    ),
    op!(
        "create_oauth_providers",
        "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2",
        "createOauthProvidersIntentV2",
        "createOauthProvidersResultV2",
        "CREDENTIAL" / "CREATE",
        oauth::create_oauth_providers
    ),
    op!(
        "delete_oauth_providers",
        "ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS",
        "deleteOauthProvidersIntent",
        "deleteOauthProvidersResult",
        "CREDENTIAL" / "DELETE",
        oauth::delete_oauth_providers
    ),
    op!(
        "create_oauth2_credential",
        "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
        "createOauth2CredentialIntent",
        "createOauth2CredentialResult",
        "AUTH" / "CREATE",
        oauth2::create_oauth2_credential
    ),
    op!(
        "update_oauth2_credential",
        "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL",
        "updateOauth2CredentialIntent",
        "updateOauth2CredentialResult",
        "AUTH" / "UPDATE",
        oauth2::update_oauth2_credential
    ),
    op!(
        "delete_oauth2_credential",
        "ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL",
        "deleteOauth2CredentialIntent",
        "deleteOauth2CredentialResult",
        "AUTH" / "DELETE",
        oauth2::delete_oauth2_credential
    ),
    op!(
        "oauth2_authenticate",
        "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE",
        "oauth2AuthenticateIntent",
        "oauth2AuthenticateResult",
        "AUTH" / "CREATE",
        oauth2::oauth2_authenticate
    ),
    op!(login
        "oauth_login",
        "ACTIVITY_TYPE_OAUTH_LOGIN",
        "oauthLoginIntent",
        "oauthLoginResult",
        "AUTH" / "CREATE",
        sessions::oauth_login
    ),
    op!(login
        "stamp_login",
        "ACTIVITY_TYPE_STAMP_LOGIN",
        "stampLoginIntent",
        "stampLoginResult",
        "AUTH" / "CREATE",
        sessions::stamp_login
    ),
    op!(login
        "create_read_write_session",
        "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2",
        "createReadWriteSessionIntentV2",
        "createReadWriteSessionResultV2",
        "AUTH" / "CREATE",
        sessions::create_read_write_session
    ),
    op!("init_otp", "ACTIVITY_TYPE_INIT_OTP_V3", "initOtpIntentV3", "initOtpResultV2", "OTP" / "CREATE", otp::init_otp),
    op!(
        "verify_otp",
        "ACTIVITY_TYPE_VERIFY_OTP_V2",
        "verifyOtpIntentV2",
        "verifyOtpResult",
        "OTP" / "VERIFY",
        otp::verify_otp
    ),
    op!(login
        "otp_login",
        "ACTIVITY_TYPE_OTP_LOGIN_V2",
        "otpLoginIntentV2",
        "otpLoginResult",
        "AUTH" / "CREATE",
        sessions::otp_login
    ),
    op!(login
        "oauth",
        "ACTIVITY_TYPE_OAUTH",
        "oauthIntent",
        "oauthResult",
        "AUTH" / "CREATE",
        sessions::oauth
    ),
    // Older versions (subjects::OLDER_VERSIONS), after the current one at the same path.
    op!(
        "verify_otp",
        "ACTIVITY_TYPE_VERIFY_OTP",
        "verifyOtpIntent",
        "verifyOtpResult",
        "OTP" / "VERIFY",
        otp::verify_otp
    ),
    op!(login
        "otp_login",
        "ACTIVITY_TYPE_OTP_LOGIN",
        "otpLoginIntent",
        "otpLoginResult",
        "AUTH" / "CREATE",
        sessions::otp_login
    ),
    op!(login
        "init_otp_auth",
        "ACTIVITY_TYPE_INIT_OTP_AUTH_V3",
        "initOtpAuthIntentV3",
        "initOtpAuthResultV2",
        "OTP" / "CREATE",
        otp::init_otp_auth
    ),
    op!(login
        "otp_auth",
        "ACTIVITY_TYPE_OTP_AUTH",
        "otpAuthIntent",
        "otpAuthResult",
        "AUTH" / "CREATE",
        sessions::otp_auth
    ),
    op!(login
        "email_auth",
        "ACTIVITY_TYPE_EMAIL_AUTH_V3",
        "emailAuthIntentV3",
        "emailAuthResult",
        "AUTH" / "CREATE",
        sessions::email_auth
    ),
    op!(login
        "init_user_email_recovery",
        "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2",
        "initUserEmailRecoveryIntentV2",
        "initUserEmailRecoveryResult",
        "RECOVERY" / "CREATE",
        sessions::init_user_email_recovery
    ),
    op!(
        "create_read_only_session",
        "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION",
        "createReadOnlySessionIntent",
        "createReadOnlySessionResult",
        "AUTH" / "CREATE",
        sessions::create_read_only_session
    ),
    op!(
        "recover_user",
        "ACTIVITY_TYPE_RECOVER_USER",
        "recoverUserIntent",
        "recoverUserResult",
        "RECOVERY" / "UPDATE",
        authenticators::recover_user
    ),
    op!(root_quorum
        "update_organization_name",
        "ACTIVITY_TYPE_UPDATE_ORGANIZATION_NAME",
        "updateOrganizationNameIntent",
        "updateOrganizationNameResult",
        "ORGANIZATION" / "UPDATE",
        organization::update_organization_name
    ),
    op!(
        "create_invitations",
        "ACTIVITY_TYPE_CREATE_INVITATIONS",
        "createInvitationsIntent",
        "createInvitationsResult",
        "INVITATION" / "CREATE",
        invitations::create_invitations
    ),
    op!(
        "delete_invitation",
        "ACTIVITY_TYPE_DELETE_INVITATION",
        "deleteInvitationIntent",
        "deleteInvitationResult",
        "INVITATION" / "DELETE",
        invitations::delete_invitation
    ),
    // Coffer's path (no `@turnkey/http` fetcher): stamped by the API key the receiver brings.
    op!(
        "accept_invitation",
        "ACTIVITY_TYPE_ACCEPT_INVITATION_V2",
        "acceptInvitationIntentV2",
        "acceptInvitationResult",
        "INVITATION" / "ACCEPT",
        invitations::accept_invitation
    ),
    op!(
        "create_session_profile",
        "ACTIVITY_TYPE_CREATE_SESSION_PROFILE",
        "createSessionProfileIntent",
        "createSessionProfileResult",
        "SESSION_PROFILE" / "CREATE",
        session_profiles::create_session_profile
    ),
    op!(root_quorum
        "set_ip_allowlist",
        "ACTIVITY_TYPE_SET_IP_ALLOWLIST",
        "setIpAllowlistIntent",
        "setIpAllowlistResult",
        "ORGANIZATION" / "UPDATE",
        allowlists::set_ip_allowlist
    ),
    op!(root_quorum
        "remove_ip_allowlist",
        "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST",
        "removeIpAllowlistIntent",
        "removeIpAllowlistResult",
        "ORGANIZATION" / "UPDATE",
        allowlists::remove_ip_allowlist
    ),
    op!(root_quorum
        "enable_auth_proxy",
        "ACTIVITY_TYPE_ENABLE_AUTH_PROXY",
        "enableAuthProxyIntent",
        "enableAuthProxyResult",
        "ORGANIZATION" / "UPDATE",
        proxy_config::enable_auth_proxy
    ),
    op!(root_quorum
        "disable_auth_proxy",
        "ACTIVITY_TYPE_DISABLE_AUTH_PROXY",
        "disableAuthProxyIntent",
        "disableAuthProxyResult",
        "ORGANIZATION" / "UPDATE",
        proxy_config::disable_auth_proxy
    ),
    op!(root_quorum
        "update_auth_proxy_config",
        "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG",
        "updateAuthProxyConfigIntent",
        "updateAuthProxyConfigResult",
        "ORGANIZATION" / "UPDATE",
        proxy_config::update_auth_proxy_config
    ),
    op!(
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        "createPolicyIntentV3",
        "createPolicyResult",
        "POLICY" / "CREATE",
        policies::create_policy
    ),
    op!(
        "create_policies",
        "ACTIVITY_TYPE_CREATE_POLICIES",
        "createPoliciesIntent",
        "createPoliciesResult",
        "POLICY" / "CREATE",
        policies::create_policies
    ),
    op!(
        "update_policy",
        "ACTIVITY_TYPE_UPDATE_POLICY_V2",
        "updatePolicyIntentV2",
        "updatePolicyResultV2",
        "POLICY" / "UPDATE",
        policies::update_policy
    ),
    op!(
        "delete_policy",
        "ACTIVITY_TYPE_DELETE_POLICY",
        "deletePolicyIntent",
        "deletePolicyResult",
        "POLICY" / "DELETE",
        policies::delete_policy
    ),
    op!(
        "delete_policies",
        "ACTIVITY_TYPE_DELETE_POLICIES",
        "deletePoliciesIntent",
        "deletePoliciesResult",
        "POLICY" / "DELETE",
        policies::delete_policies
    ),
    op!(
        "create_smart_contract_interface",
        "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE",
        "createSmartContractInterfaceIntent",
        "createSmartContractInterfaceResult",
        "SMART_CONTRACT_INTERFACE" / "CREATE",
        contracts::create_smart_contract_interface
    ),
    op!(
        "delete_smart_contract_interface",
        "ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE",
        "deleteSmartContractInterfaceIntent",
        "deleteSmartContractInterfaceResult",
        "SMART_CONTRACT_INTERFACE" / "DELETE",
        contracts::delete_smart_contract_interface
    ),
    op!(
        "create_webhook_endpoint",
        "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        "createWebhookEndpointIntent",
        "createWebhookEndpointResult",
        "WEBHOOK_ENDPOINT" / "CREATE",
        webhooks::create_webhook_endpoint
    ),
    op!(
        "update_webhook_endpoint",
        "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
        "updateWebhookEndpointIntent",
        "updateWebhookEndpointResult",
        "WEBHOOK_ENDPOINT" / "UPDATE",
        webhooks::update_webhook_endpoint
    ),
    op!(
        "delete_webhook_endpoint",
        "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT",
        "deleteWebhookEndpointIntent",
        "deleteWebhookEndpointResult",
        "WEBHOOK_ENDPOINT" / "DELETE",
        webhooks::delete_webhook_endpoint
    ),
    op!(root_quorum
        "set_organization_feature",
        "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        "setOrganizationFeatureIntent",
        "setOrganizationFeatureResult",
        "ORGANIZATION" / "UPDATE",
        organization::set_organization_feature
    ),
    op!(root_quorum
        "remove_organization_feature",
        "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE",
        "removeOrganizationFeatureIntent",
        "removeOrganizationFeatureResult",
        "ORGANIZATION" / "UPDATE",
        organization::remove_organization_feature
    ),
    op!(root_quorum
        "update_root_quorum",
        "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM",
        "updateRootQuorumIntent",
        "updateRootQuorumResult",
        "ORGANIZATION" / "UPDATE",
        organization::update_root_quorum
    ),
    op!(
        "create_tvc_app",
        "ACTIVITY_TYPE_CREATE_TVC_APP",
        "createTvcAppIntent",
        "createTvcAppResult",
        "TVC_APP" / "CREATE",
        tvc::create_tvc_app
    ),
    op!(
        "create_tvc_deployment",
        "ACTIVITY_TYPE_CREATE_TVC_DEPLOYMENT",
        "createTvcDeploymentIntent",
        "createTvcDeploymentResult",
        "TVC_DEPLOYMENT" / "CREATE",
        tvc::create_tvc_deployment
    ),
    op!(
        "delete_tvc_app_and_deployments",
        "ACTIVITY_TYPE_DELETE_TVC_APP_AND_DEPLOYMENTS",
        "deleteTvcAppAndDeploymentsIntent",
        "deleteTvcAppAndDeploymentsResult",
        "TVC_APP" / "DELETE",
        tvc::delete_tvc_app_and_deployments
    ),
    op!(
        "create_sub_organization",
        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
        "createSubOrganizationIntentV8",
        "createSubOrganizationResultV8",
        "ORGANIZATION" / "CREATE",
        suborgs::create_sub_organization
    ),
    // Only the sub-organization's root users, meeting its root quorum, may delete it.
    op!(root_quorum
        "delete_sub_organization",
        "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION",
        "deleteSubOrganizationIntent",
        "deleteSubOrganizationResult",
        "ORGANIZATION" / "DELETE",
        suborgs::delete_sub_organization
    ),
    // <policy engine and approvals>: the pipeline itself adds the vote and answers with the target.
    op!(
        "approve_activity",
        "ACTIVITY_TYPE_APPROVE_ACTIVITY",
        "approveActivityIntent",
        "approveActivityResult",
        "ACTIVITY" / "APPROVE",
        approvals::handled_by_pipeline
    ),
    op!(
        "reject_activity",
        "ACTIVITY_TYPE_REJECT_ACTIVITY",
        "rejectActivityIntent",
        "rejectActivityResult",
        "ACTIVITY" / "REJECT",
        approvals::handled_by_pipeline
    ),
];

/// Every query endpoint.
pub static QUERIES: &[Query] = &[
    Query { path: "whoami", handler: query_handler!(activities::whoami) },
    Query { path: "get_activity", handler: query_handler!(activities::get_activity) },
    Query { path: "list_activities", handler: query_handler!(activities::list_activities) },
    Query { path: "list_app_proofs", handler: query_handler!(proofs::list_app_proofs) },
    Query { path: "get_boot_proof", handler: query_handler!(proofs::get_boot_proof) },
    Query { path: "get_latest_boot_proof", handler: query_handler!(proofs::get_latest_boot_proof) },
    Query { path: "coffer_list_activity_log", handler: query_handler!(proofs::list_activity_log) },
    Query { path: "coffer_get_organization_state", handler: query_handler!(proofs::get_organization_state) },
    Query { path: "list_wallets", handler: query_handler!(wallets::list_wallets) },
    Query { path: "get_wallet", handler: query_handler!(wallets::get_wallet) },
    Query { path: "list_wallet_accounts", handler: query_handler!(wallets::list_wallet_accounts) },
    Query { path: "get_wallet_account", handler: query_handler!(wallets::get_wallet_account) },
    Query { path: "list_private_keys", handler: query_handler!(keys::list_private_keys) },
    Query { path: "get_private_key", handler: query_handler!(keys::get_private_key) },
    Query { path: "get_user", handler: query_handler!(users::get_user) },
    Query { path: "list_users", handler: query_handler!(users::list_users) },
    Query { path: "get_api_key", handler: query_handler!(users::get_api_key) },
    Query { path: "get_api_keys", handler: query_handler!(users::get_api_keys) },
    Query { path: "list_user_tags", handler: query_handler!(tags::list_user_tags) },
    Query { path: "list_private_key_tags", handler: query_handler!(tags::list_private_key_tags) },
    Query { path: "get_authenticator", handler: query_handler!(authenticators::get_authenticator) },
    Query { path: "get_authenticators", handler: query_handler!(authenticators::get_authenticators) },
    Query { path: "get_oauth_providers", handler: query_handler!(oauth::get_oauth_providers) },
    Query { path: "get_oauth2_credential", handler: query_handler!(oauth2::get_oauth2_credential) },
    Query { path: "list_oauth2_credentials", handler: query_handler!(oauth2::list_oauth2_credentials) },
    Query { path: "coffer_get_auth_proxy_config", handler: query_handler!(proxy_config::get_auth_proxy_config) },
    Query { path: "get_policy", handler: query_handler!(policies::get_policy) },
    Query { path: "list_policies", handler: query_handler!(policies::list_policies) },
    Query { path: "get_smart_contract_interface", handler: query_handler!(contracts::get_smart_contract_interface) },
    Query {
        path: "list_smart_contract_interfaces",
        handler: query_handler!(contracts::list_smart_contract_interfaces),
    },
    Query { path: "get_organization", handler: query_handler!(organization::get_organization) },
    Query { path: "get_organization_configs", handler: query_handler!(organization::get_organization_configs) },
    Query { path: "get_tvc_app", handler: query_handler!(tvc::get_tvc_app) },
    Query { path: "list_tvc_apps", handler: query_handler!(tvc::list_tvc_apps) },
    Query { path: "list_tvc_app_deployments", handler: query_handler!(tvc::list_tvc_app_deployments) },
    Query { path: "get_tvc_deployment", handler: query_handler!(tvc::get_tvc_deployment) },
    Query { path: "list_tvc_operators", handler: query_handler!(tvc::list_tvc_operators) },
    Query { path: "list_suborgs", handler: query_handler!(suborgs::list_suborgs) },
    Query { path: "list_verified_suborgs", handler: query_handler!(suborgs::list_verified_suborgs) },
    Query { path: "get_active_policies", handler: query_handler!(policies::get_active_policies) },
    Query { path: "get_ip_allowlist", handler: query_handler!(allowlists::get_ip_allowlist) },
    Query { path: "get_attestation", handler: query_handler!(proofs::get_attestation) },
    Query { path: "list_email_events", handler: query_handler!(email_events::list_email_events) },
    Query { path: "get_session_profile", handler: query_handler!(session_profiles::get_session_profile) },
    Query { path: "get_session_profiles", handler: query_handler!(session_profiles::get_session_profiles) },
    Query { path: "get_policy_evaluations", handler: query_handler!(approvals::get_policy_evaluations) },
    Query { path: "coffer_policy_dry_run", handler: query_handler!(approvals::policy_dry_run) },
    Query { path: "list_webhook_endpoints", handler: query_handler!(webhooks::list_webhook_endpoints) },
    Query { path: "coffer_list_webhook_deliveries", handler: query_handler!(webhooks::list_webhook_deliveries) },
];

/// The registry the pipeline runs.
pub static REGISTRY: Registry = Registry { activities: ACTIVITIES, queries: QUERIES };

#[cfg(test)]
mod tests {
    use super::params::Pagination;
    use super::*;

    #[test]
    fn registry_paths_are_unique_and_keys_follow_the_rule() {
        // A path is registered once, but for older versions (after their current one).
        let current =
            |o: &&Operation| !coffer_org_rules::subjects::OLDER_VERSIONS.iter().any(|(t, _)| *t == o.activity_type);
        let mut paths: Vec<_> =
            ACTIVITIES.iter().filter(current).map(|o| o.path).chain(QUERIES.iter().map(|q| q.path)).collect();
        let n = paths.len();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), n);
        for op in ACTIVITIES {
            assert!(op.activity_type.starts_with("ACTIVITY_TYPE_"));
            assert!(op.intent_key.ends_with("Intent") || op.intent_key.contains("IntentV"), "{}", op.intent_key);
            assert!(op.result_key.contains("Result"), "{}", op.result_key);
        }
    }

    /// The registry states each activity as the table the enclave reads does
    /// (`coffer_org_rules::subjects`): the same types, policy subjects, intent and result names.
    #[test]
    fn registry_matches_the_subjects_the_enclave_reads() {
        for op in ACTIVITIES {
            let s = coffer_org_rules::subjects::subject(op.activity_type)
                .unwrap_or_else(|| panic!("{} has no subject", op.activity_type));
            assert_eq!(
                (op.resource, op.action, op.root_quorum, op.intent_key, op.result_key),
                (s.resource, s.action, s.root_quorum, s.intent_key, s.result_key),
                "{}",
                op.activity_type
            );
        }
        assert_eq!(ACTIVITIES.len(), coffer_org_rules::subjects::SUBJECTS.len());
    }

    #[test]
    fn an_older_version_is_served_at_its_current_versions_path_after_it() {
        for (older, current) in coffer_org_rules::subjects::OLDER_VERSIONS {
            let o = REGISTRY.activity_by_type(older).unwrap();
            let c = REGISTRY.activity_by_type(current).unwrap();
            assert_eq!(o.path, c.path, "{older}");
            assert_eq!(o.parent_may_act, c.parent_may_act, "{older}");
            assert_eq!(
                REGISTRY.activity(o.path).unwrap().activity_type,
                *current,
                "the current version is found first"
            );
            assert_eq!(REGISTRY.activity_version(o.path, older).unwrap().intent_key, o.intent_key);
        }
        assert!(REGISTRY.activity_version("otp_login", "ACTIVITY_TYPE_VERIFY_OTP").is_none());
    }

    /// The paths of `@turnkey/http` 6.6.0's generated fetchers (docs/turnkey-http-6.6.0-paths.txt)
    /// this registry serves, as README's "API coverage" counts them, and every path it does not
    /// serve named there with its reason.
    #[test]
    fn readme_counts_the_served_paths_and_names_every_other_one() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let paths = std::fs::read_to_string(root.join("docs/turnkey-http-6.6.0-paths.txt")).unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let section = readme.split("\n## API coverage").nth(1).expect("README has an API coverage section");
        let section = section.split("\n## ").next().unwrap();
        let (mut served, mut left) = (0, Vec::new());
        let paths: Vec<&str> = paths.lines().filter(|l| !l.trim().is_empty()).collect();
        for p in &paths {
            let is_served = match p.strip_prefix("/public/v1/submit/") {
                Some(name) => REGISTRY.activity(name).is_some(),
                None => p.strip_prefix("/public/v1/query/").is_some_and(|name| REGISTRY.query(name).is_some()),
            };
            if is_served {
                served += 1;
            } else {
                left.push(*p);
            }
        }
        let count = format!("**{served} of {}**", paths.len());
        assert!(section.contains(&count), "README's API coverage should say {count}");
        for p in left {
            let name = p.rsplit('/').next().unwrap();
            assert!(section.contains(&format!("`{name}`")), "README's API coverage does not name {p}");
        }
    }

    #[test]
    fn pagination_limit() {
        assert_eq!(Pagination::default().limit().unwrap(), 10);
        let p = |s: &str| Pagination { limit: Some(s.into()), ..Default::default() };
        assert_eq!(p("100").limit().unwrap(), 100);
        assert!(p("0").limit().is_err());
        assert!(p("101").limit().is_err());
        assert!(p("x").limit().is_err());
    }
}
