//! `coffer-gateway`: `serve` the HTTP API, `init-org` bootstraps an organization, `keygen`
//! prints a fresh P-256 API key pair.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use coffer_gateway::config::GatewayConfig;
use coffer_gateway::state::AppState;
use coffer_gateway::store::SqliteStore;

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
    /// Create an organization with a root user and its API public key; prints the ids as JSON.
    InitOrg {
        #[arg(long, default_value = "Coffer organization")]
        name: String,
        #[arg(long, default_value = "root")]
        user_name: String,
        /// The root user's P-256 API public key, compressed hex.
        #[arg(long)]
        api_public_key: String,
    },
    /// Print a fresh P-256 API key pair as JSON (for development and tests).
    Keygen,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut cfg = GatewayConfig::load(cli.config.as_deref())?;
    if let Some(u) = cli.store_url {
        cfg.store_url = u;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COFFER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log)),
        )
        .json()
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Keygen => {
            let sk = p256::SecretKey::random(&mut rand_core::OsRng);
            let pk = sk.public_key().to_sec1_bytes();
            let compressed = p256::EncodedPoint::from(sk.public_key()).compress();
            let _ = pk;
            println!(
                "{}",
                serde_json::json!({
                    "apiPublicKey": hex::encode(compressed.as_bytes()),
                    "apiPrivateKey": hex::encode(sk.to_bytes()),
                })
            );
            Ok(())
        }
        Command::InitOrg { name, user_name, api_public_key } => {
            let store = SqliteStore::open(&cfg.sqlite_path()?)?;
            let created = coffer_gateway::orgs::create_root_org(&store, &name, &user_name, &api_public_key)?;
            println!("{}", serde_json::to_string(&created)?);
            Ok(())
        }
        Command::Serve { listen, enclave_socket } => {
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if let Some(s) = enclave_socket {
                cfg.enclave_socket = s;
            }
            serve(cfg).await
        }
    }
}

async fn serve(cfg: GatewayConfig) -> anyhow::Result<()> {
    let store = Arc::new(SqliteStore::open(&cfg.sqlite_path()?)?);
    let enclave = coffer_gateway::enclave_client::connect(cfg.enclave_socket.clone())?;
    let state = Arc::new(AppState { store, enclave, body_limit: cfg.body_limit });
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, "gateway ready");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    };
    axum::serve(listener, coffer_gateway::http::router(state)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}
