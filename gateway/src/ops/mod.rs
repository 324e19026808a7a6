//! The operation registry: every submit and query endpoint, one line each, and their handlers
//! grouped one file per resource family.

pub mod activities;
pub mod keys;
pub mod signing;
pub mod transfer;
pub mod users;
pub mod wallets;

use serde::Deserialize;

use crate::activity::registry::{Operation, Query};
use crate::error::ApiError;
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
            handler: activity_handler!($h),
        }
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
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        "signRawPayloadIntentV2",
        "signRawPayloadResult",
        "PRIVATE_KEY" / "SIGN",
        signing::sign_raw_payload
    ),
    op!(
        "sign_raw_payloads",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS",
        "signRawPayloadsIntent",
        "signRawPayloadsResult",
        "PRIVATE_KEY" / "SIGN",
        signing::sign_raw_payloads
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
];

/// Every query endpoint.
pub static QUERIES: &[Query] = &[
    Query { path: "whoami", handler: query_handler!(activities::whoami) },
    Query { path: "get_activity", handler: query_handler!(activities::get_activity) },
    Query { path: "list_activities", handler: query_handler!(activities::list_activities) },
    Query { path: "list_wallets", handler: query_handler!(wallets::list_wallets) },
    Query { path: "get_wallet", handler: query_handler!(wallets::get_wallet) },
    Query { path: "list_wallet_accounts", handler: query_handler!(wallets::list_wallet_accounts) },
    Query { path: "get_wallet_account", handler: query_handler!(wallets::get_wallet_account) },
    Query { path: "list_private_keys", handler: query_handler!(keys::list_private_keys) },
    Query { path: "get_private_key", handler: query_handler!(keys::get_private_key) },
];

pub fn activity(path: &str) -> Option<&'static Operation> {
    ACTIVITIES.iter().find(|o| o.path == path)
}

pub fn query(path: &str) -> Option<&'static Query> {
    QUERIES.iter().find(|q| q.path == path)
}

/// `paginationOptions`: `limit` is a string "1".."100" (default 10); `before`/`after` are ids.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pagination {
    pub limit: Option<String>,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl Pagination {
    pub fn limit(&self) -> Result<usize, ApiError> {
        match &self.limit {
            None => Ok(10),
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=100).contains(&n) => Ok(n),
                _ => Err(ApiError::invalid("invalid pagination limit: must be a string from \"1\" to \"100\"")),
            },
        }
    }
}

/// Fails with 400 when a string field that must be present is empty.
pub fn required(value: &str, field: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid(format!("{field} is required")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_paths_are_unique_and_keys_follow_the_rule() {
        let mut paths: Vec<_> = ACTIVITIES.iter().map(|o| o.path).chain(QUERIES.iter().map(|q| q.path)).collect();
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
