//! `coffer-gateway`: `serve` the HTTP API, `init-org` bootstraps an organization, `keygen`
//! prints a fresh P-256 API key pair.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use coffer_gateway::config::GatewayConfig;
use coffer_gateway::custody::Custody;
use coffer_gateway::state::AppState;

#[derive(Parser)]
#[command(name = "coffer-gateway", about = "Coffer's HTTP gateway (holds no secrets)")]
struct Cli {
    /// TOML configuration file (see README); environment and flags override it.
    #[arg(long, env = "COFFER_GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// Store URL, e.g. sqlite://./.coffer/coffer.db (overrides the config).
    #[arg(long)]
    store_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Whom the commands that ask the public API ask: the gateway, the organization and an API key of
/// it (a file).
#[derive(clap::Args)]
struct ApiArgs {
    #[arg(long)]
    base_url: String,
    #[arg(long)]
    organization_id: String,
    #[arg(long)]
    api_key_file: PathBuf,
}

/// What `diff-state` and `rebuild` ask the organization's signed state with: [`ApiArgs`] and the
/// enclave's proof key (hex).
#[derive(clap::Args)]
struct StateArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[arg(long)]
    proof_key: String,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve {
        /// Listen address (overrides the config).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Enclave Unix socket (overrides the config).
        #[arg(long)]
        enclave_socket: Option<PathBuf>,
    },
    /// What each KEK holds: the enclave's view (current, seals counted, in the HSM, sealed
    /// service keys under it) and the blobs this gateway's store keeps under it. Prints JSON.
    KekStatus,
    /// Makes a new KEK current in the running enclave (stamped by the operator's key from
    /// COFFER_OPERATOR_KEY_FILE): new seals use it from then on; run `reseal` next.
    RotateKek,
    /// Moves every blob the store keeps that names an older KEK to the current one, through the
    /// enclave, while the service runs. Resumable: stop it at any point and run it again. Prints
    /// progress on stderr and a JSON report (moved, already current, failed) on stdout; exit
    /// status 1 if a blob did not open.
    Reseal {
        /// Blobs per enclave call (1 to 256).
        #[arg(long, default_value_t = 128)]
        batch: usize,
    },
    /// Destroys an old KEK in the HSM (stamped by the operator's key) once no stored blob names
    /// it. A backup of the store from before the re-seal names it still: its blobs never open
    /// again.
    DestroyKek {
        #[arg(long)]
        label: String,
    },
    /// Create an organization with a root user and its API public key, certified by the running
    /// enclave for the operator's stamp (key from COFFER_OPERATOR_KEY_FILE); prints the ids as JSON.
    InitOrg {
        #[arg(long, default_value = "Coffer organization")]
        name: String,
        #[arg(long, default_value = "root")]
        user_name: String,
        /// The root user's P-256 API public key, compressed hex.
        #[arg(long)]
        api_public_key: String,
        /// Enclave Unix socket (overrides the config).
        #[arg(long)]
        enclave_socket: Option<PathBuf>,
    },
    /// Create the gateway's store if it does not exist and bring its schema up to date (`serve`
    /// does the same when it starts); prints the store, redacted, as JSON. The one operator
    /// command that creates a store: the others refuse a store that does not exist.
    Migrate,
    /// Print a fresh P-256 API key pair as JSON (for development and tests).
    Keygen,
    /// Print the `X-Stamp` header's value for the request body read on stdin (at most 1 MiB),
    /// stamped with the API key read from a file (its P-256 private key as hex on the first line;
    /// never argv): for `curl -H "X-Stamp: …"` and other hand-made requests.
    Stamp {
        #[arg(long)]
        api_key_file: PathBuf,
    },
    /// Make the operator's key pair: the private key into a new file (mode 0600, never
    /// overwritten; an existing file is kept and read), the public key printed as JSON for the
    /// enclave's `operator_public_keys`.
    OperatorKeygen {
        /// The private key file to create (or read, if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// One-time upgrade: print, as JSON lines, the API keys and passkeys that have no enclave
    /// certificate (created before certificates existed), for `coffer-enclave certify-existing`.
    UncertifiedCredentials,
    /// One-time upgrade to the enclave's authority state: print, as JSON lines, the changes that
    /// build each given organization's state (and its sub-organizations') from this database, for
    /// `coffer-enclave import-authority-state` on the enclave host. It trusts the database now.
    AuthorityState {
        /// Root organization ids (their sub-organizations follow).
        #[arg(required = true)]
        organization_ids: Vec<String>,
    },
    /// One-time upgrade: store the certificates `coffer-enclave certify-existing` printed (JSON
    /// lines on stdin); each must match its credential row exactly.
    ImportCertificates,
    /// Export an organization's activity log through the public API, as JSON for `verify-log`:
    /// the head the enclave signs now, every link up to it and the activities they name. Stamped
    /// with an API key of the organization read from a file (its P-256 private key as hex).
    ExportLog {
        #[command(flatten)]
        api: ApiArgs,
        /// Where to write the export.
        #[arg(long)]
        out: PathBuf,
    },
    /// Check an exported activity log offline against the enclave's proof key (hex, from
    /// `/public/v1/discovery/keys` `proofPublicKey`): prints what verified, how old the signed
    /// head is and whether it was signed for this export (`fresh`), or the first activity that
    /// does not verify and why (exit status 1). An export whose head carries no nonce of its own
    /// (made by other means than `export-log`) may end at an old head: `fresh` is "unknown" and
    /// the exit status 2, unless `--allow-stale`.
    VerifyLog {
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        proof_key: String,
        #[arg(long)]
        allow_stale: bool,
    },
    /// Compare what the gateway's queries say of an organization (its users, credentials,
    /// policies, tags, root quorum, features, wallets, accounts, private keys, contract
    /// interfaces, webhook endpoints and OAuth 2.0 credentials) with the organization's state as
    /// the enclave enforces it, signed by its proof key for a nonce chosen here. The proof key
    /// (hex) must come from the enclave host, not from the gateway being checked. Prints every
    /// difference as JSON; exit status 1 when there is one (or when an item was shown twice, or
    /// the state has a kind this command does not know). Stamped with an API key of the
    /// organization read from a file. Catches a database edited under the gateway; a taken-over
    /// gateway process can answer this command's own queries consistently, so keep the signed
    /// state (`--state-out`) as the view to trust.
    DiffState {
        #[command(flatten)]
        state: StateArgs,
        /// Where to write the verified state (`{organizationId, version, signedAtMs, logSeq,
        /// logHead, entries}`).
        #[arg(long)]
        state_out: Option<PathBuf>,
    },
    /// Repair the gateway's records of an organization from its state as the enclave signs it
    /// (asked through `--base-url`, checked against the proof key): compared with the gateway's
    /// store of this process's configuration, read directly, and repaired in one transaction of
    /// it. Policies, tags, users' names, contacts and tags, and the root
    /// quorum are made the enclave's; users, credentials, contract interfaces, webhook endpoints
    /// and OAuth 2.0 credentials the enclave does not have are deleted. Wallets, accounts, private
    /// keys (sealed material only the gateway keeps) and what only the enclave has are listed,
    /// never rewritten. Then compares again. Prints `{before, repaired, left, after}` as JSON;
    /// exit status 1 when a difference remains. Run it with the organization quiet: it repairs
    /// what it finds at that moment. Arguments as `diff-state`'s.
    Rebuild {
        #[command(flatten)]
        state: StateArgs,
        /// Print what would be repaired, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Development bootstrap (idempotent): an organization with a root user and a fresh API
    /// key, written with the enclave signer key to `dev-org.json` (mode 0600).
    InitDev {
        /// Where to write dev-org.json.
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        base_url: String,
        #[arg(long)]
        auth_proxy_url: String,
        /// Enclave Unix socket (overrides the config).
        #[arg(long)]
        enclave_socket: Option<PathBuf>,
    },
}

/// Most bytes `stamp` reads (the gateway's default body limit).
const STAMP_BODY_LIMIT: u64 = 1 << 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut cfg = GatewayConfig::load(cli.config.as_deref())?;
    if let Some(u) = cli.store_url {
        cfg.store_url = u;
        cfg.named.store = true;
    }
    coffer_process::init_logging(&cfg.log);
    coffer_process::environment::warn_unknown(&[]);
    match cli.command {
        Command::ExportLog { api: ApiArgs { base_url, organization_id, api_key_file }, out } => {
            let key = coffer_gateway::activity_log::ApiKeyFile::read(&api_key_file)?;
            let log = coffer_gateway::activity_log::export(&base_url, &organization_id, &key).await?;
            std::fs::write(&out, serde_json::to_vec(&log)?)?;
            println!(
                "{}",
                serde_json::json!({ "links": log.links.len(), "activities": log.activities.len(), "out": out })
            );
            Ok(())
        }
        Command::VerifyLog { log, proof_key, allow_stale } => {
            let key = coffer_gateway::activity_log::proof_key(&proof_key)?;
            match coffer_gateway::activity_log::verify_file(&log, &key)? {
                Ok(v) => {
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                    let fresh = if v.fresh { serde_json::json!(true) } else { serde_json::json!("unknown") };
                    println!(
                        "{}",
                        serde_json::json!({
                            "verified": true, "links": v.links, "unlogged": v.unlogged, "fresh": fresh,
                            "headAgeMs": now_ms.saturating_sub(v.head_timestamp_ms),
                        })
                    );
                    if !v.fresh && !allow_stale {
                        std::process::exit(2);
                    }
                    Ok(())
                }
                Err(f) => {
                    println!(
                        "{}",
                        serde_json::json!({
                            "verified": false, "seq": f.seq, "activityId": f.activity_id, "reason": f.reason,
                        })
                    );
                    std::process::exit(1);
                }
            }
        }
        Command::DiffState {
            state: StateArgs { api: ApiArgs { base_url, organization_id, api_key_file }, proof_key },
            state_out,
        } => {
            let key = coffer_gateway::activity_log::ApiKeyFile::read(&api_key_file)?;
            let proof_key = coffer_gateway::activity_log::proof_key(&proof_key)?;
            let (diff, signed) =
                coffer_gateway::state_diff::diff(&base_url, &organization_id, &key, &proof_key).await?;
            if let Some(out) = state_out {
                let state = serde_json::json!({ "organizationId": signed.organization_id, "version": signed.version,
                    "signedAtMs": signed.timestamp_ms, "logSeq": signed.log.seq, "logHead": signed.log.head,
                    "entries": signed.entries });
                std::fs::write(&out, serde_json::to_vec_pretty(&state)?)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
            }
            println!("{}", serde_json::to_string(&diff)?);
            if !diff.agrees() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Rebuild {
            state: StateArgs { api: ApiArgs { base_url, organization_id, api_key_file }, proof_key },
            dry_run,
        } => {
            use coffer_gateway::{state_diff, state_rebuild};
            let key = coffer_gateway::activity_log::ApiKeyFile::read(&api_key_file)?;
            let proof_key = coffer_gateway::activity_log::proof_key(&proof_key)?;
            let store = cfg.operator_store()?;
            // The gateway's side read from the store rebuild writes, not from a gateway's answers.
            let sign = || state_diff::signed_state(&base_url, &organization_id, &key, &proof_key);
            let rebuilt = state_rebuild::rebuild(store.as_ref(), &organization_id, sign, !dry_run, &|| true).await?;
            // Applied: the report is printed whatever the comparison after it answers.
            let (remains, after) = match &rebuilt.after {
                None => (!rebuilt.before.agrees(), None),
                Some(Ok(diff)) => (!diff.agrees(), Some(serde_json::to_value(diff)?)),
                Some(Err(e)) => (true, Some(serde_json::json!({ "error": e.to_string() }))),
            };
            let report = serde_json::json!({ "organizationId": organization_id, "dryRun": dry_run,
                "before": rebuilt.before, "repaired": rebuilt.plan.repaired, "left": rebuilt.plan.left, "after": after });
            println!("{}", serde_json::to_string(&report)?);
            if remains {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Migrate => {
            let url = cfg.named_store_url()?;
            coffer_gateway::store::open(url)?;
            println!("{}", serde_json::json!({ "store": coffer_sql::redact(url), "migrated": true }));
            Ok(())
        }
        Command::Stamp { api_key_file } => {
            use std::io::Read;
            let key = coffer_gateway::activity_log::ApiKeyFile::read(&api_key_file)?;
            let mut body = Vec::new();
            std::io::stdin().take(STAMP_BODY_LIMIT + 1).read_to_end(&mut body)?;
            if body.len() as u64 > STAMP_BODY_LIMIT {
                anyhow::bail!("the body on stdin is over {STAMP_BODY_LIMIT} bytes");
            }
            println!("{}", key.stamp(&body));
            Ok(())
        }
        Command::Keygen => {
            let (public, private) = keygen();
            println!("{}", serde_json::json!({ "apiPublicKey": public, "apiPrivateKey": *private }));
            Ok(())
        }
        Command::OperatorKeygen { out } => {
            let key = if out.exists() {
                coffer_gateway::operator_key::OperatorKey::from_file(&out)?
            } else {
                coffer_gateway::operator_key::OperatorKey::create_file(&out)?
            };
            println!("{}", serde_json::json!({ "operatorPublicKey": key.public_key(), "operatorKeyFile": out }));
            Ok(())
        }
        Command::InitDev { out, base_url, auth_proxy_url, enclave_socket } => {
            if let Some(s) = enclave_socket {
                cfg.enclave_socket = s;
                cfg.enclave_sockets.clear();
                cfg.enclave_urls.clear();
            }
            init_dev(&cfg, &out, &base_url, &auth_proxy_url).await
        }
        Command::UncertifiedCredentials => {
            let store = cfg.operator_store()?;
            for c in store.uncertified_credentials()? {
                println!("{}", serde_json::to_string(&c)?);
            }
            Ok(())
        }
        Command::AuthorityState { organization_ids } => {
            let store = cfg.operator_store()?;
            for id in organization_ids {
                for line in coffer_gateway::orgs::authority_state_lines(store.as_ref(), &id)? {
                    println!("{line}");
                }
            }
            Ok(())
        }
        Command::ImportCertificates => {
            let store = cfg.operator_store()?;
            let n = coffer_gateway::orgs::import_certificates(store.as_ref(), std::io::stdin().lock())?;
            println!("{}", serde_json::json!({ "certificatesStored": n }));
            Ok(())
        }
        Command::KekStatus => {
            let custody = Custody::connect_all(cfg.operator_enclaves()?)?;
            let report = coffer_gateway::reseal::status(cfg.operator_store()?.as_ref(), &custody).await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::RotateKek => {
            let operator = cfg.operator_key()?;
            let custody = Custody::connect_all(cfg.operator_enclaves()?)?;
            let current = coffer_gateway::reseal::rotate(&custody, &operator).await?;
            println!("{}", serde_json::json!({ "current": current }));
            Ok(())
        }
        Command::Reseal { batch } => {
            let custody = Custody::connect_all(cfg.operator_enclaves()?)?;
            let store = cfg.operator_store()?;
            let report = coffer_gateway::reseal::reseal(store.as_ref(), &custody, batch, |table, moved| {
                eprintln!("{}", serde_json::json!({ "table": table, "moved": moved }));
            })
            .await?;
            println!("{}", serde_json::to_string(&report)?);
            if !report.failed.is_empty() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::DestroyKek { label } => {
            let operator = cfg.operator_key()?;
            let custody = Custody::connect_all(cfg.operator_enclaves()?)?;
            coffer_gateway::reseal::destroy(cfg.operator_store()?.as_ref(), &custody, &operator, &label).await?;
            println!("{}", serde_json::json!({ "destroyed": label }));
            Ok(())
        }
        Command::InitOrg { name, user_name, api_public_key, enclave_socket } => {
            if let Some(s) = enclave_socket {
                cfg.enclave_socket = s;
                cfg.enclave_sockets.clear();
                cfg.enclave_urls.clear();
                cfg.named.enclaves = true;
            }
            let store = cfg.operator_store()?;
            let enclaves = cfg.operator_enclaves()?;
            let operator = cfg.operator_key()?;
            let custody = Custody::connect_all(enclaves)?;
            let created = coffer_gateway::orgs::create_root_org(
                store.as_ref(),
                &custody,
                &operator,
                &name,
                &user_name,
                &api_public_key,
            )
            .await?;
            println!("{}", serde_json::to_string(&created)?);
            Ok(())
        }
        Command::Serve { listen, enclave_socket } => {
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if let Some(s) = enclave_socket {
                cfg.enclave_socket = s;
                cfg.enclave_sockets.clear();
                cfg.enclave_urls.clear();
            }
            serve(cfg).await
        }
    }
}

/// A fresh P-256 API key pair: (compressed public key hex, private key hex).
fn keygen() -> (String, zeroize::Zeroizing<String>) {
    let sk = p256::SecretKey::random(&mut rand_core::OsRng);
    let compressed = p256::EncodedPoint::from(sk.public_key()).compress();
    (hex::encode(compressed.as_bytes()), zeroize::Zeroizing::new(hex::encode(sk.to_bytes())))
}

async fn init_dev(
    cfg: &GatewayConfig,
    out: &std::path::Path,
    base_url: &str,
    auth_proxy_url: &str,
) -> anyhow::Result<()> {
    let store = cfg.open_store()?;
    if let Ok(text) = std::fs::read_to_string(out) {
        let existing: serde_json::Value = serde_json::from_str(&text)?;
        let org = existing["organizationId"].as_str().unwrap_or_default();
        let key = existing["apiPublicKey"].as_str().unwrap_or_default();
        // Reused only if its key carries an enclave certificate: a development organization made
        // before certificates existed could not sign, so a new one replaces it.
        let certified = store.api_key_by_public_key(org, key).is_ok_and(|k| !k.certificate.is_empty());
        if store.organization(org).is_ok() && certified {
            println!("{}", out.display());
            return Ok(());
        }
    }
    let operator = cfg.operator_key()?;
    // The signer key comes from the running enclave (retry while it starts).
    let custody = Custody::connect_all(cfg.enclave_endpoints())?;
    let mut signer = None;
    for _ in 0..100 {
        match custody.signer_public_key().await {
            Ok(key) => {
                signer = Some(hex::encode(key));
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    let signer = signer.ok_or_else(|| anyhow::anyhow!("enclave did not answer on {}", cfg.enclave_socket.display()))?;
    let (public, private) = keygen();
    let created = coffer_gateway::orgs::create_root_org(
        store.as_ref(),
        &custody,
        &operator,
        "Coffer development",
        "root",
        &public,
    )
    .await?;
    let doc = zeroize::Zeroizing::new(serde_json::to_string_pretty(&serde_json::json!({
        "baseUrl": base_url,
        "authProxyUrl": auth_proxy_url,
        "organizationId": created.organization_id,
        "userId": created.user_id,
        "apiPublicKey": public,
        "apiPrivateKey": *private,
        "enclaveSignerPublicKey": signer,
    }))?);
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(out)?;
    f.write_all(doc.as_bytes())?;
    println!("{}", out.display());
    Ok(())
}

async fn serve(cfg: GatewayConfig) -> anyhow::Result<()> {
    use coffer_gateway::serve::{serve, ConnectionLimits};
    let policy = cfg.policy_settings();
    tracing::info!(slots = policy.slots, per_organization = policy.per_organization, "policy evaluation share");
    if cfg.policy_cache_bytes != 0 {
        tracing::warn!(
            "policy_cache_bytes is no longer used: the enclave evaluates every policy (its state_cache_mib)"
        );
    }
    coffer_gateway::evaluation_share::configure(policy);
    let store = cfg.open_store()?;
    let custody = Custody::connect_all(cfg.enclave_endpoints())?;
    let limits = coffer_gateway::limits::Limits::new(&cfg);
    let state =
        Arc::new(AppState { store, custody, body_limit: cfg.body_limit, limits, webhooks: cfg.webhooks.clone() });
    let _webhooks = coffer_gateway::webhook_delivery::spawn(state.clone(), cfg.instance())?;
    coffer_gateway::catch_up::spawn(state.clone());
    let bind = |addr| coffer_gateway::serve::bind(addr, cfg.listen_backlog);
    let listener = bind(cfg.listen)?;
    let proxy_listener = bind(cfg.auth_proxy_listen)?;
    tracing::info!(listen = %listener.local_addr()?, auth_proxy = %proxy_listener.local_addr()?, ops = ?cfg.ops_listen, "gateway ready");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    // The connection cap, not the kernel's file limit, is what turns clients away: raise the soft
    // limit to the hard one and keep the cap below it (files for the store, the enclave, logs).
    let files = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    let limits = ConnectionLimits {
        max_connections: cfg.max_connections.min(files.saturating_sub(256).max(64) as usize),
        max_connections_per_ip: cfg.max_connections_per_ip,
        header_read_timeout: std::time::Duration::from_millis(cfg.header_read_timeout_ms),
        max_header_bytes: cfg.max_header_bytes,
        write_timeout: std::time::Duration::from_millis(cfg.write_timeout_ms),
    };
    tracing::info!(max_connections = limits.max_connections, open_file_limit = files, "connection limits");
    // The auth proxy and the operations listener get small caps of their own.
    let side_limits = ConnectionLimits { max_connections: 128, max_connections_per_ip: 128, ..limits };
    let proxy_router = coffer_gateway::auth_proxy::router(
        state.clone(),
        coffer_gateway::auth_proxy::ProxyLimits {
            per_config: cfg.auth_proxy_rate_limit_per_config,
            per_ip: cfg.auth_proxy_rate_limit_per_ip,
            otp_sends_per_ip_per_hour: cfg.auth_proxy_otp_sends_per_ip_per_hour,
            signups_per_ip_per_hour: cfg.auth_proxy_signups_per_ip_per_hour,
            range_factor: cfg.auth_proxy_range_factor,
        },
    );
    // Browsers reach the auth proxy directly: more connections than the operations listener.
    let proxy_limits = ConnectionLimits { max_connections: 2048, max_connections_per_ip: 256, ..limits };
    let proxy = tokio::spawn(serve(proxy_listener, proxy_router, proxy_limits, stopped()));
    let ops = match cfg.ops_listen {
        Some(addr) => Some(ops_thread(&cfg, addr, state.store.clone(), side_limits, stopped())?),
        None => None,
    };
    let shutdown = async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        let _ = stop_tx.send(true);
    };
    serve(listener, coffer_gateway::http::router(state, cfg.console), limits, shutdown).await?;
    proxy.await??;
    if let Some(ops) = ops {
        tokio::task::spawn_blocking(move || ops.join())
            .await?
            .map_err(|_| anyhow::anyhow!("operations thread panicked"))??;
    }
    Ok(())
}

/// The operations listener (`/healthz`, `/readyz`) on a thread and runtime of its own, with its
/// own enclave connection: when API traffic saturates the main runtime's workers, the kernel
/// still schedules this thread, so a health check is answered in milliseconds.
fn ops_thread(
    cfg: &GatewayConfig,
    addr: std::net::SocketAddr,
    store: Arc<dyn coffer_gateway::store::Store>,
    limits: coffer_gateway::serve::ConnectionLimits,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<std::io::Result<()>>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Bound and connected in the context of the runtime whose reactor drives them.
    let (listener, custody) = {
        let _in_ops_runtime = runtime.enter();
        (coffer_gateway::serve::bind(addr, cfg.listen_backlog)?, Custody::connect_all(cfg.enclave_endpoints())?)
    };
    let state = Arc::new(AppState {
        store,
        custody,
        body_limit: cfg.body_limit,
        limits: coffer_gateway::limits::Limits::new(cfg),
        webhooks: cfg.webhooks.clone(),
    });
    Ok(std::thread::Builder::new().name("coffer-ops".into()).spawn(move || {
        runtime.block_on(coffer_gateway::serve::serve(
            listener,
            coffer_gateway::http::ops_router(state),
            limits,
            stopped,
        ))
    })?)
}
