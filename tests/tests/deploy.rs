//! A deployed stack (`make test-deploy`: the images and the compose stack) driven through its load
//! balancer with the official Rust client; ignored by `make test`, which starts its own processes.

use coffer_tests::recover_eth_address;
use sha2::Digest;
use turnkey_api_key_stamper::TurnkeyP256ApiKey;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::{CreateWalletIntent, GetWalletsRequest, SignRawPayloadIntentV2, WalletAccountParams};

fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: this test is run by `make test-deploy`"))
}

/// Makes a wallet and signs with it, then signs with every wallet the earlier runs made (their
/// addresses are kept in `COFFER_DEPLOY_STATE_FILE`): each signature's address is recovered with
/// k256, independently of Coffer, and must be the account's.
#[tokio::test]
#[ignore = "needs the stack `make test-deploy` starts"]
async fn a_new_wallet_and_every_earlier_one_sign() {
    let (url, organization) = (setting("COFFER_DEPLOY_URL"), setting("COFFER_DEPLOY_ORGANIZATION_ID"));
    let private = std::fs::read_to_string(setting("COFFER_DEPLOY_API_KEY_FILE")).unwrap();
    let key = TurnkeyP256ApiKey::from_strings(private.trim(), None).unwrap();
    let client = turnkey_client::TurnkeyClient::builder().api_key(key).base_url(url).build().unwrap();
    let state_file = setting("COFFER_DEPLOY_STATE_FILE");
    let mut addresses: Vec<String> =
        std::fs::read_to_string(&state_file).unwrap_or_default().lines().map(str::to_string).collect();

    let account = WalletAccountParams {
        curve: Curve::Secp256k1,
        path_format: PathFormat::Bip32,
        path: "m/44'/60'/0'/0/0".into(),
        address_format: AddressFormat::Ethereum,
        name: None,
    };
    let intent = CreateWalletIntent {
        wallet_name: format!("deploy-{}", addresses.len()),
        accounts: vec![account],
        mnemonic_length: None,
    };
    let created = client.create_wallet(organization.clone(), client.current_timestamp(), intent).await.unwrap();
    let address = created.result.addresses[0].clone();
    addresses.push(address.clone());
    std::fs::write(&state_file, addresses.join("\n")).unwrap();

    let wallets = client.get_wallets(GetWalletsRequest { organization_id: organization.clone() }).await.unwrap();
    assert_eq!(wallets.wallets.len(), addresses.len(), "every wallet of every run is listed");
    let message = format!("coffer deploy check {}", client.current_timestamp());
    let digest: [u8; 32] = sha3::Keccak256::digest(message.as_bytes()).into();
    for address in &addresses {
        let intent = SignRawPayloadIntentV2 {
            sign_with: address.clone(),
            payload: message.clone(),
            encoding: PayloadEncoding::TextUtf8,
            hash_function: HashFunction::Keccak256,
            external_signer_pubkey: None,
        };
        let signed = client.sign_raw_payload(organization.clone(), client.current_timestamp(), intent).await.unwrap();
        let s = signed.result;
        assert_eq!(recover_eth_address(&digest, &s.r, &s.s, &s.v), address.to_lowercase());
        println!("deploy: {address} signed (activity {}), its address recovered with k256", signed.activity_id);
    }
    println!("deploy: made wallet {} of {}; {} signed", created.result.wallet_id, addresses.len(), addresses.len());
}
