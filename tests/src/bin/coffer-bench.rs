//! `coffer-bench`: signing, activity-write and read throughput of a real Coffer stack, reported
//! as ratios to the crypto floor (stamp verify + HSM unseal + sign) measured in the same run, and
//! the enclave floor (the same plus the credential certificate's HSM MAC check).

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
    duration: Duration,
    warmup: Duration,
    out: std::path::PathBuf,
    /// Run only scenarios whose name contains this text.
    only: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        clients: 32,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        out: std::path::PathBuf::from("target/bench/latest.json"),
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().context("flag needs a value");
        match flag.as_str() {
            "--clients" => a.clients = val()?.parse()?,
            "--duration" => a.duration = Duration::from_secs_f64(val()?.parse()?),
            "--warmup" => a.warmup = Duration::from_secs_f64(val()?.parse()?),
            "--out" => a.out = val()?.into(),
            "--only" => a.only = Some(val()?),
            "--help" | "-h" => {
                println!(
                    "coffer-bench [--clients N] [--duration SECONDS] [--warmup SECONDS] [--out FILE] [--only TEXT]"
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
}

impl Sample {
    fn rps(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
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
    stack_url: &str,
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
    for _ in 0..clients {
        let (http, key, sc, url) =
            (http.clone(), key.clone(), scenario.clone(), format!("{stack_url}{}", scenario.path));
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
    measuring.store(true, Ordering::Relaxed);
    let t = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut total = Sample { elapsed, ..Default::default() };
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

fn check_k1(address: String) -> CheckResponse {
    Arc::new(move |n, v| {
        let r = &completed(v)?["signRawPayloadResult"];
        if n % 16 != 0 {
            return Ok(false);
        }
        let sig = hex::decode(format!("{}{}", r["r"].as_str().unwrap_or(""), r["s"].as_str().unwrap_or("")))
            .map_err(|e| e.to_string())?;
        let sig = k256::ecdsa::Signature::from_slice(&sig).map_err(|e| e.to_string())?;
        let recid = k256::ecdsa::RecoveryId::from_byte(if r["v"] == "01" { 1 } else { 0 }).unwrap();
        let digest = sha3::Keccak256::digest(hex::decode(payload(n)).unwrap());
        let vk = k256::ecdsa::VerifyingKey::recover_from_prehash(&digest, &sig, recid).map_err(|e| e.to_string())?;
        let point = vk.to_encoded_point(false);
        let got = format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]));
        if got != address.to_lowercase() {
            return Err(format!("signature recovers to {got}, expected {address}"));
        }
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

/// The crypto floor of one signing request, in-process on the same token, one thread per core.
fn crypto_floor(stack: &Stack, floor: Floor, duration: Duration) -> anyhow::Result<f64> {
    use coffer_enclave::hsm::{BlobBinding, BlobKind, Hsm, HsmSettings};
    static HSM: std::sync::OnceLock<Arc<Hsm>> = std::sync::OnceLock::new();
    let (conf, label, pin) = stack.token();
    let hsm = HSM
        .get_or_init(|| {
            std::env::set_var("SOFTHSM2_CONF", &conf);
            Arc::new(
                Hsm::open(HsmSettings {
                    module: "/usr/lib/softhsm/libsofthsm2.so".into(),
                    token_label: label.into(),
                    pin: cryptoki::types::AuthPin::new(pin.to_string().into()),
                    pool_size: 16,
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
    let stamped: Vec<(String, coffer_gateway::auth::stamp::ApiStamp)> = (0..64)
        .map(|i| {
            let body = format!("{{\"organizationId\":\"bench\",\"n\":{i}}}");
            let h = key.stamp(body.as_bytes()).unwrap();
            (body, coffer_gateway::auth::stamp::parse(&h.value).unwrap())
        })
        .collect();
    let stamped = Arc::new(stamped);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (hsm, blob, stamped, count) = (hsm.clone(), blob.clone(), stamped.clone(), count.clone());
            let (certificate, mac) = (certificate.clone(), mac.clone());
            std::thread::spawn(move || {
                let mut i = t as u64;
                while Instant::now() < deadline {
                    let (body, stamp) = &stamped[(i % 64) as usize];
                    coffer_gateway::auth::stamp::verify(stamp, body.as_bytes()).expect("stamp verifies");
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
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("floor thread panicked"))?;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / duration.as_secs_f64())
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    eprintln!("starting a fresh stack (binaries from {})", coffer_tests::bin_dir().display());
    let stack = Stack::start().await;
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
    drop(client);
    // A second organization (same API key) with a long history, for the page query.
    let history_org = stack.gateway_cli(&["init-org", "--name", "history", "--api-public-key", &stack.api_public_key])
        ["organizationId"]
        .as_str()
        .context("history organization")?
        .to_string();
    eprintln!("seeding {HISTORY} activities into a second organization's log...");
    seed_history(&stack, &history_org, HISTORY)?;

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
    let run_id = std::process::id();
    let scenarios = [
        Scenario {
            name: "sign secp256k1 wallet account (HEX, KECCAK256)",
            path: "/public/v1/submit/sign_raw_payload",
            make: sign_body(org.clone(), eth.clone(), "HASH_FUNCTION_KECCAK256"),
            check: check_k1(eth.clone()),
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
            name: "activity write (create_policy, unique names)",
            path: "/public/v1/submit/create_policy",
            make: Arc::new(move |n| {
                envelope(
                    "ACTIVITY_TYPE_CREATE_POLICY_V3",
                    &o,
                    json!({"policyName": format!("bench-{run_id}-{n}"), "effect": "EFFECT_ALLOW", "condition": "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'", "notes": ""}),
                )
            }),
            check: Arc::new(|_, v| {
                completed(v)?["createPolicyResult"]["policyId"].as_str().map(|_| false).ok_or("no policyId".into())
            }),
        },
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

    let floor_duration = args.duration.min(Duration::from_secs(5));
    eprintln!(
        "measuring the crypto floor ({} threads)...",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    );
    let floor_hsm = crypto_floor(&stack, Floor::Hsm, floor_duration)?;
    let floor_mem = crypto_floor(&stack, Floor::Memory, floor_duration)?;
    let floor_enclave = crypto_floor(&stack, Floor::Enclave, floor_duration)?;

    let seq = Arc::new(AtomicU64::new(1));
    let mut results = Vec::new();
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    // One client back to back: the latency figure.
    if wanted("1 client") {
        eprintln!("running: {} with 1 client", scenarios[0].name);
        let single = run(&scenarios[0], &stack.base_url, key.clone(), 1, args.warmup, args.duration, seq.clone()).await;
        results.push(("sign secp256k1 wallet account, 1 client", 1usize, single));
    }
    let (_, gateway) = stack.pids();
    let mut rss_growth = Vec::new();
    for sc in scenarios.iter().filter(|s| wanted(s.name)) {
        let before = peak_rss_mib(gateway);
        eprintln!("running: {} with {} clients", sc.name, args.clients);
        let s = run(sc, &stack.base_url, key.clone(), args.clients, args.warmup, args.duration, seq.clone()).await;
        results.push((sc.name, args.clients, s));
        rss_growth.push((sc.name, peak_rss_mib(gateway).zip(before).map(|(a, b)| a - b)));
    }

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
        json_scenarios.push(json!({
            "name": name, "clients": clients, "requestsPerSecond": s.rps(), "requests": s.latencies_us.len(),
            "p50Ms": s.pct(0.5), "p90Ms": s.pct(0.9), "p99Ms": s.pct(0.99), "maxMs": s.pct(1.0),
            "errors": s.errors, "signaturesVerified": s.verified, "ratioToCryptoFloor": ratio,
        }));
    }
    let rss = (peak_rss_mib(enclave_pid), peak_rss_mib(gateway_pid));
    println!(
        "peak RSS: enclave {:.1} MiB, gateway {:.1} MiB; startup to ready: enclave {:.0} ms, gateway {:.0} ms",
        rss.0.unwrap_or(0.0),
        rss.1.unwrap_or(0.0),
        stack.enclave_startup.as_secs_f64() * 1000.0,
        stack.gateway_startup.as_secs_f64() * 1000.0
    );
    for (name, growth) in &rss_growth {
        if let Some(g) = growth {
            println!("gateway peak RSS growth during {name}: {g:.1} MiB");
        }
    }
    let report = json!({
        "machine": machine,
        "clients": args.clients,
        "durationSeconds": args.duration.as_secs_f64(),
        "cryptoFloorOpsPerSecond": floor_hsm,
        "cryptoFloorWithoutHsmOpsPerSecond": floor_mem,
        "enclaveFloorOpsPerSecond": floor_enclave,
        "scenarios": json_scenarios,
        "peakRssMiB": {"enclave": rss.0, "gateway": rss.1},
        "gatewayPeakRssGrowthMiB": rss_growth.iter().map(|(n, g)| json!({"scenario": n, "growth": g})).collect::<Vec<_>>(),
        "startupMs": {"enclave": stack.enclave_startup.as_secs_f64() * 1000.0, "gateway": stack.gateway_startup.as_secs_f64() * 1000.0},
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    println!("written: {}", args.out.display());
    let errors: u64 = results.iter().map(|r| r.2.errors).sum();
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
