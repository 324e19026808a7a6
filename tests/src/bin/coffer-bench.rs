//! `coffer-bench`: signing, activity-write and read throughput of a real Coffer stack, reported
//! as ratios to the crypto floor (stamp verify + HSM unseal + sign) measured in the same run, and
//! the enclave floor (the same plus the credential certificate's HSM MAC check); the server CPU
//! each signed request costs (gateway + enclave, from /proc) beside the floor's CPU per operation;
//! and a burst of thousands of signing clients at once (latency of the accepted ones, the share
//! shed, the time to recover, and `/healthz` latency meanwhile).

#![recursion_limit = "256"]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use coffer_tests::Stack;
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_api_key_stamper::{Stamp, TurnkeyP256ApiKey};

struct Args {
    clients: usize,
    /// The burst scenario: clients released at once, and how many times.
    burst_clients: usize,
    burst_rounds: usize,
    duration: Duration,
    warmup: Duration,
    out: std::path::PathBuf,
    /// Run only scenarios whose name contains this text (or one of several, separated by `|`).
    only: Option<String>,
    /// `--store postgres`: also measure writes and reads on PostgreSQL, with one and with two
    /// gateways, beside SQLite's (fresh stacks each).
    store: Option<String>,
    /// The scale section: how many sub-organizations it creates (`--scale-suborgs`).
    scale_suborgs: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        clients: 32,
        burst_clients: 2000,
        burst_rounds: 3,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        out: std::path::PathBuf::from("target/bench/latest.json"),
        only: None,
        store: None,
        scale_suborgs: SCALE_SUBORGS,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().context("flag needs a value");
        match flag.as_str() {
            "--clients" => a.clients = val()?.parse()?,
            "--burst-clients" => a.burst_clients = val()?.parse()?,
            "--burst-rounds" => a.burst_rounds = val()?.parse()?,
            "--duration" => a.duration = Duration::from_secs_f64(val()?.parse()?),
            "--warmup" => a.warmup = Duration::from_secs_f64(val()?.parse()?),
            "--out" => a.out = val()?.into(),
            "--only" => a.only = Some(val()?),
            "--scale-suborgs" => a.scale_suborgs = val()?.parse::<usize>()?.max(1),
            "--store" => match val()?.as_str() {
                "postgres" => a.store = Some("postgres".into()),
                other => bail!("--store {other}: expected postgres (SQLite is always measured)"),
            },
            "--help" | "-h" => {
                println!(
                    "coffer-bench [--clients N] [--duration SECONDS] [--warmup SECONDS] [--out FILE] [--only TEXT] \
                     [--burst-clients N] [--burst-rounds N] [--store postgres] [--scale-suborgs N]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// Latencies and outcome counts of one scenario.
#[derive(Default)]
struct Sample {
    latencies_us: Vec<u64>,
    errors: u64,
    verified: u64,
    elapsed: Duration,
    /// Server CPU (gateway, enclave) spent in the measured window, in seconds.
    cpu: Option<ServerCpu>,
}

impl Sample {
    fn rps(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        pct_ms(&self.latencies_us, p)
    }
}

/// Percentile `p` of sorted microsecond latencies, in milliseconds (0 if there are none).
fn pct_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() as f64 - 1.0) * p).round() as usize;
    sorted_us[i] as f64 / 1000.0
}

/// Seconds per clock tick in /proc's `stat` files (USER_HZ, 100 on Linux; asked of `getconf`).
fn tick_seconds() -> f64 {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        let hz = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|hz| *hz > 0.0)
            .unwrap_or(100.0);
        1.0 / hz
    })
}

/// utime + stime from a `/proc/.../stat` file, in seconds: for `/proc/<pid>/stat` all the
/// process's threads (exited ones included), for `/proc/thread-self/stat` the calling thread.
fn cpu_seconds(stat_path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name may hold spaces and parentheses: fields are counted after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state), so utime (field 14) is fields[11] and stime (15) fields[12].
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 * tick_seconds())
}

/// CPU time of the gateway, the enclave and the database server, in seconds (a reading, or the
/// difference of two).
#[derive(Clone, Copy, Debug)]
struct ServerCpu {
    gateway: f64,
    enclave: f64,
    /// The PostgreSQL server's processes (0 on SQLite, which runs inside the gateway).
    database: f64,
}

/// The PostgreSQL server whose CPU [`ServerCpu::read`] adds (its postmaster's pid; 0: none).
static DATABASE_PID: AtomicU64 = AtomicU64::new(0);

/// CPU seconds of the process `pid` and of its children (a PostgreSQL server's backends).
fn process_tree_cpu_seconds(pid: u32) -> Option<f64> {
    let mut total = cpu_seconds(&format!("/proc/{pid}/stat"))?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // Field 4 (ppid) is the second after the command name's closing parenthesis.
        let ppid = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            total += cpu_seconds(&format!("/proc/{child}/stat")).unwrap_or(0.0);
        }
    }
    Some(total)
}

impl ServerCpu {
    /// The current reading for `pids` = (enclave, gateway), as [`Stack::pids`] gives them.
    fn read(pids: (Option<u32>, Option<u32>)) -> Option<ServerCpu> {
        let database = match DATABASE_PID.load(Ordering::Relaxed) {
            0 => 0.0,
            pid => process_tree_cpu_seconds(pid as u32)?,
        };
        Some(ServerCpu {
            enclave: cpu_seconds(&format!("/proc/{}/stat", pids.0?))?,
            gateway: cpu_seconds(&format!("/proc/{}/stat", pids.1?))?,
            database,
        })
    }
    fn since(self, start: Option<ServerCpu>) -> Option<ServerCpu> {
        let s = start?;
        Some(ServerCpu {
            gateway: self.gateway - s.gateway,
            enclave: self.enclave - s.enclave,
            database: self.database - s.database,
        })
    }
    /// Microseconds of CPU per request for `requests` requests: (gateway, enclave, total).
    fn per_request_us(self, requests: usize) -> Option<(f64, f64, f64)> {
        if requests == 0 {
            return None;
        }
        let per = |s: f64| s * 1e6 / requests as f64;
        Some((per(self.gateway), per(self.enclave), per(self.gateway + self.enclave)))
    }
}

/// Builds request `seq`'s body.
type MakeBody = Arc<dyn Fn(u64) -> String + Send + Sync>;
/// Checks a response: `Ok(true)` if a signature was verified, `Ok(false)` if only the shape was.
type CheckResponse = Arc<dyn Fn(u64, &Value) -> Result<bool, String> + Send + Sync>;

/// What a scenario sends and how a response is checked. `seq` is unique per request.
#[derive(Clone)]
struct Scenario {
    name: &'static str,
    path: &'static str,
    make: MakeBody,
    check: CheckResponse,
}

async fn run(
    scenario: &Scenario,
    stack: &Stack,
    key: Arc<TurnkeyP256ApiKey>,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    seq: Arc<AtomicU64>,
) -> Sample {
    run_on(scenario, std::slice::from_ref(&stack.base_url), stack.pids(), key, clients, warmup, duration, seq).await
}

/// [`run`] against several gateways: client `i` talks to `gateways[i % n]`, as behind a load
/// balancer. `pids` are the processes whose CPU is sampled.
#[allow(clippy::too_many_arguments)]
async fn run_on(
    scenario: &Scenario,
    gateways: &[String],
    pids: (Option<u32>, Option<u32>),
    key: Arc<TurnkeyP256ApiKey>,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    seq: Arc<AtomicU64>,
) -> Sample {
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build().unwrap();
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (http, key, sc, url) =
            (http.clone(), key.clone(), scenario.clone(), format!("{}{}", gateways[i % gateways.len()], scenario.path));
        let (measuring, stop, seq) = (measuring.clone(), stop.clone(), seq.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = Sample::default();
            while !stop.load(Ordering::Relaxed) {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let body = (sc.make)(n);
                let t = Instant::now();
                let stamp = key.stamp(body.as_bytes()).unwrap();
                let resp = http.post(&url).header(stamp.name, stamp.value).body(body).send().await;
                let outcome = match resp {
                    Ok(r) if r.status() == 200 => match r.json::<Value>().await {
                        Ok(v) => (sc.check)(n, &v),
                        Err(e) => Err(e.to_string()),
                    },
                    Ok(r) => Err(format!("HTTP {}: {}", r.status(), r.text().await.unwrap_or_default())),
                    Err(e) => Err(e.to_string()),
                };
                let us = t.elapsed().as_micros() as u64;
                if measuring.load(Ordering::Relaxed) {
                    match outcome {
                        Ok(verified) => {
                            s.latencies_us.push(us);
                            s.verified += verified as u64;
                        }
                        Err(e) => {
                            if s.errors == 0 {
                                eprintln!("  {}: first error: {}", sc.name, e.chars().take(300).collect::<String>());
                            }
                            s.errors += 1;
                        }
                    }
                }
            }
            s
        }));
    }
    tokio::time::sleep(warmup).await;
    let cpu_before = ServerCpu::read(pids);
    measuring.store(true, Ordering::Relaxed);
    let t = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t.elapsed();
    let cpu = ServerCpu::read(pids).and_then(|c| c.since(cpu_before));
    stop.store(true, Ordering::Relaxed);
    let mut total = Sample { elapsed, cpu, ..Default::default() };
    for task in tasks {
        let s = task.await.unwrap();
        total.latencies_us.extend(s.latencies_us);
        total.errors += s.errors;
        total.verified += s.verified;
    }
    total.latencies_us.sort_unstable();
    total
}

fn envelope(ty: &str, org: &str, parameters: Value) -> String {
    json!({
        "type": ty,
        "timestampMs": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis().to_string(),
        "organizationId": org,
        "parameters": parameters,
    })
    .to_string()
}

fn completed(v: &Value) -> Result<&Value, String> {
    let a = &v["activity"];
    if a["status"] != "ACTIVITY_STATUS_COMPLETED" {
        return Err(format!("status {}", a["status"]));
    }
    Ok(&a["result"])
}

/// Payload for request `n`: 32 distinct bytes, hex.
fn payload(n: u64) -> String {
    hex::encode(sha2::Sha256::digest(n.to_be_bytes()))
}

/// A non-root user `name` of `org` with a fresh P-256 API key, created by `root`: its key and id.
async fn member(
    stack: &Stack,
    root: &TurnkeyP256ApiKey,
    org: &str,
    name: &str,
) -> anyhow::Result<(Arc<TurnkeyP256ApiKey>, String)> {
    let key = TurnkeyP256ApiKey::generate();
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_USERS_V4",
        org,
        json!({"users": [{"userName": name, "apiKeys": [{"apiKeyName": name,
            "publicKey": hex::encode(key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}],
            "authenticators": [], "oauthProviders": [], "userTags": []}]}),
    );
    let r = stack.post_raw("/public/v1/submit/create_users", body.as_bytes(), Some(root)).await;
    let user = r.json["activity"]["result"]["createUsersResult"]["userIds"][0]
        .as_str()
        .with_context(|| format!("user {name}: {}", r.text))?
        .to_string();
    Ok((Arc::new(key), user))
}

/// A wallet `name` of `org` with one secp256k1 Ethereum account, created by `root`: its address.
async fn ethereum_account(stack: &Stack, root: &TurnkeyP256ApiKey, org: &str, name: &str) -> anyhow::Result<String> {
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_WALLET",
        org,
        json!({"walletName": name, "accounts": [
            {"curve":"CURVE_SECP256K1","pathFormat":"PATH_FORMAT_BIP32","path":"m/44'/60'/0'/0/0","addressFormat":"ADDRESS_FORMAT_ETHEREUM"}]}),
    );
    let r = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(root)).await;
    Ok(r.json["activity"]["result"]["createWalletResult"]["addresses"][0]
        .as_str()
        .with_context(|| format!("wallet {name}: {}", r.text))?
        .to_string())
}

/// `create_policies` bodies for `org` making `policy(i)` for each `i` of `range`,
/// [`POLICIES_PER_ACTIVITY`] a body.
fn policy_batches(org: &str, range: std::ops::Range<usize>, policy: &dyn Fn(usize) -> Value) -> Vec<String> {
    range
        .clone()
        .step_by(POLICIES_PER_ACTIVITY)
        .map(|from| {
            let batch: Vec<Value> = (from..(from + POLICIES_PER_ACTIVITY).min(range.end)).map(policy).collect();
            envelope("ACTIVITY_TYPE_CREATE_POLICIES", org, json!({"policies": batch}))
        })
        .collect()
}

/// Raw signing by the account `eth` of `org` (a distinct payload per request, keccak256), each
/// 16th signature recovered to the address.
fn raw_signing(name: &'static str, org: &str, eth: &str) -> Scenario {
    let (org, sign_with) = (org.to_string(), eth.to_string());
    Scenario {
        name,
        path: "/public/v1/submit/sign_raw_payload",
        make: Arc::new(move |n| {
            envelope(
                "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
                &org,
                json!({"signWith": sign_with, "payload": payload(n), "encoding": "PAYLOAD_ENCODING_HEXADECIMAL",
                    "hashFunction": "HASH_FUNCTION_KECCAK256"}),
            )
        }),
        check: check_k1(eth.to_string()),
    }
}

fn check_k1(address: String) -> CheckResponse {
    Arc::new(move |n, v| match recovered_k1(n, v)? {
        None => Ok(false),
        Some(got) if got == address.to_lowercase() => Ok(true),
        Some(got) => Err(format!("signature recovers to {got}, expected {address}")),
    })
}

/// A completed raw signing of [`payload`]`(n)` (keccak256): for each 16th request the Ethereum
/// address its signature recovers to (lowercase), for the others `None` (the shape is checked).
fn recovered_k1(n: u64, v: &Value) -> Result<Option<String>, String> {
    let r = &completed(v)?["signRawPayloadResult"];
    if !n.is_multiple_of(16) {
        return Ok(None);
    }
    let sig = hex::decode(format!("{}{}", r["r"].as_str().unwrap_or(""), r["s"].as_str().unwrap_or("")))
        .map_err(|e| e.to_string())?;
    let sig = k256::ecdsa::Signature::from_slice(&sig).map_err(|e| e.to_string())?;
    let recid = k256::ecdsa::RecoveryId::from_byte(if r["v"] == "01" { 1 } else { 0 }).unwrap();
    let digest = sha3::Keccak256::digest(hex::decode(payload(n)).unwrap());
    let vk = k256::ecdsa::VerifyingKey::recover_from_prehash(&digest, &sig, recid).map_err(|e| e.to_string())?;
    let point = vk.to_encoded_point(false);
    Ok(Some(format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]))))
}

/// A completed raw signing of [`payload`]`(n)` (SHA-256) by the P-256 key whose compressed
/// public key is `public_key`: every 16th verified with the p256 crate, low-S required.
fn check_p256(public_key: String) -> CheckResponse {
    use p256::ecdsa::signature::Verifier;
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&hex::decode(&public_key).unwrap()).unwrap();
    Arc::new(move |n, v| {
        let r = &completed(v)?["signRawPayloadResult"];
        if n % 16 != 0 {
            return Ok(false);
        }
        let sig = hex::decode(format!("{}{}", r["r"].as_str().unwrap_or(""), r["s"].as_str().unwrap_or("")))
            .map_err(|e| e.to_string())?;
        let sig = p256::ecdsa::Signature::from_slice(&sig).map_err(|e| e.to_string())?;
        if sig.normalize_s().is_some() {
            return Err("a high-S signature".into());
        }
        vk.verify(&hex::decode(payload(n)).unwrap(), &sig).map_err(|e| e.to_string())?;
        Ok(true)
    })
}

fn check_ed(address: String) -> CheckResponse {
    let pk: [u8; 32] = bs58::decode(&address).into_vec().unwrap().try_into().unwrap();
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).unwrap();
    Arc::new(move |n, v| {
        let r = &completed(v)?["signRawPayloadResult"];
        if n % 16 != 0 {
            return Ok(false);
        }
        let sig: [u8; 64] = hex::decode(format!("{}{}", r["r"].as_str().unwrap_or(""), r["s"].as_str().unwrap_or("")))
            .map_err(|e| e.to_string())?
            .try_into()
            .map_err(|_| "bad signature length".to_string())?;
        vk.verify_strict(&hex::decode(payload(n)).unwrap(), &ed25519_dalek::Signature::from_bytes(&sig))
            .map_err(|e| e.to_string())?;
        Ok(true)
    })
}

/// What one floor operation includes (all: verify a P-256 stamp, sign secp256k1, zeroize).
#[derive(Clone, Copy, PartialEq)]
enum Floor {
    /// No HSM: the key is in memory.
    Memory,
    /// Open the sealed key through PKCS#11 (the floor before enclave authority).
    Hsm,
    /// The enclave's work per request: also verify the credential certificate's MAC in the HSM.
    Enclave,
}

/// What a floor run measured.
struct FloorRun {
    ops_per_second: f64,
    /// CPU time per operation (each thread's own utime + stime, summed), in microseconds.
    cpu_us_per_op: Option<f64>,
}

/// The crypto floor of one signing request, in-process on the same token, on `threads` threads.
fn crypto_floor(stack: &Stack, floor: Floor, duration: Duration, threads: usize) -> anyhow::Result<FloorRun> {
    use coffer_enclave::hsm::{BlobBinding, BlobKind, Hsm, HsmSettings};
    static HSM: std::sync::OnceLock<Arc<Hsm>> = std::sync::OnceLock::new();
    let (conf, label, pin) = stack.token();
    let hsm = HSM
        .get_or_init(|| {
            // The stack's module: SoftHSM, or kryoptic where the run's module is (its token in
            // the stack's directory beside SoftHSM's configuration).
            let module = match coffer_tests::kryoptic_under_test() {
                Some(module) => {
                    std::env::set_var("KRYOPTIC_CONF", conf.with_file_name("kryoptic.conf"));
                    module
                }
                None => {
                    std::env::set_var("SOFTHSM2_CONF", &conf);
                    "/usr/lib/softhsm/libsofthsm2.so".into()
                }
            };
            Arc::new(
                Hsm::open(HsmSettings {
                    module: module.into(),
                    token_label: label.into(),
                    pin: cryptoki::types::AuthPin::new(pin.to_string().into()),
                    pool_size: 16,
                    profile: None,
                    shelf: None,
                    creates_keys: false,
                    native_keys: Default::default(),
                })
                .expect("open token"),
            )
        })
        .clone();
    let secret = [7u8; 32];
    let binding = BlobBinding::plain(BlobKind::PrivateKey, "bench", "k");
    let blob = hsm.seal(&binding, &secret)?;
    let certificate = b"certificate fields: organization, user, type, public key, expiry, fingerprint".to_vec();
    let mac = hsm.certificate_mac(&certificate)?;
    let key = stack.api_key();
    let stamped: Vec<(String, coffer_gateway::stamps::stamp::ApiStamp)> = (0..64)
        .map(|i| {
            let body = format!("{{\"organizationId\":\"bench\",\"n\":{i}}}");
            let h = key.stamp(body.as_bytes()).unwrap();
            (body, coffer_gateway::stamps::stamp::parse(&h.value).unwrap())
        })
        .collect();
    let stamped = Arc::new(stamped);
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (hsm, blob, stamped, count) = (hsm.clone(), blob.clone(), stamped.clone(), count.clone());
            let (certificate, mac) = (certificate.clone(), mac.clone());
            std::thread::spawn(move || {
                let cpu_start = cpu_seconds("/proc/thread-self/stat");
                let mut i = t as u64;
                while Instant::now() < deadline {
                    let (body, stamp) = &stamped[(i % 64) as usize];
                    coffer_gateway::stamps::stamp::verify(stamp, body.as_bytes()).expect("stamp verifies");
                    if floor == Floor::Enclave {
                        assert!(hsm.certificate_mac_valid(&certificate, &mac).expect("MAC verify"));
                    }
                    let sig = if floor != Floor::Memory {
                        let opened = hsm.unseal(&binding, &blob).expect("unseal");
                        let sk = zeroize::Zeroizing::new(secret32(&opened));
                        sign(&sk, i)
                    } else {
                        sign(&secret, i)
                    };
                    std::hint::black_box(sig);
                    i += threads as u64;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Some(cpu_seconds("/proc/thread-self/stat")? - cpu_start?)
            })
        })
        .collect();
    let mut cpu = Some(0.0);
    for h in handles {
        let spent = h.join().map_err(|_| anyhow::anyhow!("floor thread panicked"))?;
        cpu = cpu.zip(spent).map(|(a, b)| a + b);
    }
    let ops = count.load(Ordering::Relaxed);
    Ok(FloorRun {
        ops_per_second: ops as f64 / duration.as_secs_f64(),
        cpu_us_per_op: cpu.filter(|_| ops > 0).map(|c| c * 1e6 / ops as f64),
    })
}

fn secret32(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(b);
    out
}

fn sign(secret: &[u8; 32], n: u64) -> coffer_crypto::sign::SignatureParts {
    coffer_crypto::sign::sign_payload(
        coffer_crypto::Curve::Secp256k1,
        secret,
        &payload(n),
        "PAYLOAD_ENCODING_HEXADECIMAL",
        "HASH_FUNCTION_KECCAK256",
    )
    .expect("sign")
}

/// How many activities the `list_activities` scenario's organization holds.
const HISTORY: usize = 100_000;

/// Writes `n` completed activities into `org`'s log directly in the database (what months of
/// history look like to a page query), in one transaction.
fn seed_history(stack: &Stack, org: &str, n: usize) -> anyhow::Result<()> {
    let mut c = rusqlite::Connection::open(stack.database_path())?;
    c.busy_timeout(Duration::from_secs(30))?;
    let tx = c.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO activities (id, organization_id, activity_type, status, fingerprint, intent, result, votes,
                failure, created_at, updated_at)
             VALUES (?1, ?2, 'ACTIVITY_TYPE_CREATE_POLICY_V3', 'ACTIVITY_STATUS_COMPLETED', ?3, '{}', '{}', '[]', NULL, ?4, ?4)",
        )?;
        let t0 = 1_600_000_000_000_000_000i64;
        for i in 0..n {
            insert.execute(rusqlite::params![
                format!("history-{i:07}"),
                org,
                format!("sha256:history-{org}-{i}"),
                t0 + i as i64 * 1_000_000
            ])?;
        }
    }
    tx.commit()?;
    // Leave no seeding work in the WAL for the scenarios' commits to checkpoint.
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// Peak resident set size (VmHWM) of a process, in MiB.
fn peak_rss_mib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// One HTTP exchange on a fresh connection, as the burst's clients make it.
struct RawAnswer {
    /// Time to connect (the kernel's accept queue included).
    connect: Duration,
    status: u16,
    content_type: Option<String>,
    retry_after: Option<String>,
    body: String,
}

/// POSTs `body` stamped with `stamp` (header name, value) on a new connection to `addr`
/// (`Connection: close`) and reads the whole answer. Errors are short labels, for counting.
async fn post_fresh(addr: &str, path: &str, stamp: &(String, String), body: &str) -> Result<RawAnswer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let mut conn = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {}", e.kind()))?;
    let connect = started.elapsed();
    let _ = conn.set_nodelay(true);
    // Head and body in one write, so the server has the whole request even if it answers early.
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{}: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        stamp.0,
        stamp.1,
        body.len()
    );
    conn.write_all(request.as_bytes()).await.map_err(|e| format!("write: {}", e.kind()))?;
    let mut raw = Vec::new();
    if let Err(e) = conn.read_to_end(&mut raw).await {
        if raw.is_empty() {
            return Err(format!("read: {}", e.kind()));
        }
    }
    if raw.is_empty() {
        return Err("closed without an answer".into());
    }
    parse_answer(&raw, connect)
}

fn parse_answer(raw: &[u8], connect: Duration) -> Result<RawAnswer, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("incomplete answer")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut out = String::new();
        let mut rest = body;
        loop {
            let (size, after) = rest.split_once("\r\n").ok_or("bad chunk")?;
            let size = usize::from_str_radix(size.trim(), 16).map_err(|_| "bad chunk size")?;
            if size == 0 {
                break;
            }
            out.push_str(after.get(..size).ok_or("short chunk")?);
            rest = after.get(size + 2..).ok_or("short chunk")?;
        }
        out
    } else {
        body.to_string()
    };
    Ok(RawAnswer { connect, status, content_type: header("content-type"), retry_after: header("retry-after"), body })
}

/// A refusal in the API's error shape: 503 or 429, JSON, with a numeric `code` and a `message`.
fn is_json_shed(a: &RawAnswer) -> bool {
    if a.status != 503 && a.status != 429 {
        return false;
    }
    if !a.content_type.as_deref().is_some_and(|c| c.starts_with("application/json")) {
        return false;
    }
    serde_json::from_str::<Value>(&a.body).is_ok_and(|v| v["code"].is_i64() && v["message"].is_string())
}

/// Polls `url` every 10 ms once `go` is set until `stop` is, on a kept-alive connection, on its own
/// thread and runtime (so the burst's client tasks cannot delay it): the latencies of the 200s
/// and how many polls got anything else.
fn healthz_prober(url: String, go: Arc<AtomicBool>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Vec<u64>, u64)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("prober runtime");
        rt.block_on(async move {
            let health = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
            let _ = health.get(&url).send().await; // open the connection
            while !go.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let (mut lat, mut failures) = (Vec::new(), 0u64);
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let t = Instant::now();
                let ok = match health.get(&url).send().await {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    lat.push(t.elapsed().as_micros() as u64);
                } else {
                    failures += 1;
                }
            }
            (lat, failures)
        })
    })
}

/// `TcpExt: ListenOverflows` from /proc/net/netstat: connections the kernel dropped because a
/// listener's accept queue was full (the client retries its SYN after a second).
fn listen_overflows() -> Option<u64> {
    let netstat = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut tcp_ext = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (tcp_ext.next()?, tcp_ext.next()?);
    let i = names.split_whitespace().position(|n| n == "ListenOverflows")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// What the burst scenario measured over all its rounds.
#[derive(Default)]
struct BurstReport {
    clients: usize,
    rounds: usize,
    /// Latency of each accepted (200, completed, checked) request, from its release (connecting
    /// included), sorted.
    accepted_us: Vec<u64>,
    /// The same from the connection's establishment (what the server's queueing adds), sorted.
    accepted_after_connect_us: Vec<u64>,
    verified: u64,
    shed: u64,
    shed_429: u64,
    shed_without_retry_after: u64,
    /// Shed answers by status and message (up to its first ':').
    shed_kinds: std::collections::BTreeMap<String, u64>,
    errors: u64,
    error_kinds: std::collections::BTreeMap<String, u64>,
    /// Connecting time of every answered request, sorted.
    connect_us: Vec<u64>,
    /// The kernel's count of connections dropped for a full accept queue (`ListenOverflows`,
    /// host-wide) over the rounds.
    listen_overflows: Option<u64>,
    /// Release to the last answer, per round, in ms.
    burst_ms: Vec<f64>,
    /// Last answer to the first signing request served in normal latency again, per round, in ms.
    recovery_ms: Vec<Option<f64>>,
    /// The single-request latency taken as normal (twice the median before the burst), in ms.
    normal_ms: f64,
    /// `/healthz` latencies during the bursts, sorted; polls that did not get a 200.
    healthz_us: Vec<u64>,
    healthz_failures: u64,
    /// The same, on the operations listener (`ops_listen`, its own thread and runtime).
    ops_healthz_us: Vec<u64>,
    ops_healthz_failures: u64,
    /// Server CPU over the rounds (bursts and recoveries), and the signatures made in them.
    cpu: Option<ServerCpu>,
    signed: usize,
}

/// The open-file limit this process needs for `clients` sockets at once: raised to the hard limit
/// with `prlimit` (no unsafe code here) if the soft one is too low; the burst is cut to fit what
/// remains, with a warning.
fn burst_fits(clients: usize) -> usize {
    let soft_hard = || -> Option<(u64, u64)> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        let mut f = line["Max open files".len()..].split_whitespace();
        let parse = |v: Option<&str>| v.map(|v| if v == "unlimited" { u64::MAX } else { v.parse().unwrap_or(0) });
        Some((parse(f.next())?, parse(f.next())?))
    };
    let needed = clients as u64 + 256;
    let Some((soft, hard)) = soft_hard() else { return clients };
    if soft >= needed {
        return clients;
    }
    let raised = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), &format!("--nofile={hard}:{hard}")])
        .status()
        .is_ok_and(|s| s.success());
    let soft = soft_hard().map_or(soft, |l| l.0);
    if soft >= needed {
        eprintln!("  raised the open-file limit to {soft} with prlimit");
        return clients;
    }
    let fit = soft.saturating_sub(256) as usize;
    eprintln!(
        "  WARNING: open-file limit {soft} (hard {hard}{}) fits {fit} burst clients, not {clients}: \
         run the bench under `ulimit -n {needed}` or `prlimit --nofile={needed}:{needed}`",
        if raised { "" } else { "; prlimit failed" }
    );
    fit
}

/// `clients` signing requests, each on its own new connection, released at once by a barrier,
/// `rounds` times; a prober polls `/healthz` every 10 ms meanwhile on a kept-alive connection.
/// After each burst, single requests are sent until one is served in normal latency.
async fn burst(
    stack: &Stack,
    ops_health_url: &str,
    key: &TurnkeyP256ApiKey,
    scenario: &Scenario,
    clients: usize,
    rounds: usize,
    seq: &AtomicU64,
) -> BurstReport {
    let addr = stack.base_url.trim_start_matches("http://").to_string();
    let pids = stack.pids();
    let stamped = |n: u64| {
        let body = (scenario.make)(n);
        let s = key.stamp(body.as_bytes()).unwrap();
        (n, body, (s.name.to_string(), s.value))
    };
    let mut report = BurstReport { clients, rounds, ..Default::default() };

    // What one signing request takes when nothing else runs (fresh connection, like the burst's).
    let mut normal = Vec::new();
    for _ in 0..20 {
        let (n, body, stamp) = stamped(seq.fetch_add(1, Ordering::Relaxed));
        let t = Instant::now();
        let a = post_fresh(&addr, scenario.path, &stamp, &body).await;
        if let Ok(a) = a
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|a| serde_json::from_str::<Value>(&a.body).map_err(|e| e.to_string()).map(|v| (a.status, v)))
        {
            if a.0 == 200 && (scenario.check)(n, &a.1).is_ok() {
                normal.push(t.elapsed().as_micros() as u64);
            }
        }
    }
    normal.sort_unstable();
    report.normal_ms = (2.0 * pct_ms(&normal, 0.5)).max(2.0);

    let health_url = format!("{}/healthz", stack.base_url);
    let cpu_before = ServerCpu::read(pids);
    let overflows_before = listen_overflows();
    let mut answers: Vec<(u64, Result<RawAnswer, String>, Duration)> = Vec::new();
    for round in 0..rounds {
        // Bodies are made and stamped before the release, so only sending is timed.
        let requests: Vec<_> = (0..clients).map(|_| stamped(seq.fetch_add(1, Ordering::Relaxed))).collect();
        let barrier = Arc::new(tokio::sync::Barrier::new(clients + 1));
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|(n, body, stamp)| {
                let (barrier, addr, path) = (barrier.clone(), addr.clone(), scenario.path);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let t = Instant::now();
                    let a = tokio::time::timeout(Duration::from_secs(30), post_fresh(&addr, path, &stamp, &body))
                        .await
                        .unwrap_or_else(|_| Err("no answer within 30 s".into()));
                    (n, a, t.elapsed(), Instant::now())
                })
            })
            .collect();
        let (go, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let prober = healthz_prober(health_url.clone(), go.clone(), stop.clone());
        let ops_prober = healthz_prober(ops_health_url.to_string(), go.clone(), stop.clone());
        tokio::time::sleep(Duration::from_millis(100)).await; // the prober connects
        go.store(true, Ordering::Relaxed);
        barrier.wait().await;
        let released = Instant::now();
        let mut last = released;
        for t in tasks {
            let (n, a, took, done) = t.await.unwrap();
            last = last.max(done);
            answers.push((n, a, took));
        }
        stop.store(true, Ordering::Relaxed);
        let (lat, failures) = tokio::task::spawn_blocking(move || prober.join().expect("prober")).await.unwrap();
        report.healthz_us.extend(lat);
        report.healthz_failures += failures;
        let (lat, failures) = tokio::task::spawn_blocking(move || ops_prober.join().expect("prober")).await.unwrap();
        report.ops_healthz_us.extend(lat);
        report.ops_healthz_failures += failures;
        report.burst_ms.push((last - released).as_secs_f64() * 1000.0);

        // Recovery: single requests until one is signed in normal latency.
        let mut recovered = None;
        while last.elapsed() < Duration::from_secs(30) {
            let (n, body, stamp) = stamped(seq.fetch_add(1, Ordering::Relaxed));
            let t = Instant::now();
            if let Ok(a) = post_fresh(&addr, scenario.path, &stamp, &body).await {
                let ok = a.status == 200
                    && serde_json::from_str::<Value>(&a.body).is_ok_and(|v| (scenario.check)(n, &v).is_ok());
                report.signed += ok as usize;
                if ok && t.elapsed().as_secs_f64() * 1000.0 <= report.normal_ms {
                    recovered = Some(last.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        report.recovery_ms.push(recovered);
        eprintln!(
            "  round {}: burst over after {:.0} ms, recovered {}",
            round + 1,
            report.burst_ms[round],
            recovered.map_or("not within 30 s".into(), |r| format!("after {r:.1} ms"))
        );
        if round + 1 < rounds {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    report.cpu = ServerCpu::read(pids).and_then(|c| c.since(cpu_before));
    report.listen_overflows = listen_overflows().zip(overflows_before).map(|(a, b)| a.saturating_sub(b));

    // Outcomes are checked after the rounds, so that checking takes no CPU during a burst.
    let error = |kind: String, report: &mut BurstReport| {
        if report.errors < 3 {
            eprintln!("  burst: error: {}", kind.chars().take(300).collect::<String>());
        }
        report.errors += 1;
        let label = kind.split(':').next().unwrap_or_default().chars().take(60).collect::<String>();
        *report.error_kinds.entry(label).or_default() += 1;
    };
    for (n, a, took) in answers {
        if let Ok(a) = &a {
            report.connect_us.push(a.connect.as_micros() as u64);
        }
        match a {
            Ok(a) if a.status == 200 => match serde_json::from_str::<Value>(&a.body) {
                Ok(v) => match (scenario.check)(n, &v) {
                    Ok(verified) => {
                        report.accepted_us.push(took.as_micros() as u64);
                        report.accepted_after_connect_us.push(took.saturating_sub(a.connect).as_micros() as u64);
                        report.verified += verified as u64;
                        report.signed += 1;
                    }
                    Err(e) => error(format!("HTTP 200: {e}"), &mut report),
                },
                Err(e) => error(format!("HTTP 200: not JSON: {e}"), &mut report),
            },
            Ok(a) if is_json_shed(&a) => {
                report.shed += 1;
                report.shed_429 += (a.status == 429) as u64;
                report.shed_without_retry_after += a.retry_after.is_none() as u64;
                let message = serde_json::from_str::<Value>(&a.body).unwrap_or_default()["message"]
                    .as_str()
                    .map(|m| m.split(':').next().unwrap_or_default().to_string())
                    .unwrap_or_default();
                *report.shed_kinds.entry(format!("{} {message}", a.status)).or_default() += 1;
            }
            Ok(a) => error(format!("HTTP {}: {}", a.status, a.body), &mut report),
            Err(e) => error(e, &mut report),
        }
    }
    report.accepted_us.sort_unstable();
    report.accepted_after_connect_us.sort_unstable();
    report.connect_us.sort_unstable();
    report.healthz_us.sort_unstable();
    report.ops_healthz_us.sort_unstable();
    report
}

/// The webhook scenario's name (for `--only`).
const WEBHOOK: &str = "activity write with one subscribed webhook endpoint";

/// Activity writes (create_policy) while one endpoint, a receiver in this process, is subscribed
/// to them: write throughput against the plain write scenario, deliveries per second, and the
/// time from a write's answer to its delivery's arrival.
async fn webhook_scenario(
    stack: &Stack,
    args: &Args,
    seq: Arc<AtomicU64>,
    plain_write_rps: Option<f64>,
) -> anyhow::Result<Value> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Times = Arc<Mutex<HashMap<String, Instant>>>;
    let (answered, received): (Times, Times) = Default::default();
    let rx = received.clone();
    let app = axum::Router::new().fallback(move |body: String| {
        let rx = rx.clone();
        async move {
            let at = Instant::now();
            // Only the id is read (a receiver elsewhere would do its own work on its own CPU).
            #[derive(serde::Deserialize)]
            struct Id {
                id: String,
            }
            if let Ok(Id { id }) = serde_json::from_str::<Id>(&body) {
                rx.lock().unwrap().entry(id).or_insert(at);
            }
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/bench", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    // An organization of its own: the plain write scenario filled the stack's with policies, and
    // an organization is capped in policy text and in its state's weight.
    let (org, key) = new_organization(stack, "webhook-bench")?;
    let filter = json!({"activityTypes": ["ACTIVITY_TYPE_CREATE_POLICY_V3"]}).to_string();
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        &org,
        json!({"url": url, "name": "bench", "subscriptions": [{"eventType": "ACTIVITY_UPDATES", "filtersJson": filter}]}),
    );
    let r = stack.post_raw("/public/v1/submit/create_webhook_endpoint", body.as_bytes(), Some(&key)).await;
    let endpoint = r.json["activity"]["result"]["createWebhookEndpointResult"]["endpointId"]
        .as_str()
        .with_context(|| format!("creating the endpoint: {}", r.text))?
        .to_string();
    let run_id = uuid_like();
    let answered2 = answered.clone();
    let scenario = Scenario {
        name: WEBHOOK,
        path: "/public/v1/submit/create_policy",
        make: Arc::new({
            let org = org.clone();
            move |n| {
                envelope(
                    "ACTIVITY_TYPE_CREATE_POLICY_V3",
                    &org,
                    json!({"policyName": format!("webhook-{run_id}-{n}"), "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""}),
                )
            }
        }),
        check: Arc::new(move |_, v| {
            completed(v)?;
            let id = v["activity"]["id"].as_str().ok_or("no activity id")?.to_string();
            answered2.lock().unwrap().insert(id, Instant::now());
            Ok(false)
        }),
    };
    let sample = run(&scenario, stack, key.clone(), args.clients, args.warmup, args.duration, seq).await;
    // Let the queue drain (bounded), then pair answers with arrivals.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let missing = {
            let (a, r) = (answered.lock().unwrap(), received.lock().unwrap());
            a.keys().filter(|id| !r.contains_key(*id)).count()
        };
        if missing == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (a, r) = (answered.lock().unwrap().clone(), received.lock().unwrap().clone());
    let mut lat: Vec<u64> = a
        .iter()
        .filter_map(|(id, t)| r.get(id).map(|got| got.saturating_duration_since(*t).as_micros() as u64))
        .collect();
    lat.sort_unstable();
    let undelivered = a.keys().filter(|id| !r.contains_key(*id)).count();
    let first = r.values().min().copied();
    let last = r.values().max().copied();
    let delivery_rate = match (first, last) {
        (Some(f), Some(l)) if l > f => r.len() as f64 / (l - f).as_secs_f64(),
        _ => 0.0,
    };
    let body = envelope("ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT", &org, json!({"endpointId": endpoint}));
    stack.post_raw("/public/v1/submit/delete_webhook_endpoint", body.as_bytes(), Some(&key)).await;

    let (p50, p99) = (pct_ms(&lat, 0.5), pct_ms(&lat, 0.99));
    let ratio = plain_write_rps.map(|p| sample.rps() / p);
    println!(
        "
{WEBHOOK}, {} clients",
        args.clients
    );
    println!(
        "  writes {:.0}/s{} ; deliveries {:.0}/s ({} received, {} not within 30 s, {} write errors)",
        sample.rps(),
        ratio.map_or(String::new(), |r| format!(" ({:.0} % of the plain write scenario; target ≥ 80 %)", r * 100.0)),
        delivery_rate,
        r.len(),
        undelivered,
        sample.errors
    );
    println!(
        "  answered → delivered: p50 {p50:.1} ms, p99 {p99:.1} ms (target p99 ≤ 250 ms: {})",
        if !lat.is_empty() && p99 <= 250.0 { "PASS" } else { "FAIL" }
    );
    // Server CPU per write, its delivery included (the enclave's share is the webhook signature).
    let cpu = sample.cpu.and_then(|c| c.per_request_us(sample.latencies_us.len()));
    if let Some((g, e, t)) = cpu {
        println!("  server CPU per write and its delivery: gateway {g:.0} µs, enclave {e:.0} µs, total {t:.0} µs");
    }
    Ok(json!({
        "name": WEBHOOK, "clients": args.clients, "writesPerSecond": sample.rps(), "writeErrors": sample.errors,
        "ratioToPlainWrites": ratio, "deliveriesPerSecond": delivery_rate, "received": r.len(),
        "undelivered": undelivered, "latencyP50Ms": p50, "latencyP99Ms": p99,
        "serverCpuUsPerWrite": cpu.map(|(g, e, t)| json!({"gateway": g, "enclave": e, "total": t})),
    }))
}

/// A new top-level organization (the operator's `init-org`) with a root key of its own.
fn new_organization(stack: &Stack, name: &str) -> anyhow::Result<(String, Arc<TurnkeyP256ApiKey>)> {
    let root = TurnkeyP256ApiKey::generate();
    let created = stack.gateway_cli(&[
        "init-org",
        "--name",
        name,
        "--api-public-key",
        &hex::encode(root.compressed_public_key()),
    ]);
    let org = created["organizationId"].as_str().with_context(|| format!("organization {name}"))?.to_string();
    Ok((org, Arc::new(root)))
}

/// A short unique id for names made by one bench run.
fn uuid_like() -> String {
    format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos())
}

/// The app-proof scenario's name: root signing with `generateAppProofs: true`.
const APP_PROOFS: &str = "sign secp256k1 wallet account with app proofs";
/// Signing with app proofs, at least this share of signing without (issue: one more HSM signature).
const APP_PROOFS_RATIO_TARGET: f64 = 0.7;
/// The console section's name (for `--only`).
const CONSOLE: &str = "console pages";
/// Each console page interactive within this, from the hash change to the page built
/// (issue 44).
const CONSOLE_PAGE_TARGET_MS: f64 = 500.0;
/// The console's first load, transferred, at most this (issue 44).
const CONSOLE_FIRST_LOAD_TARGET_BYTES: f64 = 200.0 * 1024.0;
/// How many times each page is opened; the slowest is reported against the target.
const CONSOLE_ROUNDS: usize = 5;

/// The console section: headless Chromium (`coffer_tests::webdriver`) signs in with the root's
/// API key and opens every page [`CONSOLE_ROUNDS`] times on the main stack as the scenarios left
/// it (thousands of activities), timed in the page from the hash change until the page is built
/// (its requests stamped, answered and drawn); and what the first load transferred, from the
/// browser's own resource timing.
async fn console_pages(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str) -> anyhow::Result<Value> {
    let browser = coffer_tests::webdriver::Browser::start().await;
    let url = stack.base_url.replace("127.0.0.1", "localhost") + "/console";
    browser.goto(&url).await;
    let loaded = browser
        .execute(
            "const n = performance.getEntriesByType('navigation')[0];
             const r = performance.getEntriesByType('resource');
             return {bytes: n.transferSize + r.reduce((a, e) => a + e.transferSize, 0),
                     interactiveMs: n.domInteractive, loadMs: n.loadEventEnd}",
            vec![],
        )
        .await;
    browser.fill("#org-id", org).await;
    browser.click("details summary").await;
    browser.fill("#api-public", &hex::encode(key.compressed_public_key())).await;
    browser.fill("#api-private", &hex::encode(key.private_key())).await;
    browser.click("#apikey-signin").await;
    browser.wait_for("#main section[data-ready]").await;
    let list = json!({"organizationId": org, "paginationOptions": {"limit": "1"}}).to_string();
    let latest = stack.post_raw("/public/v1/query/list_activities", list.as_bytes(), Some(key)).await;
    let activity = latest.json["activities"][0]["id"].as_str().context("an activity")?.to_string();
    let mut pages = Vec::new();
    for page in [
        "organization",
        "pending",
        "activities",
        &format!("activity/{activity}"),
        "wallets",
        "policies",
        "webhooks",
        "create",
    ] {
        let mut ms = Vec::new();
        for _ in 0..CONSOLE_ROUNDS {
            let took = browser
                .execute_async(
                    "const [hash, done] = [arguments[0], arguments[arguments.length - 1]];
                     const main = document.querySelector('#main');
                     const start = performance.now();
                     const seen = new MutationObserver(() => {
                       if (main.querySelector('section[data-ready]')) { seen.disconnect(); done(performance.now() - start); }
                     });
                     seen.observe(main, {subtree: true, childList: true, attributes: true});
                     main.querySelector('section').removeAttribute('data-ready');
                     location.hash = hash === location.hash.slice(1) ? hash + '?again=' + start : hash;",
                    vec![json!(page)],
                )
                .await;
            ms.push(took.as_f64().context("a time")?);
        }
        if browser.find("#error:not([hidden])").await.is_some() {
            bail!("console page {page}: {}", browser.text("#error").await);
        }
        ms.sort_by(f64::total_cmp);
        let name = page.split('/').next().unwrap_or(page);
        pages.push(json!({"page": name, "medianMs": ms[ms.len() / 2], "maxMs": ms[ms.len() - 1],
            "pass": ms[ms.len() - 1] <= CONSOLE_PAGE_TARGET_MS}));
    }
    browser.quit().await;
    let bytes = loaded["bytes"].as_f64().unwrap_or(f64::MAX);
    Ok(json!({
        "firstLoadBytes": bytes, "firstLoadTargetBytes": CONSOLE_FIRST_LOAD_TARGET_BYTES,
        "firstLoadPass": bytes <= CONSOLE_FIRST_LOAD_TARGET_BYTES,
        "firstLoadInteractiveMs": loaded["interactiveMs"], "pageTargetMs": CONSOLE_PAGE_TARGET_MS,
        "pages": pages,
    }))
}

/// The activity-log section's name (for `--only`).
const ACTIVITY_LOG: &str = "activity log export";
/// How many links the activity-log section exports and verifies.
const LOG_LINKS: u64 = 100_000;

/// A signing check that also wants one app proof, verified (P-256 over SHA-256 of the payload,
/// by the key's second half) on the requests whose signature is verified.
fn check_with_proof(inner: CheckResponse) -> CheckResponse {
    Arc::new(move |n, v| {
        let proofs = v["activity"]["appProofs"].as_array().cloned().unwrap_or_default();
        if proofs.len() != 1 {
            return Err(format!("expected one app proof: {}", v["activity"]["appProofs"]));
        }
        let verified = inner(n, v)?;
        if verified {
            use p256::ecdsa::signature::Verifier;
            let p = &proofs[0];
            let key = hex::decode(p["publicKey"].as_str().unwrap_or_default()).map_err(|e| e.to_string())?;
            let sig = hex::decode(p["signature"].as_str().unwrap_or_default()).map_err(|e| e.to_string())?;
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(key.get(65..).unwrap_or_default())
                .map_err(|e| e.to_string())?;
            let sig = p256::ecdsa::Signature::from_slice(&sig).map_err(|e| e.to_string())?;
            key.verify(p["proofPayload"].as_str().unwrap_or_default().as_bytes(), &sig)
                .map_err(|_| "the app proof does not verify".to_string())?;
        }
        Ok(verified)
    })
}

/// Fills the organization's activity log to [`LOG_LINKS`] links with signing activities (16
/// clients), then times `coffer-gateway export-log` through the API and `verify-log` offline.
async fn activity_log_export(
    stack: &Stack,
    key: &Arc<TurnkeyP256ApiKey>,
    org: &str,
    eth: &str,
    seq: &Arc<AtomicU64>,
) -> anyhow::Result<Value> {
    let body = json!({"organizationId": org, "afterSeq": "0", "limit": "1"}).to_string();
    let r = stack.post_raw("/public/v1/query/coffer_list_activity_log", body.as_bytes(), Some(key)).await;
    let have = r.json["headSeq"].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    if have < LOG_LINKS {
        let missing = Arc::new(AtomicU64::new(LOG_LINKS - have));
        let http = reqwest::Client::new();
        let url = format!("{}/public/v1/submit/sign_raw_payload", stack.base_url);
        let t = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (http, url, key, seq, missing) = (http.clone(), url.clone(), key.clone(), seq.clone(), missing.clone());
                let (org, eth) = (org.to_string(), eth.to_string());
                tokio::spawn(async move {
                    while missing.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1)).is_ok() {
                        let n = seq.fetch_add(1, Ordering::Relaxed);
                        let body = envelope(
                            "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
                            &org,
                            json!({"signWith": eth, "payload": payload(n), "encoding": "PAYLOAD_ENCODING_HEXADECIMAL", "hashFunction": "HASH_FUNCTION_KECCAK256"}),
                        );
                        let stamp = key.stamp(body.as_bytes()).unwrap();
                        let ok = matches!(http.post(&url).header(stamp.name, stamp.value).body(body).send().await, Ok(r) if r.status() == 200);
                        if !ok {
                            missing.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await?;
        }
        eprintln!("  filled the log to {LOG_LINKS} links in {:.0} s", t.elapsed().as_secs_f64());
    }
    let dir = std::env::temp_dir().join(format!("coffer-bench-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key_file = dir.join("api.key");
    std::fs::write(&key_file, format!("{}\n", stack.api_private_key))?;
    let out = dir.join("log.json");
    let t = Instant::now();
    let exported = stack.gateway_cli(&[
        "export-log",
        "--base-url",
        &stack.base_url,
        "--organization-id",
        org,
        "--api-key-file",
        key_file.to_str().unwrap_or_default(),
        "--out",
        out.to_str().unwrap_or_default(),
    ]);
    let export_seconds = t.elapsed().as_secs_f64();
    let discovery: Value = reqwest::get(format!("{}/public/v1/discovery/keys", stack.base_url)).await?.json().await?;
    let proof_key = discovery["proofPublicKey"].as_str().context("no proof key")?.to_string();
    let t = Instant::now();
    let verified = std::process::Command::new(coffer_tests::bin_dir().join("coffer-gateway"))
        .args(["verify-log", "--log", out.to_str().unwrap_or_default(), "--proof-key", &proof_key])
        .output()?;
    let verify_seconds = t.elapsed().as_secs_f64();
    let verdict: Value = serde_json::from_slice(&verified.stdout).unwrap_or_default();
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    if verdict["verified"] != true {
        bail!("the exported log does not verify: {verdict}");
    }
    Ok(json!({
        "links": verdict["links"], "exportedActivities": exported["activities"], "exportBytes": bytes,
        "exportSeconds": export_seconds, "verifySeconds": verify_seconds,
    }))
}

/// The transaction-signing scenario's name (for `--only`).
const TRANSACTION: &str = "sign_transaction EIP-1559, non-root user, value policy";
/// Its baseline: raw signing by the same user, allowed by a policy on the activity type.
const RAW_NON_ROOT: &str = "sign_raw_payload, non-root user, type policy";
/// sign_transaction's throughput must be at least this share of sign_raw_payload's.
const TRANSACTION_RATIO_TARGET: f64 = 0.9;

/// An unsigned EIP-1559 transfer on chain 1 with `nonce` and `value` (the tests' RLP encoder).
fn eip1559_transfer(nonce: u64, value: u128) -> Vec<u8> {
    use coffer_tests::rlp::{rlp_bytes, rlp_list, rlp_uint};
    let mut tx = vec![0x02];
    tx.extend(rlp_list(&[
        rlp_uint(1),
        rlp_uint(nonce.into()),
        rlp_uint(1_000_000_000),
        rlp_uint(30_000_000_000),
        rlp_uint(21_000),
        rlp_bytes(&[0x70; 20]),
        rlp_uint(value),
        rlp_bytes(&[]),
        rlp_list(&[]),
    ]));
    tx
}

/// A user who is not root (so policies decide), allowed by one policy to sign Ethereum
/// transactions of at most 1 ETH on chain 1 and by another to sign raw payloads, and two
/// scenarios as that user: transfers (every 16th signed transaction recovered to `eth`) and raw
/// payloads (the baseline).
async fn transaction_setup(
    stack: &Stack,
    root: &TurnkeyP256ApiKey,
    org: &str,
    eth: &str,
) -> anyhow::Result<(Arc<TurnkeyP256ApiKey>, Scenario, Scenario)> {
    let (signer, user) = member(stack, root, org, "bench-signer").await?;
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        org,
        json!({"policyName": "bench: transfers up to 1 ETH", "effect": "EFFECT_ALLOW",
            "condition": "activity.type == 'ACTIVITY_TYPE_SIGN_TRANSACTION_V2' && eth.tx.chain_id == 1 && eth.tx.value <= 1000000000000000000",
            "consensus": format!("approvers.any(user, user.id == '{user}')"), "notes": ""}),
    );
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(root)).await;
    r.json["activity"]["result"]["createPolicyResult"]["policyId"].as_str().context("bench policy")?;
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        org,
        json!({"policyName": "bench: raw payloads", "effect": "EFFECT_ALLOW",
            "condition": "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'",
            "consensus": format!("approvers.any(user, user.id == '{user}')"), "notes": ""}),
    );
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(root)).await;
    r.json["activity"]["result"]["createPolicyResult"]["policyId"].as_str().context("bench policy")?;
    let raw = raw_signing(RAW_NON_ROOT, org, eth);
    let (org, sign_with, address) = (org.to_string(), eth.to_string(), eth.to_lowercase());
    let scenario = Scenario {
        name: TRANSACTION,
        path: "/public/v1/submit/sign_transaction",
        make: Arc::new(move |n| {
            envelope(
                "ACTIVITY_TYPE_SIGN_TRANSACTION_V2",
                &org,
                json!({"signWith": sign_with, "type": "TRANSACTION_TYPE_ETHEREUM",
                    "unsignedTransaction": hex::encode(eip1559_transfer(n, u128::from(n % 1000)))}),
            )
        }),
        check: Arc::new(move |n, v| {
            use coffer_tests::rlp::{rlp_items, rlp_payload};
            let signed =
                completed(v)?["signTransactionResult"]["signedTransaction"].as_str().ok_or("no signedTransaction")?;
            if n % 16 != 0 {
                return Ok(false);
            }
            let signed = hex::decode(signed).map_err(|e| e.to_string())?;
            let items = rlp_items(&signed[1..]);
            let pad = |x: Vec<u8>| {
                let mut out = [0u8; 32];
                out[32 - x.len()..].copy_from_slice(&x);
                out
            };
            let sig = k256::ecdsa::Signature::from_scalars(pad(rlp_payload(&items[10])), pad(rlp_payload(&items[11])))
                .map_err(|e| e.to_string())?;
            let recid = k256::ecdsa::RecoveryId::from_byte(rlp_payload(&items[9]).first().copied().unwrap_or(0))
                .ok_or("bad y parity")?;
            let digest = sha3::Keccak256::digest(eip1559_transfer(n, u128::from(n % 1000)));
            let vk =
                k256::ecdsa::VerifyingKey::recover_from_prehash(&digest, &sig, recid).map_err(|e| e.to_string())?;
            let point = vk.to_encoded_point(false);
            let got = format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]));
            if got != address {
                return Err(format!("transaction recovers to {got}, expected {address}"));
            }
            Ok(true)
        }),
    };
    Ok((signer, raw, scenario))
}

/// The authority-scale section's name (for `--only`).
const AUTHORITY_SCALE: &str = "authority scale";
/// Its scenarios: a non-root user's raw signing with one applicable policy among many that name
/// another activity type, then with that many applicable.
const ONE_APPLICABLE: &str = "sign_raw_payload, non-root, 1 of 25,001 policies applicable";
const MANY_APPLICABLE: &str = "sign_raw_payload, non-root, 25,001 of 50,001 applicable";
const MANY_POLICIES: usize = 25_000;
const MANY_ORGANIZATIONS: usize = 10_000;
/// Policies per create_policies activity while filling an organization.
const POLICIES_PER_ACTIVITY: usize = 250;

fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Submits every body to `path`, `concurrency` at a time, stamped by `key`; fails on the first
/// answer that is not 200.
async fn submit_all(
    base_url: &str,
    path: &'static str,
    key: Arc<TurnkeyP256ApiKey>,
    bodies: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<()> {
    let queue = Arc::new(std::sync::Mutex::new(bodies));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (queue, key, base_url) = (queue.clone(), key.clone(), base_url.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(body) = queue.lock().map_err(|_| anyhow::anyhow!("queue"))?.pop() else { return Ok(()) };
                let r = coffer_tests::post_to(&base_url, path, body.as_bytes(), Some(&key)).await;
                anyhow::ensure!(r.status == 200, "{path}: {} {}", r.status, r.text);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The enclave's authority state at scale, on a fresh stack: its resident memory with
/// [`MANY_ORGANIZATIONS`] sub-organizations' state loaded, and a non-root user's signing when the
/// organization has [`MANY_POLICIES`] policies that do not apply to it, then as many that do.
async fn authority_scale(args: &Args, seq: Arc<AtomicU64>) -> anyhow::Result<(Value, Vec<(&'static str, Sample)>)> {
    // 50,001 policies of about 120 bytes of text: caps and a state cache that let one
    // organization hold them (6 MiB of text, about 600 MiB by the state's weight).
    let stack = Stack::start_with(&[
        ("COFFER_MAX_POLICY_TEXT_BYTES_PER_ORGANIZATION", "8388608"),
        ("COFFER_STATE_CACHE_MIB", "2048"),
    ])
    .await;
    let root = Arc::new(stack.api_key());
    let org = stack.organization_id.clone();
    let (enclave, _) = stack.pids();
    let eth = ethereum_account(&stack, &root, &org, "scale").await?;

    // Resident memory with many organizations' state loaded (each sub-organization's state is
    // cached by the enclave from the commit that created it).
    let rss_before = rss_mib(enclave);
    eprintln!("running: {AUTHORITY_SCALE}: creating {MANY_ORGANIZATIONS} sub-organizations...");
    let started = Instant::now();
    let public_key = stack.api_public_key.clone();
    let bodies = (0..MANY_ORGANIZATIONS)
        .map(|i| {
            envelope(
                "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
                &org,
                json!({"subOrganizationName": format!("scale-{i}"), "rootQuorumThreshold": 1, "rootUsers": [{
                    "userName": "root", "apiKeys": [{"apiKeyName": "root", "publicKey": public_key,
                    "curveType": "API_KEY_CURVE_P256"}], "authenticators": [], "oauthProviders": []}]}),
            )
        })
        .collect();
    submit_all(&stack.base_url, "/public/v1/submit/create_sub_organization", root.clone(), bodies, args.clients)
        .await?;
    let organizations_s = started.elapsed().as_secs_f64();
    let rss_after = rss_mib(enclave);

    // A non-root user allowed to sign raw payloads by one policy.
    let (signer, user) = member(&stack, &root, &org, "scale-signer").await?;
    let policies = |from: usize, condition: &'static str, user: String| -> Vec<String> {
        policy_batches(&org, from..from + MANY_POLICIES, &|i| {
            json!({"policyName": format!("scale-{i}"), "effect": "EFFECT_ALLOW",
                "condition": condition, "consensus": format!("approvers.any(user, user.id == '{user}')"), "notes": ""})
        })
    };
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        &org,
        json!({"policyName": "scale: raw payloads", "effect": "EFFECT_ALLOW",
            "condition": "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'",
            "consensus": format!("approvers.any(user, user.id == '{user}')"), "notes": ""}),
    );
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&root)).await;
    anyhow::ensure!(r.status == 200, "the signer's policy: {}", r.text);
    eprintln!("running: {AUTHORITY_SCALE}: creating {MANY_POLICIES} policies for another activity type...");
    let other = policies(1_000_000, "activity.type == 'ACTIVITY_TYPE_CREATE_USERS_V4'", user.clone());
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", root.clone(), other, 4).await?;
    let sign = raw_signing(ONE_APPLICABLE, &org, &eth);
    eprintln!("running: {ONE_APPLICABLE} with {} clients", args.clients);
    let one = run(&sign, &stack, signer.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
    eprintln!("running: {AUTHORITY_SCALE}: creating {MANY_POLICIES} policies that apply to it...");
    let applicable = policies(
        2_000_000,
        "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2' && activity.resource == 'PRIVATE_KEY'",
        user,
    );
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", root.clone(), applicable, 4).await?;
    let sign = Scenario { name: MANY_APPLICABLE, ..sign };
    eprintln!("running: {MANY_APPLICABLE} with {} clients", args.clients);
    let many = run(&sign, &stack, signer, args.clients, args.warmup, args.duration, seq).await;
    let per_org_kib = rss_after.zip(rss_before).map(|(a, b)| (a - b) * 1024.0 / MANY_ORGANIZATIONS as f64);
    let peaks = (peak_rss_mib(enclave), peak_rss_mib(stack.pids().1));
    println!(
        "{AUTHORITY_SCALE}: peak RSS after the policy scenarios: enclave {} MiB, gateway {} MiB",
        peaks.0.map_or("n/a".into(), |v| format!("{v:.1}")),
        peaks.1.map_or("n/a".into(), |v| format!("{v:.1}")),
    );
    println!(
        "\n{AUTHORITY_SCALE}: {MANY_ORGANIZATIONS} sub-organizations made in {organizations_s:.1} s; enclave RSS {} → {} MiB ({} KiB per organization's state)",
        rss_before.map_or("n/a".into(), |v| format!("{v:.1}")),
        rss_after.map_or("n/a".into(), |v| format!("{v:.1}")),
        per_org_kib.map_or("n/a".into(), |v| format!("{v:.1}")),
    );
    let report = json!({
        "organizations": MANY_ORGANIZATIONS, "organizationsSeconds": organizations_s,
        "enclaveRssMiBBefore": rss_before, "enclaveRssMiBAfter": rss_after, "enclaveRssKiBPerOrganization": per_org_kib,
        "policies": MANY_POLICIES, "peakRssMiB": {"enclave": peaks.0, "gateway": peaks.1},
    });
    Ok((report, vec![(ONE_APPLICABLE, one), (MANY_APPLICABLE, many)]))
}

/// The scale section's name (for `--only`; a term that is a whole section's name selects that
/// section alone, so `--only scale` does not run [`AUTHORITY_SCALE`] too).
const SCALE: &str = "scale";
/// Its scenarios: raw signing in one sub-organization, then in a uniformly random one a request
/// (named `sign…`, so the table counts them as signing: server CPU against the floor's).
const SCALE_ONE_ORG: &str = "sign_raw_payload, scale: one sub-organization";
const SCALE_RANDOM: &str = "sign_raw_payload, scale: a random sub-organization";
/// How many sub-organizations it creates unless `--scale-suborgs` says otherwise (issue 40).
const SCALE_SUBORGS: usize = 250_000;
/// Its targets (issue 40): signing in a random sub-organization at least this share of signing in
/// one; the enclave's peak RSS with them all; an enclave killed and started again signing within.
const SCALE_RANDOM_RATIO_TARGET: f64 = 0.5;
const SCALE_ENCLAVE_RSS_TARGET_MIB: f64 = 256.0;
const SCALE_RESTART_TARGET_MS: f64 = 2000.0;
/// The main stack's gateway and enclave: peak RSS of each over the whole bench (issue 40).
const MAIN_RSS_TARGET_MIB: f64 = 128.0;

/// Request `n`'s sub-organization of `len` in the random scenario (splitmix64 of `n`: uniform,
/// and the same for the request's body and for its check).
fn scale_pick(n: u64, len: usize) -> usize {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % len as u64) as usize
}

/// One sub-organization of the scale section: its id and its Ethereum account's address.
struct SubOrganization {
    id: String,
    eth: String,
}

/// A raw signing body (keccak256 of [`payload`]`(n)`) for the account `sign_with` of `org`.
fn sign_raw_payload_body(org: &str, sign_with: &str, n: u64) -> String {
    envelope(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        org,
        json!({"signWith": sign_with, "payload": payload(n), "encoding": "PAYLOAD_ENCODING_HEXADECIMAL",
            "hashFunction": "HASH_FUNCTION_KECCAK256"}),
    )
}

/// Creates `count` sub-organizations of `parent` through the API (`create_sub_organization` V8,
/// `clients` at a time on kept-alive connections, stamped by the parent's `root`), each with a
/// root user holding the API key `sub_root_public` and a wallet with one Ethereum account. A
/// request shed (503 or 429) is sent again (a fresh body, after 50 ms, up to 20 times); any other
/// answer but a completed activity fails the section. Answers the sub-organizations and how many
/// requests were sent again.
async fn create_sub_organizations(
    base_url: &str,
    parent: &str,
    root: Arc<TurnkeyP256ApiKey>,
    sub_root_public: &str,
    count: usize,
    clients: usize,
) -> anyhow::Result<(Vec<SubOrganization>, u64)> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
    let url = format!("{base_url}/public/v1/submit/create_sub_organization");
    let (next, done, resent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (http, url, root, parent, public) =
            (http.clone(), url.clone(), root.clone(), parent.to_string(), sub_root_public.to_string());
        let (next, done, resent) = (next.clone(), done.clone(), resent.clone());
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= count {
                    return anyhow::Ok(made);
                }
                let mut tries = 0;
                let sub = loop {
                    let body = envelope(
                        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
                        &parent,
                        json!({"subOrganizationName": format!("scale-{i}"), "rootQuorumThreshold": 1,
                            "rootUsers": [{"userName": "root", "apiKeys": [{"apiKeyName": "root", "publicKey": public,
                                "curveType": "API_KEY_CURVE_P256"}], "authenticators": [], "oauthProviders": []}],
                            "wallet": {"walletName": "scale", "accounts": [{"curve": "CURVE_SECP256K1",
                                "pathFormat": "PATH_FORMAT_BIP32", "path": "m/44'/60'/0'/0/0",
                                "addressFormat": "ADDRESS_FORMAT_ETHEREUM"}]}}),
                    );
                    let stamp = root.stamp(body.as_bytes())?;
                    let r = http.post(&url).header(stamp.name, stamp.value).body(body).send().await?;
                    let status = r.status().as_u16();
                    let text = r.text().await?;
                    if matches!(status, 503 | 429) && tries < 20 {
                        tries += 1;
                        resent.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    anyhow::ensure!(status == 200, "sub-organization {i}: HTTP {status}: {text}");
                    let v: Value = serde_json::from_str(&text)?;
                    let result = &completed(&v).map_err(|e| anyhow::anyhow!("sub-organization {i}: {e}: {text}"))?
                        ["createSubOrganizationResultV8"];
                    let (id, eth) = (result["subOrganizationId"].as_str(), result["wallet"]["addresses"][0].as_str());
                    let (Some(id), Some(eth)) = (id, eth) else {
                        bail!("sub-organization {i}: no id or address: {text}");
                    };
                    break SubOrganization { id: id.to_string(), eth: eth.to_string() };
                };
                made.push(sub);
                let done = done.fetch_add(1, Ordering::Relaxed) + 1;
                if done % (count as u64 / 10).max(1) == 0 {
                    eprintln!(
                        "  {done} of {count} sub-organizations, {:.0}/s so far",
                        done as f64 / started.elapsed().as_secs_f64()
                    );
                }
            }
        }));
    }
    let mut subs = Vec::with_capacity(count);
    for t in tasks {
        subs.extend(t.await??);
    }
    Ok((subs, resent.load(Ordering::Relaxed)))
}

/// The scale section (issue 40), on a fresh stack: `args.scale_suborgs` sub-organizations
/// created through the API (the rate); raw signing at `args.clients` clients in one of them, then
/// in a uniformly random one a request, every 16th signature recovered to that one's address (the
/// ratio); the enclave's and the gateway's peak RSS after that; then the enclave killed (SIGKILL)
/// and started again on the same token and stores, timed to its first signature (in a random
/// sub-organization) through the gateway, beside the times to its socket accepting and to the
/// gateway's `/healthz` answering 200.
async fn scale(args: &Args, seq: Arc<AtomicU64>) -> anyhow::Result<(Value, Vec<(&'static str, Sample)>)> {
    // The parent organization makes every creation request: past the default per-organization
    // replay quota (100,000 in 300 s, a fairness limit between organizations) above 333 a second.
    let mut stack = Stack::start_with(&[("COFFER_REPLAY_QUOTA_PER_ORGANIZATION", "10000000")]).await;
    let root = Arc::new(stack.api_key());
    let parent = stack.organization_id.clone();
    // One API key is every sub-organization root's (an organization's credentials are its own:
    // the same public key may be in many), so the bench keeps one private key, not 250,000.
    let sub_root = Arc::new(TurnkeyP256ApiKey::generate());
    let sub_root_public = hex::encode(sub_root.compressed_public_key());
    let count = args.scale_suborgs;
    eprintln!("running: {SCALE}: creating {count} sub-organizations with {} clients...", args.clients);
    let started = Instant::now();
    let (subs, resent) =
        create_sub_organizations(&stack.base_url, &parent, root, &sub_root_public, count, args.clients).await?;
    let create_seconds = started.elapsed().as_secs_f64();
    let create_rate = count as f64 / create_seconds;
    let (enclave, gateway) = stack.pids();
    let after_create = (rss_mib(enclave), rss_mib(gateway));

    let subs = Arc::new(subs);
    let one = &subs[scale_pick(0, subs.len())];
    let one_org = raw_signing(SCALE_ONE_ORG, &one.id, &one.eth);
    eprintln!("running: {SCALE_ONE_ORG} with {} clients", args.clients);
    let one_sample =
        run(&one_org, &stack, sub_root.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
    let random = Scenario {
        name: SCALE_RANDOM,
        path: SIGN_PATH,
        make: Arc::new({
            let subs = subs.clone();
            move |n| {
                let s = &subs[scale_pick(n, subs.len())];
                sign_raw_payload_body(&s.id, &s.eth, n)
            }
        }),
        check: Arc::new({
            let subs = subs.clone();
            move |n, v| match recovered_k1(n, v)? {
                None => Ok(false),
                Some(got) => {
                    let s = &subs[scale_pick(n, subs.len())];
                    if got == s.eth.to_lowercase() {
                        Ok(true)
                    } else {
                        Err(format!("signature in {} recovers to {got}, expected {}", s.id, s.eth))
                    }
                }
            }
        }),
    };
    eprintln!("running: {SCALE_RANDOM} (of {count}) with {} clients", args.clients);
    let random_sample =
        run(&random, &stack, sub_root.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
    let ratio = random_sample.rps() / one_sample.rps();
    let peaks = (peak_rss_mib(enclave), peak_rss_mib(gateway));

    // Restart to ready: killed, started again, and timed (from the start) to the enclave's socket
    // accepting, the gateway's /healthz answering 200, and the first signature through the gateway.
    eprintln!("running: {SCALE}: the enclave killed (SIGKILL) and started again...");
    stack.kill_enclave();
    let restarted = Instant::now();
    stack.start_enclave();
    let deadline = Duration::from_secs(60);
    let socket = stack.enclave_socket();
    let accepting = async {
        while restarted.elapsed() < deadline {
            if tokio::net::UnixStream::connect(&socket).await.is_ok() {
                return Some(restarted.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let healthy = async {
        while restarted.elapsed() < deadline {
            if http.get(format!("{}/healthz", stack.base_url)).send().await.is_ok_and(|r| r.status() == 200) {
                return Some(restarted.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    };
    let signing = async {
        let (mut tries, mut last) = (0u64, String::new());
        while restarted.elapsed() < deadline {
            // A multiple of 16, so that its signature is recovered and checked.
            let n = seq.fetch_add(16, Ordering::Relaxed).next_multiple_of(16);
            let body = (random.make)(n);
            let stamp = sub_root.stamp(body.as_bytes()).expect("stamp");
            let url = format!("{}{SIGN_PATH}", stack.base_url);
            tries += 1;
            match http.post(&url).header(stamp.name, stamp.value).body(body).send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let text = r.text().await.unwrap_or_default();
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    match (status, (random.check)(n, &v)) {
                        (200, Ok(true)) => return (Some(restarted.elapsed()), tries, last),
                        (200, Ok(false)) => last = "HTTP 200, signature not checked".into(),
                        (200, Err(e)) => last = format!("HTTP 200: {e}"),
                        (s, _) => last = format!("HTTP {s}: {}", text.chars().take(200).collect::<String>()),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (None, tries, last)
    };
    let (accepting, healthy, (ready, tries, last)) = tokio::join!(accepting, healthy, signing);
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
    let (accepting_ms, healthy_ms, ready_ms) = (ms(accepting), ms(healthy), ms(ready));
    let restarted_rss = rss_mib(stack.pids().0);
    drop(stack);

    let verdict = |pass: bool| if pass { "PASS" } else { "MISSED" };
    let mib = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    let ratio_pass = ratio >= SCALE_RANDOM_RATIO_TARGET && random_sample.errors == 0;
    let rss_pass = peaks.0.is_some_and(|p| p <= SCALE_ENCLAVE_RSS_TARGET_MIB);
    let restart_pass = ready_ms.is_some_and(|r| r <= SCALE_RESTART_TARGET_MS);
    println!(
        "\n{SCALE}: {count} sub-organizations (each a root user with an API key and a wallet with an Ethereum account) created through the API with {} clients in {create_seconds:.1} s = {create_rate:.0}/s ({resent} requests shed and sent again)",
        args.clients,
    );
    println!(
        "{SCALE}: signing, {} clients: in one sub-organization {:.0} req/s (p50 {:.1} ms, p99 {:.1} ms), in a uniformly random one {:.0} req/s (p50 {:.1} ms, p99 {:.1} ms, {} errors, {} signatures verified) = {:.1}% (target ≥ {:.0}%: {})",
        args.clients,
        one_sample.rps(),
        one_sample.pct(0.5),
        one_sample.pct(0.99),
        random_sample.rps(),
        random_sample.pct(0.5),
        random_sample.pct(0.99),
        random_sample.errors,
        random_sample.verified,
        ratio * 100.0,
        SCALE_RANDOM_RATIO_TARGET * 100.0,
        verdict(ratio_pass),
    );
    println!(
        "{SCALE}: peak RSS enclave {} MiB (target ≤ {SCALE_ENCLAVE_RSS_TARGET_MIB:.0} MiB: {}), gateway {} MiB; RSS after creating them: enclave {} MiB, gateway {} MiB",
        mib(peaks.0),
        verdict(rss_pass),
        mib(peaks.1),
        mib(after_create.0),
        mib(after_create.1),
    );
    println!(
        "{SCALE}: enclave restart (SIGKILL, started again) to its first signature in a random sub-organization: {} (target ≤ {SCALE_RESTART_TARGET_MS:.0} ms: {}); its socket accepting after {}, the gateway's /healthz 200 after {}; {tries} signing requests{}; enclave RSS then {} MiB",
        ready_ms.map_or("not within 60 s".into(), |v| format!("{v:.0} ms")),
        verdict(restart_pass),
        accepting_ms.map_or("n/a".into(), |v| format!("{v:.0} ms")),
        healthy_ms.map_or("n/a".into(), |v| format!("{v:.0} ms")),
        if last.is_empty() { String::new() } else { format!(" (the last refused: {last})") },
        mib(restarted_rss),
    );
    let report = json!({
        "subOrganizations": count, "createPerSecond": create_rate, "randomSigningRatio": ratio,
        "enclavePeakRssMiB": peaks.0, "enclaveRestartToReadyMs": ready_ms,
        "clients": args.clients, "createSeconds": create_seconds, "createResent": resent,
        "oneOrgSignsPerSecond": one_sample.rps(), "randomSignsPerSecond": random_sample.rps(),
        "oneOrgP99Ms": one_sample.pct(0.99), "randomP99Ms": random_sample.pct(0.99),
        "randomSigningErrors": random_sample.errors, "randomSignaturesVerified": random_sample.verified,
        "gatewayPeakRssMiB": peaks.1, "rssAfterCreateMiB": {"enclave": after_create.0, "gateway": after_create.1},
        "enclaveRestartAcceptingMs": accepting_ms, "enclaveRestartHealthzMs": healthy_ms,
        "enclaveRestartSigningRequests": tries, "enclaveRssAfterRestartMiB": restarted_rss,
        "targets": {"randomSigningRatio": SCALE_RANDOM_RATIO_TARGET, "enclavePeakRssMiB": SCALE_ENCLAVE_RSS_TARGET_MIB,
            "enclaveRestartToReadyMs": SCALE_RESTART_TARGET_MS},
        "pass": {"randomSigningRatio": ratio_pass, "enclavePeakRssMiB": rss_pass, "enclaveRestartToReadyMs": restart_pass},
    });
    Ok((report, vec![(SCALE_ONE_ORG, one_sample), (SCALE_RANDOM, random_sample)]))
}

/// The one-time code section's name (for `--only`), its rate and its target (issue 27): codes
/// asked for at 20 a second (open loop) reach the SMTP server within 500 ms at p99.
const OTP_DELIVERY: &str = "otp delivery";
const OTP_PER_SECOND: u32 = 20;
const OTP_P99_TARGET_MS: f64 = 500.0;

/// `init_otp` at [`OTP_PER_SECOND`] for the run's duration on a fresh stack whose enclave sends
/// through a real SMTP server (aiosmtpd): each code's delivery time is the message file's
/// modification time (written when the server accepted it) less the moment its request was
/// sent, matched by the code's unique contact. The answer's own latency is reported beside it.
async fn otp_delivery(args: &Args) -> anyhow::Result<Value> {
    let dir = std::env::temp_dir().join(format!("coffer-bench-otp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let smtp = coffer_tests::smtp::SmtpServer::start(&dir).await;
    let stack = Stack::start_on(
        "sqlite",
        &[("COFFER_SMTP_URL", &smtp.url()), ("COFFER_OTP_SENDS_PER_ORGANIZATION_PER_HOUR", "1000000")],
    )
    .await;
    let (root, org) = (Arc::new(stack.api_key()), stack.organization_id.clone());
    let n = ((args.duration.as_secs_f64() * OTP_PER_SECOND as f64) as usize).max(1);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / OTP_PER_SECOND as f64)).into()).await;
        let (base, root, org) = (stack.base_url.clone(), root.clone(), org.clone());
        tasks.push(tokio::spawn(async move {
            let body = envelope(
                "ACTIVITY_TYPE_INIT_OTP_V3",
                &org,
                json!({"otpType": "OTP_TYPE_EMAIL", "contact": format!("bench-{i}@bench.test"), "appName": "Coffer bench"}),
            );
            let sent = std::time::SystemTime::now();
            let t = Instant::now();
            let r = coffer_tests::post_to(&base, "/public/v1/submit/init_otp", body.as_bytes(), Some(&root)).await;
            (i, sent, t.elapsed(), r.status == 200 && completed(&r.json).is_ok())
        }));
    }
    let mut sent_at = vec![None; n];
    let mut answered_us = Vec::with_capacity(n);
    let mut errors = 0u64;
    for t in tasks {
        let (i, sent, took, ok) = t.await?;
        if ok {
            sent_at[i] = Some(sent);
            answered_us.push(took.as_micros() as u64);
        } else {
            errors += 1;
        }
    }
    let mut delivered_us = Vec::with_capacity(n);
    for (file, message) in smtp.messages() {
        let Some(i) = message
            .lines()
            .find_map(|l| l.strip_prefix("To: bench-").and_then(|r| r.strip_suffix("@bench.test")))
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        let (Some(Some(sent)), Ok(written)) = (sent_at.get(i), std::fs::metadata(&file).and_then(|m| m.modified()))
        else {
            continue;
        };
        delivered_us.push(written.duration_since(*sent).unwrap_or_default().as_micros() as u64);
    }
    let undelivered = n as u64 - errors - delivered_us.len() as u64;
    delivered_us.sort_unstable();
    answered_us.sort_unstable();
    let p99 = pct_ms(&delivered_us, 0.99);
    let pass = errors == 0 && undelivered == 0 && p99 <= OTP_P99_TARGET_MS;
    println!(
        "\n{OTP_DELIVERY}: {n} init_otp at {OTP_PER_SECOND}/s → SMTP server: p50 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms \
         (answer p99 {:.1} ms); {errors} failed, {undelivered} not delivered (target p99 ≤ {OTP_P99_TARGET_MS} ms: {})",
        pct_ms(&delivered_us, 0.5),
        pct_ms(&delivered_us, 1.0),
        pct_ms(&answered_us, 0.99),
        if pass { "PASS" } else { "MISSED" }
    );
    drop(stack);
    drop(smtp);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "requests": n, "perSecond": OTP_PER_SECOND, "errors": errors, "undelivered": undelivered,
        "deliveredP50Ms": pct_ms(&delivered_us, 0.5), "deliveredP99Ms": p99, "deliveredMaxMs": pct_ms(&delivered_us, 1.0),
        "answeredP99Ms": pct_ms(&answered_us, 0.99), "p99TargetMs": OTP_P99_TARGET_MS, "pass": pass,
    }))
}

/// The policy-cost section's name (for `--only`), and its targets (issue 26): a non-root user's
/// latency does not grow with policies that cannot apply, and many applicable ALLOW policies
/// that test the same things cost little more than one.
const POLICY_COST: &str = "policy cost";
const POLICY_COST_ROOT: &str = "policy cost: root signing";
const POLICY_COST_OWN_ONLY: &str = "policy cost: non-root, its own policy only";
const POLICY_COST_INAPPLICABLE: &str = "policy cost: non-root, 10,000 policies that cannot apply";
const POLICY_COST_APPLICABLE: &str = "policy cost: non-root, 1,000 applicable ALLOW policies";
const INAPPLICABLE_POLICIES: usize = 10_000;
const APPLICABLE_POLICIES: usize = 1_000;
/// The p50 with policies that cannot apply may exceed the p50 without by at most this (ms).
const INAPPLICABLE_P50_MARGIN_MS: f64 = 1.0;
/// Non-root signing with the applicable policies: at least this share of root's throughput.
const APPLICABLE_RATIO_TARGET: f64 = 0.5;
/// The isolation part of the section ([`policy_isolation`]): organization A's expensive
/// policies, and how many of its dry runs at once.
const POLICY_COST_ISOLATION: &str = "policy cost: isolation";
/// 25 of about 6 KB: the decision's budget ends a dry run after about ten of them, and together
/// they weigh about 14.5 MB compiled, within an organization's cap (half the state cache).
const ISOLATION_POLICIES: usize = 25;
const ISOLATION_RUNS: usize = 4;
/// `coffer_policy::EVAL_DEADLINE` (one clause's wall-clock backstop; a decision's, over all of
/// its clauses, is `coffer_policy::DECISION_DEADLINE`, 100 ms), in ms.
const EVAL_DEADLINE_MS: f64 = 50.0;

/// Policy cost, on a fresh stack: root's raw signing (32 clients), then a non-root user's (1
/// client) allowed by one policy, again with [`INAPPLICABLE_POLICIES`] policies that name another
/// activity type, and then (32 clients) with [`APPLICABLE_POLICIES`] more ALLOW policies that all
/// apply: the same condition, and a consensus naming one of ten users (the signer in a tenth).
async fn policy_cost(args: &Args, seq: Arc<AtomicU64>) -> anyhow::Result<(Value, Vec<(&'static str, usize, Sample)>)> {
    // On its own stack, gone before this section's.
    let isolation = policy_isolation().await?;
    // Its 11,000 policies are past the default caps on an organization's policy text (256 KiB)
    // and state (half of a 64 MiB state cache): the cost measured is of policies, not of caps.
    let stack = Stack::start_with(&[
        ("COFFER_MAX_POLICY_TEXT_BYTES_PER_ORGANIZATION", "8388608"),
        ("COFFER_STATE_CACHE_MIB", "512"),
    ])
    .await;
    let root = Arc::new(stack.api_key());
    let org = stack.organization_id.clone();
    let eth = ethereum_account(&stack, &root, &org, "policy-cost").await?;
    let (signer, user) = member(&stack, &root, &org, "policy-cost-signer").await?;
    let raw_payloads = "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'";
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        &org,
        json!({"policyName": "policy cost: the signer's raw payloads", "effect": "EFFECT_ALLOW",
            "condition": raw_payloads, "consensus": format!("approvers.any(user, user.id == '{user}')"), "notes": ""}),
    );
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&root)).await;
    anyhow::ensure!(r.status == 200, "the signer's policy: {}", r.text);
    let sign = |name: &'static str| raw_signing(name, &org, &eth);
    let clients = args.clients;
    eprintln!("running: {POLICY_COST_ROOT} with {clients} clients");
    let root_sample =
        run(&sign(POLICY_COST_ROOT), &stack, root.clone(), clients, args.warmup, args.duration, seq.clone()).await;
    eprintln!("running: {POLICY_COST_OWN_ONLY} with 1 client");
    let own =
        run(&sign(POLICY_COST_OWN_ONLY), &stack, signer.clone(), 1, args.warmup, args.duration, seq.clone()).await;
    eprintln!("running: {POLICY_COST}: creating {INAPPLICABLE_POLICIES} policies for another activity type...");
    let consensus = format!("approvers.any(user, user.id == '{user}')");
    let other = policy_batches(&org, 0..INAPPLICABLE_POLICIES, &|i| {
        json!({"policyName": format!("other-{i}"), "effect": "EFFECT_ALLOW",
            "condition": "activity.type == 'ACTIVITY_TYPE_CREATE_USERS_V4'", "consensus": consensus, "notes": ""})
    });
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", root.clone(), other, 4).await?;
    eprintln!("running: {POLICY_COST_INAPPLICABLE} with 1 client");
    let inapplicable =
        run(&sign(POLICY_COST_INAPPLICABLE), &stack, signer.clone(), 1, args.warmup, args.duration, seq.clone()).await;
    eprintln!("running: {POLICY_COST}: creating {APPLICABLE_POLICIES} applicable ALLOW policies...");
    let applicable = policy_batches(&org, 0..APPLICABLE_POLICIES, &|i| {
        let approver = if i % 10 == 0 { user.clone() } else { format!("someone-else-{}", i % 10) };
        json!({"policyName": format!("applicable-{i}"), "effect": "EFFECT_ALLOW",
            "condition": format!("{raw_payloads} && activity.resource == 'PRIVATE_KEY'"),
            "consensus": format!("approvers.any(user, user.id == '{approver}')"), "notes": ""})
    });
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", root.clone(), applicable, 4).await?;
    eprintln!("running: {POLICY_COST_APPLICABLE} with {clients} clients");
    let many = run(&sign(POLICY_COST_APPLICABLE), &stack, signer, clients, args.warmup, args.duration, seq).await;
    let (p50_own, p50_inapplicable) = (own.pct(0.5), inapplicable.pct(0.5));
    let ratio = many.rps() / root_sample.rps();
    let peaks = (peak_rss_mib(stack.pids().0), peak_rss_mib(stack.pids().1));
    println!(
        "\n{POLICY_COST}: non-root p50 {p50_own:.2} ms with its own policy only, {p50_inapplicable:.2} ms with {INAPPLICABLE_POLICIES} that cannot apply (target ≤ +{INAPPLICABLE_P50_MARGIN_MS} ms: {})",
        if p50_inapplicable - p50_own <= INAPPLICABLE_P50_MARGIN_MS { "PASS" } else { "MISSED" }
    );
    println!(
        "{POLICY_COST}: non-root signing with {APPLICABLE_POLICIES} applicable ALLOW policies {:.0} req/s = {:.1}% of root's {:.0} req/s (target ≥ {:.0}%: {}); peak RSS enclave {} MiB, gateway {} MiB",
        many.rps(),
        ratio * 100.0,
        root_sample.rps(),
        APPLICABLE_RATIO_TARGET * 100.0,
        if ratio >= APPLICABLE_RATIO_TARGET { "PASS" } else { "MISSED" },
        peaks.0.map_or("n/a".into(), |v| format!("{v:.1}")),
        peaks.1.map_or("n/a".into(), |v| format!("{v:.1}")),
    );
    let report = json!({
        "isolation": isolation,
        "ownPolicyOnlyP50Ms": p50_own, "inapplicablePolicies": INAPPLICABLE_POLICIES,
        "inapplicableP50Ms": p50_inapplicable, "inapplicableP50MarginMs": INAPPLICABLE_P50_MARGIN_MS,
        "inapplicablePass": p50_inapplicable - p50_own <= INAPPLICABLE_P50_MARGIN_MS,
        "applicablePolicies": APPLICABLE_POLICIES, "applicableRequestsPerSecond": many.rps(),
        "rootRequestsPerSecond": root_sample.rps(), "applicableRatioToRoot": ratio,
        "applicableRatioTarget": APPLICABLE_RATIO_TARGET, "applicablePass": ratio >= APPLICABLE_RATIO_TARGET,
        "peakRssMiB": {"enclave": peaks.0, "gateway": peaks.1},
    });
    Ok((
        report,
        vec![
            (POLICY_COST_ROOT, clients, root_sample),
            (POLICY_COST_OWN_ONLY, 1, own),
            (POLICY_COST_INAPPLICABLE, 1, inapplicable),
            (POLICY_COST_APPLICABLE, clients, many),
        ],
    ))
}

/// Policy cost, isolation (issue 23): the timings behind tests/tests/policy_cost.rs, which
/// checks the pool's share with its counters only. On a fresh stack with that test's pool (2
/// threads, 1 per organization), organization A has [`ISOLATION_POLICIES`] expensive ALLOW
/// policies (a quantifier over a 3,000-item literal list each, within the step budget) and B one
/// cheap one. Measured: one
/// dry run of A alone (the decision's budget ends it after about ten of A's policies), then
/// `/healthz` and B's dry run while [`ISOLATION_RUNS`] of A's run at once. Targets (reported): B and `/healthz` answer before any
/// of A's runs ends (they do not wait for A's evaluation), and one clause of A's, near the step
/// budget, takes well within the evaluator's wall-clock backstop (`coffer_policy::EVAL_DEADLINE`,
/// [`EVAL_DEADLINE_MS`]: the step budget, not the clock, ends costly evaluations).
async fn policy_isolation() -> anyhow::Result<Value> {
    let stack = Stack::start_with(&[
        ("COFFER_POLICY_THREADS", "2"),
        ("COFFER_POLICY_THREADS_PER_ORGANIZATION", "1"),
        ("COFFER_POLICY_QUEUE_TIMEOUT_MS", "120000"),
    ])
    .await;
    let (root, org_a) = (Arc::new(stack.api_key()), stack.organization_id.clone());
    eprintln!("running: {POLICY_COST_ISOLATION}: creating {ISOLATION_POLICIES} expensive policies...");
    let costly: Vec<Value> = (0..ISOLATION_POLICIES)
        .map(|i| {
            json!({"policyName": format!("costly-{i}"), "effect": "EFFECT_ALLOW", "notes": "",
                "condition": format!("[{}0].all(x, x == 0) && {i} == {i}", "0,".repeat(2_999))})
        })
        .collect();
    let bodies =
        costly.chunks(50).map(|c| envelope("ACTIVITY_TYPE_CREATE_POLICIES", &org_a, json!({"policies": c}))).collect();
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", root.clone(), bodies, 2).await?;
    let (alice, _) = member(&stack, &root, &org_a, "alice").await?;
    let (org_b, root_b) = new_organization(&stack, "org-b")?;
    let cheap =
        json!({"policies": [{"policyName": "cheap", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""}]});
    let body = envelope("ACTIVITY_TYPE_CREATE_POLICIES", &org_b, cheap);
    let r = stack.post_raw("/public/v1/submit/create_policies", body.as_bytes(), Some(&root_b)).await;
    anyhow::ensure!(r.status == 200, "B's policy: {}", r.text);
    let (bob, _) = member(&stack, &root_b, &org_b, "bob").await?;
    let dry_run = |org: &str| {
        json!({"organizationId": org, "activity": {"type": "ACTIVITY_TYPE_CREATE_WALLET", "organizationId": org,
            "parameters": {"walletName": "dry", "accounts": []}}})
        .to_string()
    };
    let path = "/public/v1/query/coffer_policy_dry_run";

    eprintln!("running: {POLICY_COST_ISOLATION}: one dry run of A alone, then {ISOLATION_RUNS} at once");
    let t = Instant::now();
    let r = stack.post_raw(path, dry_run(&org_a).as_bytes(), Some(&alice)).await;
    let alone = t.elapsed();
    anyhow::ensure!(r.status == 200, "A's dry run: {}", r.text);
    // The decision's budget (issue 39) ends it after some of A's policies: the others err at
    // once, and the time per clause is over the ones evaluated.
    let evaluated = r.json["policies"]
        .as_array()
        .map_or(0, |o| o.iter().filter(|o| o["outcome"] != "OUTCOME_ERROR").count())
        .max(1);
    let started = Instant::now();
    let runs: Vec<_> = (0..ISOLATION_RUNS)
        .map(|_| {
            let (url, body) = (stack.base_url.clone(), dry_run(&org_a));
            let key = TurnkeyP256ApiKey::from_bytes(alice.private_key(), None).expect("alice's key");
            tokio::spawn(async move {
                let r = coffer_tests::post_to(&url, path, body.as_bytes(), Some(&key)).await;
                (r.status, started.elapsed())
            })
        })
        .collect();
    // Once one of A's is being evaluated (the pool's wait count moved), B and /healthz.
    let waits = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("coffer_policy_evaluation_wait_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let metrics = || async { reqwest::get(format!("{}/metrics", stack.base_url)).await?.text().await };
    let before = waits(&metrics().await?);
    while waits(&metrics().await?) <= before {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "none of A's dry runs started in 60 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let t = Instant::now();
    let health = reqwest::get(format!("{}/healthz", stack.base_url)).await?.status();
    let health_ms = t.elapsed().as_secs_f64() * 1000.0;
    let health_at = started.elapsed();
    let t = Instant::now();
    let b = stack.post_raw(path, dry_run(&org_b).as_bytes(), Some(&bob)).await;
    let b_ms = t.elapsed().as_secs_f64() * 1000.0;
    let b_at = started.elapsed();
    anyhow::ensure!(health == 200 && b.status == 200, "/healthz {health}, B's dry run: {}", b.text);
    let mut first_end = Duration::MAX;
    let (mut served, mut shed) = (0, 0);
    for run in runs {
        let (status, at) = run.await?;
        first_end = first_end.min(at);
        match status {
            200 => served += 1,
            503 => shed += 1,
            other => bail!("A's dry run: {other}"),
        }
    }
    let alone_ms = alone.as_secs_f64() * 1000.0;
    let clause_ms = alone_ms / evaluated as f64;
    let pass_isolation = health_at < first_end && b_at < first_end;
    let pass_clause = clause_ms <= EVAL_DEADLINE_MS;
    let verdict = |pass: bool| if pass { "PASS" } else { "MISSED" };
    println!(
        "\n{POLICY_COST_ISOLATION}: A's dry run alone {alone_ms:.0} ms ({evaluated} of its {ISOLATION_POLICIES} policies evaluated before the decision's budget ran out: {clause_ms:.2} ms a clause near the step budget, target ≤ {EVAL_DEADLINE_MS} ms: {}); with {ISOLATION_RUNS} of A's at once ({served} served, {shed} shed), /healthz {health_ms:.1} ms and B's dry run {b_ms:.1} ms, first of A's ended after {:.0} ms (target: both before it: {})",
        verdict(pass_clause),
        first_end.as_secs_f64() * 1000.0,
        verdict(pass_isolation),
    );
    Ok(json!({
        "policies": ISOLATION_POLICIES, "evaluatedPolicies": evaluated, "aloneMs": alone_ms, "clauseMs": clause_ms, "clauseTargetMs": EVAL_DEADLINE_MS,
        "clausePass": pass_clause, "runs": ISOLATION_RUNS, "served": served, "shed": shed,
        "healthzMs": health_ms, "otherOrganizationDryRunMs": b_ms,
        "firstOfAEndedMs": first_end.as_secs_f64() * 1000.0, "isolationPass": pass_isolation,
    }))
}

/// The tenant-isolation section's name (for `--only`), its scenarios and its targets (issue 39):
/// organizations A and B at their policy text cap with the costliest policies allowed, C with one
/// cheap policy; each signs as a non-root member, whose activities the policies decide.
const TENANT_ISOLATION: &str = "tenant isolation";
const TENANT_QUIET: &str = "tenant isolation: C's signing, quiet";
const TENANT_ATTACKED: &str = "tenant isolation: C's signing, A and B attacking";
/// `coffer_org_rules::limits::DEFAULT_MAX_POLICY_TEXT_BYTES`: the default cap on an
/// organization's policy text (enclave `max_policy_text_bytes_per_organization`).
const POLICY_TEXT_CAP: usize = 256 * 1024;
/// Items of each costly policy's literal list: 6 steps an item (the item, the iteration, the
/// comparison, the variable and its copy, the literal), so a clause takes about 19,800 steps,
/// just within `coffer_policy::MAX_EVAL_STEPS` (20,000).
const COSTLY_LIST_LEN: usize = 3_300;
/// Costly policies per `create_policies` activity (about 8 KB each).
const COSTLY_PER_ACTIVITY: usize = 8;
/// No decision may take more CPU than this, in either process (`coffer_policy::DECISION_DEADLINE`).
const DECISION_CPU_TARGET_MS: f64 = 100.0;
/// C's signing p99 while A and B attack, at most this many times its quiet p99.
const ATTACK_P99_RATIO_TARGET: f64 = 2.0;
/// No request may grow either process's peak RSS by more than this (MiB).
const RSS_GROWTH_TARGET_MIB: f64 = 64.0;
/// Clients of each attacking organization at once (half dry runs, half signing).
const ATTACK_CLIENTS: usize = 16;

/// CPU time of a process in nanoseconds: the sum of its live threads' time on a CPU
/// (`/proc/<pid>/task/*/schedstat`, nanosecond resolution, where `stat` counts 10 ms ticks).
fn process_cpu_ns(pid: Option<u32>) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{}/task", pid?)).ok()?.flatten() {
        let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        total += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

/// A costly policy: a quantifier over a literal list of `len` zeros (6 steps an item),
/// ALLOW for even `i`, DENY for odd `i`. Every one applies to every activity; a DENY's condition
/// ends false, so it is evaluated whole and denies nothing (the decision goes on to the ALLOWs).
/// `i` (unique across organizations) makes each text its own, so no two policies of a decision
/// share one evaluation (`coffer_policy::decision`'s clause memo).
fn costly_policy(i: usize, len: usize) -> Value {
    let (effect, tail) = match i % 2 {
        0 => ("EFFECT_ALLOW", format!("{i} == {i}")),
        _ => ("EFFECT_DENY", format!("{i} != {i}")),
    };
    json!({"policyName": format!("costly-{i}"), "effect": effect, "notes": "",
        "condition": format!("[{}0].all(x, x == 0) && {tail}", "0,".repeat(len.max(1) - 1))})
}

/// One organization of the section: its root's key, a non-root member's, and an Ethereum account.
struct Tenant {
    org: String,
    root: Arc<TurnkeyP256ApiKey>,
    member: Arc<TurnkeyP256ApiKey>,
    eth: String,
}

/// A tenant: the stack's own organization (`None`) or a new one, with a wallet and a member.
async fn tenant(stack: &Stack, name: &str, own: Option<(String, Arc<TurnkeyP256ApiKey>)>) -> anyhow::Result<Tenant> {
    let (org, root) = match own {
        Some(o) => o,
        None => new_organization(stack, name)?,
    };
    let eth = ethereum_account(stack, &root, &org, name).await?;
    let (member, _) = member(stack, &root, &org, &format!("{name}-member")).await?;
    Ok(Tenant { org, root, member, eth })
}

/// Fills `t`'s organization up to [`POLICY_TEXT_CAP`] with [`costly_policy`]s numbered from
/// `first`: full ones, then one shorter to take what is left. Answers (policies, bytes of text,
/// whether one more small policy was refused: the organization is at its cap).
async fn fill_to_cap(stack: &Stack, t: &Tenant, first: usize) -> anyhow::Result<(usize, usize, bool)> {
    let text_len = |p: &Value| p["condition"].as_str().map_or(0, str::len);
    let mut policies = Vec::new();
    let mut bytes = 0;
    loop {
        let p = costly_policy(first + policies.len(), COSTLY_LIST_LEN);
        if bytes + text_len(&p) > POLICY_TEXT_CAP {
            break;
        }
        bytes += text_len(&p);
        policies.push(p);
    }
    let bodies = policies
        .chunks(COSTLY_PER_ACTIVITY)
        .map(|c| envelope("ACTIVITY_TYPE_CREATE_POLICIES", &t.org, json!({"policies": c})))
        .collect();
    submit_all(&stack.base_url, "/public/v1/submit/create_policies", t.root.clone(), bodies, 2).await?;
    // The rest: a shorter list (2 bytes an item), 16 bytes shorter after each refusal (the
    // enclave may count a few bytes this does not), until one fits.
    let i = first + policies.len();
    let overhead = text_len(&costly_policy(i, 1));
    let mut len = POLICY_TEXT_CAP.saturating_sub(bytes + overhead) / 2 + 1;
    let mut count = policies.len();
    while len > 1 {
        let p = costly_policy(i, len);
        let body = envelope("ACTIVITY_TYPE_CREATE_POLICY_V3", &t.org, p.clone());
        let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&t.root)).await;
        if r.status == 200 {
            bytes += text_len(&p);
            count += 1;
            break;
        }
        anyhow::ensure!(r.status == 400 && r.text.contains("policy text"), "the last policy: {}", r.text);
        len = len.saturating_sub(8);
    }
    // At the cap: one more policy of about 64 bytes is refused.
    let small = json!({"policyName": "one more", "effect": "EFFECT_ALLOW", "notes": "",
        "condition": format!("activity.type == 'ACTIVITY_TYPE_CREATE_WALLET' && {i} == {i}")});
    let body = envelope("ACTIVITY_TYPE_CREATE_POLICY_V3", &t.org, small);
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&t.root)).await;
    let at_cap = r.status == 400 && r.text.contains("policy text");
    Ok((count, bytes, at_cap))
}

/// A dry run (`coffer_policy_dry_run`) of a wallet's creation in `org`.
fn dry_run_body(org: &str) -> String {
    json!({"organizationId": org, "activity": {"type": "ACTIVITY_TYPE_CREATE_WALLET", "organizationId": org,
        "parameters": {"walletName": "dry", "accounts": []}}})
    .to_string()
}
const DRY_RUN_PATH: &str = "/public/v1/query/coffer_policy_dry_run";
const SIGN_PATH: &str = "/public/v1/submit/sign_raw_payload";

/// A raw signing body for `t`'s account.
fn sign_raw_body(t: &Tenant, n: u64) -> String {
    envelope(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &t.org,
        json!({"signWith": t.eth, "payload": payload(n), "encoding": "PAYLOAD_ENCODING_HEXADECIMAL",
            "hashFunction": "HASH_FUNCTION_KECCAK256"}),
    )
}

/// Requests made one at a time, each timed and with the CPU each process spent on it.
#[derive(Default)]
struct Probe {
    latencies_us: Vec<u64>,
    /// (gateway, enclave) CPU per request, in ms.
    cpu_ms: Vec<(f64, f64)>,
    statuses: std::collections::BTreeMap<u16, u64>,
    /// The first answer's body (shortened): what the decision was.
    first: String,
}

impl Probe {
    fn cpu_mean_ms(&self) -> (f64, f64) {
        let n = self.cpu_ms.len().max(1) as f64;
        (self.cpu_ms.iter().map(|c| c.0).sum::<f64>() / n, self.cpu_ms.iter().map(|c| c.1).sum::<f64>() / n)
    }
    fn cpu_max_ms(&self) -> (f64, f64) {
        self.cpu_ms.iter().fold((0.0, 0.0), |m, c| (f64::max(m.0, c.0), f64::max(m.1, c.1)))
    }
    fn report(&self) -> Value {
        let (mean, max) = (self.cpu_mean_ms(), self.cpu_max_ms());
        json!({
            "requests": self.latencies_us.len(), "p50Ms": pct_ms(&self.latencies_us, 0.5),
            "p99Ms": pct_ms(&self.latencies_us, 0.99), "maxMs": pct_ms(&self.latencies_us, 1.0),
            "statuses": self.statuses.iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "cpuMsPerRequest": {"gateway": mean.0, "enclave": mean.1, "total": mean.0 + mean.1},
            "maxCpuMsPerRequest": {"gateway": max.0, "enclave": max.1},
            "firstAnswer": self.first,
        })
    }
}

/// One client, back to back for `duration`: `make(n)` posted to `path`, stamped by `key`.
async fn probe(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    path: &str,
    make: &dyn Fn(u64) -> String,
    duration: Duration,
    seq: &AtomicU64,
) -> anyhow::Result<Probe> {
    let (enclave, gateway) = stack.pids();
    let http = reqwest::Client::new();
    let url = format!("{}{path}", stack.base_url);
    let mut p = Probe::default();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let body = make(seq.fetch_add(1, Ordering::Relaxed));
        let before = (process_cpu_ns(gateway), process_cpu_ns(enclave));
        let t = Instant::now();
        let stamp = key.stamp(body.as_bytes())?;
        let (status, text) = match http.post(&url).header(stamp.name, stamp.value).body(body).send().await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        };
        p.latencies_us.push(t.elapsed().as_micros() as u64);
        let ms = |a: Option<u64>, b: Option<u64>| a.zip(b).map_or(0.0, |(a, b)| a.saturating_sub(b) as f64 / 1e6);
        p.cpu_ms.push((ms(process_cpu_ns(gateway), before.0), ms(process_cpu_ns(enclave), before.1)));
        *p.statuses.entry(status).or_default() += 1;
        if p.first.is_empty() {
            p.first = format!("{status} {}", text.chars().take(300).collect::<String>());
        }
    }
    p.latencies_us.sort_unstable();
    Ok(p)
}

/// One attacking client: `make(n)` posted to `path` back to back until `stop`; the answers'
/// statuses counted.
async fn attack_client(
    http: reqwest::Client,
    url: String,
    key: Arc<TurnkeyP256ApiKey>,
    make: Arc<dyn Fn(u64) -> String + Send + Sync>,
    stop: Arc<AtomicBool>,
    seq: Arc<AtomicU64>,
) -> std::collections::BTreeMap<u16, u64> {
    let mut statuses = std::collections::BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let body = make(seq.fetch_add(1, Ordering::Relaxed));
        let Ok(stamp) = key.stamp(body.as_bytes()) else { break };
        let status = match http.post(&url).header(stamp.name, stamp.value).body(body).send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let _ = r.bytes().await;
                s
            }
            Err(_) => 0,
        };
        *statuses.entry(status).or_insert(0u64) += 1;
    }
    statuses
}

/// Tenant isolation (issue 39), on a fresh stack with the default settings: organizations A and
/// B each at the policy text cap ([`POLICY_TEXT_CAP`]) with the costliest policies allowed (each
/// near a clause's step budget, all applying, each text its own), C with one cheap policy.
/// Measured: (1) A's non-root member's dry run and signing, one at a time, with the CPU each
/// process spent per request (target: none over [`DECISION_CPU_TARGET_MS`]); (2) C's member's
/// signing (1 client) quiet, then while [`ATTACK_CLIENTS`] clients each of A and B send dry runs
/// and signing requests (target: p99 ≤ [`ATTACK_P99_RATIO_TARGET`] × quiet); (3) each process's
/// peak RSS at the end against its RSS before the first measured request (target: ≤
/// [`RSS_GROWTH_TARGET_MIB`], which bounds any one request's growth).
async fn tenant_isolation(
    args: &Args,
    seq: Arc<AtomicU64>,
) -> anyhow::Result<(Value, Vec<(&'static str, usize, Sample)>)> {
    let stack = Stack::start().await;
    let (enclave_pid, gateway_pid) = stack.pids();
    let fresh = (rss_mib(gateway_pid), rss_mib(enclave_pid));
    let a = tenant(&stack, "tenant-a", Some((stack.organization_id.clone(), Arc::new(stack.api_key())))).await?;
    let b = tenant(&stack, "tenant-b", None).await?;
    let c = tenant(&stack, "tenant-c", None).await?;
    eprintln!("running: {TENANT_ISOLATION}: filling A's and B's policy text to the cap...");
    let filled_a = fill_to_cap(&stack, &a, 0).await?;
    let filled_b = fill_to_cap(&stack, &b, 10_000).await?;
    let cheap = envelope(
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        &c.org,
        json!({"policyName": "raw payloads", "effect": "EFFECT_ALLOW", "notes": "",
            "condition": "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'"}),
    );
    let r = stack.post_raw("/public/v1/submit/create_policy", cheap.as_bytes(), Some(&c.root)).await;
    anyhow::ensure!(r.status == 200, "C's policy: {}", r.text);
    eprintln!(
        "{TENANT_ISOLATION}: A holds {} policies ({} bytes of text, at the cap: {}), B {} ({} bytes, at the cap: {})",
        filled_a.0, filled_a.1, filled_a.2, filled_b.0, filled_b.1, filled_b.2
    );
    // Before the first measured request.
    let before = (rss_mib(gateway_pid), rss_mib(enclave_pid));

    // (1) A's member, one request at a time. The first dry run tells what the decision reads.
    let r = stack.post_raw(DRY_RUN_PATH, dry_run_body(&a.org).as_bytes(), Some(&a.member)).await;
    anyhow::ensure!(r.status == 200, "A's dry run: {}", r.text);
    let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
    for o in r.json["policies"].as_array().into_iter().flatten() {
        let detail = o["detail"].as_str().unwrap_or_default();
        let label = match o["outcome"].as_str().unwrap_or_default() {
            "OUTCOME_ERROR" if detail.contains("the decision's") => "OUTCOME_ERROR (the decision's budget)".to_string(),
            "OUTCOME_ERROR" => format!("OUTCOME_ERROR ({})", detail.chars().take(60).collect::<String>()),
            other => other.to_string(),
        };
        *outcomes.entry(label).or_default() += 1;
    }
    let (decision, reason) = (r.json["decision"].clone(), r.json["reason"].clone());
    eprintln!("{TENANT_ISOLATION}: A's dry run: {decision} {reason}, outcomes {outcomes:?}");
    eprintln!("running: {TENANT_ISOLATION}: A's dry runs, 1 client");
    let dry = probe(&stack, &a.member, DRY_RUN_PATH, &|_| dry_run_body(&a.org), args.duration, &seq).await?;
    eprintln!("running: {TENANT_ISOLATION}: A's signing, 1 client");
    let signing = probe(&stack, &a.member, SIGN_PATH, &|n| sign_raw_body(&a, n), args.duration, &seq).await?;

    // (2) C's signing, quiet, then under attack.
    let c_signing = raw_signing(TENANT_QUIET, &c.org, &c.eth);
    eprintln!("running: {TENANT_QUIET} with 1 client");
    let quiet = run(&c_signing, &stack, c.member.clone(), 1, args.warmup, args.duration, seq.clone()).await;
    eprintln!("running: {TENANT_ATTACKED} with 1 client ({ATTACK_CLIENTS} clients each of A and B)");
    let stop = Arc::new(AtomicBool::new(false));
    let http = reqwest::Client::builder().pool_max_idle_per_host(4 * ATTACK_CLIENTS).build()?;
    let mut attackers = Vec::new();
    let cpu_before = ServerCpu::read(stack.pids());
    let attack_started = Instant::now();
    for t in [&a, &b] {
        for i in 0..ATTACK_CLIENTS {
            let (path, make): (&str, Arc<dyn Fn(u64) -> String + Send + Sync>) = if i % 2 == 0 {
                let org = t.org.clone();
                (DRY_RUN_PATH, Arc::new(move |_| dry_run_body(&org)))
            } else {
                let (org, eth) = (t.org.clone(), t.eth.clone());
                let t = Tenant { org, root: t.root.clone(), member: t.member.clone(), eth };
                (SIGN_PATH, Arc::new(move |n| sign_raw_body(&t, n)))
            };
            attackers.push(tokio::spawn(attack_client(
                http.clone(),
                format!("{}{path}", stack.base_url),
                t.member.clone(),
                make,
                stop.clone(),
                seq.clone(),
            )));
        }
    }
    let attacked = run(
        &raw_signing(TENANT_ATTACKED, &c.org, &c.eth),
        &stack,
        c.member.clone(),
        1,
        args.warmup,
        args.duration,
        seq.clone(),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let attack_cpu = ServerCpu::read(stack.pids()).and_then(|c| c.since(cpu_before));
    let attack_seconds = attack_started.elapsed().as_secs_f64();
    let mut attack_statuses = std::collections::BTreeMap::<u16, u64>::new();
    for t in attackers {
        for (s, n) in t.await? {
            *attack_statuses.entry(s).or_default() += n;
        }
    }
    // Answers that were decisions: dry runs answered and signing refused or signed (not shed).
    let decisions: u64 = attack_statuses.iter().filter(|(s, _)| matches!(s, 200 | 403)).map(|(_, n)| n).sum();
    let attack_cpu_ms =
        attack_cpu.and_then(|c| c.per_request_us(decisions as usize)).map(|(g, e, t)| (g / 1e3, e / 1e3, t / 1e3));

    // (3) Memory.
    let peak = (peak_rss_mib(gateway_pid), peak_rss_mib(enclave_pid));
    let growth = (peak.0.zip(before.0).map(|(p, b)| p - b), peak.1.zip(before.1).map(|(p, b)| p - b));

    let verdict = |pass: bool| if pass { "PASS" } else { "MISSED" };
    let (dry_max, sign_max) = (dry.cpu_max_ms(), signing.cpu_max_ms());
    let max_cpu = [dry_max.0, dry_max.1, sign_max.0, sign_max.1].into_iter().fold(0.0, f64::max);
    let cpu_pass = max_cpu <= DECISION_CPU_TARGET_MS && !dry.cpu_ms.is_empty();
    let (quiet_p99, attacked_p99) = (quiet.pct(0.99), attacked.pct(0.99));
    let ratio = attacked_p99 / quiet_p99;
    let p99_pass = ratio <= ATTACK_P99_RATIO_TARGET && attacked.errors == 0 && !attacked.latencies_us.is_empty();
    let rss_pass =
        growth.0.zip(growth.1).is_some_and(|(g, e)| g <= RSS_GROWTH_TARGET_MIB && e <= RSS_GROWTH_TARGET_MIB);
    let mib = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    let statuses = |s: &std::collections::BTreeMap<u16, u64>| {
        s.iter().map(|(s, n)| format!("{n}× {s}")).collect::<Vec<_>>().join(", ")
    };
    println!(
        "\n{TENANT_ISOLATION}: A and B each at the policy text cap ({} and {} bytes of {POLICY_TEXT_CAP}; one more refused: {}, {}), {} and {} policies of about {COSTLY_LIST_LEN} list items (ALLOW and DENY, all applicable); A's dry run: {decision} {reason}, outcomes {outcomes:?}",
        filled_a.1, filled_b.1, filled_a.2, filled_b.2, filled_a.0, filled_b.0,
    );
    for (what, p) in [("A's member's dry run", &dry), ("A's member's signing", &signing)] {
        let (mean, max) = (p.cpu_mean_ms(), p.cpu_max_ms());
        println!(
            "{TENANT_ISOLATION}: {what}, 1 client: {} requests ({}), p50 {:.1} ms, p99 {:.1} ms; CPU per request gateway {:.1} ms (max {:.1}), enclave {:.1} ms (max {:.1})",
            p.latencies_us.len(),
            statuses(&p.statuses),
            pct_ms(&p.latencies_us, 0.5),
            pct_ms(&p.latencies_us, 0.99),
            mean.0,
            max.0,
            mean.1,
            max.1,
        );
    }
    println!(
        "{TENANT_ISOLATION}: most CPU one request took in one process {max_cpu:.1} ms (target: no decision over {DECISION_CPU_TARGET_MS} ms: {})",
        verdict(cpu_pass)
    );
    println!(
        "{TENANT_ISOLATION}: C's signing p50 {:.2} ms / p99 {quiet_p99:.2} ms quiet, p50 {:.2} ms / p99 {attacked_p99:.2} ms ({} errors) with A and B attacking = {ratio:.2}× (target ≤ {ATTACK_P99_RATIO_TARGET}×: {})",
        quiet.pct(0.5),
        attacked.pct(0.5),
        attacked.errors,
        verdict(p99_pass),
    );
    println!(
        "{TENANT_ISOLATION}: the attack ({} clients, {attack_seconds:.1} s): {}; server CPU per decision gateway {} ms, enclave {} ms",
        2 * ATTACK_CLIENTS,
        statuses(&attack_statuses),
        attack_cpu_ms.map_or("n/a".into(), |c| format!("{:.1}", c.0)),
        attack_cpu_ms.map_or("n/a".into(), |c| format!("{:.1}", c.1)),
    );
    println!(
        "{TENANT_ISOLATION}: RSS gateway {} MiB fresh, {} MiB before the first measured request, peak {} MiB after (growth {} MiB); enclave {} → {} → peak {} MiB (growth {} MiB) (target: growth ≤ {RSS_GROWTH_TARGET_MIB} MiB: {})",
        mib(fresh.0),
        mib(before.0),
        mib(peak.0),
        mib(growth.0),
        mib(fresh.1),
        mib(before.1),
        mib(peak.1),
        mib(growth.1),
        verdict(rss_pass),
    );
    let report = json!({
        "policyTextCapBytes": POLICY_TEXT_CAP, "listItemsPerPolicy": COSTLY_LIST_LEN,
        "organizationA": {"policies": filled_a.0, "policyTextBytes": filled_a.1, "atCap": filled_a.2},
        "organizationB": {"policies": filled_b.0, "policyTextBytes": filled_b.1, "atCap": filled_b.2},
        "dryRunDecision": decision, "dryRunReason": reason, "dryRunOutcomes": outcomes,
        "dryRun": dry.report(), "signing": signing.report(),
        "maxCpuMsPerRequest": max_cpu, "decisionCpuTargetMs": DECISION_CPU_TARGET_MS, "decisionCpuPass": cpu_pass,
        "quiet": {"clients": 1, "requests": quiet.latencies_us.len(), "p50Ms": quiet.pct(0.5), "p99Ms": quiet_p99, "errors": quiet.errors},
        "underAttack": {"clients": 1, "requests": attacked.latencies_us.len(), "p50Ms": attacked.pct(0.5), "p99Ms": attacked_p99, "errors": attacked.errors},
        "attack": {
            "clientsPerOrganization": ATTACK_CLIENTS, "seconds": attack_seconds,
            "statuses": attack_statuses.iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "decisions": decisions,
            "cpuMsPerDecision": attack_cpu_ms.map(|(g, e, t)| json!({"gateway": g, "enclave": e, "total": t})),
        },
        "p99Ratio": ratio, "p99RatioTarget": ATTACK_P99_RATIO_TARGET, "p99Pass": p99_pass,
        "rssMiB": {
            "gateway": {"fresh": fresh.0, "beforeRequests": before.0, "peakAfter": peak.0, "growth": growth.0},
            "enclave": {"fresh": fresh.1, "beforeRequests": before.1, "peakAfter": peak.1, "growth": growth.1},
        },
        "rssGrowthTargetMiB": RSS_GROWTH_TARGET_MIB, "rssPass": rss_pass,
    });
    Ok((report, vec![(TENANT_QUIET, 1, quiet), (TENANT_ATTACKED, 1, attacked)]))
}

/// The burst scenario's name (for `--only`).
const BURST: &str = "burst: signing clients released at once";
/// Targets the burst is held to (reported, not enforced).
const BURST_ACCEPTED_P99_MS: f64 = 250.0;
const BURST_HEALTHZ_P99_MS: f64 = 50.0;

/// Prints the burst's figures against its targets and returns them as JSON.
fn print_burst(b: &BurstReport, floor_cpu_us: Option<f64>) -> Value {
    let total = (b.clients * b.rounds) as f64;
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let (p50, p99, max) = (pct_ms(&b.accepted_us, 0.5), pct_ms(&b.accepted_us, 0.99), pct_ms(&b.accepted_us, 1.0));
    let (h50, h99, hmax) = (pct_ms(&b.healthz_us, 0.5), pct_ms(&b.healthz_us, 0.99), pct_ms(&b.healthz_us, 1.0));
    let recovered: Vec<f64> = b.recovery_ms.iter().flatten().copied().collect();
    let worst_recovery = recovered.iter().copied().fold(0.0, f64::max);
    let cpu = b.cpu.and_then(|c| c.per_request_us(b.signed));
    println!("\nburst: {} signing clients, each on a new connection, released at once, {} rounds", b.clients, b.rounds);
    println!(
        "  accepted {} ({:.1}%): p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms (connecting included) — target p99 ≤ {BURST_ACCEPTED_P99_MS:.0} ms: {}",
        b.accepted_us.len(),
        100.0 * b.accepted_us.len() as f64 / total,
        verdict(!b.accepted_us.is_empty() && p99 <= BURST_ACCEPTED_P99_MS)
    );
    println!(
        "  shed (JSON 503/429 with code and message) {} ({:.1}%; {} were 429, {} without Retry-After{}); other outcomes (errors) {} ({:.1}%){}",
        b.shed,
        100.0 * b.shed as f64 / total,
        b.shed_429,
        b.shed_without_retry_after,
        if b.shed_kinds.is_empty() { String::new() } else { format!("; {:?}", b.shed_kinds) },
        b.errors,
        100.0 * b.errors as f64 / total,
        if b.error_kinds.is_empty() { String::new() } else { format!(": {:?}", b.error_kinds) }
    );
    println!(
        "  accepted, from connected to answered: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct_ms(&b.accepted_after_connect_us, 0.5),
        pct_ms(&b.accepted_after_connect_us, 0.99),
        pct_ms(&b.accepted_after_connect_us, 1.0)
    );
    println!(
        "  connecting (all answered requests): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; accept-queue overflows (host-wide): {}",
        pct_ms(&b.connect_us, 0.5),
        pct_ms(&b.connect_us, 0.99),
        pct_ms(&b.connect_us, 1.0),
        b.listen_overflows.map_or("n/a".into(), |n| n.to_string())
    );
    println!(
        "  release to last answer: {} ms; recovery (last answer to a signature in ≤ {:.1} ms): {}",
        b.burst_ms.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(", "),
        b.normal_ms,
        b.recovery_ms
            .iter()
            .map(|r| r.map_or("none within 30 s".into(), |r| format!("{r:.1} ms")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  /healthz every 10 ms during the bursts: {} answers, p50 {h50:.1} ms, p99 {h99:.1} ms, max {hmax:.1} ms, {} not 200 — target p99 ≤ {BURST_HEALTHZ_P99_MS:.0} ms: {}",
        b.healthz_us.len(),
        b.healthz_failures,
        verdict(!b.healthz_us.is_empty() && b.healthz_failures == 0 && h99 <= BURST_HEALTHZ_P99_MS)
    );
    let (o50, o99, omax) =
        (pct_ms(&b.ops_healthz_us, 0.5), pct_ms(&b.ops_healthz_us, 0.99), pct_ms(&b.ops_healthz_us, 1.0));
    let ops_pass = !b.ops_healthz_us.is_empty() && b.ops_healthz_failures == 0 && o99 <= BURST_HEALTHZ_P99_MS;
    println!(
        "  /healthz on the operations listener meanwhile: {} answers, p50 {o50:.1} ms, p99 {o99:.1} ms, max {omax:.1} ms, {} not 200 — target p99 ≤ {BURST_HEALTHZ_P99_MS:.0} ms: {}",
        b.ops_healthz_us.len(),
        b.ops_healthz_failures,
        verdict(ops_pass)
    );
    let ops_health = json!({"answers": b.ops_healthz_us.len(), "failures": b.ops_healthz_failures,
        "p50Ms": o50, "p99Ms": o99, "maxMs": omax, "p99Pass": ops_pass});
    if let Some((g, e, t)) = cpu {
        println!(
            "  server CPU per signature in the rounds: gateway {g:.0} µs + enclave {e:.0} µs = {t:.0} µs{}",
            floor_cpu_us.map_or(String::new(), |f| format!(" ({:.2}× the crypto floor's {f:.0} µs)", t / f))
        );
    }
    json!({
        "name": BURST, "clients": b.clients, "rounds": b.rounds, "requests": b.clients * b.rounds,
        "accepted": b.accepted_us.len(), "acceptedP50Ms": p50, "acceptedP99Ms": p99, "acceptedMaxMs": max,
        "acceptedP99TargetMs": BURST_ACCEPTED_P99_MS, "acceptedP99Pass": !b.accepted_us.is_empty() && p99 <= BURST_ACCEPTED_P99_MS,
        "signaturesVerified": b.verified,
        "shed": b.shed, "shedShare": b.shed as f64 / total, "shed429": b.shed_429, "shedKinds": b.shed_kinds,
        "shedWithoutRetryAfter": b.shed_without_retry_after,
        "errors": b.errors, "errorKinds": b.error_kinds,
        "acceptedAfterConnectP50Ms": pct_ms(&b.accepted_after_connect_us, 0.5),
        "acceptedAfterConnectP99Ms": pct_ms(&b.accepted_after_connect_us, 0.99),
        "connectP50Ms": pct_ms(&b.connect_us, 0.5), "connectP99Ms": pct_ms(&b.connect_us, 0.99),
        "connectMaxMs": pct_ms(&b.connect_us, 1.0), "listenOverflows": b.listen_overflows,
        "burstMs": b.burst_ms, "normalLatencyMs": b.normal_ms, "recoveryMs": b.recovery_ms,
        "worstRecoveryMs": worst_recovery,
        "healthzAnswers": b.healthz_us.len(), "healthzFailures": b.healthz_failures,
        "healthzP50Ms": h50, "healthzP99Ms": h99, "healthzMaxMs": hmax, "healthzP99TargetMs": BURST_HEALTHZ_P99_MS,
        "healthzP99Pass": !b.healthz_us.is_empty() && b.healthz_failures == 0 && h99 <= BURST_HEALTHZ_P99_MS,
        "opsHealthz": ops_health,
        "signed": b.signed,
        "serverCpuUsPerSignature": cpu.map(|(g, e, t)| json!({"gateway": g, "enclave": e, "total": t})),
        "serverCpuRatioToFloorCpu": cpu.zip(floor_cpu_us).map(|(c, f)| c.2 / f),
    })
}

/// Activity writes: a policy with a new name each (`{prefix}{n}`). Each is 12 to 14 bytes of
/// policy text, so that one organization takes about 20,000 of them (10 s at 2,000 a second)
/// before the default cap of 256 KiB of policy text per organization refuses more: the scenario
/// measures writes, not that cap (with 66 bytes each, as until issue 40, a run writing 350 a
/// second reached it after 12 s and measured refusals).
fn create_policy_scenario(org: String, prefix: String) -> Scenario {
    Scenario {
        name: "activity write (create_policy, unique names)",
        path: "/public/v1/submit/create_policy",
        make: Arc::new(move |n| {
            envelope(
                "ACTIVITY_TYPE_CREATE_POLICY_V3",
                &org,
                json!({"policyName": format!("{prefix}{n}"), "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""}),
            )
        }),
        check: Arc::new(|_, v| {
            completed(v)?["createPolicyResult"]["policyId"].as_str().map(|_| false).ok_or("no policyId".into())
        }),
    }
}

/// The store comparison's name (for `--only`).
const STORE: &str = "store comparison";
/// PostgreSQL's target on the 2-core machine: durable activity writes per second, one gateway.
const POSTGRES_WRITES_TARGET: f64 = 1500.0;

/// Activity writes (create_policy, unique names) and reads (list_wallets) on fresh stacks:
/// SQLite with one gateway, then PostgreSQL with one and with two gateways on one database.
async fn store_comparison(args: &Args, seq: Arc<AtomicU64>) -> anyhow::Result<(Value, u64)> {
    let mut rows = Vec::new();
    let mut errors = 0;
    for (label, store, gateways) in [
        ("SQLite, 1 gateway", "sqlite", 1),
        ("PostgreSQL, 1 gateway", "postgres", 1),
        ("PostgreSQL, 2 gateways", "postgres", 2),
    ] {
        eprintln!("running: {STORE}: {label} with {} clients", args.clients);
        let stack = Stack::start_on(store, &[]).await;
        let database = if store == "postgres" { coffer_tests::postgres::server().postmaster_pid() } else { None };
        DATABASE_PID.store(database.unwrap_or(0).into(), Ordering::Relaxed);
        let key = Arc::new(stack.api_key());
        let org = stack.organization_id.clone();
        let body = envelope("ACTIVITY_TYPE_CREATE_WALLET", &org, json!({"walletName": "bench", "accounts": []}));
        let r = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&key)).await;
        anyhow::ensure!(r.status == 200, "creating the wallet: {}", r.text);
        let mut urls = vec![stack.base_url.clone()];
        let mut second = None;
        if gateways == 2 {
            let (url, child) = stack.spawn_gateway().await;
            urls.push(url);
            second = Some(child);
        }
        let run_id = std::process::id();
        let write = create_policy_scenario(org.clone(), "s".into());
        let o = org.clone();
        let users = Scenario {
            name: "activity write (create_users, one user without credentials)",
            path: "/public/v1/submit/create_users",
            make: Arc::new(move |n| {
                envelope(
                    "ACTIVITY_TYPE_CREATE_USERS_V4",
                    &o,
                    json!({"users": [{"userName": format!("store-{run_id}-{n}"), "userEmail": null, "userPhoneNumber": null,
                        "apiKeys": [], "authenticators": [], "oauthProviders": [], "userTags": []}]}),
                )
            }),
            check: Arc::new(|_, v| {
                completed(v)?["createUsersResult"]["userIds"][0].as_str().map(|_| false).ok_or("no userId".into())
            }),
        };
        let read = Scenario {
            name: "read (list_wallets)",
            path: "/public/v1/query/list_wallets",
            make: Arc::new(move |_| json!({"organizationId": org}).to_string()),
            check: Arc::new(|_, v| match v["wallets"].as_array().map(Vec::len) {
                Some(1) => Ok(false),
                _ => Err(format!("unexpected wallets: {v}")),
            }),
        };
        let pids = stack.pids();
        let (c, w, d) = (args.clients, args.warmup, args.duration);
        let writes = run_on(&write, &urls, pids, key.clone(), c, w, d, seq.clone()).await;
        let user_writes = run_on(&users, &urls, pids, key.clone(), c, w, d, seq.clone()).await;
        let mut reads = run_on(&read, &urls, pids, key.clone(), c, w, d, seq.clone()).await;
        let (mut writes, mut user_writes) = (writes, user_writes);
        if let Some(gateway) = second {
            // `pids` is the first gateway's only: no per-request figure for two.
            (writes.cpu, user_writes.cpu, reads.cpu) = (None, None, None);
            drop(gateway);
        }
        DATABASE_PID.store(0, Ordering::Relaxed);
        errors += writes.errors + user_writes.errors + reads.errors;
        rows.push((label, writes, user_writes, reads));
        if store == "sqlite" && args.store.is_none() {
            break;
        }
    }
    println!();
    println!("store comparison ({} clients, fresh stacks)", args.clients);
    println!(
        "{:<24} {:>10} {:>6} {:>11} {:>9} {:>6} {:>11} {:>9} {:>6} {:>11} {:>6}",
        "store",
        "policies/s",
        "p99 ms",
        "gw+db µs",
        "users/s",
        "p99 ms",
        "gw+db µs",
        "reads/s",
        "p99 ms",
        "gw+db µs",
        "errors"
    );
    // Server CPU per request, gateway + database (one gateway only).
    let cpu = |s: &Sample| match s.cpu {
        Some(c) if !s.latencies_us.is_empty() => {
            let per = |x: f64| x * 1e6 / s.latencies_us.len() as f64;
            format!("{:.0}+{:.0}", per(c.gateway), per(c.database))
        }
        _ => "-".into(),
    };
    for (label, p, u, r) in &rows {
        println!(
            "{label:<24} {:>10.0} {:>6.1} {:>11} {:>9.0} {:>6.1} {:>11} {:>9.0} {:>6.1} {:>11} {:>6}",
            p.rps(),
            p.pct(0.99),
            cpu(p),
            u.rps(),
            u.pct(0.99),
            cpu(u),
            r.rps(),
            r.pct(0.99),
            cpu(r),
            p.errors + u.errors + r.errors
        );
    }
    let find = |l: &str| rows.iter().find(|r| r.0 == l);
    if let (Some(sqlite), Some(pg)) = (find("SQLite, 1 gateway"), find("PostgreSQL, 1 gateway")) {
        let pass = |ok: bool| if ok { "PASS" } else { "FAIL" };
        let best = pg.1.rps().max(pg.2.rps());
        println!(
            "PostgreSQL durable writes, 1 gateway: {best:.0}/s (target ≥ {POSTGRES_WRITES_TARGET:.0}: {}); reads {:.0}/s vs SQLite's {:.0}/s ({})",
            pass(best >= POSTGRES_WRITES_TARGET),
            pg.3.rps(),
            sqlite.3.rps(),
            pass(pg.3.rps() >= sqlite.3.rps())
        );
    }
    let json = rows
        .iter()
        .map(|(label, p, u, r)| {
            json!({"store": label, "createPolicyPerSecond": p.rps(), "createPolicyP99Ms": p.pct(0.99),
                "createUsersPerSecond": u.rps(), "createUsersP99Ms": u.pct(0.99),
                "readsPerSecond": r.rps(), "readP99Ms": r.pct(0.99),
                "serverCpuUsPerRequest": {"createPolicy": cpu(p), "createUsers": cpu(u), "reads": cpu(r)}, "errors": p.errors + u.errors + r.errors})
        })
        .collect::<Vec<_>>();
    Ok((json!(json), errors))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    eprintln!("starting a fresh stack (binaries from {})", coffer_tests::bin_dir().display());
    // Health is also probed on the operations listener, as a load balancer would be pointed.
    let ops_addr = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    // The webhook scenario's receiver is a local one. One organization makes every request of
    // the main scenarios, well over the default per-organization replay quota (100,000 in the
    // 300 s window, a fairness limit between organizations, not what is measured here).
    let stack = Stack::start_with(&[
        ("COFFER_OPS_LISTEN", &ops_addr),
        ("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true"),
        ("COFFER_REPLAY_QUOTA_PER_ORGANIZATION", "1000000"),
        ("COFFER_HSM_NATIVE_KEYS_MAX", "16"),
        ("COFFER_CONSOLE", "true"),
    ])
    .await;
    let ops_health_url = format!("http://{ops_addr}/healthz");
    // For profilers: where the processes are.
    if let Ok(f) = std::env::var("COFFER_BENCH_PIDS") {
        let (e, g) = stack.pids();
        std::fs::write(f, format!("{} {}", e.unwrap_or(0), g.unwrap_or(0)))?;
    }
    let client = stack.client();
    let org = stack.organization_id.clone();

    // Keys the scenarios need.
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_WALLET",
        &org,
        json!({"walletName": "bench", "accounts": [
            {"curve":"CURVE_SECP256K1","pathFormat":"PATH_FORMAT_BIP32","path":"m/44'/60'/0'/0/0","addressFormat":"ADDRESS_FORMAT_ETHEREUM"},
            {"curve":"CURVE_ED25519","pathFormat":"PATH_FORMAT_BIP32","path":"m/44'/501'/0'/0'","addressFormat":"ADDRESS_FORMAT_SOLANA"}]}),
    );
    let key = Arc::new(stack.api_key());
    let r = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&key)).await;
    let addrs = &r.json["activity"]["result"]["createWalletResult"]["addresses"];
    let (eth, sol) =
        (addrs[0].as_str().context("wallet")?.to_string(), addrs[1].as_str().context("wallet")?.to_string());
    let body = envelope(
        "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2",
        &org,
        json!({"privateKeys": [{"privateKeyName": "bench-k1", "curve": "CURVE_SECP256K1", "privateKeyTags": [], "addressFormats": ["ADDRESS_FORMAT_ETHEREUM"]}]}),
    );
    let r = stack.post_raw("/public/v1/submit/create_private_keys", body.as_bytes(), Some(&key)).await;
    let pk = &r.json["activity"]["result"]["createPrivateKeysResultV2"]["privateKeys"][0];
    let (pk_id, pk_addr) = (
        pk["privateKeyId"].as_str().context("key")?.to_string(),
        pk["addresses"][0]["address"].as_str().context("key")?.to_string(),
    );
    // P-256 private keys: one sealed (this organization), one HSM-native and a secp256k1 one
    // where the module makes them (an organization with FEATURE_NAME_COFFER_HSM_NATIVE_KEYS).
    let private_key = |org: &str, name: &str, curve: &str, format: &str| {
        envelope(
            "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2",
            org,
            json!({"privateKeys": [{"privateKeyName": name, "curve": curve, "privateKeyTags": [], "addressFormats": [format]}]}),
        )
    };
    let made = |r: &coffer_tests::RawResponse| -> Option<(String, String)> {
        let pk = &r.json["activity"]["result"]["createPrivateKeysResultV2"]["privateKeys"][0];
        Some((pk["privateKeyId"].as_str()?.to_string(), pk["addresses"][0]["address"].as_str()?.to_string()))
    };
    let body = private_key(&org, "bench-p256", "CURVE_P256", "ADDRESS_FORMAT_COMPRESSED");
    let r = stack.post_raw("/public/v1/submit/create_private_keys", body.as_bytes(), Some(&key)).await;
    let p256_sealed = made(&r).context("a sealed P-256 key")?;
    let native_org = stack.gateway_cli(&["init-org", "--name", "native", "--api-public-key", &stack.api_public_key])
        ["organizationId"]
        .as_str()
        .context("native organization")?
        .to_string();
    let body = envelope(
        "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        &native_org,
        json!({"name": "FEATURE_NAME_COFFER_HSM_NATIVE_KEYS", "value": "on"}),
    );
    let r = stack.post_raw("/public/v1/submit/set_organization_feature", body.as_bytes(), Some(&key)).await;
    anyhow::ensure!(r.status == 200, "setting the HSM-native feature: {}", r.text);
    let body = private_key(&native_org, "native-p256", "CURVE_P256", "ADDRESS_FORMAT_COMPRESSED");
    let r = stack.post_raw("/public/v1/submit/create_private_keys", body.as_bytes(), Some(&key)).await;
    let p256_native = made(&r).context("an HSM-native P-256 key")?;
    let body = private_key(&native_org, "native-k1", "CURVE_SECP256K1", "ADDRESS_FORMAT_ETHEREUM");
    let r = stack.post_raw("/public/v1/submit/create_private_keys", body.as_bytes(), Some(&key)).await;
    // None where the module makes no secp256k1 keys (kryoptic).
    let k1_native = made(&r);
    drop(client);
    // A second organization (same API key) with a long history, for the page query.
    let history_org = stack.gateway_cli(&["init-org", "--name", "history", "--api-public-key", &stack.api_public_key])
        ["organizationId"]
        .as_str()
        .context("history organization")?
        .to_string();
    eprintln!("seeding {HISTORY} activities into a second organization's log...");
    seed_history(&stack, &history_org, HISTORY)?;
    // The main stack's peak resident memory after each phase (the issue's bound is per process,
    // over the whole bench): which phase raises it.
    let mut peaks_by_phase: Vec<(&'static str, Option<f64>, Option<f64>)> = Vec::new();
    let mut phase_peak = |phase: &'static str| {
        let (e, g) = stack.pids();
        peaks_by_phase.push((phase, peak_rss_mib(e), peak_rss_mib(g)));
    };
    phase_peak("seeding the history");

    let sign_body = |org: String, sign_with: String, hash: &'static str| -> MakeBody {
        Arc::new(move |n| {
            envelope(
                "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
                &org,
                json!({"signWith": sign_with, "payload": payload(n), "encoding": "PAYLOAD_ENCODING_HEXADECIMAL", "hashFunction": hash}),
            )
        })
    };
    let o = org.clone();
    let mut scenarios = vec![
        Scenario {
            name: "sign secp256k1 wallet account (HEX, KECCAK256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(org.clone(), eth.clone(), "HASH_FUNCTION_KECCAK256"),
            check: check_k1(eth.clone()),
        },
        Scenario {
            name: APP_PROOFS,
            path: "/public/v1/submit/sign_raw_payload",
            make: {
                let plain = sign_body(org.clone(), eth.clone(), "HASH_FUNCTION_KECCAK256");
                Arc::new(move |n| {
                    let mut body: Value = serde_json::from_str(&plain(n)).unwrap_or_default();
                    body["generateAppProofs"] = json!(true);
                    body.to_string()
                })
            },
            check: check_with_proof(check_k1(eth.clone())),
        },
        Scenario {
            name: "sign Ed25519 wallet account (NOT_APPLICABLE)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(org.clone(), sol.clone(), "HASH_FUNCTION_NOT_APPLICABLE"),
            check: check_ed(sol.clone()),
        },
        Scenario {
            name: "sign secp256k1 private key (HEX, KECCAK256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(org.clone(), pk_id.clone(), "HASH_FUNCTION_KECCAK256"),
            check: check_k1(pk_addr.clone()),
        },
        Scenario {
            name: "sign P-256 private key, sealed (HEX, SHA256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(org.clone(), p256_sealed.0.clone(), "HASH_FUNCTION_SHA256"),
            check: check_p256(p256_sealed.1.clone()),
        },
        Scenario {
            name: "sign P-256 private key, HSM-native (HEX, SHA256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(native_org.clone(), p256_native.0.clone(), "HASH_FUNCTION_SHA256"),
            check: check_p256(p256_native.1.clone()),
        },
        create_policy_scenario(o, "b".into()),
        Scenario {
            name: "read (list_activities, limit 10, 100k history)",
            path: "/public/v1/query/list_activities",
            make: Arc::new({
                let org = history_org.clone();
                move |_| json!({"organizationId": org, "paginationOptions": {"limit": "10"}}).to_string()
            }),
            check: Arc::new(|_, v| match v["activities"].as_array() {
                Some(a) if a.len() == 10 => Ok(false),
                _ => Err(format!("expected 10 activities: {v}")),
            }),
        },
        Scenario {
            name: "read (list_wallets)",
            path: "/public/v1/query/list_wallets",
            make: Arc::new({
                let org = org.clone();
                move |_| json!({"organizationId": org}).to_string()
            }),
            check: Arc::new(|_, v| {
                if v["wallets"].as_array().map(|w| w.len()) == Some(1) {
                    Ok(false)
                } else {
                    Err(format!("unexpected wallets: {v}"))
                }
            }),
        },
    ];
    if let Some((id, address)) = k1_native {
        scenarios.push(Scenario {
            name: "sign secp256k1 private key, HSM-native (HEX, KECCAK256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(native_org.clone(), id, "HASH_FUNCTION_KECCAK256"),
            check: check_k1(address),
        });
    }

    let floor_duration = args.duration.min(Duration::from_secs(5));
    eprintln!(
        "measuring the crypto floor ({} threads)...",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    );
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let floor_hsm = crypto_floor(&stack, Floor::Hsm, floor_duration, cores)?.ops_per_second;
    let floor_mem = crypto_floor(&stack, Floor::Memory, floor_duration, cores)?.ops_per_second;
    let floor_enclave = crypto_floor(&stack, Floor::Enclave, floor_duration, cores)?.ops_per_second;
    // CPU per operation on one thread (no contention for the token), to compare with the server
    // CPU each signed request costs.
    eprintln!("measuring the floors' CPU per operation (1 thread)...");
    let cpu_duration = floor_duration.min(Duration::from_secs(3));
    let floor_hsm_cpu = crypto_floor(&stack, Floor::Hsm, cpu_duration, 1)?.cpu_us_per_op;
    let floor_enclave_cpu = crypto_floor(&stack, Floor::Enclave, cpu_duration, 1)?.cpu_us_per_op;

    let seq = Arc::new(AtomicU64::new(1));
    let mut results = Vec::new();
    // A term of `--only` that is a whole section's name selects that section alone (`scale` is
    // part of `authority scale`); any other term, every scenario whose name contains it.
    let sections =
        [SCALE, AUTHORITY_SCALE, POLICY_COST, TENANT_ISOLATION, OTP_DELIVERY, WEBHOOK, ACTIVITY_LOG, CONSOLE, BURST];
    let wanted = |name: &str| {
        args.only
            .as_deref()
            .is_none_or(|o| o.split('|').any(|o| if sections.contains(&o) { name == o } else { name.contains(o) }))
    };
    // One client back to back: the latency figure.
    if wanted("1 client") {
        eprintln!("running: {} with 1 client", scenarios[0].name);
        let single = run(&scenarios[0], &stack, key.clone(), 1, args.warmup, args.duration, seq.clone()).await;
        results.push(("sign secp256k1 wallet account, 1 client", 1usize, single));
    }
    let (_, gateway) = stack.pids();
    let mut rss_growth = Vec::new();
    for sc in scenarios.iter().filter(|s| wanted(s.name)) {
        let before = peak_rss_mib(gateway);
        eprintln!("running: {} with {} clients", sc.name, args.clients);
        let s = run(sc, &stack, key.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
        results.push((sc.name, args.clients, s));
        rss_growth.push((sc.name, peak_rss_mib(gateway).zip(before).map(|(a, b)| a - b)));
    }
    phase_peak("the main scenarios");
    // Transaction signing as a user whose policy is evaluated, against raw signing by root.
    let transaction_report = if wanted(TRANSACTION) {
        let (signer, raw_scenario, scenario) = transaction_setup(&stack, &key, &org, &eth).await?;
        eprintln!("running: {RAW_NON_ROOT} with {} clients", args.clients);
        let raw =
            run(&raw_scenario, &stack, signer.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
        eprintln!("running: {TRANSACTION} with {} clients", args.clients);
        let s = run(&scenario, &stack, signer, args.clients, args.warmup, args.duration, seq.clone()).await;
        let root_raw = results.iter().find(|r| r.0 == scenarios[0].name && r.1 == args.clients).map(|r| r.2.rps());
        let ratio = s.rps() / raw.rps();
        let report = json!({
            "requestsPerSecond": s.rps(), "sameUserSignRawPayloadRequestsPerSecond": raw.rps(), "ratio": ratio,
            "rootSignRawPayloadRequestsPerSecond": root_raw, "ratioToRootRaw": root_raw.map(|r| s.rps() / r),
            "ratioTarget": TRANSACTION_RATIO_TARGET, "pass": ratio >= TRANSACTION_RATIO_TARGET,
        });
        results.push((RAW_NON_ROOT, args.clients, raw));
        results.push((TRANSACTION, args.clients, s));
        Some(report)
    } else {
        None
    };
    phase_peak("transaction signing");
    let webhook_report = if wanted(WEBHOOK) {
        let plain = results.iter().find(|r| r.0.starts_with("activity write")).map(|r| r.2.rps());
        eprintln!("running: {WEBHOOK} with {} clients", args.clients);
        Some(webhook_scenario(&stack, &args, seq.clone(), plain).await?)
    } else {
        None
    };
    let policy_report = if wanted(POLICY_COST) {
        let (report, samples) = policy_cost(&args, seq.clone()).await?;
        results.extend(samples);
        Some(report)
    } else {
        None
    };
    let tenant_report = if wanted(TENANT_ISOLATION) {
        let (report, samples) = tenant_isolation(&args, seq.clone()).await?;
        results.extend(samples);
        Some(report)
    } else {
        None
    };
    let otp_report = if wanted(OTP_DELIVERY) {
        eprintln!("running: {OTP_DELIVERY} ({OTP_PER_SECOND} init_otp a second)");
        Some(otp_delivery(&args).await?)
    } else {
        None
    };
    let scale_report = if wanted(AUTHORITY_SCALE) {
        let (report, samples) = authority_scale(&args, seq.clone()).await?;
        results.extend(samples.into_iter().map(|(name, s)| (name, args.clients, s)));
        Some(report)
    } else {
        None
    };
    let big_scale_report = if wanted(SCALE) {
        let (report, samples) = scale(&args, seq.clone()).await?;
        results.extend(samples.into_iter().map(|(name, s)| (name, args.clients, s)));
        Some(report)
    } else {
        None
    };
    let proofs_report = {
        let rps = |name: &str| results.iter().find(|r| r.0 == name && r.1 == args.clients).map(|r| r.2.rps());
        rps(APP_PROOFS).zip(rps(scenarios[0].name)).map(|(with, without)| {
            json!({
                "withAppProofsRequestsPerSecond": with, "withoutRequestsPerSecond": without,
                "ratio": with / without, "ratioTarget": APP_PROOFS_RATIO_TARGET, "pass": with / without >= APP_PROOFS_RATIO_TARGET,
            })
        })
    };
    phase_peak("webhooks");
    let log_report = if wanted(ACTIVITY_LOG) {
        eprintln!("running: {ACTIVITY_LOG} ({LOG_LINKS} links)");
        Some(activity_log_export(&stack, &key, &org, &eth, &seq).await?)
    } else {
        None
    };
    phase_peak("the activity log export");
    let console_report = if wanted(CONSOLE) {
        eprintln!("running: {CONSOLE} ({CONSOLE_ROUNDS} rounds)");
        Some(console_pages(&stack, &key, &org).await?)
    } else {
        None
    };
    // Last, as it is the most disruptive: thousands of signing clients at once.
    let burst_report = if wanted(BURST) {
        let clients = burst_fits(args.burst_clients);
        eprintln!("running: {BURST} ({clients} clients, {} rounds)", args.burst_rounds);
        Some(burst(&stack, &ops_health_url, &key, &scenarios[0], clients, args.burst_rounds, &seq).await)
    } else {
        None
    };

    phase_peak("the burst");
    let (enclave_pid, gateway_pid) = stack.pids();
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .trim()
                .to_string()))
            .unwrap_or_default()
    );
    println!("\nCoffer benchmark — {machine}");
    println!("crypto floor (stamp verify + HSM unseal + secp256k1 sign): {floor_hsm:.0} ops/s; without HSM: {floor_mem:.0} ops/s");
    println!("enclave floor (stamp verify + HSM MAC verify + HSM unseal + secp256k1 sign): {floor_enclave:.0} ops/s");
    let us = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0} µs"));
    println!(
        "CPU per operation, 1 thread: crypto floor {}, enclave floor {}",
        us(floor_hsm_cpu),
        us(floor_enclave_cpu)
    );
    println!(
        "{:<50} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>9}",
        "scenario", "clients", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors", "verified", "÷ floor"
    );
    let mut json_scenarios = Vec::new();
    for (name, clients, s) in &results {
        let ratio = s.rps() / floor_hsm;
        println!(
            "{:<50} {:>7} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>8} {:>8.1}%",
            name,
            clients,
            s.rps(),
            s.pct(0.5),
            s.pct(0.9),
            s.pct(0.99),
            s.pct(1.0),
            s.errors,
            s.verified,
            ratio * 100.0
        );
        let cpu = s.cpu.and_then(|c| c.per_request_us(s.latencies_us.len()));
        let signing = name.starts_with("sign");
        json_scenarios.push(json!({
            "name": name, "clients": clients, "requestsPerSecond": s.rps(), "requests": s.latencies_us.len(),
            "p50Ms": s.pct(0.5), "p90Ms": s.pct(0.9), "p99Ms": s.pct(0.99), "maxMs": s.pct(1.0),
            "errors": s.errors, "signaturesVerified": s.verified, "ratioToCryptoFloor": ratio,
            "serverCpuUsPerRequest": cpu.map(|(g, e, t)| json!({"gateway": g, "enclave": e, "total": t})),
            "serverCpuRatioToFloorCpu": if signing { cpu.zip(floor_hsm_cpu).map(|(c, f)| c.2 / f) } else { None },
        }));
    }
    println!("\nserver CPU per successful request (gateway + enclave utime+stime over the measured window)");
    println!("{:<50} {:>12} {:>12} {:>12} {:>14}", "scenario", "gateway µs", "enclave µs", "total µs", "÷ floor CPU");
    let cpu_row = |name: &str, cpu: Option<(f64, f64, f64)>, signing: bool| {
        let Some((g, e, t)) = cpu else {
            println!("{name:<50} {:>12}", "n/a");
            return;
        };
        let ratio = match floor_hsm_cpu {
            Some(f) if signing => format!("{:.2}×", t / f),
            _ => "—".into(),
        };
        println!("{name:<50} {g:>12.0} {e:>12.0} {t:>12.0} {ratio:>14}");
    };
    for (name, _, s) in &results {
        cpu_row(name, s.cpu.and_then(|c| c.per_request_us(s.latencies_us.len())), name.starts_with("sign"));
    }
    if let Some(b) = &burst_report {
        cpu_row(&format!("{BURST} (incl. shedding, probes)"), b.cpu.and_then(|c| c.per_request_us(b.signed)), true);
    }
    println!("{:<50} {:>12} {:>12} {:>12.0}", "crypto floor, 1 thread (per op)", "", "", floor_hsm_cpu.unwrap_or(0.0));
    let burst_json = burst_report.as_ref().map(|b| print_burst(b, floor_hsm_cpu));
    if let Some(p) = &proofs_report {
        println!(
            "signing with app proofs ÷ without: {:.1}% (target ≥ {:.0}%)",
            p["ratio"].as_f64().unwrap_or(0.0) * 100.0,
            APP_PROOFS_RATIO_TARGET * 100.0
        );
    }
    if let Some(l) = &log_report {
        println!(
            "activity log: {} links exported in {:.1} s, verified offline in {:.1} s",
            l["links"],
            l["exportSeconds"].as_f64().unwrap_or(0.0),
            l["verifySeconds"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(c) = &console_report {
        let pass = |v: &Value| if v.as_bool() == Some(true) { "PASS" } else { "MISSED" };
        println!(
            "console first load: {:.1} KB transferred (target ≤ {:.0} KB): {}",
            c["firstLoadBytes"].as_f64().unwrap_or(0.0) / 1024.0,
            CONSOLE_FIRST_LOAD_TARGET_BYTES / 1024.0,
            pass(&c["firstLoadPass"])
        );
        for p in c["pages"].as_array().into_iter().flatten() {
            println!(
                "console page {:<14} median {:>6.1} ms, slowest {:>6.1} ms (target ≤ {CONSOLE_PAGE_TARGET_MS:.0} ms): {}",
                p["page"].as_str().unwrap_or(""),
                p["medianMs"].as_f64().unwrap_or(0.0),
                p["maxMs"].as_f64().unwrap_or(0.0),
                pass(&p["pass"])
            );
        }
    }
    if let Some(t) = &transaction_report {
        let pct = |k: &str| t[k].as_f64().map_or("n/a".to_string(), |r| format!("{:.1}%", r * 100.0));
        println!(
            "sign_transaction ÷ sign_raw_payload throughput, same non-root user: {} (target ≥ {:.0}%); ÷ root's raw signing: {}",
            pct("ratio"),
            TRANSACTION_RATIO_TARGET * 100.0,
            pct("ratioToRootRaw")
        );
    }
    let rss = (peak_rss_mib(enclave_pid), peak_rss_mib(gateway_pid));
    println!(
        "peak RSS: enclave {:.1} MiB, gateway {:.1} MiB; startup to ready: enclave {:.0} ms, gateway {:.0} ms",
        rss.0.unwrap_or(0.0),
        rss.1.unwrap_or(0.0),
        stack.enclave_startup.as_secs_f64() * 1000.0,
        stack.gateway_startup.as_secs_f64() * 1000.0
    );
    let main_rss_pass = rss.0.zip(rss.1).is_some_and(|(e, g)| e <= MAIN_RSS_TARGET_MIB && g <= MAIN_RSS_TARGET_MIB);
    println!(
        "peak RSS of the main stack's enclave and gateway, target ≤ {MAIN_RSS_TARGET_MIB:.0} MiB each: {}",
        if main_rss_pass { "PASS" } else { "MISSED" }
    );
    for (name, growth) in &rss_growth {
        if let Some(g) = growth {
            println!("gateway peak RSS growth during {name}: {g:.1} MiB");
        }
    }
    let mib = |v: &Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    for (phase, e, g) in &peaks_by_phase {
        println!("peak RSS after {phase}: enclave {} MiB, gateway {} MiB", mib(e), mib(g));
    }
    let store_report = if args.store.is_some() || args.only.as_deref().is_some_and(|o| STORE.contains(o)) {
        Some(store_comparison(&args, seq.clone()).await?)
    } else {
        None
    };
    let report = json!({
        "storeComparison": store_report.as_ref().map(|r| r.0.clone()),
        "machine": machine,
        "clients": args.clients,
        "durationSeconds": args.duration.as_secs_f64(),
        "cryptoFloorOpsPerSecond": floor_hsm,
        "cryptoFloorWithoutHsmOpsPerSecond": floor_mem,
        "enclaveFloorOpsPerSecond": floor_enclave,
        "cryptoFloorCpuUsPerOp": floor_hsm_cpu,
        "enclaveFloorCpuUsPerOp": floor_enclave_cpu,
        "scenarios": json_scenarios,
        "burst": burst_json,
        "webhook": webhook_report,
        "authorityScale": scale_report,
        "scale": big_scale_report,
        "policyCost": policy_report,
        "tenantIsolation": tenant_report,
        "otpDelivery": otp_report,
        "transactionSigning": transaction_report,
        "appProofs": proofs_report,
        "activityLog": log_report,
        "console": console_report,
        "peakRssMiB": {"enclave": rss.0, "gateway": rss.1, "targetMiB": MAIN_RSS_TARGET_MIB, "pass": main_rss_pass},
        "peakRssMiBByPhase": peaks_by_phase.iter().map(|(p, e, g)| json!({"after": p, "enclave": e, "gateway": g})).collect::<Vec<_>>(),
        "gatewayPeakRssGrowthMiB": rss_growth.iter().map(|(n, g)| json!({"scenario": n, "growth": g})).collect::<Vec<_>>(),
        "startupMs": {"enclave": stack.enclave_startup.as_secs_f64() * 1000.0, "gateway": stack.gateway_startup.as_secs_f64() * 1000.0},
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    println!("written: {}", args.out.display());
    let errors: u64 = results.iter().map(|r| r.2.errors).sum::<u64>() + store_report.map_or(0, |r| r.1);
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
