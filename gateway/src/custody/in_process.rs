//! Test support: the real enclave service on a SoftHSM token, in this process, behind a
//! [`Custody`], and a gateway around it, so that unit tests of handlers that create keys, sign
//! or export meet the enclave's own checks without processes or sockets.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;
use coffer_enclave::admission::Admission;
use coffer_enclave::hsm::{init_token, Hsm, HsmSettings};
use coffer_enclave::operator::Operators;
use coffer_enclave::service::EnclaveService;
use coffer_proto::v1::enclave_server::EnclaveServer;
use cryptoki::types::AuthPin;
use p256::ecdsa::signature::Signer;
use serde_json::{json, Value};

use super::transport::Transport;
use super::Custody;
use crate::activity::pipeline;
use crate::error::ApiError;
use crate::operator_key::OperatorKey;
use crate::state::AppState;
use crate::store::SqliteStore;

/// SoftHSM's PKCS#11 module (installed by `make deps`).
const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// The enclave service of this test process: one token, made on first use (the PKCS#11 module
/// is a process-wide singleton, so every test of the process shares it).
fn service() -> Arc<EnclaveService> {
    static SERVICE: OnceLock<Arc<EnclaveService>> = OnceLock::new();
    SERVICE
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("coffer-gateway-hsm-{}", std::process::id()));
            std::fs::create_dir_all(dir.join("tokens")).expect("token directory");
            let conf = dir.join("softhsm2.conf");
            let tokens = dir.join("tokens");
            std::fs::write(
                &conf,
                format!("directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n", tokens.display()),
            )
            .expect("softhsm2.conf");
            // Read by C_Initialize; set before the module is first loaded in this process.
            std::env::set_var("SOFTHSM2_CONF", &conf);
            let pin = || AuthPin::new("gateway-test-pin".to_string().into());
            let so_pin = AuthPin::new("gateway-test-so-pin".to_string().into());
            init_token(MODULE.as_ref(), "gateway-test", &so_pin, &pin()).expect("SoftHSM token");
            let settings = HsmSettings {
                module: MODULE.into(),
                token_label: "gateway-test".into(),
                pin: pin(),
                pool_size: 4,
                profile: None,
                shelf: None,
                creates_keys: true,
                native_keys: Default::default(),
            };
            let hsm = Arc::new(Hsm::open(settings).expect("open the token"));
            hsm.init_service_keys().expect("service keys");
            let authority = Arc::new(Admission::in_memory(hsm.clone(), 60_000, 100_000).expect("authority store"));
            let operators = Operators::new(vec![operator().public_key()]);
            Arc::new(EnclaveService::new(hsm, authority, Default::default()).with_operators(operators))
        })
        .clone()
}

/// The operator key of this test process, the one operator its enclave knows.
pub fn operator() -> &'static OperatorKey {
    static OPERATOR: OnceLock<OperatorKey> = OnceLock::new();
    OPERATOR.get_or_init(OperatorKey::generate)
}

/// The enclave of this test process, reached in memory.
pub fn custody() -> Custody {
    Custody::new(Transport::new(EnclaveServer::from_arc(service())))
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `X-Stamp` headers of `body` signed with `key` (API-key stamp, P-256).
pub fn stamp_headers(key: &p256::ecdsa::SigningKey, body: &[u8]) -> HeaderMap {
    let signature: p256::ecdsa::Signature = key.sign(body);
    let stamp = json!({
        "publicKey": hex::encode(key.verifying_key().to_encoded_point(true).as_bytes()),
        "scheme": "SIGNATURE_SCHEME_TK_API_P256",
        "signature": hex::encode(signature.to_der().as_bytes()),
    });
    let mut headers = HeaderMap::new();
    let value = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stamp.to_string());
    headers.insert("x-stamp", HeaderValue::from_str(&value).expect("base64url is a header value"));
    headers
}

/// A gateway's state on `store` and `custody`, with the default limits and settings.
pub fn gateway_state(store: SqliteStore, custody: Custody) -> Arc<AppState> {
    Arc::new(AppState {
        store: Arc::new(store),
        custody,
        body_limit: 1 << 20,
        limits: crate::limits::Limits::new(&crate::config::GatewayConfig::default()),
        webhooks: Default::default(),
    })
}

/// A gateway on a fresh SQLite store and the in-process enclave, with one organization that
/// the enclave bootstrapped: its root user holds a certified P-256 API key.
pub struct Harness {
    pub state: Arc<AppState>,
    pub organization_id: String,
    pub user_id: String,
    pub key: p256::ecdsa::SigningKey,
    _dir: TempDir,
}

impl Harness {
    pub async fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("coffer-gateway-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let store = SqliteStore::open(&dir.join("coffer.db")).expect("store");
        let custody = custody();
        let key = p256::ecdsa::SigningKey::random(&mut rand_core::OsRng);
        let public = hex::encode(key.verifying_key().to_encoded_point(true).as_bytes());
        let created = crate::orgs::create_root_org(&store, &custody, operator(), "test", "root", &public)
            .await
            .expect("bootstrap");
        let state = gateway_state(store, custody);
        Harness { state, organization_id: created.organization_id, user_id: created.user_id, key, _dir: TempDir(dir) }
    }

    /// The body of a `ty` activity of this organization with `parameters`, timestamped now.
    pub fn body(&self, ty: &str, parameters: Value) -> String {
        json!({
            "type": ty,
            "timestampMs": (crate::store::now_nanos() / 1_000_000).to_string(),
            "organizationId": self.organization_id,
            "parameters": parameters,
        })
        .to_string()
    }

    /// Submits `body` to `submit/<path>`, stamped by the root user's key.
    pub async fn submit_body(&self, path: &str, body: &str) -> Result<Value, ApiError> {
        let headers = stamp_headers(&self.key, body.as_bytes());
        pipeline::submit(self.state.clone(), &crate::ops::REGISTRY, path, &headers, body.as_bytes()).await
    }

    /// Submits a `ty` activity; the completed activity's `result.<result_key>`, or the error.
    pub async fn run(&self, path: &str, ty: &str, parameters: Value) -> Result<Value, ApiError> {
        let answer = self.submit_body(path, &self.body(ty, parameters)).await?;
        let activity = &answer["activity"];
        assert_eq!(activity["status"], "ACTIVITY_STATUS_COMPLETED", "{activity}");
        let result = activity["result"].as_object().expect("a result object");
        Ok(result.values().next().cloned().unwrap_or(Value::Null))
    }

    /// Asks `query/<path>` with `request` (the organization id added), stamped by the root key.
    pub async fn query(&self, path: &str, mut request: Value) -> Result<Value, ApiError> {
        request["organizationId"] = json!(self.organization_id);
        let body = request.to_string();
        let headers = stamp_headers(&self.key, body.as_bytes());
        pipeline::query(self.state.clone(), &crate::ops::REGISTRY, path, &headers, body.as_bytes()).await
    }

    /// Creates a wallet named `name` with the Ethereum accounts at `m/44'/60'/0'/0/<index>`
    /// for each of `indexes`: its id and their addresses.
    pub async fn ethereum_wallet(&self, name: &str, indexes: &[u32]) -> (String, Vec<String>) {
        let accounts: Vec<Value> = indexes.iter().map(|i| ethereum_account(*i)).collect();
        let result = self
            .run("create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", json!({ "walletName": name, "accounts": accounts }))
            .await
            .expect("create_wallet");
        let addresses = result["addresses"].as_array().expect("addresses").iter();
        let addresses = addresses.map(|a| a.as_str().expect("an address").to_string()).collect();
        (result["walletId"].as_str().expect("walletId").to_string(), addresses)
    }
}

/// The wallet account parameters of the Ethereum account at `m/44'/60'/0'/0/<index>`.
pub fn ethereum_account(index: u32) -> Value {
    json!({
        "curve": "CURVE_SECP256K1",
        "pathFormat": "PATH_FORMAT_BIP32",
        "path": format!("m/44'/60'/0'/0/{index}"),
        "addressFormat": "ADDRESS_FORMAT_ETHEREUM",
    })
}
