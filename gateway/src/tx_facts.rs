//! What policies see of a transaction being signed (`eth.tx`, `solana.tx`, `tron.tx`):
//! coffer-chain's facts, the signer's address, and the calls the organization's smart contract
//! interfaces decode. Interfaces are parsed once per stored version of the organization's set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use coffer_chain::{abi::Abi, idl::Idl, Unsigned};
use coffer_policy::context::TransactionFacts;
use coffer_policy::eval::Val;
use serde_json::Value;

use crate::record_kinds::SMART_CONTRACT_INTERFACE;
use crate::store::{Store, StoreError};

/// An organization's parsed interfaces: Ethereum ABIs by lowercase contract address, Solana IDLs
/// by program key. An interface that does not parse is left out (it decodes nothing).
struct Interfaces {
    version: (i64, i64),
    abis: HashMap<String, Arc<Abi>>,
    idls: HashMap<String, Arc<Idl>>,
}

/// Most organizations whose interfaces are kept; past it the cache starts over.
const INTERFACE_CACHE: usize = 10_000;

fn interfaces(store: &dyn Store, org: &str) -> Result<Arc<Interfaces>, StoreError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Interfaces>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let poisoned = || StoreError::Backend("interface cache lock poisoned".into());
    let version = store.records_version(org, SMART_CONTRACT_INTERFACE)?;
    if let Some(i) = cache.lock().map_err(|_| poisoned())?.get(org) {
        if i.version == version {
            return Ok(i.clone());
        }
    }
    let records = store.records(org, SMART_CONTRACT_INTERFACE)?;
    let (mut abis, mut idls) = (HashMap::new(), HashMap::new());
    for r in &records {
        let field = |k: &str| r.data.get(k).and_then(Value::as_str).unwrap_or_default();
        let (address, body) = (field("smartContractAddress"), field("smartContractInterface"));
        match field("type") {
            "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM" => {
                if let Ok(abi) = Abi::parse(body) {
                    abis.insert(address.to_ascii_lowercase(), Arc::new(abi));
                }
            }
            "SMART_CONTRACT_INTERFACE_TYPE_SOLANA" => {
                if let Ok(idl) = Idl::parse(body) {
                    idls.insert(address.to_string(), Arc::new(idl));
                }
            }
            _ => {}
        }
    }
    let built = Arc::new(Interfaces { version, abis, idls });
    let mut cache = cache.lock().map_err(|_| poisoned())?;
    if cache.len() >= INTERFACE_CACHE {
        cache.clear();
    }
    cache.insert(org.to_string(), built.clone());
    Ok(built)
}

/// The facts of the transaction `params` (a `sign_transaction` intent) carries, or `None` when
/// it carries none or it does not parse (the handler then refuses it with a 400). `signer` is
/// the Ethereum address of the key `signWith` resolved to, if it has one.
pub fn transaction_facts(
    store: &dyn Store,
    org: &str,
    params: &Value,
    signer: Option<&str>,
) -> Result<Option<TransactionFacts>, StoreError> {
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let (Some(ty), Some(unsigned)) = (text("type"), text("unsignedTransaction")) else { return Ok(None) };
    let Ok(tx) = coffer_chain::parse(ty, unsigned) else { return Ok(None) };
    let root = tx.policy_root();
    let tx = match &tx {
        Unsigned::Ethereum(t) => {
            let mut f = t.facts();
            if let Some(from) = signer {
                f.insert("from".into(), Val::Str(from.to_ascii_lowercase()));
            }
            if let (Some(to), true) = (t.to(), t.data().len() >= 4) {
                if let Some(abi) = interfaces(store, org)?.abis.get(&to) {
                    f.extend(abi.call_facts(t.data()).unwrap_or_default());
                }
            }
            f
        }
        Unsigned::Solana(t) => {
            let mut f = t.facts();
            let ifaces = interfaces(store, org)?;
            if !ifaces.idls.is_empty() {
                if let Some(Val::List(list)) = f.get_mut("instructions") {
                    for ((ix, program), raw) in list.iter_mut().zip(t.program_keys()).zip(&t.instructions) {
                        let parsed = ifaces.idls.get(&program).and_then(|idl| idl.instruction_facts(&raw.data));
                        if let (Val::Map(m), Some(p)) = (ix, parsed) {
                            m.insert("parsed_instruction_data".into(), Val::Map(p));
                        }
                    }
                }
            }
            f
        }
        Unsigned::Tron(t) => t.facts(),
    };
    Ok(Some(TransactionFacts { root, tx }))
}
