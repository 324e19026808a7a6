//! The kinds of the store's generic records (the `records` table), named once for every module.

/// A policy (`data`: the policy JSON clients read).
pub const POLICY: &str = "policy";
/// A smart contract interface (Ethereum ABI or Solana IDL) policies decode calls with.
pub const SMART_CONTRACT_INTERFACE: &str = "smart_contract_interface";
/// A user tag (`data.userIds`).
pub const USER_TAG: &str = "user_tag";
/// A private-key tag (`data.privateKeyIds`).
pub const PRIVATE_KEY_TAG: &str = "private_key_tag";
/// An organization feature: id = name = the `FeatureName`, data `{"value": ..}`.
pub const FEATURE: &str = "feature";
/// A webhook endpoint (its URL, filters and name).
pub const WEBHOOK_ENDPOINT: &str = "webhook_endpoint";
/// An OAuth 2.0 client (X, Discord), its secret sealed to the enclave.
pub const OAUTH2_CREDENTIAL: &str = "oauth2_credential";
/// The auth proxy's configuration of an organization (its key sealed by the enclave).
pub const AUTH_PROXY: &str = "auth_proxy";
/// A sub-organization's parent certificate: the enclave's proof that the parent's credentials may
/// submit its login activities.
pub const PARENT_CERTIFICATE: &str = "parent_certificate";
/// A one-time code's record, sealed by the enclave (`data.sealed`, hex): the gateway keeps it for
/// `verify_otp` and cannot read the code from it.
pub const OTP: &str = "otp";
/// A public key (API key or passkey) that proved in this organization that its holder signs
/// with it: it stamped a `stamp_login` here, or its `clientSignature` covered the sign-up that
/// registered it. id = name = the key (lowercase hex), as stored. The auth proxy's anonymous
/// `PUBLIC_KEY` lookups find only these.
pub const PROVEN_KEY: &str = "proven_key";
/// An IP allowlist (`coffer_org_rules::model::IpAllowlist` as data): the organization's (id
/// `organization`) or an API key's (id: its public key).
pub const IP_ALLOWLIST: &str = "ip_allowlist";
/// A session profile (`coffer_org_rules::model::SessionProfile` as data), by its id.
pub const SESSION_PROFILE: &str = "session_profile";
/// An invitation (`coffer_org_rules::model::Invitation` as data), by its id.
pub const INVITATION: &str = "invitation";
/// Turnkey Verifiable Cloud: apps, deployments, operator sets and operators.
pub const TVC_APP: &str = "tvc_app";
pub const TVC_DEPLOYMENT: &str = "tvc_deployment";
pub const TVC_OPERATOR_SET: &str = "tvc_operator_set";
pub const TVC_OPERATOR: &str = "tvc_operator";

/// Every kind, for checks that they are distinct.
pub const ALL: &[&str] = &[
    POLICY,
    SMART_CONTRACT_INTERFACE,
    USER_TAG,
    PRIVATE_KEY_TAG,
    FEATURE,
    WEBHOOK_ENDPOINT,
    OAUTH2_CREDENTIAL,
    AUTH_PROXY,
    PARENT_CERTIFICATE,
    OTP,
    PROVEN_KEY,
    IP_ALLOWLIST,
    SESSION_PROFILE,
    INVITATION,
    TVC_APP,
    TVC_DEPLOYMENT,
    TVC_OPERATOR_SET,
    TVC_OPERATOR,
];

#[cfg(test)]
mod tests {
    #[test]
    fn kinds_are_distinct() {
        let mut kinds = super::ALL.to_vec();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), super::ALL.len());
    }
}
