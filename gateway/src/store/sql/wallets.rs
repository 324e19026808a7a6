//! Keys: wallets, their accounts, private keys (with their addresses), and import targets.

use super::db::{args, json_text, parse_json, unique_as, Dialect, SqlRow};
use super::page::{by_organization, keyset_page, Listing};
use crate::store::error::{Conflict, StoreError};
use crate::store::model::{now_nanos, ImportTarget, Named, Nanos, Page, PrivateKey, Wallet, WalletAccount};

const WALLET_COLS: &str = "id, organization_id, name, exported, imported, sealed_seed, created_at, updated_at";
fn wallet_row(r: &dyn SqlRow) -> Result<Wallet, StoreError> {
    Ok(Wallet {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        exported: r.int(3)? != 0,
        imported: r.int(4)? != 0,
        sealed_seed: r.bytes(5)?,
        created_at: r.int(6)?,
        updated_at: r.int(7)?,
    })
}

const ACCOUNT_COLS: &str = "id, organization_id, wallet_id, curve, path_format, path, address_format, address, public_key, sealed_key, created_at, updated_at";
fn account_row(r: &dyn SqlRow) -> Result<WalletAccount, StoreError> {
    Ok(WalletAccount {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        wallet_id: r.text(2)?,
        curve: r.text(3)?,
        path_format: r.text(4)?,
        path: r.text(5)?,
        address_format: r.text(6)?,
        address: r.text(7)?,
        public_key: r.text(8)?,
        sealed_key: r.bytes(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
    })
}

const PRIVATE_KEY_COLS: &str = "id, organization_id, name, curve, public_key, addresses, tags, exported, imported, sealed_key, created_at, updated_at";
fn private_key_row(r: &dyn SqlRow) -> Result<PrivateKey, StoreError> {
    Ok(PrivateKey {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        curve: r.text(3)?,
        public_key: r.text(4)?,
        addresses: parse_json(r.text(5)?),
        tags: parse_json(r.text(6)?),
        exported: r.int(7)? != 0,
        imported: r.int(8)? != 0,
        sealed_key: r.bytes(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
    })
}

pub fn insert_wallet<D: Dialect>(db: &mut D, wl: &Wallet) -> Result<(), StoreError> {
    db.execute(
        &format!("INSERT INTO wallets ({WALLET_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
        args![
            wl.id,
            wl.organization_id,
            wl.name,
            wl.exported as i64,
            wl.imported as i64,
            wl.sealed_seed,
            wl.created_at,
            wl.updated_at
        ],
    )
    .map_err(unique_as("wallet name must be unique"))?;
    Ok(())
}

/// See `Write::InsertAccounts`.
pub fn insert_accounts<D: Dialect>(db: &mut D, accounts: &[WalletAccount]) -> Result<(), StoreError> {
    // An account's place in its wallet is the wallet's last plus one: the wallet's row is
    // locked first, so a transaction of another gateway deriving into the same wallet
    // waits for this one and then counts its accounts (a no-op write on SQLite, whose
    // one writer already serializes).
    let mut locked: Vec<&str> = Vec::new();
    for a in accounts {
        if !locked.contains(&a.wallet_id.as_str()) {
            db.execute("UPDATE wallets SET updated_at = updated_at WHERE id = ?1", args![a.wallet_id])?;
            locked.push(&a.wallet_id);
        }
    }
    for a in accounts {
        db.execute(
            "INSERT INTO wallet_accounts (id, organization_id, wallet_id, seq, curve, path_format, path, address_format, address, public_key, exported, sealed_key, created_at, updated_at)
                     VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), -1) + 1 FROM wallet_accounts WHERE wallet_id = ?3), ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12)",
            args![a.id, a.organization_id, a.wallet_id, a.curve, a.path_format, a.path, a.address_format, a.address, a.public_key, a.sealed_key, a.created_at, a.updated_at],
        )
        .map_err(unique_as(format!(
            "wallet account already exists for path {} and address format {}",
            a.path, a.address_format
        )))?;
    }
    Ok(())
}

pub fn insert_private_keys<D: Dialect>(db: &mut D, keys: &[PrivateKey]) -> Result<(), StoreError> {
    for k in keys {
        db.execute(
            &format!("INSERT INTO private_keys ({PRIVATE_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
            args![
                k.id, k.organization_id, k.name, k.curve, k.public_key, json_text(&k.addresses),
                json_text(&k.tags), k.exported as i64, k.imported as i64, k.sealed_key, k.created_at, k.updated_at
            ],
        )
        .map_err(unique_as("private key name must be unique"))?;
        for a in &k.addresses {
            db.execute(
                "INSERT INTO private_key_addresses (private_key_id, organization_id, address) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                args![k.id, k.organization_id, a.address],
            )?;
        }
    }
    Ok(())
}

pub fn mark_wallet_exported<D: Dialect>(db: &mut D, id: &str) -> Result<(), StoreError> {
    db.execute("UPDATE wallets SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now_nanos()])?;
    Ok(())
}

pub fn mark_private_key_exported<D: Dialect>(db: &mut D, id: &str) -> Result<(), StoreError> {
    db.execute("UPDATE private_keys SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now_nanos()])?;
    Ok(())
}

pub fn mark_account_exported<D: Dialect>(db: &mut D, id: &str) -> Result<(), StoreError> {
    db.execute("UPDATE wallet_accounts SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now_nanos()])?;
    Ok(())
}

/// See `Write::DeleteWallets`.
pub fn delete_wallets<D: Dialect>(db: &mut D, ids: &[String], require_exported: bool) -> Result<(), StoreError> {
    for id in ids {
        match db.query_opt("SELECT exported FROM wallets WHERE id = ?1", args![id], |r| r.int(0))? {
            None => return Err(StoreError::conflict(format!("wallet not found: {id}"))),
            Some(0) if require_exported => {
                return Err(StoreError::Conflict(Conflict::not_exported(&format!("wallet {id}"))))
            }
            Some(_) => {}
        }
        db.execute("DELETE FROM wallet_accounts WHERE wallet_id = ?1", args![id])?;
        db.execute("DELETE FROM wallets WHERE id = ?1", args![id])?;
    }
    Ok(())
}

/// See `Write::RenameWallet`.
pub fn rename_wallet<D: Dialect>(db: &mut D, id: &str, name: &str, updated_at: Nanos) -> Result<(), StoreError> {
    let n = db.execute("UPDATE wallets SET name = ?2, updated_at = ?3 WHERE id = ?1", args![id, name, updated_at])?;
    if n == 0 {
        return Err(StoreError::conflict(format!("wallet not found: {id}")));
    }
    Ok(())
}

/// See `Write::DeleteAccounts`.
pub fn delete_accounts<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    ids: &[String],
    require_exported: bool,
) -> Result<(), StoreError> {
    for id in ids {
        match account_key_left(db, organization_id, id) {
            Err(StoreError::NotFound) => return Err(StoreError::conflict(format!("wallet account not found: {id}"))),
            Ok(false) if require_exported => {
                return Err(StoreError::Conflict(Conflict::not_exported(&format!("wallet account {id}"))))
            }
            other => other.map(drop)?,
        }
        db.execute("DELETE FROM wallet_accounts WHERE id = ?1", args![id])?;
    }
    Ok(())
}

/// Whether the key of account `id` of `organization_id` left the enclave: the account or its
/// wallet was exported. `NotFound` if the organization has no such account.
pub fn account_key_left<D: Dialect>(db: &mut D, organization_id: &str, id: &str) -> Result<bool, StoreError> {
    db.query_one(
        "SELECT a.exported + w.exported FROM wallet_accounts a JOIN wallets w ON w.id = a.wallet_id
         WHERE a.id = ?1 AND a.organization_id = ?2",
        args![id, organization_id],
        |r| r.int(0),
    )
    .map(|n| n > 0)
    .map_err(StoreError::from)
}

/// See `Write::DeletePrivateKeys`.
pub fn delete_private_keys<D: Dialect>(db: &mut D, ids: &[String], require_exported: bool) -> Result<(), StoreError> {
    for id in ids {
        match db.query_opt("SELECT exported FROM private_keys WHERE id = ?1", args![id], |r| r.int(0))? {
            None => return Err(StoreError::conflict(format!("private key not found: {id}"))),
            Some(0) if require_exported => {
                return Err(StoreError::Conflict(Conflict::not_exported(&format!("private key {id}"))))
            }
            Some(_) => {}
        }
        db.execute("DELETE FROM private_key_addresses WHERE private_key_id = ?1", args![id])?;
        db.execute("DELETE FROM private_keys WHERE id = ?1", args![id])?;
    }
    Ok(())
}

pub fn put_import_target<D: Dialect>(db: &mut D, t: &ImportTarget) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO import_targets (organization_id, user_id, sealed_key, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (organization_id, user_id) DO UPDATE SET sealed_key = excluded.sealed_key, created_at = excluded.created_at",
        args![t.organization_id, t.user_id, t.sealed_key, t.created_at],
    )?;
    Ok(())
}

/// See `Write::TakeImportTarget`.
pub fn take_import_target<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    user_id: &str,
    sealed_key: &[u8],
) -> Result<(), StoreError> {
    let n = db.execute(
        "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2 AND sealed_key = ?3",
        args![organization_id, user_id, sealed_key],
    )?;
    if n != 1 {
        return Err(StoreError::conflict("import target was already used or replaced: call init_import again"));
    }
    Ok(())
}

pub fn names_in_use<D: Dialect>(db: &mut D, org: &str, kind: Named, names: &[&str]) -> Result<Vec<String>, StoreError> {
    let sql = match kind {
        Named::Wallet => "SELECT name FROM wallets WHERE organization_id = ?1 AND name = ?2",
        Named::PrivateKey => "SELECT name FROM private_keys WHERE organization_id = ?1 AND name = ?2",
    };
    let mut taken = Vec::new();
    for name in names {
        if let Some(n) = db.query_opt(sql, args![org, name], |r| r.text(0))? {
            taken.push(n);
        }
    }
    Ok(taken)
}

pub fn wallet<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<Wallet, StoreError> {
    let sql = format!("SELECT {WALLET_COLS} FROM wallets WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], wallet_row)
}

pub fn wallets_page<D: Dialect>(db: &mut D, org: &str, page: &Page) -> Result<Vec<Wallet>, StoreError> {
    keyset_page(db, by_organization("wallets", WALLET_COLS, &[org]), page, wallet_row)
}

pub fn accounts_page<D: Dialect>(
    db: &mut D,
    org: &str,
    wallet_id: Option<&str>,
    page: &Page,
) -> Result<Vec<WalletAccount>, StoreError> {
    let list = match wallet_id {
        Some(w) => Listing {
            table: "wallet_accounts",
            cols: ACCOUNT_COLS,
            scope: "organization_id = ? AND wallet_id = ?",
            args: &[org, w],
            order: &["seq"],
        },
        None => Listing {
            table: "wallet_accounts",
            cols: ACCOUNT_COLS,
            scope: "organization_id = ?",
            args: &[org],
            order: &["created_at", "wallet_id", "seq"],
        },
    };
    keyset_page(db, list, page, account_row)
}

pub fn account_by_address<D: Dialect>(db: &mut D, org: &str, address: &str) -> Result<WalletAccount, StoreError> {
    let sql = format!(
        "SELECT {ACCOUNT_COLS} FROM wallet_accounts WHERE organization_id = ?1 AND address = ?2 ORDER BY created_at LIMIT 1"
    );
    db.query_one(&sql, args![org, address], account_row)
}

pub fn private_key<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<PrivateKey, StoreError> {
    let sql = format!("SELECT {PRIVATE_KEY_COLS} FROM private_keys WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], private_key_row)
}

pub fn private_keys_page<D: Dialect>(db: &mut D, org: &str, page: &Page) -> Result<Vec<PrivateKey>, StoreError> {
    keyset_page(db, by_organization("private_keys", PRIVATE_KEY_COLS, &[org]), page, private_key_row)
}

pub fn private_key_by_address<D: Dialect>(db: &mut D, org: &str, address: &str) -> Result<PrivateKey, StoreError> {
    let sql = format!(
        "SELECT {} FROM private_keys k JOIN private_key_addresses a ON a.private_key_id = k.id
         WHERE a.organization_id = ?1 AND a.address = ?2 ORDER BY k.created_at LIMIT 1",
        PRIVATE_KEY_COLS.split(", ").map(|c| format!("k.{c}")).collect::<Vec<_>>().join(", ")
    );
    db.query_one(&sql, args![org, address], private_key_row)
}

pub fn import_target<D: Dialect>(db: &mut D, org: &str, user_id: &str) -> Result<ImportTarget, StoreError> {
    db.query_one(
        "SELECT organization_id, user_id, sealed_key, created_at FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
        args![org, user_id],
        |r| Ok(ImportTarget { organization_id: r.text(0)?, user_id: r.text(1)?, sealed_key: r.bytes(2)?, created_at: r.int(3)? }),
    )
}
