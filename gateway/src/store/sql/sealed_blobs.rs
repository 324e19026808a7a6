//! The blobs the enclave sealed that the gateway keeps, table by table, for re-sealing under a new
//! KEK: read a page at a time in key order, each replaced only if it is still the blob read.

use super::db::{args, json_text, parse_json, Dialect};
use crate::record_kinds::{AUTH_PROXY, OTP};
use crate::store::error::StoreError;
use crate::store::model::{SealedBlobTable, StoredBlob};

/// Where a record keeps its blob (hex, in its data), by record kind.
fn record_field(table: SealedBlobTable) -> Option<(&'static str, &'static str)> {
    match table {
        SealedBlobTable::AuthProxyKeys => Some((AUTH_PROXY, "sealedKey")),
        SealedBlobTable::OtpRecords => Some((OTP, "sealed")),
        _ => None,
    }
}

/// Up to `limit` blobs of `table` whose key is after `after` (`""`: from the first), in key order.
pub fn sealed_blobs_page<D: Dialect>(
    db: &mut D,
    table: SealedBlobTable,
    after: &str,
    limit: usize,
) -> Result<Vec<StoredBlob>, StoreError> {
    let limit = limit as i64;
    let blob = |table, key: String, org: String, resource: String, blob: Vec<u8>| StoredBlob {
        table,
        key,
        organization_id: org,
        resource_id: resource,
        blob,
        ..Default::default()
    };
    match table {
        SealedBlobTable::Wallets => db.query(
            "SELECT id, organization_id, sealed_seed FROM wallets WHERE id > ?1 ORDER BY id LIMIT ?2",
            args![after, limit],
            |r| Ok(blob(table, r.text(0)?, r.text(1)?, r.text(0)?, r.bytes(2)?)),
        ),
        SealedBlobTable::WalletAccounts => db.query(
            "SELECT id, organization_id, sealed_key, curve, address, address_format FROM wallet_accounts
             WHERE id > ?1 ORDER BY id LIMIT ?2",
            args![after, limit],
            |r| {
                Ok(StoredBlob {
                    curve: r.text(3)?,
                    address: r.text(4)?,
                    address_format: r.text(5)?,
                    ..blob(table, r.text(0)?, r.text(1)?, r.text(0)?, r.bytes(2)?)
                })
            },
        ),
        SealedBlobTable::PrivateKeys => db.query(
            "SELECT id, organization_id, sealed_key, curve, public_key FROM private_keys
             WHERE id > ?1 ORDER BY id LIMIT ?2",
            args![after, limit],
            |r| {
                Ok(StoredBlob {
                    curve: r.text(3)?,
                    public_key: r.text(4)?,
                    ..blob(table, r.text(0)?, r.text(1)?, r.text(0)?, r.bytes(2)?)
                })
            },
        ),
        // Keyed by organization and user: `after` is `organization\nuser`.
        SealedBlobTable::ImportTargets => {
            let (org, user) = after.split_once('\n').unwrap_or((after, ""));
            db.query(
                "SELECT organization_id, user_id, sealed_key FROM import_targets
                 WHERE organization_id > ?1 OR (organization_id = ?1 AND user_id > ?2)
                 ORDER BY organization_id, user_id LIMIT ?3",
                args![org, user, limit],
                |r| {
                    let (org, user) = (r.text(0)?, r.text(1)?);
                    Ok(blob(table, format!("{org}\n{user}"), org, user, r.bytes(2)?))
                },
            )
        }
        SealedBlobTable::AuthProxyKeys | SealedBlobTable::OtpRecords => {
            let (kind, field) = record_field(table).unwrap_or_default();
            let (org, id) = after.split_once('\n').unwrap_or((after, ""));
            let rows = db.query(
                "SELECT organization_id, id, data FROM records
                 WHERE kind = ?1 AND (organization_id > ?2 OR (organization_id = ?2 AND id > ?3))
                 ORDER BY organization_id, id LIMIT ?4",
                args![kind, org, id, limit],
                |r| Ok::<_, StoreError>((r.text(0)?, r.text(1)?, r.text(2)?)),
            )?;
            Ok(rows
                .into_iter()
                .map(|(org, id, data)| {
                    let value: serde_json::Value = parse_json(data.clone());
                    let sealed = hex::decode(value[field].as_str().unwrap_or_default()).unwrap_or_default();
                    let key = format!("{org}\n{id}");
                    match table {
                        // The proxy user's key: bound to its user and public key.
                        SealedBlobTable::AuthProxyKeys => StoredBlob {
                            curve: "CURVE_P256".into(),
                            public_key: value["publicKey"].as_str().unwrap_or_default().to_string(),
                            record_data: data,
                            ..blob(table, key, org, value["userId"].as_str().unwrap_or_default().to_string(), sealed)
                        },
                        _ => StoredBlob { record_data: data, ..blob(table, key, org, id, sealed) },
                    }
                })
                .collect())
        }
    }
}

/// Replaces `stored`'s blob by `new` if the row still holds the blob `stored` was read with;
/// answers whether it did.
pub fn replace_sealed_blob<D: Dialect>(db: &mut D, stored: &StoredBlob, new: &[u8]) -> Result<bool, StoreError> {
    let changed = match stored.table {
        SealedBlobTable::Wallets => db.execute(
            "UPDATE wallets SET sealed_seed = ?3 WHERE id = ?1 AND sealed_seed = ?2",
            args![stored.key, stored.blob, new],
        )?,
        SealedBlobTable::WalletAccounts => db.execute(
            "UPDATE wallet_accounts SET sealed_key = ?3 WHERE id = ?1 AND sealed_key = ?2",
            args![stored.key, stored.blob, new],
        )?,
        SealedBlobTable::PrivateKeys => db.execute(
            "UPDATE private_keys SET sealed_key = ?3 WHERE id = ?1 AND sealed_key = ?2",
            args![stored.key, stored.blob, new],
        )?,
        SealedBlobTable::ImportTargets => db.execute(
            "UPDATE import_targets SET sealed_key = ?4 WHERE organization_id = ?1 AND user_id = ?2 AND sealed_key = ?3",
            args![stored.organization_id, stored.resource_id, stored.blob, new],
        )?,
        SealedBlobTable::AuthProxyKeys | SealedBlobTable::OtpRecords => {
            let (kind, field) = record_field(stored.table).unwrap_or_default();
            let id = stored.key.split_once('\n').map(|(_, id)| id).unwrap_or_default();
            let mut data: serde_json::Value = parse_json(stored.record_data.clone());
            data[field] = serde_json::Value::String(hex::encode(new));
            db.execute(
                "UPDATE records SET data = ?5 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3 AND data = ?4",
                args![stored.organization_id, kind, id, stored.record_data, json_text(&data)],
            )?
        }
    };
    Ok(changed == 1)
}
