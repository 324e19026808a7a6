//! `coffer-enclave`: `init` creates the token's service keys; `serve` runs the gRPC service.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use coffer_enclave::config::EnclaveConfig;
use coffer_enclave::hsm::{Hsm, HsmSettings};
use coffer_enclave::service::EnclaveService;
use coffer_proto::v1::enclave_server::EnclaveServer;

#[derive(Parser)]
#[command(name = "coffer-enclave", about = "Coffer's HSM-backed key custody process")]
struct Cli {
    /// TOML configuration file (see README); environment and flags override it.
    #[arg(long, env = "COFFER_ENCLAVE_CONFIG")]
    config: Option<PathBuf>,
    /// Unix socket to listen on (overrides the config).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Token label (overrides the config).
    #[arg(long)]
    token_label: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the token (SO PIN from $COFFER_HSM_SO_PIN, user PIN as configured) if no token
    /// with the label exists. For development and CI with SoftHSM; real HSMs are provisioned
    /// with their vendor's tools.
    InitToken,
    /// Create the eight service keys in the token if missing (idempotent): the KEK, the bundle
    /// signer, the credential-certificate MAC key, the webhook signer, the proof key, the
    /// notarizer, the OIDC issuer key and the TLS fetcher's key (a module that cannot hold one
    /// gets it sealed, in the authority store). Prints what it created and the keys clients and
    /// auditors pin (the signer's and the proof key).
    Init,
    /// Serve the gRPC interface on the Unix socket.
    Serve,
    /// One-time upgrade, run by the operator on the enclave host: certify credentials created
    /// before certificates existed. Reads `coffer-gateway uncertified-credentials` JSON lines on
    /// stdin and prints each with its `certificate` (hex) for `coffer-gateway import-certificates`.
    /// It certifies what the database says: run it on a database you trust.
    CertifyExisting,
    /// One-time upgrade: builds the authority state of each organization that has none from
    /// `coffer-gateway authority-state` lines on stdin (trusting the gateway's records at that
    /// moment, on the enclave host); an organization that already has one is left alone.
    ImportAuthorityState,
    /// Lists the enclave's decisions (`allow`) that have no activity in the gateway's records:
    /// reads the gateway's activity fingerprints, one per line, from FILE (`-` = stdin), e.g.
    /// `sqlite3 coffer.db 'SELECT fingerprint FROM activities'`, and prints each unmatched
    /// decision as a JSON line (with the outcomes the log has after it for the same activity).
    /// Exits 1 if there is any, 0 otherwise. Reads the enclave's store as configured and stops if
    /// there is none there: it never creates one.
    Reconcile {
        /// The gateway's activity fingerprints, one per line; `-` reads stdin.
        #[arg(long, value_name = "FILE")]
        gateway_activities: PathBuf,
        /// Only decisions made at or after this time (ms since the Unix epoch). Default: all the
        /// log keeps (`decision_retention_days`).
        #[arg(long, default_value_t = 0)]
        since_ms: i64,
    },
}

/// The authority store, after the socket's directory exists (the default store file is in it).
fn open_store(cfg: &EnclaveConfig) -> anyhow::Result<Arc<dyn coffer_enclave::store::EnclaveStore>> {
    if let Some(dir) = cfg.socket.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let settings = cfg.store_settings();
    let store = coffer_enclave::store::open(&settings)?;
    tracing::info!(store = %coffer_enclave::store::redact(&settings.url), "authority store open");
    Ok(store)
}

/// The HSM under its profile, with `store` keeping the service keys the module cannot hold.
/// `creates_keys`: `init` (the module must offer key generation too).
fn open_hsm(
    cfg: &EnclaveConfig,
    store: &Arc<dyn coffer_enclave::store::EnclaveStore>,
    creates_keys: bool,
) -> anyhow::Result<Hsm> {
    Ok(Hsm::open(HsmSettings {
        module: cfg.pkcs11_module.clone(),
        token_label: cfg.token_label.clone(),
        pin: cfg.pin()?,
        pool_size: cfg.session_pool,
        profile: coffer_enclave::hsm::ModuleProfile::configured(&cfg.hsm_profile)?,
        shelf: Some(Arc::new(coffer_enclave::service_key_shelf::ServiceKeyShelf(store.clone()))),
        creates_keys,
        native_keys: coffer_enclave::hsm::NativeKeyBounds {
            total: cfg.hsm_native_keys_max,
            per_organization: cfg.hsm_native_keys_per_organization,
        },
    })?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // No core dumps: a crash must not write key material to disk.
    rlimit::setrlimit(rlimit::Resource::CORE, 0, 0).map_err(|e| anyhow::anyhow!("disabling core dumps: {e}"))?;
    let cli = Cli::parse();
    let mut cfg = EnclaveConfig::load(cli.config.as_deref())?;
    if let Some(s) = cli.socket {
        cfg.socket = s;
    }
    if let Some(t) = cli.token_label {
        cfg.token_label = t;
    }
    coffer_process::init_logging(&cfg.log);
    coffer_process::environment::warn_unknown(&[cfg.pin_env.as_str()]);

    match cli.command {
        Command::InitToken => {
            let profile = coffer_enclave::hsm::ModuleProfile::configured(&cfg.hsm_profile)?;
            if let Some(profile) = profile.filter(|p| !p.init_token) {
                anyhow::bail!(
                    "hsm_profile {:?}: this module's tokens (partitions) are made with its vendor's tools, not C_InitToken",
                    profile.name
                );
            }
            let so_pin = zeroize::Zeroizing::new(
                std::env::var("COFFER_HSM_SO_PIN")
                    .map_err(|_| anyhow::anyhow!("set COFFER_HSM_SO_PIN to initialize a token"))?,
            );
            let created = coffer_enclave::hsm::init_token(
                &cfg.pkcs11_module,
                &cfg.token_label,
                &cryptoki::types::AuthPin::new(Box::from(so_pin.as_str())),
                &cfg.pin()?,
            )?;
            println!("{}", serde_json::json!({ "tokenCreated": created, "tokenLabel": cfg.token_label }));
            Ok(())
        }
        Command::Init => {
            let mut hsm = open_hsm(&cfg, &open_store(&cfg)?, true)?;
            // The KEK and the signer first, then the sealing self-test (which settles a Luna in
            // FIPS mode), and only then the service keys, some of which are sealed under the KEK.
            let mut created = hsm.init_resident_keys()?;
            hsm.self_test()?;
            created.extend(hsm.init_service_keys()?);
            if !created.is_empty() && !hsm.profile().sees_other_processes_objects {
                eprintln!(
                    "hsm_profile {:?}: this module shows a running enclave the keys another process made only after it restarts: restart every running enclave on this token",
                    hsm.profile().name
                );
            }
            let signer = hex::encode(hsm.signer_public_key()?);
            // The keys clients and auditors pin, printed where they are made: not taken from a
            // gateway that may be lying.
            let proof = hex::encode(hsm.proof_public_key()?);
            println!(
                "{}",
                serde_json::json!({ "created": created, "enclaveSignerPublicKey": signer, "proofPublicKey": proof })
            );
            Ok(())
        }
        Command::Serve => serve(cfg).await,
        Command::ImportAuthorityState => {
            use std::io::BufRead;
            let store = coffer_enclave::store::open(&cfg.store_settings())?;
            // An organization's records are taken as they are, above a cap too (made before the
            // enclave decided the caps): such an organization may then shrink, not grow.
            let rules = coffer_enclave::decider::Decider::new(store).limited(coffer_org_rules::Limits::UNBOUNDED);
            let (mut built, mut kept) = (0usize, 0usize);
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(&line)?;
                let org = v["organizationId"].as_str().ok_or_else(|| anyhow::anyhow!("missing organizationId"))?;
                let changes: Vec<coffer_org_rules::Change> = serde_json::from_value(v["changes"].clone())?;
                if rules.import(org, &changes)? {
                    built += 1;
                } else {
                    kept += 1;
                }
            }
            println!("{}", serde_json::json!({ "organizationsBuilt": built, "organizationsKept": kept }));
            Ok(())
        }
        Command::CertifyExisting => {
            use std::io::BufRead;
            let store = open_store(&cfg)?;
            let hsm = Arc::new(open_hsm(&cfg, &store, false)?);
            let admission = coffer_enclave::admission::Admission::new(hsm, 0, store);
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if line.trim().is_empty() {
                    continue;
                }
                let mut v: serde_json::Value = serde_json::from_str(&line)?;
                let field = |k: &str| v[k].as_str().map(str::to_string).ok_or_else(|| anyhow::anyhow!("missing {k}"));
                let cert = coffer_proto::v1::CredentialCertificate {
                    organization_id: field("organizationId")?,
                    user_id: field("userId")?,
                    credential_type: field("credentialType")?,
                    public_key: field("publicKey")?,
                    expires_at_ms: v["expiresAtMs"].as_u64().unwrap_or(0),
                    issuing_fingerprint: "operator:certify-existing".into(),
                    mac: vec![],
                    session_scope: String::new(),
                };
                tracing::info!(
                    target: "coffer_audit",
                    decision = "allow",
                    operation = "certify_existing",
                    organization = %cert.organization_id,
                    credential = %cert.public_key,
                    "enclave decision"
                );
                // The credential enters its organization's authority state too (the same trust).
                use coffer_org_rules::model::CredentialKind;
                let kind = match v["kind"].as_str() {
                    Some("apiKey") => Some(CredentialKind::ApiKey),
                    Some("authenticator") => Some(CredentialKind::Passkey),
                    Some("oauthProvider") => Some(CredentialKind::OauthIdentity),
                    _ => None,
                };
                if let Some(kind) = kind {
                    let credential = coffer_org_rules::Credential {
                        id: field("id")?,
                        user_id: cert.user_id.clone(),
                        kind,
                        credential_type: cert.credential_type.clone(),
                        public_key: cert.public_key.clone(),
                        expires_at_ms: cert.expires_at_ms,
                    };
                    if !admission.rules().adopt_credential(&cert.organization_id, credential)? {
                        eprintln!(
                            "{}: not added to the authority state (no state for its organization or user, or already there)",
                            field("id")?
                        );
                    }
                }
                v["certificate"] = hex::encode(admission.certify(cert)?).into();
                println!("{v}");
            }
            Ok(())
        }
        Command::Reconcile { gateway_activities, since_ms } => {
            let unmatched = reconcile(&cfg, &gateway_activities, since_ms)?;
            if unmatched > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// `reconcile`: prints the `allow` decisions since `since_ms` whose fingerprint the gateway's
/// records (`activities`, one fingerprint a line) lack; returns how many.
fn reconcile(cfg: &EnclaveConfig, activities: &std::path::Path, since_ms: i64) -> anyhow::Result<usize> {
    use coffer_enclave::store::{DecisionRecord, OUTCOME_ALLOW};
    use std::collections::{HashMap, HashSet};
    use std::io::{BufRead, Write};
    let input: Box<dyn BufRead> = if activities.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file =
            std::fs::File::open(activities).map_err(|e| anyhow::anyhow!("reading {}: {e}", activities.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut known = HashSet::new();
    for line in input.lines() {
        let line = line?;
        let fingerprint = line.trim();
        if !fingerprint.is_empty() {
            known.insert(fingerprint.to_string());
        }
    }
    // Never a new store: a reconciliation against an empty one would find nothing, and say so.
    let store = coffer_enclave::store::open_existing(&cfg.store_settings())?;
    // (organization, operation, fingerprint) of each unmatched allow → the decision and the
    // outcomes logged after it for the same activity and operation.
    let mut unmatched: Vec<(DecisionRecord, Vec<String>)> = Vec::new();
    let mut index: HashMap<(String, String, String), usize> = HashMap::new();
    let (mut scanned, mut allowed) = (0usize, 0usize);
    const PAGE: usize = 10_000;
    let (mut since, mut skip) = (since_ms, 0usize);
    loop {
        let page = store.decisions(since, PAGE)?;
        let full = page.len() == PAGE;
        let last_at = page.last().map(|d| d.at_ms);
        let at_last = page.iter().filter(|d| Some(d.at_ms) == last_at).count();
        for d in page.into_iter().skip(skip) {
            scanned += 1;
            let key = (d.organization_id.clone(), d.operation.clone(), d.fingerprint.clone());
            if d.outcome == OUTCOME_ALLOW {
                allowed += 1;
                if !known.contains(&d.fingerprint) {
                    index.insert(key, unmatched.len());
                    unmatched.push((d, Vec::new()));
                }
            } else if let Some(i) = index.get(&key) {
                unmatched[*i].1.push(format!("{}:{}", d.outcome, d.reason));
            }
        }
        match last_at {
            Some(at) if full => {
                // The next page starts at the last millisecond again: skip what was seen of it.
                skip = if at == since { skip + at_last } else { at_last };
                since = at;
            }
            _ => break,
        }
    }
    let mut out = std::io::stdout().lock();
    for (d, later) in &unmatched {
        let line = serde_json::json!({
            "atMs": d.at_ms,
            "organizationId": d.organization_id,
            "operation": d.operation,
            "fingerprint": d.fingerprint,
            "activityType": d.activity_type,
            "userId": d.user_id,
            "outcome": d.outcome,
            "laterOutcomes": later,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    eprintln!(
        "{}",
        serde_json::json!({
            "decisionsScanned": scanned,
            "allowed": allowed,
            "gatewayActivities": known.len(),
            "unmatched": unmatched.len(),
        })
    );
    Ok(unmatched.len())
}

async fn serve(cfg: EnclaveConfig) -> anyhow::Result<()> {
    let started_at_ms = coffer_enclave::admission::now_ms();
    let store = open_store(&cfg)?;
    let mut hsm = open_hsm(&cfg, &store, false)?;
    // Seal and open under the KEK before any request: a profile that does not fit the module is
    // refused now, with the profile to try, not found when a user signs.
    hsm.self_test()?;
    tracing::info!(profile = hsm.profile().name, "sealing self-test passed");
    // Sealed service keys a rotation did not get to move (it stopped after making the new KEK
    // current) move now.
    let moved = hsm.reseal_service_keys()?;
    if moved > 0 {
        tracing::info!(moved, kek = %hsm.current_kek()?, "sealed service keys moved to the current KEK");
    }
    let hsm = Arc::new(hsm);
    let signer = hsm.signer_public_key()?;
    let admission = Arc::new(
        coffer_enclave::admission::Admission::new(
            hsm.clone(),
            (cfg.freshness_window_secs as i64).saturating_mul(1000),
            store,
        )
        .limited(cfg.limits())
        .state_cache(cfg.state_cache_mib.saturating_mul(1 << 20))
        .signup_quota(cfg.auth_proxy_signups_per_hour, cfg.auth_proxy_signups_per_day)
        .signup_replay_quota(cfg.replay_quota_per_signup, cfg.replay_all_signups()),
    );
    tracing::info!(
        max_webhook_endpoints_per_organization = cfg.max_webhook_endpoints_per_organization,
        max_policies_per_organization = cfg.max_policies_per_organization,
        max_policy_text_bytes_per_organization = cfg.max_policy_text_bytes_per_organization,
        state_cache_mib = cfg.state_cache_mib,
        "organization rules"
    );
    match std::fs::remove_file(&cfg.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let listener = tokio::net::UnixListener::bind(&cfg.socket)?;
    // The owner and its group may connect: with separate users (deploy/systemd), the gateway's
    // user is in the socket's group and the directory keeps everyone else out.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o660))?;
    }
    tracing::info!(
        socket = %cfg.socket.display(),
        token = %cfg.token_label,
        signer = %hex::encode(signer),
        "enclave ready"
    );
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("installing the SIGTERM handler: {e}"))?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    };
    let mailer = coffer_enclave::mail::Mailer::from_settings(&cfg.otp)?;
    tracing::info!("{}", mailer.describe());
    let sms = coffer_enclave::sms::SmsSender::from_settings(&cfg.otp)?;
    tracing::info!("{}", sms.describe());
    let operators = cfg.operator_keys()?;
    if operators.is_empty() {
        tracing::warn!("no operator_public_keys configured: BootstrapOrganization refuses every call");
    }
    // HSM-native keys nothing holds (a call that failed after making them, a deletion whose
    // destruction failed) go, at start and every ten minutes, once older than any request that
    // could still hold them.
    {
        let (hsm, admission) = (hsm.clone(), admission.clone());
        let grace_ms = (cfg.freshness_window_secs as i64).saturating_mul(2000).max(600_000);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(600));
            loop {
                every.tick().await;
                let (hsm, admission) = (hsm.clone(), admission.clone());
                let swept = tokio::task::spawn_blocking(move || {
                    coffer_enclave::service::remove_unheld_native_keys(&hsm, &admission, grace_ms)
                })
                .await;
                match swept {
                    Ok(Ok(0)) | Err(_) => {}
                    Ok(Ok(n)) => tracing::info!(n, "HSM-native keys nothing holds were destroyed"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "HSM-native keys nothing holds were not swept"),
                }
            }
        });
    }
    let service = Arc::new(
        EnclaveService::new(hsm, admission, Arc::new(cfg.login.clone()))
            .with_otp(cfg.otp.clone(), mailer, sms)
            .with_operators(coffer_enclave::operator::Operators::new(operators))
            .with_boot_proof(coffer_enclave::proofs::BootFacts {
                configuration_digest: {
                    use sha2::Digest;
                    // The configuration as read (no secret is in it: PINs and passwords are in
                    // files or variables it only names).
                    hex::encode(sha2::Sha256::digest(format!("{cfg:?}").as_bytes()))
                },
                pkcs11_module: cfg.pkcs11_module.display().to_string(),
                token_label: cfg.token_label.clone(),
                started_at_ms,
            }),
    );
    // Over TCP, only a client presenting a certificate of `client_ca` gets a connection: what
    // the Unix socket's file permissions decide for a local gateway.
    let tcp = match (cfg.tcp_listen, &cfg.tls) {
        (Some(addr), Some(files)) => {
            let read = |p: &std::path::Path| {
                std::fs::read(p)
                    .map(zeroize::Zeroizing::new)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
            };
            let (cert, key, ca) = (read(&files.cert)?, read(&files.key)?, read(&files.client_ca)?);
            let tls = tonic::transport::ServerTlsConfig::new()
                .identity(tonic::transport::Identity::from_pem(&*cert, &*key))
                .client_ca_root(tonic::transport::Certificate::from_pem(&*ca));
            let server = tonic::transport::Server::builder()
                .tls_config(tls)?
                .add_service(EnclaveServer::from_arc(service.clone()));
            let listener = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(address = %listener.local_addr()?, "enclave serving TCP with mutual TLS");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            Some(tokio::spawn(server.serve_with_incoming(incoming)))
        }
        _ => None,
    };
    tonic::transport::Server::builder()
        .add_service(EnclaveServer::from_arc(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    if let Some(tcp) = tcp {
        tcp.abort();
    }
    let _ = std::fs::remove_file(&cfg.socket);
    Ok(())
}
