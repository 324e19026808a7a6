//! End to end: `sign_transaction` for Ethereum (every type), Solana (legacy and v0, one and two
//! signers) and Tron through the official Rust client, each result checked with independent
//! code (k256 recovery, ed25519-dalek verification, the tests' own RLP splitter), and
//! policies over `eth.tx`, ABI-decoded calls and `solana.tx` for a user who is not root.

use coffer_tests::rlp::{
    eip1559, eip1559_value, erc20_transfer, rlp_bytes, rlp_items, rlp_list, rlp_payload, rlp_uint,
};
use coffer_tests::{eth_address, peak_rss_mib, recover_secp256k1 as recover, refused, settled, Stack};
use prost::Message;
use serde_json::Value;
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, ApiKeyCurve, Curve, Effect, HashFunction, PathFormat, PayloadEncoding, SmartContractInterfaceType,
    TransactionType,
};
use turnkey_client::generated::{
    ApiKeyParamsV2, CreatePolicyIntentV3, CreateSmartContractInterfaceIntent, CreateUsersIntentV4, CreateWalletIntent,
    SignRawPayloadIntentV2, SignTransactionIntentV2, UserParamsV4, WalletAccountParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

const VIEM_VECTORS: &str = include_str!("../../chain/src/ethereum/viem-vectors.json");

fn be_number(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x))
}

/// How many transactions the enclave has signed and returned: the gateway's count of enclave
/// `SignTransaction` calls that succeeded (its `allow` audit lines count attempts the enclave
/// authorized, some of which it then refuses, e.g. for the wrong curve), once it has stopped
/// changing for 300 ms.
async fn signed_transactions(stack: &Stack) -> usize {
    let read = || async {
        let text = reqwest::get(format!("{}/metrics", stack.base_url)).await.unwrap().text().await.unwrap();
        let series = r#"coffer_enclave_calls_total{method="SignTransaction",outcome="ok"} "#;
        text.lines().find_map(|l| l.strip_prefix(series)).map_or(0, |v| v.parse::<usize>().unwrap())
    };
    settled("the enclave's transaction signings", read, std::time::Duration::from_millis(300)).await
}

/// Checks a signed Ethereum transaction against the unsigned one it came from: the same fields
/// followed by a signature that recovers to `address`.
fn check_signed_ethereum(unsigned: &[u8], signed: &[u8], address: &str) {
    let digest: [u8; 32] = sha3::Keccak256::digest(unsigned).into();
    let typed = unsigned[0] < 0xc0;
    let items = if typed {
        assert_eq!(signed[0], unsigned[0], "same type byte");
        rlp_items(&signed[1..])
    } else {
        rlp_items(signed)
    };
    let n = items.len();
    let (v, r, s) = (rlp_payload(&items[n - 3]), rlp_payload(&items[n - 2]), rlp_payload(&items[n - 1]));
    let parity = if typed {
        let mut again = vec![unsigned[0]];
        again.extend(rlp_list(&items[..n - 3]));
        assert_eq!(again, unsigned, "the signed transaction carries exactly the unsigned fields");
        u8::try_from(be_number(&v)).unwrap()
    } else {
        let unsigned_items = rlp_items(unsigned);
        assert_eq!(&items[..6], &unsigned_items[..6]);
        let v = be_number(&v);
        if unsigned_items.len() == 9 {
            let chain_id = be_number(&rlp_payload(&unsigned_items[6]));
            assert!(v == chain_id * 2 + 35 || v == chain_id * 2 + 36, "EIP-155 v {v} for chain {chain_id}");
            (v - chain_id * 2 - 35) as u8
        } else {
            assert!(v == 27 || v == 28, "pre-EIP-155 v {v}");
            (v - 27) as u8
        }
    };
    assert_eq!(eth_address(&recover(&digest, &r, &s, parity)), address.to_lowercase());
}

// ---- Solana, built here byte by byte ------------------------------------------------------

fn compact(n: usize) -> Vec<u8> {
    assert!(n < 0x80);
    vec![n as u8]
}

/// A System Program transfer `from` → `to` paid by `payer` (legacy or v0), signature slots
/// empty. Returns (transaction, message).
fn solana_transfer(payer: [u8; 32], from: [u8; 32], to: [u8; 32], lamports: u64, v0: bool) -> (Vec<u8>, Vec<u8>) {
    let mut keys = vec![payer];
    if from != payer {
        keys.push(from);
    }
    let signers = keys.len();
    keys.extend([to, [0u8; 32]]);
    let index = |k: [u8; 32]| keys.iter().position(|x| *x == k).unwrap() as u8;
    let mut message = Vec::new();
    if v0 {
        message.push(0x80);
    }
    message.extend([signers as u8, 0, 1]);
    message.extend(compact(keys.len()));
    keys.iter().for_each(|k| message.extend(k));
    message.extend([5u8; 32]);
    message.extend(compact(1));
    message.push(index([0u8; 32]));
    message.extend(compact(2));
    message.extend([index(from), index(to)]);
    let mut data = 2u32.to_le_bytes().to_vec();
    data.extend(lamports.to_le_bytes());
    message.extend(compact(data.len()));
    message.extend(data);
    if v0 {
        message.extend(compact(0));
    }
    let mut tx = compact(signers);
    tx.extend(vec![0u8; 64 * signers]);
    tx.extend(&message);
    (tx, message)
}

/// A one-instruction transaction calling `program` with `data`, paid and signed by `payer`.
fn solana_call(payer: [u8; 32], program: [u8; 32], data: &[u8]) -> Vec<u8> {
    let mut message = vec![1, 0, 1];
    message.extend(compact(2));
    message.extend(payer);
    message.extend(program);
    message.extend([5u8; 32]);
    message.extend(compact(1));
    message.push(1);
    message.extend(compact(1));
    message.push(0);
    message.extend(compact(data.len()));
    message.extend(data);
    let mut tx = compact(1);
    tx.extend([0u8; 64]);
    tx.extend(message);
    tx
}

// ---- Tron -----------------------------------------------------------------------------------

#[derive(Clone, PartialEq, Message)]
struct TronTransferContract {
    #[prost(bytes = "vec", tag = "1")]
    owner_address: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    to_address: Vec<u8>,
    #[prost(int64, tag = "3")]
    amount: i64,
}

#[derive(Clone, PartialEq, Message)]
struct TronAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct TronContract {
    #[prost(int32, tag = "1")]
    r#type: i32,
    #[prost(message, optional, tag = "2")]
    parameter: Option<TronAny>,
}

#[derive(Clone, PartialEq, Message)]
struct TronRaw {
    #[prost(bytes = "vec", tag = "1")]
    ref_block_bytes: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    ref_block_hash: Vec<u8>,
    #[prost(int64, tag = "8")]
    expiration: i64,
    #[prost(message, repeated, tag = "11")]
    contract: Vec<TronContract>,
    #[prost(int64, tag = "14")]
    timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
struct TronTransaction {
    #[prost(bytes = "vec", tag = "1")]
    raw_data: Vec<u8>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    signature: Vec<Vec<u8>>,
}

fn tron_address_bytes(address: &str) -> Vec<u8> {
    bs58::decode(address).with_check(None).into_vec().unwrap()
}

// ---- the stack ------------------------------------------------------------------------------

struct Accounts {
    eth: String,
    sol: String,
    tron: String,
}

async fn wallet(c: &Client, org: &str) -> Accounts {
    let account = |curve, path: &str, format| WalletAccountParams {
        curve,
        path_format: PathFormat::Bip32,
        path: path.into(),
        address_format: format,
        name: None,
    };
    let r = c
        .create_wallet(
            org.into(),
            c.current_timestamp(),
            CreateWalletIntent {
                wallet_name: "chains".into(),
                accounts: vec![
                    account(Curve::Secp256k1, "m/44'/60'/0'/0/0", AddressFormat::Ethereum),
                    account(Curve::Ed25519, "m/44'/501'/0'/0'", AddressFormat::Solana),
                    account(Curve::Secp256k1, "m/44'/195'/0'/0/0", AddressFormat::Tron),
                ],
                mnemonic_length: None,
            },
        )
        .await
        .unwrap()
        .result;
    Accounts { eth: r.addresses[0].clone(), sol: r.addresses[1].clone(), tron: r.addresses[2].clone() }
}

async fn sign(
    c: &Client,
    org: &str,
    sign_with: &str,
    unsigned: &[u8],
    ty: TransactionType,
) -> Result<Vec<u8>, TurnkeyClientError> {
    let intent = SignTransactionIntentV2 {
        sign_with: sign_with.into(),
        unsigned_transaction: hex::encode(unsigned),
        r#type: ty,
        external_signer_pubkey: None,
    };
    let r = c.sign_transaction(org.into(), c.current_timestamp(), intent).await?;
    let signed = r.result.signed_transaction;
    assert!(!signed.starts_with("0x"), "hex without 0x, like the hosted service");
    Ok(hex::decode(signed).unwrap())
}

#[tokio::test]
async fn transactions_end_to_end() {
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let a = wallet(&root, &org).await;

    // Ethereum: every type viem serializes, signed with the wallet's key, recovered to it.
    let vectors: Value = serde_json::from_str(VIEM_VECTORS).unwrap();
    for name in ["legacy_155", "legacy_pre155", "eip2930", "eip1559", "eip1559_create", "eip4844", "eip7702"] {
        let unsigned = hex::decode(vectors[name]["unsigned"].as_str().unwrap()).unwrap();
        let signed = sign(&root, &org, &a.eth, &unsigned, TransactionType::Ethereum).await.unwrap();
        check_signed_ethereum(&unsigned, &signed, &a.eth);
    }
    // `0x`-prefixed input is accepted as viem sends it stripped or not.
    let tx = eip1559(0, "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", 5, &[]);
    let intent = SignTransactionIntentV2 {
        sign_with: a.eth.clone(),
        unsigned_transaction: format!("0x{}", hex::encode(&tx)),
        r#type: TransactionType::Ethereum,
        external_signer_pubkey: None,
    };
    let signed = root.sign_transaction(org.clone(), root.current_timestamp(), intent).await.unwrap();
    check_signed_ethereum(&tx, &hex::decode(signed.result.signed_transaction).unwrap(), &a.eth);

    // Solana: legacy and v0, alone and as the second of two signers (the other slot kept empty).
    let ours: [u8; 32] = bs58::decode(&a.sol).into_vec().unwrap().try_into().unwrap();
    let ours_vk = ed25519_dalek::VerifyingKey::from_bytes(&ours).unwrap();
    let payer = ed25519_dalek::SigningKey::from_bytes(&[42u8; 32]);
    let payer_pk = payer.verifying_key().to_bytes();
    for v0 in [false, true] {
        let (tx, message) = solana_transfer(ours, ours, [9u8; 32], 1500, v0);
        let signed = sign(&root, &org, &a.sol, &tx, TransactionType::Solana).await.unwrap();
        assert_eq!(signed.len(), tx.len());
        assert_eq!(&signed[65..], message.as_slice(), "the message is left as given");
        let sig = ed25519_dalek::Signature::from_bytes(signed[1..65].try_into().unwrap());
        ours_vk.verify_strict(&message, &sig).unwrap();

        let (tx, message) = solana_transfer(payer_pk, ours, [9u8; 32], 2500, v0);
        let signed = sign(&root, &org, &a.sol, &tx, TransactionType::Solana).await.unwrap();
        assert_eq!(signed[0], 2);
        assert_eq!(&signed[1..65], &[0u8; 64], "the payer's slot is left for the payer");
        let sig = ed25519_dalek::Signature::from_bytes(signed[65..129].try_into().unwrap());
        ours_vk.verify_strict(&message, &sig).unwrap();
        // The payer completes it; both signatures verify over the same message.
        let mut both = signed.clone();
        both[1..65].copy_from_slice(&ed25519_dalek::Signer::sign(&payer, &message).to_bytes());
        let payer_sig = ed25519_dalek::Signature::from_bytes(both[1..65].try_into().unwrap());
        payer.verifying_key().verify_strict(&message, &payer_sig).unwrap();
    }
    let (not_ours, _) = solana_transfer(payer_pk, payer_pk, [9u8; 32], 1, false);
    refused(
        sign(&root, &org, &a.sol, &not_ours, TransactionType::Solana).await,
        400,
        "REQUEST_INVALID",
        "signWith is not a required signer of this Solana transaction",
    );

    // Tron: a TransferContract as raw_data and as a Transaction; v = 27 + recovery id.
    let owner = tron_address_bytes(&a.tron);
    let mut to = vec![0x41];
    to.extend([0x22u8; 20]);
    let parameter = TronTransferContract { owner_address: owner.clone(), to_address: to, amount: 1_000_000 };
    let raw = TronRaw {
        ref_block_bytes: vec![0x12, 0x34],
        ref_block_hash: vec![7; 8],
        expiration: 1_900_000_060_000,
        contract: vec![TronContract {
            r#type: 1,
            parameter: Some(TronAny {
                type_url: "type.googleapis.com/protocol.TransferContract".into(),
                value: parameter.encode_to_vec(),
            }),
        }],
        timestamp: 1_900_000_000_000,
    }
    .encode_to_vec();
    let framed = TronTransaction { raw_data: raw.clone(), signature: vec![] }.encode_to_vec();
    for input in [&raw, &framed] {
        let signed = sign(&root, &org, &a.tron, input, TransactionType::Tron).await.unwrap();
        let t = TronTransaction::decode(signed.as_slice()).unwrap();
        assert_eq!(t.raw_data, raw);
        assert_eq!(t.signature.len(), 1);
        let s = &t.signature[0];
        assert!(s[64] == 27 || s[64] == 28, "v = {}", s[64]);
        let digest: [u8; 32] = sha2::Sha256::digest(&raw).into();
        let vk = recover(&digest, &s[..32], &s[32..64], s[64] - 27);
        let eth = eth_address(&vk);
        let mut tron = vec![0x41];
        tron.extend(hex::decode(&eth[2..]).unwrap());
        assert_eq!(tron, owner, "recovered to the Tron account");
    }

    // Refusals: each a 400 naming the problem, and nothing recorded or signed. (The oracles see
    // what there is: the activities and the signatures above.)
    let before = stack.activities(&stack.api_key(), &org).await;
    let signed = signed_transactions(&stack).await;
    assert!(signed > 0 && before.len() >= signed, "{signed} signed, {} activities", before.len());
    let mut trailing = tx.clone();
    trailing.push(0);
    refused(
        sign(&root, &org, &a.eth, &trailing, TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        "unsignedTransaction: 1 trailing bytes after the transaction",
    );
    refused(
        sign(&root, &org, &a.eth, &[0x02, 0xc1], TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        "unsignedTransaction:",
    );
    refused(
        sign(&root, &org, &a.eth, &tx, TransactionType::Bitcoin).await,
        400,
        "REQUEST_INVALID",
        "not supported yet",
    );
    refused(
        sign(&root, &org, &a.eth, &tx, TransactionType::Solana).await,
        400,
        "REQUEST_INVALID",
        "unsignedTransaction",
    );
    refused(
        sign(&root, &org, &a.sol, &tx, TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        "signWith: Ethereum transactions are signed by a CURVE_SECP256K1 key",
    );
    refused(
        sign(&root, &org, "0x0000000000000000000000000000000000000001", &tx, TransactionType::Ethereum).await,
        404,
        "REQUEST_INVALID",
        "no wallet account or private key found",
    );
    assert_eq!(stack.activities(&stack.api_key(), &org).await, before);
    assert_eq!(signed_transactions(&stack).await, signed);

    policies_over_transactions(&stack, &root, &org, &a).await;
}

async fn add_policy(root: &Client, org: &str, name: &str, effect: Effect, condition: &str, consensus: &str) {
    let intent = CreatePolicyIntentV3 {
        policy_name: name.into(),
        effect,
        condition: Some(condition.into()),
        consensus: Some(consensus.into()),
        notes: String::new(),
        time: None,
    };
    root.create_policy(org.into(), root.current_timestamp(), intent).await.unwrap();
}

async fn policies_over_transactions(stack: &Stack, root: &Client, org: &str, a: &Accounts) {
    let signed_before = signed_transactions(stack).await;
    // Alice is not root: only policies let her sign.
    let (alice, alice_id) = non_root(stack, root, org, "alice").await;
    let is_alice = format!("approvers.any(user, user.id == '{alice_id}')");
    let signing = "activity.type == 'ACTIVITY_TYPE_SIGN_TRANSACTION_V2'";

    let friend = "0x1111111111111111111111111111111111111111";
    let stranger = "0x2222222222222222222222222222222222222222";
    let from = a.eth.to_lowercase();
    add_policy(
        root,
        org,
        "to friend",
        Effect::Allow,
        &format!("{signing} && eth.tx.to == '{friend}' && eth.tx.from == '{from}'"),
        &is_alice,
    )
    .await;
    // Scoped to Ethereum: a DENY naming `eth` errs, and denies, on a Solana transaction.
    let ethereum = "activity.params.type == 'TRANSACTION_TYPE_ETHEREUM'";
    let not_above = format!("{signing} && {ethereum} && eth.tx.value > 1000");
    add_policy(root, org, "not above 1000 wei", Effect::Deny, &not_above, "true").await;
    let eth = |to: &str, value: u128| eip1559(3, to, value, &[]);
    let ok = sign(&alice, org, &a.eth, &eth(friend, 500), TransactionType::Ethereum).await.unwrap();
    check_signed_ethereum(&eth(friend, 500), &ok, &a.eth);
    refused(
        sign(&alice, org, &a.eth, &eth(stranger, 500), TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    refused(
        sign(&alice, org, &a.eth, &eth(friend, 1001), TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    // 2^200 wei does not fit in an i128 and still compares as a number.
    let mut huge = vec![1u8];
    huge.extend([0u8; 25]);
    let huge = eip1559_value(3, friend, rlp_bytes(&huge), &[]);
    refused(
        sign(&alice, org, &a.eth, &huge, TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    // A malformed transaction is a 400 for her too, not a policy error.
    refused(
        sign(&alice, org, &a.eth, &[0x02, 0xc0, 0x00], TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        "unsignedTransaction",
    );

    // An ERC-20 `transfer` allowed only to one recipient, through an uploaded ABI.
    let token = "0xabcdefabcdefabcdefabcdefabcdefabcdefabcd";
    let abi = r#"[{"type":"function","name":"transfer","stateMutability":"nonpayable",
        "inputs":[{"name":"_to","type":"address"},{"name":"_value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}]},
        {"type":"function","name":"approve","stateMutability":"nonpayable",
        "inputs":[{"name":"_spender","type":"address"},{"name":"_value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}]}]"#;
    root.create_smart_contract_interface(
        org.into(),
        root.current_timestamp(),
        CreateSmartContractInterfaceIntent {
            // Mixed case as users paste it; policies see lowercase.
            smart_contract_address: "0xABCDEFabcdefABCDEFabcdefABCDEFabcdefABCD".into(),
            smart_contract_interface: abi.into(),
            r#type: SmartContractInterfaceType::Ethereum,
            label: "token".into(),
            notes: String::new(),
        },
    )
    .await
    .unwrap();
    let recipient = "0x4444444444444444444444444444444444444444";
    add_policy(
        root,
        org,
        "erc20 to recipient",
        Effect::Allow,
        &format!(
            "{signing} && eth.tx.to == '{token}' && eth.tx.function_name == 'transfer' && \
             eth.tx.function_signature == 'transfer(address,uint256)' && eth.tx.contract_call_args['_to'] == '{recipient}' \
             && eth.tx.contract_call_args['_value'] <= 1000000"
        ),
        &is_alice,
    )
    .await;
    let call = |data: Vec<u8>| eip1559(4, token, 0, &data);
    let ok = sign(&alice, org, &a.eth, &call(erc20_transfer(recipient, 250)), TransactionType::Ethereum).await.unwrap();
    check_signed_ethereum(&call(erc20_transfer(recipient, 250)), &ok, &a.eth);
    refused(
        sign(&alice, org, &a.eth, &call(erc20_transfer(stranger, 250)), TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    refused(
        sign(&alice, org, &a.eth, &call(erc20_transfer(recipient, 2_000_000)), TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    let mut approve = erc20_transfer(recipient, 250);
    approve[..4].copy_from_slice(&hex::decode("095ea7b3").unwrap());
    refused(
        sign(&alice, org, &a.eth, &call(approve), TransactionType::Ethereum).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );

    // Solana: System Program transfers of at most 1000 lamports.
    add_policy(
        root,
        org,
        "small sol transfers",
        Effect::Allow,
        &format!("{signing} && solana.tx.transfers.count() > 0 && solana.tx.transfers.all(t, t.amount <= 1000)"),
        &is_alice,
    )
    .await;
    let ours: [u8; 32] = bs58::decode(&a.sol).into_vec().unwrap().try_into().unwrap();
    let (small, _) = solana_transfer(ours, ours, [9u8; 32], 1000, true);
    sign(&alice, org, &a.sol, &small, TransactionType::Solana).await.unwrap();
    let (large, _) = solana_transfer(ours, ours, [9u8; 32], 1001, true);
    refused(
        sign(&alice, org, &a.sol, &large, TransactionType::Solana).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );

    // An Anchor program's `deposit` of at most 100, through an uploaded IDL.
    let program = bs58::encode([77u8; 32]).into_string();
    let idl = r#"{"instructions":[{"name":"deposit","args":[{"name":"amount","type":"u64"}]},
        {"name":"withdraw","args":[{"name":"amount","type":"u64"}]}]}"#;
    root.create_smart_contract_interface(
        org.into(),
        root.current_timestamp(),
        CreateSmartContractInterfaceIntent {
            smart_contract_address: program.clone(),
            smart_contract_interface: idl.into(),
            r#type: SmartContractInterfaceType::Solana,
            label: "vault".into(),
            notes: String::new(),
        },
    )
    .await
    .unwrap();
    add_policy(
        root,
        org,
        "small deposits",
        Effect::Allow,
        &format!(
            "{signing} && solana.tx.instructions.all(i, i.program_key == '{program}' && \
             i.parsed_instruction_data.instruction_name == 'deposit' && i.parsed_instruction_data.program_call_args['amount'] <= 100)"
        ),
        &is_alice,
    )
    .await;
    let anchor = |name: &str, amount: u64| {
        let mut data = sha2::Sha256::digest(format!("global:{name}").as_bytes())[..8].to_vec();
        data.extend(amount.to_le_bytes());
        solana_call(ours, [77u8; 32], &data)
    };
    sign(&alice, org, &a.sol, &anchor("deposit", 100), TransactionType::Solana).await.unwrap();
    refused(
        sign(&alice, org, &a.sol, &anchor("deposit", 101), TransactionType::Solana).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    refused(
        sign(&alice, org, &a.sol, &anchor("withdraw", 1), TransactionType::Solana).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    // The enclave signed exactly her four allowed transactions, none of the refused ones.
    assert_eq!(signed_transactions(stack).await, signed_before + 4);
}

/// A user who is not root, allowed by nothing but the policies a test adds.
async fn non_root(stack: &Stack, root: &Client, org: &str, name: &str) -> (Client, String) {
    let key = TurnkeyP256ApiKey::generate();
    let user = UserParamsV4 {
        user_name: name.into(),
        user_email: None,
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: name.into(),
            public_key: hex::encode(key.compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    let id = root
        .create_users(org.into(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![user] })
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone();
    (stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap()), id)
}

/// Compact-u16 of any length.
fn compact_u16(n: usize) -> Vec<u8> {
    let (mut n, mut out) = (n, Vec::new());
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

#[tokio::test]
async fn oversized_transactions_are_refused_before_they_are_parsed() {
    // Issue 39: a 467 KB Solana transaction (7 instructions × 65,535 accounts) under a one-line
    // ALLOW took 2.7 s a request and grew the enclave from 52 to 1,468 MiB; an Ethereum
    // transaction or authorization list had no bound either. Each is now a 400 naming the limit,
    // from the parser the gateway and the enclave share, before any fact is built.
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let a = wallet(&root, &org).await;
    let (alice, alice_id) = non_root(&stack, &root, &org, "alice").await;
    add_policy(&root, &org, "anything", Effect::Allow, "true", &format!("approvers.any(u, u.id == '{alice_id}')"))
        .await;
    let payer: [u8; 32] = bs58::decode(&a.sol).into_vec().unwrap().try_into().unwrap();

    let mut attack = vec![1u8];
    attack.extend([0u8; 64]);
    attack.extend([1, 0, 1]);
    attack.extend(compact_u16(2));
    attack.extend(payer);
    attack.extend([9u8; 32]);
    attack.extend([5u8; 32]);
    attack.extend(compact_u16(7));
    for _ in 0..7 {
        attack.push(1);
        attack.extend(compact_u16(65_535));
        attack.extend(std::iter::repeat_n(0u8, 65_535));
        attack.extend(compact_u16(0));
    }
    let signed_before = signed_transactions(&stack).await;
    // Refused before parsing: neither process's memory high-water mark moves by more than the
    // body's few copies (the parse took 1.4 GiB), whatever the machine's load.
    let (enclave_pid, gateway_pid) = stack.pids();
    let peaks = || (peak_rss_mib(enclave_pid.unwrap()), peak_rss_mib(gateway_pid.unwrap()));
    let peaks_before = peaks();
    for c in [&alice, &root] {
        stack.refused_by_gateway(
            sign(c, &org, &a.sol, &attack, TransactionType::Solana).await,
            400,
            "REQUEST_INVALID",
            &format!(
                "a Solana transaction is at most 1232 bytes (the network's packet size), this one is {}",
                attack.len()
            ),
        );
    }
    let peaks_after = peaks();
    assert!(peaks_after.0 - peaks_before.0 < 32.0, "enclave {peaks_before:?} -> {peaks_after:?}");
    assert!(peaks_after.1 - peaks_before.1 < 64.0, "gateway {peaks_before:?} -> {peaks_after:?}");
    // One byte over the packet size: the same refusal; at it, alice signs under her ALLOW.
    let call = |data_len: usize| {
        let mut message = vec![1, 0, 1];
        message.extend(compact_u16(2));
        message.extend(payer);
        message.extend([9u8; 32]);
        message.extend([5u8; 32]);
        message.extend(compact_u16(1));
        message.push(1);
        message.extend(compact_u16(0));
        message.extend(compact_u16(data_len));
        message.extend(vec![0xee; data_len]);
        let mut tx = compact_u16(1);
        tx.extend([0u8; 64]);
        tx.extend(message);
        tx
    };
    let fits = (0..1232).rev().find(|n| call(*n).len() == 1232).unwrap();
    let signed = sign(&alice, &org, &a.sol, &call(fits), TransactionType::Solana).await.unwrap();
    assert_eq!(signed.len(), 1232);
    assert_eq!(call(fits + 1).len(), 1233);
    stack.refused_by_gateway(
        sign(&alice, &org, &a.sol, &call(fits + 1), TransactionType::Solana).await,
        400,
        "REQUEST_INVALID",
        "at most 1232 bytes (the network's packet size), this one is 1233",
    );

    // Ethereum: geth's 128 KiB, and 64 EIP-7702 authorizations.
    let big = eip1559(0, "0x1111111111111111111111111111111111111111", 1, &vec![0xab; 128 * 1024]);
    stack.refused_by_gateway(
        sign(&alice, &org, &a.eth, &big, TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        &format!(
            "an Ethereum transaction is at most 131072 bytes (geth's txMaxSize, 128 KiB), this one is {}",
            big.len()
        ),
    );
    let authorizations = |n: usize| {
        let auth = |i: usize| {
            rlp_list(&[
                rlp_uint(1),
                rlp_bytes(&[0x10 + (i % 200) as u8; 20]),
                rlp_uint(i as u128),
                rlp_uint(0),
                rlp_bytes(&[0x44; 32]),
                rlp_bytes(&[0x55; 32]),
            ])
        };
        let mut tx = vec![0x04];
        tx.extend(rlp_list(&[
            rlp_uint(1),
            rlp_uint(0),
            rlp_uint(1),
            rlp_uint(30_000_000_000),
            rlp_uint(100_000),
            rlp_bytes(&[0x70; 20]),
            rlp_uint(0),
            rlp_bytes(&[]),
            rlp_list(&[]),
            rlp_list(&(0..n).map(auth).collect::<Vec<_>>()),
        ]));
        tx
    };
    stack.refused_by_gateway(
        sign(&alice, &org, &a.eth, &authorizations(65), TransactionType::Ethereum).await,
        400,
        "REQUEST_INVALID",
        "authorizationList: at most 64 authorizations, this one has 65",
    );
    sign(&alice, &org, &a.eth, &authorizations(64), TransactionType::Ethereum).await.unwrap();

    // Tron: java-tron's 500 KiB (a transfer padded with a `data` memo, field 10), and 250,000
    // empty contracts within it refused on the field count.
    let mut to = vec![0x41];
    to.extend([0x22u8; 20]);
    let transfer = TronTransferContract { owner_address: tron_address_bytes(&a.tron), to_address: to, amount: 1 };
    let transfer = TronContract {
        r#type: 1,
        parameter: Some(TronAny {
            type_url: "type.googleapis.com/protocol.TransferContract".into(),
            value: transfer.encode_to_vec(),
        }),
    };
    let raw = TronRaw {
        ref_block_bytes: vec![0x12, 0x34],
        ref_block_hash: vec![7; 8],
        expiration: 1_900_000_060_000,
        contract: vec![transfer],
        timestamp: 1_900_000_000_000,
    }
    .encode_to_vec();
    let padded = |total: usize| {
        let memo = |len: usize| {
            let mut field = vec![0x52];
            prost::encoding::encode_varint(len as u64, &mut field);
            field.extend(std::iter::repeat_n(0x6d, len));
            field
        };
        let len = (0..total).rev().find(|len| raw.len() + memo(*len).len() == total).unwrap();
        [&raw[..], &memo(len)[..]].concat()
    };
    let signed = sign(&alice, &org, &a.tron, &padded(512_000), TransactionType::Tron).await.unwrap();
    assert_eq!(TronTransaction::decode(signed.as_slice()).unwrap().raw_data, padded(512_000));
    stack.refused_by_gateway(
        sign(&alice, &org, &a.tron, &padded(512_001), TransactionType::Tron).await,
        400,
        "REQUEST_INVALID",
        "a Tron transaction is at most 512000 bytes (java-tron's TRANSACTION_MAX_BYTE_SIZE, 500 KiB), this one is 512001",
    );
    let mut many = raw.clone();
    for _ in 0..250_000 {
        many.extend([0x5a, 0x00]);
    }
    let started = std::time::Instant::now();
    stack.refused_by_gateway(
        sign(&alice, &org, &a.tron, &many, TransactionType::Tron).await,
        400,
        "REQUEST_INVALID",
        "raw_data has 250001 contracts; Tron executes exactly one",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(signed_transactions(&stack).await, signed_before + 3);
}

async fn sign_payload(
    c: &Client,
    org: &str,
    sign_with: &str,
    payload: &str,
    encoding: PayloadEncoding,
) -> Result<String, TurnkeyClientError> {
    let intent = SignRawPayloadIntentV2 {
        sign_with: sign_with.into(),
        payload: payload.into(),
        encoding,
        hash_function: HashFunction::NoOp,
        external_signer_pubkey: None,
    };
    Ok(c.sign_raw_payload(org.into(), c.current_timestamp(), intent).await?.result.r)
}

#[tokio::test]
async fn eip712_and_eip7702_facts_are_the_values_signed() {
    // Issue 39: the facts were the payload's raw JSON. An authorization to a denied delegate in
    // uppercase hex was signed despite a DENY on the lowercase address, `chainId: "0x0"` passed
    // a decimal rule, and EIP-712 `verifyingContract` and `spender` in uppercase passed a deny
    // list. Now the facts are what coffer-chain's parser encodes, in the gateway and the enclave.
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let a = wallet(&root, &org).await;
    let (alice, alice_id) = non_root(&stack, &root, &org, "alice").await;
    let is_alice = format!("approvers.any(u, u.id == '{alice_id}')");
    let signing = "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'";
    add_policy(&root, &org, "alice signs", Effect::Allow, signing, &is_alice).await;
    let delegate = "0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1";
    let (usdc, drainer) = ("0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", "0xdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef");
    let e7702 = "activity.params.encoding == 'PAYLOAD_ENCODING_EIP7702_AUTHORIZATION'";
    let e712 = "activity.params.encoding == 'PAYLOAD_ENCODING_EIP712'";
    let deny = [
        format!("{signing} && {e7702} && eth.eip_7702_authorization.address == '{delegate}'"),
        format!("{signing} && {e7702} && eth.eip_7702_authorization.chain_id == 0"),
        format!("{signing} && {e712} && eth.eip_712.domain.verifying_contract in ['{usdc}']"),
        format!("{signing} && {e712} && eth.eip_712.message.spender in ['{drainer}']"),
    ];
    for (i, condition) in deny.iter().enumerate() {
        add_policy(&root, &org, &format!("deny {i}"), Effect::Deny, condition, "true").await;
    }
    let upper = |x: &str| format!("0x{}", x[2..].to_uppercase());
    let auth = |address: &str, chain: &str| format!(r#"{{"address":"{address}","chainId":{chain},"nonce":"0"}}"#);
    let permit = |contract: &str, spender: &str| {
        serde_json::json!({
            "types": {"Permit": [{"name": "spender", "type": "address"}, {"name": "value", "type": "uint256"}]},
            "primaryType": "Permit",
            "domain": {"name": "Token", "chainId": 1, "verifyingContract": contract},
            "message": {"spender": spender, "value": "1000"}
        })
        .to_string()
    };
    let friend = "0x1111111111111111111111111111111111111111";
    // What the policies allow signs.
    sign_payload(&alice, &org, &a.eth, &auth(friend, "1"), PayloadEncoding::Eip7702Authorization).await.unwrap();
    sign_payload(&alice, &org, &a.eth, &permit(friend, friend), PayloadEncoding::Eip712).await.unwrap();
    // The attacks: each refused.
    for (payload, encoding) in [
        (auth(&upper(delegate), "1"), PayloadEncoding::Eip7702Authorization),
        (auth(friend, "\"0x0\""), PayloadEncoding::Eip7702Authorization),
        (permit(&upper(usdc), friend), PayloadEncoding::Eip712),
        (permit(friend, &upper(drainer)), PayloadEncoding::Eip712),
    ] {
        refused(
            sign_payload(&alice, &org, &a.eth, &payload, encoding).await,
            403,
            "REQUEST_NOT_AUTHORIZED",
            "request not authorized",
        );
    }
    stack.refusals_accounted();
    // Bounded before they are read: a 400 naming the limit, from the gateway.
    let big = permit(friend, friend).replacen('{', &format!("{{{}", " ".repeat(64 * 1024)), 1);
    stack.refused_by_gateway(
        sign_payload(&alice, &org, &a.eth, &big, PayloadEncoding::Eip712).await,
        400,
        "REQUEST_INVALID",
        &format!(
            "invalid EIP-712 typed data: typed data is at most 65536 bytes of JSON, this document is {}",
            big.len()
        ),
    );
    let items = vec![1; 1025];
    let long = serde_json::json!({"types": {"M": [{"name": "a", "type": "uint8[]"}]}, "primaryType": "M",
        "domain": {}, "message": {"a": items}})
    .to_string();
    stack.refused_by_gateway(
        sign_payload(&alice, &org, &a.eth, &long, PayloadEncoding::Eip712).await,
        400,
        "REQUEST_INVALID",
        "at most 1024 items an array, this one has 1025",
    );
}
