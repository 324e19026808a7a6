//! Test harness: a fresh SoftHSM token, the real `coffer-enclave` and `coffer-gateway`
//! binaries on real sockets, and the official Rust client pointed at them.

pub mod cbor;
pub mod oidc;
pub mod postgres;
pub mod rlp;
pub mod tls;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use turnkey_api_key_stamper::TurnkeyP256ApiKey;
use turnkey_client::{TurnkeyClient, TurnkeyClientError};

const TEST_PIN: &str = "coffer-test-pin";
const TEST_SO_PIN: &str = "coffer-test-so-pin";

/// Where the built binaries are: `$COFFER_BIN_DIR`, else the workspace's `target/debug`.
pub fn bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("COFFER_BIN_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}

/// A port free now and never handed out before in this process (the OS may offer a released
/// port again, and two stacks starting at once would then collide).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A running Coffer: its own directory, token, database and processes. Stopped on drop.
pub struct Stack {
    pub dir: PathBuf,
    pub base_url: String,
    pub organization_id: String,
    pub user_id: String,
    pub api_public_key: String,
    pub api_private_key: String,
    /// The bundle signer's uncompressed public key, hex.
    pub signer_public_key: String,
    /// Time from spawning each process to its first successful answer.
    pub enclave_startup: Duration,
    pub gateway_startup: Duration,
    enclave: Option<Child>,
    gateway: Option<Child>,
    port: u16,
    /// The auth proxy listener's port.
    pub auth_proxy_port: u16,
    /// Extra environment for both processes (settings a test changes).
    extra_env: Vec<(String, String)>,
    /// `sqlite://…` in the stack's directory, or a fresh PostgreSQL database when the run's
    /// `COFFER_TEST_STORE` is `postgres` (see [`postgres::store_under_test`]).
    store_url: String,
}

impl Stack {
    fn env(&self, cmd: &mut Command) {
        cmd.env("SOFTHSM2_CONF", self.dir.join("softhsm2.conf"))
            .env("COFFER_HSM_PIN", TEST_PIN)
            .env("COFFER_TOKEN_LABEL", "coffer-test")
            .env("COFFER_ENCLAVE_SOCKET", self.dir.join("enclave.sock"))
            .env("COFFER_STORE_URL", &self.store_url)
            .env("COFFER_LISTEN", format!("127.0.0.1:{}", self.port))
            // Coffer's OIDC issuer is the gateway's base URL (the enclave signs tokens with it).
            .env("COFFER_OIDC_ISSUER", format!("http://127.0.0.1:{}", self.port))
            .env("COFFER_AUTH_PROXY_LISTEN", format!("127.0.0.1:{}", self.auth_proxy_port))
            .env("COFFER_LOG", "warn");
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
    }

    fn run(&self, bin: &str, args: &[&str]) -> String {
        let mut cmd = Command::new(bin_dir().join(bin));
        self.env(&mut cmd);
        cmd.env("COFFER_HSM_SO_PIN", TEST_SO_PIN);
        let out = cmd.args(args).output().unwrap_or_else(|e| panic!("running {bin}: {e}"));
        assert!(out.status.success(), "{bin} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Makes a token, its service keys and an organization, then starts both processes.
    pub async fn start() -> Stack {
        Self::start_with(&[]).await
    }

    /// [`Stack::start`] with extra settings in both processes' environment.
    pub async fn start_with(env: &[(&str, &str)]) -> Stack {
        Stack::start_on(postgres::store_under_test(), env).await
    }

    /// A stack on the given store, `sqlite` or `postgres`, whatever the run's `COFFER_TEST_STORE`.
    pub async fn start_on(store: &str, env: &[(&str, &str)]) -> Stack {
        // Unique per stack of this process: a port number from `free_port` can come back for
        // another stack, and a directory shared with a stack being dropped loses its token.
        static STACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("coffer-e2e-{}-{n}", std::process::id()));
        // A directory left by a crashed run whose process had the same id.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tokens")).unwrap();
        std::fs::write(
            dir.join("softhsm2.conf"),
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n",
                dir.join("tokens").display()
            ),
        )
        .unwrap();
        let store_url = match store {
            "postgres" => postgres::server().fresh_database(),
            _ => format!("sqlite://{}", dir.join("coffer.db").display()),
        };
        let mut stack = Stack {
            store_url,
            dir,
            base_url: String::new(),
            organization_id: String::new(),
            user_id: String::new(),
            api_public_key: String::new(),
            api_private_key: String::new(),
            signer_public_key: String::new(),
            enclave_startup: Duration::ZERO,
            gateway_startup: Duration::ZERO,
            enclave: None,
            gateway: None,
            port: free_port(),
            auth_proxy_port: free_port(),
            extra_env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        stack.base_url = format!("http://127.0.0.1:{}", stack.port);
        stack.run("coffer-enclave", &["init-token"]);
        let init: serde_json::Value = serde_json::from_str(&stack.run("coffer-enclave", &["init"])).unwrap();
        stack.signer_public_key = init["enclaveSignerPublicKey"].as_str().unwrap().to_string();
        let key: serde_json::Value = serde_json::from_str(&stack.run("coffer-gateway", &["keygen"])).unwrap();
        stack.api_public_key = key["apiPublicKey"].as_str().unwrap().to_string();
        stack.api_private_key = key["apiPrivateKey"].as_str().unwrap().to_string();
        let t = Instant::now();
        stack.start_enclave();
        let socket = stack.dir.join("enclave.sock");
        while !socket.exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "enclave socket did not appear");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stack.enclave_startup = t.elapsed();
        // The enclave bootstraps the organization: it chooses the ids and certifies the root key.
        let org: serde_json::Value =
            serde_json::from_str(&stack.run(
                "coffer-gateway",
                &["init-org", "--name", "e2e", "--api-public-key", &stack.api_public_key.clone()],
            ))
            .unwrap();
        stack.organization_id = org["organizationId"].as_str().unwrap().to_string();
        stack.user_id = org["userId"].as_str().unwrap().to_string();
        let t = Instant::now();
        stack.start_gateway();
        stack.wait_healthy().await;
        stack.gateway_startup = t.elapsed();
        stack
    }

    /// Runs `bin` with this stack's environment and `input` on stdin (operator pipelines).
    pub fn run_with_stdin(&self, bin: &str, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write;
        let mut cmd = Command::new(bin_dir().join(bin));
        self.env(&mut cmd);
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {bin}: {e}"));
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs `coffer-gateway` (e.g. `keygen`, `init-org`) against this stack's database; its
    /// JSON output.
    pub fn gateway_cli(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.run("coffer-gateway", args)).expect("coffer-gateway printed JSON")
    }

    /// How many activities `list_activities` shows in `org` (up to 100), read with `key`.
    pub async fn activity_count(&self, key: &TurnkeyP256ApiKey, org: &str) -> usize {
        let body = serde_json::json!({"organizationId": org, "paginationOptions": {"limit": "100"}}).to_string();
        let r = self.post_raw("/public/v1/query/list_activities", body.as_bytes(), Some(key)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.json["activities"].as_array().expect("activities").len()
    }

    /// Everything the enclave has logged so far (JSON lines; refusals are `coffer_audit` warnings).
    pub fn enclave_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("enclave.log")).unwrap_or_default()
    }

    /// The gateway's SQLite file (what an attacker with the gateway's rights can read and write).
    /// The store URL the stack's gateway uses.
    pub fn store_url(&self) -> &str {
        &self.store_url
    }

    /// The SQLite file (stacks on SQLite only).
    pub fn database_path(&self) -> PathBuf {
        assert!(self.store_url.starts_with("sqlite://"), "this test reads the SQLite file: run it on SQLite");
        self.dir.join("coffer.db")
    }

    /// The enclave's Unix socket (what an attacker with the gateway's rights can connect to).
    pub fn enclave_socket(&self) -> PathBuf {
        self.dir.join("enclave.sock")
    }

    /// Process ids of (enclave, gateway), for resource measurements.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (self.enclave.as_ref().map(|c| c.id()), self.gateway.as_ref().map(|c| c.id()))
    }

    /// The SoftHSM configuration, token label and user PIN of this stack's token.
    pub fn token(&self) -> (PathBuf, &'static str, &'static str) {
        (self.dir.join("softhsm2.conf"), "coffer-test", TEST_PIN)
    }

    /// Starts the enclave process (again).
    pub fn start_enclave(&mut self) {
        let mut cmd = Command::new(bin_dir().join("coffer-enclave"));
        self.env(&mut cmd);
        // The enclave's log (its audit lines among them) goes to a file the tests can read.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("enclave.log"))
            .expect("enclave log file");
        self.enclave = Some(cmd.arg("serve").stdin(Stdio::null()).stderr(log).spawn().expect("start enclave"));
    }

    /// Starts another enclave on the same token (the same service keys), listening on `socket`;
    /// its log goes to `<socket>.log`. The caller owns (and kills) the process.
    pub fn spawn_enclave(&self, socket: &Path) -> Child {
        let mut cmd = Command::new(bin_dir().join("coffer-enclave"));
        self.env(&mut cmd);
        cmd.env("COFFER_ENCLAVE_SOCKET", socket);
        let log = std::fs::File::create(socket.with_extension("log")).expect("enclave log file");
        cmd.arg("serve").stdin(Stdio::null()).stderr(log).spawn().expect("start enclave")
    }

    /// Sets an environment variable for the processes this stack starts from now on.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.extra_env.retain(|(k, _)| k != key);
        self.extra_env.push((key.to_string(), value.to_string()));
    }

    /// Kills the enclave (SIGKILL: an abrupt crash, not a clean stop).
    pub fn kill_enclave(&mut self) {
        if let Some(mut c) = self.enclave.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the gateway process (again) on the same port, database and enclave; see
    /// [`Stack::wait_healthy`].
    pub fn start_gateway(&mut self) {
        let mut cmd = Command::new(bin_dir().join("coffer-gateway"));
        self.env(&mut cmd);
        self.gateway = Some(cmd.arg("serve").stdin(Stdio::null()).spawn().expect("start gateway"));
    }

    /// Starts another gateway on the same store and enclaves, on a port of its own, and waits
    /// until it is healthy: its base URL and process (killed when dropped, a failing test too).
    pub async fn spawn_gateway(&self) -> (String, GatewayProcess) {
        let port = free_port();
        let mut cmd = Command::new(bin_dir().join("coffer-gateway"));
        self.env(&mut cmd);
        cmd.env("COFFER_LISTEN", format!("127.0.0.1:{port}"))
            .env("COFFER_AUTH_PROXY_LISTEN", format!("127.0.0.1:{}", free_port()));
        let child = cmd.arg("serve").stdin(Stdio::null()).spawn().expect("start gateway");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(format!("{url}/healthz")).await.is_ok_and(|r| r.status() == 200) {
            assert!(Instant::now() < deadline, "second gateway did not become healthy in 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (url, GatewayProcess(child))
    }

    /// Kills the gateway (SIGKILL: an abrupt crash, not a clean stop).
    pub fn kill_gateway(&mut self) {
        if let Some(mut c) = self.gateway.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until `/healthz` answers 200 (store and enclave reachable).
    pub async fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = reqwest::Client::new();
        loop {
            if let Ok(r) = http.get(format!("{}/healthz", self.base_url)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "stack did not become healthy in 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn api_key(&self) -> TurnkeyP256ApiKey {
        TurnkeyP256ApiKey::from_strings(&self.api_private_key, Some(&self.api_public_key)).unwrap()
    }

    /// The official client with the root user's key, pointed at this stack.
    pub fn client(&self) -> TurnkeyClient<TurnkeyP256ApiKey> {
        self.client_with(self.api_key())
    }

    pub fn client_with(&self, key: TurnkeyP256ApiKey) -> TurnkeyClient<TurnkeyP256ApiKey> {
        TurnkeyClient::builder().api_key(key).base_url(self.base_url.clone()).build().unwrap()
    }

    /// `QuorumPublicKey` for `turnkey_enclave_encrypt`: any valid point ‖ Coffer's signer key.
    pub fn quorum_public_key(&self) -> turnkey_enclave_encrypt::QuorumPublicKey {
        turnkey_enclave_encrypt::QuorumPublicKey::from_string(format!("{0}{0}", self.signer_public_key)).unwrap()
    }

    /// POSTs `body` as is, stamped by `key` if given, and returns status, content type and JSON.
    pub async fn post_raw(&self, path: &str, body: &[u8], key: Option<&TurnkeyP256ApiKey>) -> RawResponse {
        post_to(&self.base_url, path, body, key).await
    }

    pub fn now_ms() -> u128 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
    }
}

/// POSTs `body` to `base_url` + `path`, stamped with `key` if given (any gateway of a stack; for
/// spawned tasks, which cannot borrow the `Stack`).
pub async fn post_to(base_url: &str, path: &str, body: &[u8], key: Option<&TurnkeyP256ApiKey>) -> RawResponse {
    use turnkey_api_key_stamper::Stamp;
    let mut req = reqwest::Client::new().post(format!("{base_url}{path}")).body(body.to_vec());
    if let Some(k) = key {
        let stamp = k.stamp(body).unwrap();
        req = req.header(stamp.name, stamp.value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    RawResponse { status, content_type, json, text }
}

/// A gateway process beyond a stack's own ([`Stack::spawn_gateway`]), killed when dropped.
pub struct GatewayProcess(pub Child);

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a raw HTTP call returned.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub json: serde_json::Value,
    pub text: String,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for child in [self.gateway.take(), self.enclave.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Asserts that an official-client call was refused with HTTP `status` and a JSON error whose
/// message contains `needle`.
#[track_caller]
pub fn refused<T: std::fmt::Debug>(r: Result<T, TurnkeyClientError>, status: u16, needle: &str) {
    match r {
        Err(TurnkeyClientError::UnexpectedHttpStatus(s, body)) => {
            assert_eq!(s, status, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
            let m = v["message"].as_str().unwrap_or_default();
            assert!(m.contains(needle), "expected {needle:?} in {m:?}");
        }
        other => panic!("expected HTTP {status} ({needle}), got {other:?}"),
    }
}
