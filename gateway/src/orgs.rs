//! Organization bootstrap for the operator CLI: an organization, its root user and API key,
//! certified by the enclave (which also chooses the new organization's and user's ids).

use coffer_proto::v1 as pb;

use crate::enclave_client::Enclave;
use crate::store::{now_nanos, ApiKey, Organization, Store, User, Write};

/// Ids of what `init-org` created.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedOrg {
    pub organization_id: String,
    pub user_id: String,
    pub api_key_id: String,
}

/// Creates an organization with one root user holding one P-256 API key (threshold 1).
pub async fn create_root_org(
    store: &dyn Store,
    enclave: &mut Enclave,
    name: &str,
    user_name: &str,
    api_public_key: &str,
) -> anyhow::Result<CreatedOrg> {
    let (pk, credential_type) = coffer_auth::grants::api_public_key("API_KEY_CURVE_P256", api_public_key)
        .map_err(|e| anyhow::anyhow!("API public key: {}", e.message))?;
    let boot = enclave
        .bootstrap_organization(pb::BootstrapOrganizationRequest {
            credential_type: credential_type.to_string(),
            public_key: pk.clone(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("the enclave did not bootstrap the organization: {}", e.message()))?
        .into_inner();
    let now = now_nanos();
    let (org_id, user_id) = (boot.organization_id, boot.user_id);
    let key_id = uuid::Uuid::new_v4().to_string();
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
