//! What a state change's result says of the records it made ([`made_ids`]): the members of the
//! API's result that name them, each as the changes the enclave computed hold it. The enclave
//! links the activity only with these as they are, so no log link states an id it did not make.

use serde_json::{json, Value};

use crate::effect::{Change, Effect};
use crate::model::CredentialKind;

/// The members of `activity_type`'s result (JSON pointers into it, under its result key) that
/// name the records `changes` make, with their values. Members that echo the stamped body (a
/// deleted id, an updated one) are not here: the link's intent states the body as stamped.
pub fn made_ids(activity_type: &str, changes: &[Change]) -> Vec<(&'static str, Value)> {
    // The ids of the records the changes of one kind make, in order.
    let of = |is: fn(&Effect) -> bool| -> Vec<String> {
        changes.iter().filter(|c| is(&c.effect)).filter_map(|c| made(&c.effect)).map(str::to_string).collect()
    };
    let credentials = |kind: CredentialKind| -> Value {
        let ids = changes.iter().filter_map(|c| match &c.effect {
            Effect::AddCredential { credential } if credential.kind == kind => Some(credential.id.as_str()),
            _ => None,
        });
        json!(ids.collect::<Vec<_>>())
    };
    let first = |ids: Vec<String>| ids.into_iter().next().map_or(Value::Null, Value::String);
    let policies = || of(|e| matches!(e, Effect::PutPolicy { .. }));
    let users = || of(|e| matches!(e, Effect::PutUser { .. }));
    let tag = || first(of(|e| matches!(e, Effect::PutTag { .. })));
    match activity_type {
        "ACTIVITY_TYPE_CREATE_POLICY_V3" => vec![("/policyId", first(policies()))],
        "ACTIVITY_TYPE_CREATE_POLICIES" => vec![("/policyIds", json!(policies()))],
        "ACTIVITY_TYPE_CREATE_USERS_V4" | "ACTIVITY_TYPE_CREATE_API_ONLY_USERS" => vec![("/userIds", json!(users()))],
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2" => vec![("/apiKeyIds", credentials(CredentialKind::ApiKey))],
        "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2" => vec![("/authenticatorIds", credentials(CredentialKind::Passkey))],
        "ACTIVITY_TYPE_RECOVER_USER" => vec![("/authenticatorId", credentials(CredentialKind::Passkey))],
        "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2" => {
            vec![("/providerIds", credentials(CredentialKind::OauthIdentity))]
        }
        "ACTIVITY_TYPE_CREATE_INVITATIONS" => {
            vec![("/invitationIds", json!(of(|e| matches!(e, Effect::PutInvitation { .. }))))]
        }
        "ACTIVITY_TYPE_ACCEPT_INVITATION_V2" => vec![("/userId", first(users()))],
        "ACTIVITY_TYPE_CREATE_USER_TAG" => vec![("/userTagId", tag())],
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG" => vec![("/privateKeyTagId", tag())],
        "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE" => {
            vec![("/smartContractInterfaceId", first(of(|e| matches!(e, Effect::PutContractInterface { .. }))))]
        }
        "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT" => {
            vec![("/endpointId", first(of(|e| matches!(e, Effect::PutWebhookEndpoint { .. }))))]
        }
        "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL" => {
            vec![("/oauth2CredentialId", first(of(|e| matches!(e, Effect::PutOauth2Credential { .. }))))]
        }
        // Its user only the first time (the changes make one); on a re-enabling, the user is
        // the gateway's record of the first.
        "ACTIVITY_TYPE_ENABLE_AUTH_PROXY" => match users().into_iter().next() {
            Some(user) => vec![("/userId", Value::String(user))],
            None => Vec::new(),
        },
        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8" => {
            let organization = first(of(|e| matches!(e, Effect::CreateOrganization { .. })));
            let mut out = vec![("/subOrganizationId", organization), ("/rootUserIds", json!(users()))];
            if let Some(wallet) = of(|e| matches!(e, Effect::PutWallet { .. })).pop() {
                let addresses: Vec<&str> = changes
                    .iter()
                    .filter_map(|c| match &c.effect {
                        Effect::PutAccounts { accounts } => Some(accounts),
                        _ => None,
                    })
                    .flatten()
                    .map(|a| a.address.as_str())
                    .collect();
                out.push(("/wallet/walletId", Value::String(wallet)));
                out.push(("/wallet/addresses", json!(addresses)));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The id of the record `e` makes.
fn made(e: &Effect) -> Option<&str> {
    Some(match e {
        Effect::PutPolicy { policy } => &policy.id,
        Effect::PutUser { user } => &user.id,
        Effect::PutContractInterface { interface } => &interface.id,
        Effect::PutWebhookEndpoint { endpoint } => &endpoint.id,
        Effect::PutOauth2Credential { credential } => &credential.id,
        Effect::CreateOrganization { organization } => &organization.id,
        Effect::PutWallet { wallet } => &wallet.id,
        Effect::PutTag { tag, .. } => &tag.id,
        Effect::PutInvitation { id, .. } => id,
        _ => return None,
    })
}
