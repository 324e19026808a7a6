//! Operator commands on organizations: bootstrap (an organization, its root user and API key,
//! certified by the enclave, which also chooses the ids) and the one-time certificate import.

use coffer_proto::v1 as pb;
use prost::Message;

use crate::custody::Custody;
use crate::operator_key::OperatorKey;
use crate::store::{now_nanos, ApiKey, CredentialKind, Organization, Store, UncertifiedCredential, User, Write};

/// Ids of what `init-org` created.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedOrg {
    pub organization_id: String,
    pub user_id: String,
    pub api_key_id: String,
}

/// The enclave request that bootstraps `name` with root user `user_name` holding the API key
/// `public_key` (compressed P-256 hex), stamped now by the operator's key.
pub fn bootstrap_request(
    operator: &OperatorKey,
    name: &str,
    user_name: &str,
    public_key: &str,
    credential_type: &str,
) -> pb::BootstrapOrganizationRequest {
    let parameters = coffer_auth::operator::BootstrapParameters {
        organization_name: name.into(),
        root_user_name: user_name.into(),
        root_api_public_key: public_key.into(),
    };
    let body = coffer_auth::operator::bootstrap_body(&parameters, (now_nanos() / 1_000_000) as i64);
    pb::BootstrapOrganizationRequest {
        credential_type: credential_type.to_string(),
        public_key: public_key.to_string(),
        operator: Some(pb::StampedRequest {
            stamp: operator.stamp(&body),
            body,
            stamp_header: "X-Stamp".into(),
            certificate: Vec::new(),
        }),
    }
}

/// Creates an organization with one root user holding one P-256 API key (threshold 1): the
/// enclave bootstraps it for the operator's stamp.
pub async fn create_root_org(
    store: &dyn Store,
    custody: &Custody,
    operator: &OperatorKey,
    name: &str,
    user_name: &str,
    api_public_key: &str,
) -> anyhow::Result<CreatedOrg> {
    let (pk, credential_type) = coffer_auth::grants::api_public_key("API_KEY_CURVE_P256", api_public_key)
        .map_err(|e| anyhow::anyhow!("API public key: {}", e.message))?;
    let boot = custody
        .bootstrap_organization(bootstrap_request(operator, name, user_name, &pk, credential_type))
        .await
        .map_err(|e| anyhow::anyhow!("the enclave did not bootstrap the organization: {}", e.message))?;
    let now = now_nanos();
    let (org_id, user_id) = (boot.organization_id, boot.user_id);
    // The key's id in the enclave's authority state, so that deleting it there names it.
    let key_id = boot.api_key_id;
    store.apply(&[
        Write::InsertOrganization(Organization {
            id: org_id.clone(),
            name: name.into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![user_id.clone()],
            created_at: now,
            updated_at: now,
        }),
        Write::InsertUser(User {
            id: user_id.clone(),
            organization_id: org_id.clone(),
            name: user_name.into(),
            email: None,
            phone_number: None,
            contacts_verified: false,
            created_at: now,
            updated_at: now,
        }),
        Write::InsertApiKey(ApiKey {
            id: key_id.clone(),
            organization_id: org_id.clone(),
            user_id: user_id.clone(),
            name: "root".into(),
            public_key: pk,
            credential_type: credential_type.into(),
            expiration_seconds: None,
            created_at: now,
            updated_at: now,
            certificate: boot.certificate,
        }),
    ])?;
    Ok(CreatedOrg { organization_id: org_id, user_id, api_key_id: key_id })
}

/// Stores the certificates of a `coffer-enclave certify-existing` run (JSON lines: an
/// [`UncertifiedCredential`] plus `certificate`, hex). Each certificate must name exactly its
/// row's organization, user, type and public key; all are stored in one transaction, or none.
pub fn import_certificates(store: &dyn Store, input: impl std::io::BufRead) -> anyhow::Result<usize> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(flatten)]
        credential: UncertifiedCredential,
        certificate: String,
    }
    let mut writes = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("line {}: {e}", n + 1))?;
        let bytes =
            hex::decode(&l.certificate).map_err(|_| anyhow::anyhow!("line {}: certificate is not hex", n + 1))?;
        let cert = pb::CredentialCertificate::decode(bytes.as_slice())
            .map_err(|_| anyhow::anyhow!("line {}: not a certificate", n + 1))?;
        let c = &l.credential;
        if (&cert.organization_id, &cert.user_id, &cert.credential_type, &cert.public_key)
            != (&c.organization_id, &c.user_id, &c.credential_type, &c.public_key)
        {
            anyhow::bail!("line {}: the certificate is not for credential {}", n + 1, c.id);
        }
        writes.push(match c.kind {
            CredentialKind::ParentOrganization => Write::PutRecord(crate::store::Record {
                organization_id: c.organization_id.clone(),
                kind: crate::record_kinds::PARENT_CERTIFICATE.into(),
                id: crate::record_kinds::PARENT_CERTIFICATE.into(),
                name: crate::record_kinds::PARENT_CERTIFICATE.into(),
                data: serde_json::json!({ "certificate": hex::encode(&bytes) }),
                created_at: now_nanos(),
                updated_at: now_nanos(),
            }),
            kind => Write::SetCertificate { kind, id: c.id.clone(), certificate: bytes },
        });
    }
    store.apply(&writes)?;
    Ok(writes.len())
}

/// One-time upgrade to the enclave's authority state: the changes that build `organization_id`'s
/// state (and each of its sub-organizations', depth first) from the gateway's records, as
/// `{"organizationId", "changes"}` JSON lines for `coffer-enclave import-authority-state`. It
/// trusts the database at that moment, as `certify-existing` does. Session keys are left out
/// (they expire; users log in again).
pub fn authority_state_lines(store: &dyn Store, organization_id: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    use crate::record_kinds::{
        AUTH_PROXY, FEATURE, OAUTH2_CREDENTIAL, POLICY, PRIVATE_KEY_TAG, SMART_CONTRACT_INTERFACE, USER_TAG,
        WEBHOOK_ENDPOINT,
    };
    use crate::store::{Page, SubOrgFilter};
    let org = store.organization(organization_id)?;
    let mut writes = vec![Write::InsertOrganization(org.clone())];
    for kind in [USER_TAG, PRIVATE_KEY_TAG] {
        writes.extend(store.records(&org.id, kind)?.into_iter().map(Write::PutRecord));
    }
    let users = store.users(&org.id)?;
    for u in &users {
        writes.push(Write::InsertUser(u.clone()));
        writes.push(Write::UpdateUser {
            organization_id: org.id.clone(),
            id: u.id.clone(),
            name: None,
            email: None,
            phone_number: None,
            tag_ids: Some(store.user_tags_of(&org.id, &u.id)?),
            updated_at: u.updated_at,
        });
        let authenticators = store.authenticators_of_user(&org.id, &u.id)?;
        if !authenticators.is_empty() {
            writes.push(Write::InsertAuthenticators(authenticators));
        }
    }
    // Certificates cleared: the projection leaves certified keys out as enclave-issued ones.
    let keys = store.api_keys(&org.id)?.into_iter().map(|k| ApiKey { certificate: Vec::new(), ..k });
    writes.extend(keys.map(Write::InsertApiKey));
    let providers = store.oauth_providers(&org.id, None)?;
    if !providers.is_empty() {
        writes.push(Write::InsertOauthProviders(providers));
    }
    for w in store.wallets(&org.id)? {
        let accounts = store.accounts(&org.id, Some(&w.id))?;
        writes.push(Write::InsertWallet(w));
        writes.push(Write::InsertAccounts(accounts));
    }
    let private_keys = store.private_keys(&org.id)?;
    if !private_keys.is_empty() {
        writes.push(Write::InsertPrivateKeys(private_keys));
    }
    for kind in [POLICY, SMART_CONTRACT_INTERFACE, FEATURE, WEBHOOK_ENDPOINT, OAUTH2_CREDENTIAL, AUTH_PROXY] {
        writes.extend(store.records(&org.id, kind)?.into_iter().map(Write::PutRecord));
    }
    let changes = crate::record_changes::of_writes(&org.id, &writes);
    let mut out = vec![serde_json::json!({ "organizationId": org.id, "changes": changes })];
    for sub in store.sub_organization_ids(&org.id, &SubOrgFilter::All, &Page::ALL)? {
        out.extend(authority_state_lines(store, &sub)?);
    }
    Ok(out)
}
