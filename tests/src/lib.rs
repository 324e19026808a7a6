//! Test harness: a fresh SoftHSM token, the real `coffer-enclave` and `coffer-gateway`
//! binaries on real sockets, and the official Rust client pointed at them.

pub mod cbor;
pub mod oidc;
pub mod passkey;
pub mod postgres;
pub mod rlp;
pub mod smtp;
pub mod tls;
pub mod webdriver;

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
pub fn free_port() -> u16 {
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

/// Waits until a process accepts connections on the Unix socket `socket` (an enclave): the file
/// appears at bind, a moment before the listener accepts, so its existence is no readiness signal.
/// Fails the test after 30 s.
pub async fn wait_accepting(socket: &Path) {
    let t = Instant::now();
    while tokio::net::UnixStream::connect(socket).await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(30), "nothing accepts on {} after 30 s", socket.display());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The setting ([`Stack::start_with`]) under which the enclave logs its `coffer_audit` allow lines
/// too (info level; the stacks log warnings only by default), for [`Stack::audit`].
pub const AUDIT_LOG: (&str, &str) = ("COFFER_LOG", "warn,coffer_audit=info");

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
    /// The operator's public key (compressed hex): the enclave's `operator_public_keys`; its
    /// private half is in [`Stack::operator_key_file`], which the gateway's operator commands read.
    pub operator_public_key: String,
    /// Extra environment for both processes (settings a test changes).
    extra_env: Vec<(String, String)>,
    /// `sqlite://…` in the stack's directory, or a fresh PostgreSQL database when the run's
    /// `COFFER_TEST_STORE` is `postgres` (see [`postgres::store_under_test`]).
    store_url: String,
    /// The enclave tier's authority store when the stack is on PostgreSQL: a fresh database of
    /// its own, shared by every enclave the stack starts ([`Stack::spawn_enclave`] too). `None`:
    /// the enclave's default, `authority.sqlite` beside its socket, in the stack's directory.
    authority_store_url: Option<String>,
    /// How many of the enclaves' `coffer_audit` refusal lines [`Stack::refused_for`] has already
    /// accounted for.
    refusals_seen: std::sync::Mutex<usize>,
    /// Whether [`Stack::assert_secret_absent`] planted its marker yet.
    planted: tokio::sync::Mutex<bool>,
    /// Whether the test makes the gateway's records drift from the enclave's state on purpose
    /// ([`Stack::expect_record_drift`]); otherwise a gateway that found its records not following
    /// the enclave's changes fails the test when the stack is dropped.
    drift_expected: std::sync::atomic::AtomicBool,
}

/// The kryoptic module when the run's end-to-end stacks use it (`COFFER_TEST_HSM=kryoptic`,
/// the module from `COFFER_KRYOPTIC_MODULE`); SoftHSM otherwise.
pub fn kryoptic_under_test() -> Option<String> {
    match std::env::var("COFFER_TEST_HSM").as_deref() {
        Err(_) | Ok("") | Ok("softhsm") => None,
        Ok("kryoptic") => Some(
            std::env::var("COFFER_KRYOPTIC_MODULE")
                .expect("COFFER_TEST_HSM=kryoptic needs COFFER_KRYOPTIC_MODULE (deploy/build-kryoptic.sh)"),
        ),
        Ok(other) => panic!("COFFER_TEST_HSM={other:?}: expected softhsm or kryoptic"),
    }
}

impl Stack {
    /// Gives `cmd` (one of the binaries) this stack's environment, as the stack runs them.
    pub fn configure(&self, cmd: &mut Command) {
        self.env(cmd);
    }

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
        if let Some(url) = &self.authority_store_url {
            cmd.env("COFFER_AUTHORITY_STORE_URL", url);
        }
        if !self.operator_public_key.is_empty() {
            // The enclave knows the operator's public key; the gateway's operator commands
            // (init-org) read its private key from the file. Both processes get both here.
            cmd.env("COFFER_OPERATOR_PUBLIC_KEYS", &self.operator_public_key)
                .env("COFFER_OPERATOR_KEY_FILE", self.operator_key_file());
        }
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
        // On PostgreSQL both tiers are: the gateway's store and the enclaves' authority store,
        // each a fresh database (as a deployment of several enclaves runs them).
        let (store_url, authority_store_url) = match store {
            "postgres" => (postgres::server().fresh_database(), Some(postgres::server().fresh_database())),
            "sqlite" => (format!("sqlite://{}", dir.join("coffer.db").display()), None),
            other => panic!("a stack on {other:?}: expected sqlite or postgres"),
        };
        let mut extra_env: Vec<(String, String)> = Vec::new();
        if let Some(module) = kryoptic_under_test() {
            // The run's PKCS#11 module is kryoptic: a token of one slot in the stack's directory.
            let conf = dir.join("kryoptic.conf");
            let db = dir.join("tokens/kryoptic.sql");
            std::fs::write(&conf, format!("[[slots]]\nslot = 0\ndbtype = \"sqlite\"\ndbargs = \"{}\"\n", db.display()))
                .unwrap();
            extra_env.push(("COFFER_PKCS11_MODULE".into(), module));
            extra_env.push(("KRYOPTIC_CONF".into(), conf.display().to_string()));
            extra_env.push(("COFFER_HSM_PROFILE".into(), "kryoptic".into()));
        }
        extra_env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut stack = Stack {
            store_url,
            authority_store_url,
            refusals_seen: std::sync::Mutex::new(0),
            planted: tokio::sync::Mutex::new(false),
            drift_expected: Default::default(),
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
            operator_public_key: String::new(),
            extra_env,
        };
        stack.base_url = format!("http://127.0.0.1:{}", stack.port);
        stack.run("coffer-enclave", &["init-token"]);
        let init: serde_json::Value = serde_json::from_str(&stack.run("coffer-enclave", &["init"])).unwrap();
        stack.signer_public_key = init["enclaveSignerPublicKey"].as_str().unwrap().to_string();
        let key: serde_json::Value = serde_json::from_str(&stack.run("coffer-gateway", &["keygen"])).unwrap();
        stack.api_public_key = key["apiPublicKey"].as_str().unwrap().to_string();
        stack.api_private_key = key["apiPrivateKey"].as_str().unwrap().to_string();
        // The operator's key pair: the enclave bootstraps organizations only for its stamp.
        let operator_key_file = stack.operator_key_file();
        let operator: serde_json::Value = serde_json::from_str(
            &stack.run("coffer-gateway", &["operator-keygen", "--out", operator_key_file.to_str().unwrap()]),
        )
        .unwrap();
        stack.operator_public_key = operator["operatorPublicKey"].as_str().unwrap().to_string();
        let t = Instant::now();
        stack.start_enclave();
        wait_accepting(&stack.enclave_socket()).await;
        stack.enclave_startup = t.elapsed();
        // The gateway's store, made by the one operator command that makes one (init-org, as
        // every other, refuses a store that is not there).
        stack.run("coffer-gateway", &["migrate"]);
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

    /// The enclave's proof key, as the gateway's discovery endpoint publishes it (hex).
    pub async fn proof_key(&self) -> String {
        let url = format!("{}/public/v1/discovery/keys", self.base_url);
        let discovery: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        discovery["proofPublicKey"].as_str().expect("a proof key").to_string()
    }

    /// `coffer-gateway diff-state` (`command` = `diff-state`) or `rebuild` for the stack's
    /// organization, stamped with its root API key and checked against `proof_key`, with `extra`
    /// arguments: the exit status and the JSON printed.
    pub fn state_command(&self, command: &str, proof_key: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
        let key_file = self.dir.join(format!("state-command-{}.key", uuid::Uuid::new_v4()));
        std::fs::write(&key_file, format!("{}\n", self.api_private_key)).unwrap();
        let mut args = vec![command, "--base-url", &self.base_url, "--organization-id", &self.organization_id];
        args.extend(["--api-key-file", key_file.to_str().unwrap(), "--proof-key", proof_key]);
        args.extend(extra);
        let answer = self.gateway_cli_status(&args);
        let _ = std::fs::remove_file(&key_file);
        answer
    }

    /// `coffer-gateway` with `args` in the stack's environment, whatever its exit status: the
    /// status and the JSON it printed.
    pub fn gateway_cli_status(&self, args: &[&str]) -> (Option<i32>, serde_json::Value) {
        let mut cmd = Command::new(bin_dir().join("coffer-gateway"));
        self.env(&mut cmd);
        let out = cmd.args(args).output().expect("running coffer-gateway");
        let printed = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!("coffer-gateway {args:?} printed no JSON: {}", String::from_utf8_lossy(&out.stderr))
        });
        (out.status.code(), printed)
    }

    /// How many calls of the enclave's `method` the gateway made, whatever their outcome (its
    /// `coffer_enclave_calls_total` metric).
    pub async fn enclave_calls(&self, method: &str) -> u64 {
        let metrics = reqwest::get(format!("{}/metrics", self.base_url)).await.unwrap().text().await.unwrap();
        let series = format!("coffer_enclave_calls_total{{method=\"{method}\",");
        metrics
            .lines()
            .filter(|l| l.starts_with(&series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The finished activities of the stack's organization that its activity log does not link,
    /// as `type id` (`coffer_list_activity_log`'s `unlogged`, as root reads it).
    pub async fn unlogged_activities(&self) -> Vec<String> {
        let body = serde_json::json!({ "organizationId": self.organization_id }).to_string();
        let r =
            self.post_raw("/public/v1/query/coffer_list_activity_log", body.as_bytes(), Some(&self.api_key())).await;
        assert_eq!(r.status, 200, "coffer_list_activity_log: {}", r.text);
        let unlogged = r.json["unlogged"].as_array().unwrap_or_else(|| panic!("no unlogged list: {}", r.text));
        unlogged
            .iter()
            .map(|a| format!("{} {}", a["type"].as_str().unwrap_or("?"), a["id"].as_str().unwrap_or("?")))
            .collect()
    }

    /// Every activity of `org`, newest first, read with `key` through `list_activities` pages of
    /// 100 (`paginationOptions.after` = the last id of the previous page) until a short page: the
    /// exact oracle for "recorded once" / "nothing recorded" (no cap). Fails the test if a page
    /// is refused, an activity has no id, or an id comes back twice.
    pub async fn activities(&self, key: &TurnkeyP256ApiKey, org: &str) -> Vec<serde_json::Value> {
        const PAGE: usize = 100;
        let mut all: Vec<serde_json::Value> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut after: Option<String> = None;
        loop {
            let mut pagination = serde_json::json!({"limit": PAGE.to_string()});
            if let Some(a) = &after {
                pagination["after"] = serde_json::Value::String(a.clone());
            }
            let body = serde_json::json!({"organizationId": org, "paginationOptions": pagination}).to_string();
            let r = self.post_raw("/public/v1/query/list_activities", body.as_bytes(), Some(key)).await;
            assert_eq!(r.status, 200, "list_activities: {}", r.text);
            let page = r.json["activities"].as_array().unwrap_or_else(|| panic!("no activities: {}", r.text)).clone();
            assert!(page.len() <= PAGE, "a page of {} activities (asked for {PAGE})", page.len());
            for a in &page {
                let id = a["id"].as_str().unwrap_or_else(|| panic!("an activity without an id: {a}"));
                assert!(seen.insert(id.to_string()), "activity {id} listed twice while paging");
            }
            let full = page.len() == PAGE;
            after = page.last().map(|a| a["id"].as_str().unwrap().to_string());
            all.extend(page);
            if !full {
                return all;
            }
        }
    }

    /// How many activities `org` has, exactly: [`Stack::activities`] counted (every page, no
    /// cap), read with `key`, and checked against the gateway's store read directly (its
    /// `activities` table), so that a listing that drops or repeats records fails.
    pub async fn activity_count(&self, key: &TurnkeyP256ApiKey, org: &str) -> usize {
        let listed = self.activities(key, org).await.len();
        let stored = self.stored_activity_count(org);
        assert_eq!(listed, stored, "list_activities lists {listed} activities of {org}, the store holds {stored}");
        listed
    }

    /// How many rows of the gateway store's `activities` table are `org`'s, read with SQL (not
    /// through the gateway).
    pub fn stored_activity_count(&self, org: &str) -> usize {
        let (url, org) = (self.store_url.clone(), org.to_string());
        let n: i64 = if let Some(path) = url.strip_prefix("sqlite://") {
            let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            c.busy_timeout(Duration::from_secs(10)).unwrap();
            c.query_row("SELECT count(*) FROM activities WHERE organization_id = ?1", [&org], |r| r.get(0))
                .expect("counting activities")
        } else {
            // Off any async runtime: the blocking client runs one of its own.
            std::thread::spawn(move || {
                let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connecting to the store");
                c.query_one("SELECT count(*) FROM activities WHERE organization_id = $1", &[&org])
                    .expect("counting activities")
                    .get(0)
            })
            .join()
            .unwrap()
        };
        usize::try_from(n).unwrap()
    }

    /// Runs `sql` (one statement, `$1` its one text parameter) on the gateway's store directly,
    /// SQLite or PostgreSQL, as an attacker who holds the gateway's database would: the rows
    /// changed.
    pub fn tamper_store(&self, sql: &str, param: &str) -> u64 {
        let (url, sql, param) = (self.store_url.clone(), sql.to_string(), param.to_string());
        if let Some(path) = url.strip_prefix("sqlite://") {
            let c = rusqlite::Connection::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            c.busy_timeout(Duration::from_secs(10)).unwrap();
            return c.execute(&sql, [&param]).unwrap_or_else(|e| panic!("{sql}: {e}")) as u64;
        }
        std::thread::spawn(move || {
            let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connecting to the store");
            c.execute(&sql, &[&param]).unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
        .join()
        .unwrap()
    }

    /// Asserts that `secret` is nowhere the stack keeps or prints anything: not in either tier's
    /// store (the gateway's and the enclaves' authority store: SQLite files with their WAL and
    /// journal, or every table of each PostgreSQL database, as text), and not in any process's
    /// captured output (every enclave's and gateway's stdout and stderr, the `*.log` files of
    /// the stack's directory). Searched as given and as lowercase hex. Before it looks, it proves
    /// it can see: a marker it plants through the API (a user tag, which both tiers record) is
    /// found in each tier, and every output file starts with the stack's capture line. A store it
    /// does not know (another SQLite file in the stack's directory, a URL of another kind) fails.
    pub async fn assert_secret_absent(&self, secret: &str) {
        assert!(secret.len() >= 4, "a secret of {} characters would match by chance", secret.len());
        let marker = self.planted_marker().await;
        let tiers = self.stores();
        for (tier, places) in &tiers {
            assert!(
                places.iter().any(|(_, bytes)| found(bytes, &marker).is_some()),
                "the planted marker is not in the {tier}'s store ({:?}): this search cannot see it",
                places.iter().map(|(p, _)| p).collect::<Vec<_>>()
            );
        }
        let outputs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .expect("the stack's directory")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        assert!(outputs.iter().any(|p| p.ends_with("gateway.log")), "no gateway output captured");
        assert!(outputs.iter().any(|p| p.ends_with("enclave.log")), "no enclave output captured");
        let capture = self.capture_marker();
        for (tier, places) in &tiers {
            for (place, bytes) in places {
                if let Some(i) = found(bytes, secret) {
                    panic!("the secret is in the {tier}'s store, {place}: …{}…", around(bytes, i));
                }
            }
        }
        for path in outputs {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                bytes.starts_with(capture.as_bytes()),
                "{} is not an output this stack captures (no capture line)",
                path.display()
            );
            if let Some(i) = found(&bytes, secret) {
                panic!("the secret is in {}: …{}…", path.display(), around(&bytes, i));
            }
        }
    }

    /// A user tag named with a marker unique to this stack, created once through the API.
    async fn planted_marker(&self) -> String {
        let marker = format!("coffer-e2e-planted-{}", self.port);
        let mut planted = self.planted.lock().await;
        if !*planted {
            let r = submit(
                self,
                &self.api_key(),
                &self.organization_id,
                "create_user_tag",
                "ACTIVITY_TYPE_CREATE_USER_TAG",
                serde_json::json!({"userTagName": marker, "userIds": []}),
            )
            .await;
            assert_eq!(r.status, 200, "planting the marker: {}", r.text);
            *planted = true;
        }
        marker
    }

    /// How many records of `kind` the gateway's store holds for `org` (its `records` table, read
    /// with SQL, not through the gateway).
    pub fn stored_record_count(&self, org: &str, kind: &str) -> usize {
        let sql = "SELECT count(*) FROM records WHERE organization_id = $1 AND kind = $2";
        count_rows(&self.store_url, sql, org, kind)
    }

    /// How many entries of `kind` the enclaves' authority store holds in `org`'s state (its
    /// `entries` table, read with SQL).
    pub fn authority_entry_count(&self, org: &str, kind: &str) -> usize {
        let sql = "SELECT count(*) FROM entries WHERE organization_id = $1 AND kind = $2";
        count_rows(&self.authority_store(), sql, org, kind)
    }

    /// How many decisions with `outcome` (`allow`, `refuse`, ...) the enclaves' decision log holds
    /// for the activity of `org` with `fingerprint` (its `decisions` table, read with SQL).
    /// Replay entries charged to `org` (a top-level organization) that live past `after_ms`.
    pub fn replay_entries_past(&self, org: &str, after_ms: i64) -> usize {
        let sql = "SELECT count(*) FROM replay WHERE organization_id = $1 AND expires_ms > CAST($2 AS BIGINT)";
        count_rows(&self.authority_store(), sql, org, &after_ms.to_string())
    }

    /// Links of the activity of `fingerprint` in `status` in the enclave tier's log of `org`.
    pub fn link_count(&self, org: &str, fingerprint: &str, status: &str) -> usize {
        let sql = "SELECT count(*) FROM log_links WHERE organization_id = $1 AND fingerprint || ' ' || status = $2";
        count_rows(&self.authority_store(), sql, org, &format!("{fingerprint} {status}"))
    }

    pub fn decision_count(&self, org: &str, fingerprint: &str, outcome: &str) -> usize {
        let sql = "SELECT count(*) FROM decisions WHERE organization_id = $1 AND fingerprint || ' ' || outcome = $2";
        count_rows(&self.authority_store(), sql, org, &format!("{fingerprint} {outcome}"))
    }

    /// The enclaves' authority store URL.
    fn authority_store(&self) -> String {
        self.extra_env
            .iter()
            .rev()
            .find(|(k, _)| k == "COFFER_AUTHORITY_STORE_URL")
            .map(|(_, v)| v.clone())
            .filter(|v| !v.trim().is_empty())
            .or_else(|| self.authority_store_url.clone())
            .unwrap_or_else(|| format!("sqlite://{}", self.dir.join("authority.sqlite").display()))
    }

    /// Everything each tier's store holds, by place: ("gateway", …) and ("authority", …).
    fn stores(&self) -> Vec<(&'static str, Vec<StorePlace>)> {
        let authority = self.authority_store();
        let known: Vec<PathBuf> = [&self.store_url, &authority]
            .iter()
            .filter_map(|u| u.strip_prefix("sqlite://").map(PathBuf::from))
            .collect();
        for file in sqlite_files(&self.dir) {
            assert!(known.contains(&file), "{}: a store this search does not know", file.display());
        }
        vec![("gateway", store_contents(&self.store_url)), ("authority", store_contents(&authority))]
    }

    /// Everything the enclave has logged so far (JSON lines; refusals are `coffer_audit` warnings).
    pub fn enclave_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("enclave.log")).expect("the enclave's log (the stack starts it)")
    }

    /// Every enclave's output files: `enclave.log` and those of [`Stack::spawn_enclave`] in the
    /// stack's directory, in name order.
    fn enclave_logs(&self) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .expect("the stack's directory")
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("enclave") && name.ends_with(".log")
            })
            .collect();
        logs.sort();
        assert!(logs.contains(&self.dir.join("enclave.log")), "no enclave.log in {}", self.dir.display());
        logs
    }

    /// The `fields` of every enclave's `coffer_audit` refusal lines (`decision` `refuse`, or an
    /// `outcome` `failed` with a `reason_code`), oldest first per enclave.
    fn refusal_lines(&self) -> Vec<serde_json::Value> {
        self.enclave_logs()
            .iter()
            .flat_map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
            .filter(|l| l["target"] == "coffer_audit")
            .map(|l| l["fields"].clone())
            // A refusal before any decision, or one that came out of carrying an allowed one out
            // (an outcome line that failed for a typed reason: a spent code, a busy quota).
            .filter(|f| {
                f["decision"] == "refuse"
                    || (f["outcome"] == "failed" && f["reason_code"].as_str().is_some_and(|r| !r.is_empty()))
            })
            .collect()
    }

    /// Asserts that `answer` (a raw HTTP answer or an official-client result) is a refusal with
    /// HTTP `status` and `turnkey_error_code` in Coffer's error shape (as [`refused`]), and that
    /// the enclave refused it for `reason`: since the previous call, the enclaves logged at least
    /// one `coffer_audit` refusal, and every one of them names `reason` (`reason_code`). A refusal
    /// by the gateway alone, for another reason, or for several, fails. Refusals logged by other
    /// requests between two calls would fail it too: use it on a stack no other task drives.
    #[track_caller]
    pub fn refused_for(
        &self,
        answer: impl Refusal,
        status: u16,
        turnkey_error_code: &str,
        reason: coffer_proto::v1::RefusalReason,
    ) {
        let (got, body) = answer.status_and_body();
        assert_eq!(got, status, "expected HTTP {status} ({turnkey_error_code}, {reason:?}): {body}");
        assert_error_body(status, &body, turnkey_error_code, "");
        // The enclave logs its refusal before it answers; the file is read as it grows.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = self.refusals_seen.lock().unwrap_or_else(|e| e.into_inner());
        let new = loop {
            let lines = self.refusal_lines();
            assert!(lines.len() >= *seen, "the enclaves' refusal lines shrank: {} < {}", lines.len(), *seen);
            if lines.len() > *seen || Instant::now() > deadline {
                let new = lines[*seen..].to_vec();
                *seen = lines.len();
                break new;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            !new.is_empty(),
            "HTTP {status} ({body}), but no enclave logged a refusal: the gateway refused it alone"
        );
        let name = reason.as_str_name();
        assert!(
            new.iter().all(|f| f["reason_code"] == name),
            "expected the enclave's refusal {name}, its new refusal lines are: {new:?}"
        );
    }

    /// Asserts that `answer` is a refusal with HTTP `status`, `turnkey_error_code` and a message
    /// containing `needle`, in Coffer's error shape, made by the gateway alone: no enclave logged
    /// a refusal since the previous [`Stack::refused_for`] or [`Stack::refused_by_gateway`].
    #[track_caller]
    pub fn refused_by_gateway(&self, answer: impl Refusal, status: u16, turnkey_error_code: &str, needle: &str) {
        let (got, body) = answer.status_and_body();
        assert_eq!(got, status, "expected HTTP {status} ({turnkey_error_code}, {needle:?}): {body}");
        assert_error_body(status, &body, turnkey_error_code, needle);
        let mut seen = self.refusals_seen.lock().unwrap_or_else(|e| e.into_inner());
        let lines = self.refusal_lines();
        let new = &lines[(*seen).min(lines.len())..];
        assert!(new.is_empty(), "HTTP {status} ({body}), and the enclave refused too: {new:?}");
        *seen = lines.len();
    }

    /// Marks every enclave refusal logged so far as seen by [`Stack::refused_for`] (after steps
    /// whose refusals a test does not check one by one).
    pub fn refusals_accounted(&self) {
        *self.refusals_seen.lock().unwrap_or_else(|e| e.into_inner()) = self.refusal_lines().len();
    }

    /// The `fields` of the enclave's `coffer_audit` lines (JSON) with this `decision` (`allow`,
    /// `refuse`, …) and `operation` (`sign`, `export_wallet`, …), oldest first: each `allow` is
    /// one execution the enclave authorized (filter further on `fingerprint`, `organization`).
    /// Matched on the parsed fields, never on a substring of the line. `allow` lines are at info
    /// level: start the stack with [`AUDIT_LOG`] to have them.
    pub fn audit(&self, decision: &str, operation: &str) -> Vec<serde_json::Value> {
        self.enclave_log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["target"] == "coffer_audit")
            .map(|l| l["fields"].clone())
            .filter(|f| f["decision"] == decision && f["operation"] == operation)
            .collect()
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

    /// The operator's private key file (`coffer-gateway operator-keygen`; the operator's, not
    /// the gateway's: what a taken-over gateway does not have).
    pub fn operator_key_file(&self) -> PathBuf {
        self.dir.join("operator.key")
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
        let (out, err) = self.output_file("enclave.log");
        self.enclave =
            Some(cmd.arg("serve").stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("start enclave"));
    }

    /// Starts another enclave on the same token (the same service keys) and the same authority
    /// store, listening on `socket`; its output goes to `<socket>.log` (a file name starting with
    /// `enclave` when `socket` is in the stack's directory: [`Stack::refused_for`] and
    /// [`Stack::assert_secret_absent`] read it). The caller owns (and kills) the process.
    pub fn spawn_enclave(&self, socket: &Path) -> Child {
        let mut cmd = Command::new(bin_dir().join("coffer-enclave"));
        self.env(&mut cmd);
        cmd.env("COFFER_ENCLAVE_SOCKET", socket);
        let (out, err) = self.output_file(socket.with_extension("log").file_name().unwrap().to_str().unwrap());
        cmd.arg("serve").stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("start enclave")
    }

    /// A process's output file in the stack's directory (appended to, for stdout and stderr), its
    /// first line the stack's capture marker: [`Stack::assert_secret_absent`] reads every `*.log`
    /// of the directory and refuses one without it, so a file it reads is one a process writes.
    fn output_file(&self, name: &str) -> (std::fs::File, std::fs::File) {
        use std::io::Write;
        let path = self.dir.join(name);
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("an output file");
        if file.metadata().unwrap().len() == 0 {
            writeln!(file, "{}", self.capture_marker()).unwrap();
        }
        (file.try_clone().unwrap(), file)
    }

    /// The line the harness writes first in every output file it captures (unique per stack).
    fn capture_marker(&self) -> String {
        format!("coffer-e2e-capture {}", self.dir.display())
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
        // Both its streams: what it prints is searched for secrets too (assert_secret_absent).
        let (out, err) = self.output_file("gateway.log");
        self.gateway =
            Some(cmd.arg("serve").stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("start gateway"));
    }

    /// Starts another gateway on the same store and enclaves, on a port of its own, and waits
    /// until it is healthy: its base URL and process (killed when dropped, a failing test too).
    pub async fn spawn_gateway(&self) -> (String, GatewayProcess) {
        let port = free_port();
        let mut cmd = Command::new(bin_dir().join("coffer-gateway"));
        self.env(&mut cmd);
        cmd.env("COFFER_LISTEN", format!("127.0.0.1:{port}"))
            .env("COFFER_AUTH_PROXY_LISTEN", format!("127.0.0.1:{}", free_port()));
        let (out, err) = self.output_file(&format!("gateway-{port}.log"));
        let child = cmd.arg("serve").stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("start gateway");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(format!("{url}/healthz")).await.is_ok_and(|r| r.status() == 200) {
            assert!(Instant::now() < deadline, "second gateway did not become healthy in 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (url, GatewayProcess(child))
    }

    /// On a PostgreSQL run, a second gateway on the same store ([`Stack::spawn_gateway`]), so
    /// that concurrent requests race across gateways; `None` on SQLite (one gateway per file).
    pub async fn second_gateway_on_postgres(&self) -> Option<(String, GatewayProcess)> {
        match postgres::store_under_test() {
            "postgres" => Some(self.spawn_gateway().await),
            _ => None,
        }
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
        if std::thread::panicking() {
            self.print_warnings();
        } else if !self.drift_expected.load(std::sync::atomic::Ordering::Relaxed) {
            let drifted = self.log_lines_with(RECORD_DRIFT);
            if !drifted.is_empty() {
                let _ = std::fs::remove_dir_all(&self.dir);
                panic!("the gateway's records did not follow the enclave's changes:\n{}", drifted.join("\n"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the gateway logs when its records of an activity do not follow the changes the enclave
/// applied (`gateway/src/activity/pipeline.rs`): a handler and its transition disagree, or the
/// gateway's database was edited.
const RECORD_DRIFT: &str = "do not follow the changes the enclave applied";

impl Stack {
    /// The test edits the gateway's database under it (or otherwise makes its records drift
    /// from the enclave's state) on purpose: the gateway's repairs do not fail it.
    pub fn expect_record_drift(&self) {
        self.drift_expected.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every line of the stack's process logs that holds `needle`.
    fn log_lines_with(&self, needle: &str) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for path in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")) {
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
            out.extend(text.lines().filter(|l| l.contains(needle)).map(str::to_string));
        }
        out
    }

    /// On a failing test: the last warnings and errors each process of the stack printed, so
    /// that CI's output says what the enclaves and gateways saw (the directory is removed next).
    fn print_warnings(&self) {
        const LAST: usize = 30;
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut logs: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect();
        logs.sort();
        for path in logs {
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
            eprintln!("--- {} (last {} of {} warnings and errors)", path.display(), LAST.min(lines.len()), lines.len());
            for line in &lines[lines.len().saturating_sub(LAST)..] {
                eprintln!("{line}");
            }
        }
    }
}

/// Where `haystack` holds `needle` standing alone (not inside a longer run of letters and
/// digits, so that a 6-digit code is not "found" inside a timestamp or a hex id), or, for a needle
/// of 12 characters or more, its lowercase hex anywhere: the offset of the first such match.
fn found(haystack: &[u8], needle: &str) -> Option<usize> {
    let n = needle.as_bytes();
    let alone = haystack.windows(n.len()).enumerate().find(|(i, w)| {
        let before = i.checked_sub(1).is_some_and(|j| haystack[j].is_ascii_alphanumeric());
        let after = haystack.get(i + n.len()).is_some_and(u8::is_ascii_alphanumeric);
        *w == n && !before && !after
    });
    if let Some((i, _)) = alone {
        return Some(i);
    }
    let hexed = hex::encode(needle);
    (n.len() >= 12).then(|| haystack.windows(hexed.len()).position(|w| w == hexed.as_bytes())).flatten()
}

/// A little of `bytes` around offset `i`, for a failure message.
fn around(bytes: &[u8], i: usize) -> String {
    String::from_utf8_lossy(&bytes[i.saturating_sub(120)..(i + 60).min(bytes.len())]).into_owned()
}

/// A place of a store (a file, or a table) and what it holds.
type StorePlace = (String, Vec<u8>);

/// The SQLite databases under `dir` (by their header), the HSM's token directory aside.
fn sqlite_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a directory") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("tokens") {
                out.extend(sqlite_files(&path));
            }
        } else if std::fs::read(&path).is_ok_and(|b| b.starts_with(b"SQLite format 3\0")) {
            out.push(path);
        }
    }
    out
}

/// A store's contents by place: a SQLite file with its WAL and journal as bytes, or every table
/// of a PostgreSQL database as text (`row::text`; `bytea` as `\x` hex). Any other URL fails.
fn store_contents(url: &str) -> Vec<StorePlace> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let main = std::fs::read(path).unwrap_or_else(|e| panic!("the store {path}: {e}"));
        let mut places = vec![(path.to_string(), main)];
        for suffix in ["-wal", "-journal"] {
            let side = format!("{path}{suffix}");
            if let Ok(bytes) = std::fs::read(&side) {
                places.push((side, bytes));
            }
        }
        return places;
    }
    assert!(url.starts_with("postgres://"), "{url}: a store this search does not know");
    let url = url.to_string();
    std::thread::spawn(move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connecting to the store");
        let tables: Vec<String> = c
            .query(
                "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) FROM information_schema.tables \
                 WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')",
                &[],
            )
            .expect("listing tables")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(!tables.is_empty(), "{url}: no tables");
        tables
            .into_iter()
            .map(|t| {
                let mut text = Vec::new();
                for row in c.query(&format!("SELECT t::text FROM {t} t"), &[]).expect("reading a table") {
                    text.extend_from_slice(row.get::<_, String>(0).as_bytes());
                    text.push(b'\n');
                }
                (t, text)
            })
            .collect()
    })
    .join()
    .unwrap()
}

/// What [`Stack::refused_for`] checks: a raw HTTP answer, or the official client's result.
pub trait Refusal {
    /// The HTTP status and body; a success fails the test.
    fn status_and_body(self) -> (u16, String);
}

impl Refusal for &RawResponse {
    fn status_and_body(self) -> (u16, String) {
        assert_eq!(self.content_type.as_deref(), Some("application/json"), "{}", self.text);
        (self.status, self.text.clone())
    }
}

/// A status and a parsed JSON body (what a test's own HTTP helper returns).
impl Refusal for (u16, serde_json::Value) {
    fn status_and_body(self) -> (u16, String) {
        (self.0, self.1.to_string())
    }
}

impl<T: std::fmt::Debug> Refusal for Result<T, TurnkeyClientError> {
    #[track_caller]
    fn status_and_body(self) -> (u16, String) {
        match self {
            Err(TurnkeyClientError::UnexpectedHttpStatus(status, body)) => (status, body),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

/// The `@type` of the one entry of `details` in every Coffer error body.
pub const ERROR_DETAIL_TYPE: &str = "type.googleapis.com/errors.v1.TurnkeyErrorDetail";

/// Asserts that `body` (the text of a response with HTTP `status`) is Coffer's error in the
/// gRPC-gateway `Status` shape (gateway/src/error.rs): a JSON object whose `code` is the
/// numeric gRPC code that goes with `status`, whose `message` contains `needle`, and whose
/// `details[0]` is a `TurnkeyErrorDetail` with `turnkeyErrorCode` == `turnkey_error_code` (the
/// top-level `turnkeyErrorCode` too).
#[track_caller]
fn assert_error_body(status: u16, body: &str, turnkey_error_code: &str, needle: &str) {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("HTTP {status}: the body is not JSON ({e}): {body}"));
    let code = v["code"].as_i64().unwrap_or_else(|| panic!("HTTP {status}: no numeric `code`: {body}"));
    // The gRPC codes that render as this HTTP status (error.rs `Code::http_status`); other
    // statuses are explicit overrides (405, 408, 413, 501, 502) of a known code.
    let codes: &[i64] = match status {
        400 => &[3, 9],
        401 => &[16],
        403 => &[7],
        404 => &[5],
        409 => &[6, 10],
        429 => &[8],
        500 => &[13],
        503 => &[14],
        _ => &[3, 5, 6, 7, 8, 9, 10, 13, 14, 16],
    };
    assert!(codes.contains(&code), "HTTP {status} with gRPC code {code} (expected one of {codes:?}): {body}");
    let m = v["message"].as_str().unwrap_or_else(|| panic!("HTTP {status}: no `message`: {body}"));
    assert!(m.contains(needle), "HTTP {status}: expected {needle:?} in the message {m:?}");
    let details = v["details"].as_array().unwrap_or_else(|| panic!("HTTP {status}: no `details`: {body}"));
    assert_eq!(details.len(), 1, "HTTP {status}: one detail expected: {body}");
    assert_eq!(details[0]["@type"], ERROR_DETAIL_TYPE, "{body}");
    assert_eq!(details[0]["turnkeyErrorCode"], turnkey_error_code, "HTTP {status}: turnkeyErrorCode: {body}");
    assert_eq!(v["turnkeyErrorCode"], turnkey_error_code, "HTTP {status}: top-level turnkeyErrorCode: {body}");
}

/// Asserts that an official-client call was refused with HTTP `status`, in Coffer's error shape
/// (numeric gRPC `code` matching the status, `message`, `details[0].turnkeyErrorCode` ==
/// `turnkey_error_code`, e.g. `REQUEST_INVALID`, `REQUEST_NOT_AUTHORIZED`,
/// `SIGNATURE_INVALID`; see gateway/src/error.rs), with a message containing `needle`. Any other
/// outcome (success, another status, code or message, a body that is not that JSON) fails.
#[track_caller]
pub fn refused<T: std::fmt::Debug>(
    r: Result<T, TurnkeyClientError>,
    status: u16,
    turnkey_error_code: &str,
    needle: &str,
) {
    match r {
        Err(TurnkeyClientError::UnexpectedHttpStatus(s, body)) => {
            assert_eq!(s, status, "expected HTTP {status} ({turnkey_error_code}, {needle:?}): {body}");
            assert_error_body(status, &body, turnkey_error_code, needle);
        }
        other => panic!("expected HTTP {status} ({turnkey_error_code}, {needle:?}), got {other:?}"),
    }
}

/// Submits `parameters` as a `ty` activity to `submit/<path>` in `org`, stamped by `key`, with a
/// fresh `timestampMs`; the raw answer.
pub async fn submit(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    org: &str,
    path: &str,
    ty: &str,
    parameters: serde_json::Value,
) -> RawResponse {
    let body = serde_json::json!({"type": ty, "timestampMs": Stack::now_ms().to_string(), "organizationId": org,
        "parameters": parameters});
    stack.post_raw(&format!("/public/v1/submit/{path}"), body.to_string().as_bytes(), Some(key)).await
}

/// [`refused`] for a raw HTTP answer ([`Stack::post_raw`], [`post_to`]): the same strictness,
/// plus `Content-Type: application/json`.
#[track_caller]
pub fn refused_raw(r: &RawResponse, status: u16, turnkey_error_code: &str, needle: &str) {
    assert_eq!(r.status, status, "expected HTTP {status} ({turnkey_error_code}, {needle:?}): {}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"), "{}", r.text);
    assert_error_body(status, &r.text, turnkey_error_code, needle);
}

/// The secp256k1 key that made the signature (`r`, `s`, recovery id `recid`) over the 32-byte
/// prehash `digest`, recovered with `k256` (independent of Coffer). `r` and `s` are big-endian,
/// at most 32 bytes (RLP drops leading zeros; they are padded back). The signature must be
/// low-S (what Ethereum requires): a high-S one fails the assert, and so does `recid` > 1.
#[track_caller]
pub fn recover_secp256k1(digest: &[u8; 32], r: &[u8], s: &[u8], recid: u8) -> k256::ecdsa::VerifyingKey {
    let pad = |x: &[u8]| {
        assert!(x.len() <= 32, "a secp256k1 scalar of {} bytes", x.len());
        let mut out = [0u8; 32];
        out[32 - x.len()..].copy_from_slice(x);
        out
    };
    let sig = k256::ecdsa::Signature::from_scalars(pad(r), pad(s)).expect("r and s are valid scalars");
    assert!(sig.normalize_s().is_none(), "the signature is high-S (s = {})", hex::encode(s));
    assert!(recid <= 1, "recovery id {recid} (expected 0 or 1)");
    let recid = k256::ecdsa::RecoveryId::from_byte(recid).unwrap();
    k256::ecdsa::VerifyingKey::recover_from_prehash(digest, &sig, recid).expect("the signature recovers a key")
}

/// The Ethereum address (`0x` + 40 lowercase hex) of a secp256k1 key.
pub fn eth_address(vk: &k256::ecdsa::VerifyingKey) -> String {
    use sha3::Digest;
    let point = vk.to_encoded_point(false);
    format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]))
}

/// The Ethereum address that signed `digest` with the hex `r`, `s` (64 digits each) and `v` (the
/// recovery id in hex, "00" or "01"), as Coffer's `sign_raw_payload` returns them; see
/// [`recover_secp256k1`] (low-S checked).
#[track_caller]
pub fn recover_eth_address(digest: &[u8; 32], r: &str, s: &str, v: &str) -> String {
    assert_eq!((r.len(), s.len()), (64, 64), "r and s must be 32 bytes of hex: r={r} s={s}");
    let recid = u8::from_str_radix(v, 16).unwrap_or_else(|_| panic!("v is not hex: {v:?}"));
    let vk = recover_secp256k1(digest, &hex::decode(r).unwrap(), &hex::decode(s).unwrap(), recid);
    eth_address(&vk)
}

/// Settle, then observe: polls `probe` every 50 ms until what it returns has not changed for
/// `quiet`, and returns that value. For counts and absences ("no second delivery", "no other
/// execution"): assert on the settled value, not the moment an expected count is first reached,
/// so a late duplicate is seen. Fails the test if the value keeps changing for `quiet` + 60 s.
pub async fn settled<T, F, Fut>(what: &str, mut probe: F, quiet: Duration) -> T
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + quiet + Duration::from_secs(60);
    let mut value = probe().await;
    let mut since = Instant::now();
    loop {
        if since.elapsed() >= quiet {
            return value;
        }
        assert!(Instant::now() < deadline, "{what} did not settle: still changing, now {value:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let next = probe().await;
        if next != value {
            value = next;
            since = Instant::now();
        }
    }
}

/// `SELECT count(*) …` with two text parameters (`$1`, `$2`) on a store, SQLite or PostgreSQL.
fn count_rows(url: &str, sql: &str, a: &str, b: &str) -> usize {
    let (url, sql, a, b) = (url.to_string(), sql.to_string(), a.to_string(), b.to_string());
    let n: i64 = if let Some(path) = url.strip_prefix("sqlite://") {
        let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        c.busy_timeout(Duration::from_secs(10)).unwrap();
        c.query_row(&sql.replace('$', "?"), [&a, &b], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
    } else {
        // Off any async runtime: the blocking client runs one of its own.
        std::thread::spawn(move || {
            let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connecting to the store");
            c.query_one(&sql, &[&a, &b]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
        })
        .join()
        .unwrap()
    };
    usize::try_from(n).unwrap()
}

/// A process's memory high-water mark, in MiB (`VmHWM` of `/proc/<pid>/status`).
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb / 1024.0
}

/// A new user of `org`, made by `client` (a root's), with one new P-256 API key (no email, no
/// tags): its id and the key.
pub async fn user_with_key(
    client: &TurnkeyClient<TurnkeyP256ApiKey>,
    org: &str,
    name: &str,
) -> (String, TurnkeyP256ApiKey) {
    use turnkey_client::generated::immutable::common::v1::ApiKeyCurve;
    use turnkey_client::generated::{ApiKeyParamsV2, CreateUsersIntentV4, UserParamsV4};
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
    let intent = CreateUsersIntentV4 { users: vec![user] };
    let made = client.create_users(org.into(), client.current_timestamp(), intent).await.expect("the user is made");
    (made.result.user_ids[0].clone(), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(code: i64, message: &str, tk: &str) -> String {
        serde_json::json!({"code": code, "message": message,
            "details": [{"@type": ERROR_DETAIL_TYPE, "turnkeyErrorCode": tk}], "turnkeyErrorCode": tk})
        .to_string()
    }

    fn err(status: u16, b: String) -> Result<(), TurnkeyClientError> {
        Err(TurnkeyClientError::UnexpectedHttpStatus(status, b))
    }

    #[test]
    fn refused_accepts_the_exact_refusal() {
        refused(
            err(403, body(7, "denied by policy", "REQUEST_NOT_AUTHORIZED")),
            403,
            "REQUEST_NOT_AUTHORIZED",
            "policy",
        );
        let raw = RawResponse {
            status: 400,
            content_type: Some("application/json".into()),
            json: serde_json::Value::Null,
            text: body(3, "bad id", "REQUEST_INVALID"),
        };
        refused_raw(&raw, 400, "REQUEST_INVALID", "bad id");
    }

    #[test]
    #[should_panic(expected = "turnkeyErrorCode")]
    fn refused_fails_on_another_error_code() {
        refused(err(400, body(3, "bad id", "REQUEST_INVALID")), 400, "SIGNATURE_INVALID", "bad id");
    }

    #[test]
    #[should_panic(expected = "gRPC code")]
    fn refused_fails_on_a_code_that_does_not_go_with_the_status() {
        refused(err(400, body(16, "bad id", "REQUEST_INVALID")), 400, "REQUEST_INVALID", "bad id");
    }

    #[test]
    #[should_panic(expected = "in the message")]
    fn refused_fails_on_another_message() {
        refused(err(400, body(3, "bad id", "REQUEST_INVALID")), 400, "REQUEST_INVALID", "unknown wallet");
    }

    #[test]
    #[should_panic(expected = "expected HTTP 400")]
    fn refused_fails_on_success() {
        refused(Ok(()), 400, "REQUEST_INVALID", "x");
    }

    #[test]
    #[should_panic(expected = "not JSON")]
    fn refused_fails_on_a_body_that_is_not_json() {
        refused(err(400, "bad id".into()), 400, "REQUEST_INVALID", "bad id");
    }

    fn signed() -> ([u8; 32], k256::ecdsa::Signature, u8, String) {
        use sha3::Digest;
        let key = k256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let digest: [u8; 32] = sha3::Keccak256::digest(b"coffer").into();
        let (sig, recid) = key.sign_prehash_recoverable(&digest).unwrap();
        (digest, sig, recid.to_byte(), eth_address(key.verifying_key()))
    }

    #[test]
    fn recover_finds_the_signer() {
        let (digest, sig, v, address) = signed();
        let (r, s) = sig.split_bytes();
        assert_eq!(recover_eth_address(&digest, &hex::encode(r), &hex::encode(s), &format!("{v:02x}")), address);
    }

    #[test]
    #[should_panic(expected = "high-S")]
    fn recover_refuses_a_high_s_signature() {
        let (digest, sig, v, _) = signed();
        // (r, n - s) with the other parity is the same signature, malleated.
        let high = k256::ecdsa::Signature::from_scalars(sig.r(), -*sig.s()).unwrap();
        let (r, s) = high.split_bytes();
        recover_eth_address(&digest, &hex::encode(r), &hex::encode(s), &format!("{:02x}", v ^ 1));
    }

    #[test]
    fn a_secret_is_found_standing_alone_or_hex_encoded() {
        assert_eq!(found(b"{\"code\":\"123456\"}", "123456"), Some(9));
        assert_eq!(found(b"at 1712345678 ms", "123456"), None, "inside a longer number: chance");
        assert_eq!(found(b"x-123456-y", "123456"), Some(2));
        let long = "0123456789abcdef-secret";
        assert!(found(hex::encode(long).as_bytes(), long).is_some(), "a long secret hex-encoded");
        assert_eq!(found(hex::encode("123456").as_bytes(), "123456"), None, "short ones only standing alone");
    }

    #[test]
    fn every_sqlite_file_but_the_tokens_is_a_store() {
        let dir = std::env::temp_dir().join(format!("coffer-sqlite-files-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tokens")).unwrap();
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        for p in ["a.db", "nested/b.anything", "tokens/kryoptic.sql"] {
            rusqlite::Connection::open(dir.join(p)).unwrap().execute_batch("CREATE TABLE t (x)").unwrap();
        }
        std::fs::write(dir.join("notes.txt"), "SQLite but not a database").unwrap();
        let mut files = sqlite_files(&dir);
        files.sort();
        assert_eq!(files, vec![dir.join("a.db"), dir.join("nested/b.anything")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[should_panic(expected = "a store this search does not know")]
    fn a_store_of_another_kind_fails_the_search() {
        store_contents("mysql://localhost/coffer");
    }

    #[tokio::test]
    async fn settled_waits_for_the_value_to_stop_changing() {
        let t = Instant::now();
        // Reaches 3 at 0 ms, then a late change at ~300 ms: the settled value is the late one.
        let v = settled(
            "a counter",
            || async {
                if t.elapsed() < Duration::from_millis(300) {
                    3
                } else {
                    4
                }
            },
            Duration::from_millis(500),
        )
        .await;
        assert_eq!(v, 4);
        assert!(t.elapsed() >= Duration::from_millis(800));
    }
}
