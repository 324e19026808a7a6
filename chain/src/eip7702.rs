//! EIP-7702 authorizations signed as raw payloads (`PAYLOAD_ENCODING_EIP7702_AUTHORIZATION`):
//! one parse, bounded before the JSON is read, gives what the key signs (coffer-crypto RLP-encodes
//! it) and what policies see of it as `eth.eip_7702_authorization` (the address lowercase, the
//! chain id and nonce numbers, however they were written).

use std::collections::BTreeMap;

use coffer_policy::eval::Val;
use serde_json::Value;

use crate::eip712::{address_val, encode_int, int_val, parse_address, parse_int};
use crate::error::TxError;

/// `payload.encoding` of an EIP-7702 authorization payload.
pub const PAYLOAD_ENCODING: &str = "PAYLOAD_ENCODING_EIP7702_AUTHORIZATION";

/// The most bytes of JSON an authorization payload may have (`{address, chainId, nonce}` is
/// under 200 bytes; 4 KiB leaves room for whitespace and nothing else).
pub const MAX_AUTHORIZATION_BYTES: usize = 4096;

/// An authorization `{address | contractAddress, chainId, nonce}` (numbers as JSON numbers,
/// decimal or `0x`-hex strings; `contractAddress` is viem's alias of `address`).
#[derive(Debug, Clone, PartialEq)]
pub struct Authorization {
    /// The delegate.
    pub address: [u8; 20],
    /// uint256, big-endian.
    pub chain_id: [u8; 32],
    /// uint64, big-endian in 32 bytes.
    pub nonce: [u8; 32],
    chain_id_val: Val,
    nonce_val: Val,
}

impl Authorization {
    /// Parses an authorization payload, bounded before the JSON is read.
    pub fn parse(payload: &str) -> Result<Self, TxError> {
        Self::parse_inner(payload).map_err(TxError)
    }

    fn parse_inner(payload: &str) -> Result<Self, String> {
        if payload.len() > MAX_AUTHORIZATION_BYTES {
            return Err(format!(
                "an authorization is at most {MAX_AUTHORIZATION_BYTES} bytes of JSON, this one is {}",
                payload.len()
            ));
        }
        let doc: Value = serde_json::from_str(payload).map_err(|e| format!("not valid JSON: {e}"))?;
        let obj = doc.as_object().ok_or("expected a JSON object")?;
        let field = |name: &str| obj.get(name).filter(|v| !v.is_null());
        let address = field("address").or_else(|| field("contractAddress")).ok_or("missing \"address\"")?;
        let address = parse_address(address).map_err(|e| format!("address: {e}"))?;
        let chain_id = field("chainId").ok_or("missing \"chainId\"")?;
        let chain_id_word = encode_int(chain_id, 256, false).map_err(|e| format!("chainId: {e}"))?;
        let nonce = field("nonce").ok_or("missing \"nonce\"")?;
        let nonce_word = encode_int(nonce, 64, false).map_err(|e| format!("nonce: {e}"))?;
        Ok(Self {
            address,
            chain_id: chain_id_word,
            nonce: nonce_word,
            chain_id_val: int_val(parse_int(chain_id)?),
            nonce_val: int_val(parse_int(nonce)?),
        })
    }

    /// `eth.eip_7702_authorization`: `address`, `chain_id`, `nonce`.
    pub fn facts(&self) -> Val {
        let mut m = BTreeMap::new();
        m.insert("address".to_string(), address_val(&self.address));
        m.insert("chain_id".to_string(), self.chain_id_val.clone());
        m.insert("nonce".to_string(), self.nonce_val.clone());
        Val::Map(m)
    }
}

#[cfg(test)]
mod tests;
