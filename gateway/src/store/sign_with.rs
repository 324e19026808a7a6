//! What a `signWith` value names: a wallet account or a private key of the organization.

use super::error::{found, StoreError};
use super::interface::Store;
use super::model::{PrivateKey, WalletAccount};

/// The key a `signWith` value names in an organization.
#[derive(Debug, Clone)]
pub enum SignWithKey {
    Account(WalletAccount),
    /// A private key named by its id (`address_format` `None`) or by one of its addresses.
    PrivateKey {
        key: PrivateKey,
        address_format: Option<String>,
    },
}

/// The one rule for what `signWith` names, used by the policy context and the signing handlers
/// (the enclave checks the same against the sealed key's binding): a wallet account address,
/// else a private key address, else a private key id.
pub fn sign_with_key(store: &dyn Store, org: &str, sign_with: &str) -> Result<Option<SignWithKey>, StoreError> {
    if sign_with.is_empty() {
        return Ok(None);
    }
    if let Some(a) = found(store.account_by_address(org, sign_with))? {
        return Ok(Some(SignWithKey::Account(a)));
    }
    if let Some(key) = found(store.private_key_by_address(org, sign_with))? {
        let address_format = key.addresses.iter().find(|a| a.address == sign_with).map(|a| a.format.clone());
        return Ok(Some(SignWithKey::PrivateKey { key, address_format }));
    }
    Ok(found(store.private_key(org, sign_with))?.map(|key| SignWithKey::PrivateKey { key, address_format: None }))
}
