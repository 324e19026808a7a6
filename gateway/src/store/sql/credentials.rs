//! Credentials: API keys, passkeys (authenticators) and OAuth providers, their certificates, and
//! the list of those still without one.

use super::db::{args, json_text, parse_json, unique_as, Dialect, SqlRow};
use super::page::{by_organization, keyset_page};
use crate::store::error::StoreError;
use crate::store::model::{
    ApiKey, AuthenticatorRecord, CredentialKind, OauthProviderRecord, Page, UncertifiedCredential,
};

pub const API_KEY_COLS: &str = "id, organization_id, user_id, name, public_key, credential_type, expiration_seconds, created_at, updated_at, certificate";
pub fn api_key_row(r: &dyn SqlRow) -> Result<ApiKey, StoreError> {
    Ok(ApiKey {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        public_key: r.text(4)?,
        credential_type: r.text(5)?,
        expiration_seconds: r.opt_int(6)?.map(|v| v as u64),
        created_at: r.int(7)?,
        updated_at: r.int(8)?,
        certificate: r.bytes(9)?,
    })
}

const AUTHENTICATOR_COLS: &str = "id, organization_id, user_id, name, credential_id, public_key, attestation_type, aaguid, transports, sign_count, created_at, updated_at, certificate";
fn authenticator_row(r: &dyn SqlRow) -> Result<AuthenticatorRecord, StoreError> {
    Ok(AuthenticatorRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        credential_id: r.text(4)?,
        public_key: r.text(5)?,
        attestation_type: r.text(6)?,
        aaguid: r.text(7)?,
        transports: parse_json(r.text(8)?),
        sign_count: r.int(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
        certificate: r.bytes(12)?,
    })
}

const OAUTH_PROVIDER_COLS: &str =
    "id, organization_id, user_id, name, issuer, audience, subject, created_at, updated_at, certificate";
fn oauth_provider_row(r: &dyn SqlRow) -> Result<OauthProviderRecord, StoreError> {
    Ok(OauthProviderRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        issuer: r.text(4)?,
        audience: r.text(5)?,
        subject: r.text(6)?,
        created_at: r.int(7)?,
        updated_at: r.int(8)?,
        certificate: r.bytes(9)?,
    })
}

pub fn insert_api_key<D: Dialect>(db: &mut D, k: &ApiKey) -> Result<(), StoreError> {
    db.execute(
        &format!("INSERT INTO api_keys ({API_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
        args![
            k.id,
            k.organization_id,
            k.user_id,
            k.name,
            k.public_key,
            k.credential_type,
            k.expiration_seconds.map(|v| v as i64),
            k.created_at,
            k.updated_at,
            k.certificate
        ],
    )?;
    Ok(())
}

/// See `Write::DeleteApiKeys`.
pub fn delete_api_keys<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    user_id: &str,
    ids: &[String],
) -> Result<(), StoreError> {
    for id in ids {
        let n = db.execute(
            "DELETE FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
            args![organization_id, user_id, id],
        )?;
        if n != 1 {
            return Err(StoreError::conflict(format!("api key not found for user {user_id}: {id}")));
        }
    }
    Ok(())
}

/// See `Write::SetCertificate`.
pub fn set_certificate<D: Dialect>(
    db: &mut D,
    kind: CredentialKind,
    id: &str,
    certificate: &[u8],
) -> Result<(), StoreError> {
    let sql = match kind {
        CredentialKind::ApiKey => "UPDATE api_keys SET certificate = ?2 WHERE id = ?1",
        CredentialKind::Authenticator => "UPDATE authenticators SET certificate = ?2 WHERE id = ?1",
        CredentialKind::OauthProvider => "UPDATE oauth_providers SET certificate = ?2 WHERE id = ?1",
        // Parent certificates are records (Write::PutRecord), written by the importer.
        CredentialKind::ParentOrganization => {
            return Err(StoreError::conflict("a parent certificate is stored as a record"))
        }
    };
    if db.execute(sql, args![id, certificate])? != 1 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

/// See `Write::InsertAuthenticators`.
pub fn insert_authenticators<D: Dialect>(db: &mut D, list: &[AuthenticatorRecord]) -> Result<(), StoreError> {
    for a in list {
        db.execute(
            &format!("INSERT INTO authenticators ({AUTHENTICATOR_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"),
            args![
                a.id, a.organization_id, a.user_id, a.name, a.credential_id, a.public_key, a.attestation_type,
                a.aaguid, json_text(&a.transports), a.sign_count, a.created_at, a.updated_at, a.certificate
            ],
        )
        .map_err(unique_as(format!(
            "an authenticator with credential ID {} already exists in the organization",
            a.credential_id
        )))?;
    }
    Ok(())
}

/// See `Write::DeleteAuthenticators`.
pub fn delete_authenticators<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    user_id: &str,
    ids: &[String],
) -> Result<(), StoreError> {
    for id in ids {
        let n = db.execute(
            "DELETE FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
            args![organization_id, user_id, id],
        )?;
        if n != 1 {
            return Err(StoreError::conflict(format!("authenticator not found for user {user_id}: {id}")));
        }
    }
    Ok(())
}

/// See `Write::InsertOauthProviders`.
pub fn insert_oauth_providers<D: Dialect>(db: &mut D, list: &[OauthProviderRecord]) -> Result<(), StoreError> {
    for p in list {
        db.execute(
            &format!(
                "INSERT INTO oauth_providers ({OAUTH_PROVIDER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ),
            args![
                p.id,
                p.organization_id,
                p.user_id,
                p.name,
                p.issuer,
                p.audience,
                p.subject,
                p.created_at,
                p.updated_at,
                p.certificate
            ],
        )
        .map_err(unique_as("oauth provider already exists"))?;
    }
    Ok(())
}

/// See `Write::DeleteOauthProviders`.
pub fn delete_oauth_providers<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    user_id: &str,
    ids: &[String],
) -> Result<(), StoreError> {
    for id in ids {
        let n = db.execute(
            "DELETE FROM oauth_providers WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
            args![organization_id, user_id, id],
        )?;
        if n != 1 {
            return Err(StoreError::conflict(format!("oauth provider not found for user {user_id}: {id}")));
        }
    }
    Ok(())
}

pub fn api_key_by_public_key<D: Dialect>(db: &mut D, org: &str, public_key: &str) -> Result<ApiKey, StoreError> {
    let sql = format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND public_key = ?2");
    db.query_one(&sql, args![org, public_key], api_key_row)
}

pub fn api_keys_of_user<D: Dialect>(db: &mut D, org: &str, user_id: &str) -> Result<Vec<ApiKey>, StoreError> {
    let sql = format!(
        "SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], api_key_row)
}

pub fn api_key<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<ApiKey, StoreError> {
    let sql = format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], api_key_row)
}

pub fn api_keys_page<D: Dialect>(db: &mut D, org: &str, page: &Page) -> Result<Vec<ApiKey>, StoreError> {
    keyset_page(db, by_organization("api_keys", API_KEY_COLS, &[org]), page, api_key_row)
}

pub fn uncertified_credentials<D: Dialect>(db: &mut D) -> Result<Vec<UncertifiedCredential>, StoreError> {
    let mut out = db.query(
        "SELECT id, organization_id, user_id, credential_type, public_key, expiration_seconds, created_at
         FROM api_keys WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            let expiration = r.opt_int(5)?;
            let created_at = r.int(6)?;
            Ok::<_, StoreError>(UncertifiedCredential {
                kind: CredentialKind::ApiKey,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: r.text(3)?,
                public_key: r.text(4)?,
                expires_at_ms: expiration
                    .map_or(0, |e| (created_at / 1_000_000).saturating_add(e.saturating_mul(1000)).max(1) as u64),
            })
        },
    )?;
    out.extend(db.query(
        "SELECT id, organization_id, user_id, public_key FROM authenticators
         WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            Ok::<_, StoreError>(UncertifiedCredential {
                kind: CredentialKind::Authenticator,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: coffer_auth::webauthn::CREDENTIAL_TYPE.to_string(),
                public_key: r.text(3)?,
                expires_at_ms: 0,
            })
        },
    )?);
    out.extend(db.query(
        "SELECT id, organization_id, user_id, issuer, subject, audience FROM oauth_providers
         WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            Ok::<_, StoreError>(UncertifiedCredential {
                kind: CredentialKind::OauthProvider,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: coffer_auth::grants::OAUTH_PROVIDER.to_string(),
                public_key: coffer_auth::oidc::identity_hash(&r.text(3)?, &r.text(4)?, &r.text(5)?),
                expires_at_ms: 0,
            })
        },
    )?);
    out.extend(db.query(
        "SELECT o.id, o.parent_id FROM organizations o
         WHERE o.parent_id IS NOT NULL AND o.deleted_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM records r WHERE r.organization_id = o.id AND r.kind = 'parent_certificate')
         ORDER BY o.created_at, o.id",
        args![],
        |r| {
            Ok::<_, StoreError>(UncertifiedCredential {
                kind: CredentialKind::ParentOrganization,
                id: r.text(0)?,
                organization_id: r.text(0)?,
                user_id: String::new(),
                credential_type: coffer_auth::grants::PARENT_ORGANIZATION.to_string(),
                public_key: r.text(1)?,
                expires_at_ms: 0,
            })
        },
    )?);
    Ok(out)
}

pub fn authenticator<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<AuthenticatorRecord, StoreError> {
    let sql = format!("SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], authenticator_row)
}

pub fn authenticator_by_credential_id<D: Dialect>(
    db: &mut D,
    org: &str,
    credential_id: &str,
) -> Result<AuthenticatorRecord, StoreError> {
    let sql =
        format!("SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND credential_id = ?2");
    db.query_one(&sql, args![org, credential_id], authenticator_row)
}

pub fn authenticators_of_user<D: Dialect>(
    db: &mut D,
    org: &str,
    user_id: &str,
) -> Result<Vec<AuthenticatorRecord>, StoreError> {
    let sql = format!(
        "SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], authenticator_row)
}

pub fn oauth_providers<D: Dialect>(
    db: &mut D,
    org: &str,
    user_id: Option<&str>,
) -> Result<Vec<OauthProviderRecord>, StoreError> {
    let sql = format!(
        "SELECT {OAUTH_PROVIDER_COLS} FROM oauth_providers WHERE organization_id = ?1
           AND (CAST(?2 AS TEXT) IS NULL OR user_id = CAST(?2 AS TEXT))
         ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], oauth_provider_row)
}
