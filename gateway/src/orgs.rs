//! Organization bootstrap for the operator CLI: an organization, its root user and API key.

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
pub fn create_root_org(
    store: &dyn Store,
    name: &str,
    user_name: &str,
    api_public_key: &str,
) -> anyhow::Result<CreatedOrg> {
    let pk = api_public_key.trim().to_ascii_lowercase();
    let bytes = hex::decode(&pk).map_err(|_| anyhow::anyhow!("API public key must be hex"))?;
    p256::PublicKey::from_sec1_bytes(&bytes).map_err(|_| anyhow::anyhow!("API public key is not a P-256 point"))?;
    if bytes.len() != 33 {
        anyhow::bail!("API public key must be compressed (33 bytes, 66 hex chars)");
    }
    let now = now_nanos();
    let org_id = uuid::Uuid::new_v4().to_string();
    let user_id = uuid::Uuid::new_v4().to_string();
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
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            expiration_seconds: None,
            created_at: now,
            updated_at: now,
        }),
    ])?;
    Ok(CreatedOrg { organization_id: org_id, user_id, api_key_id: key_id })
}
