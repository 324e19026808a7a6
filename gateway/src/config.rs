//! Gateway configuration: a TOML file, then `COFFER_*` environment overrides, then flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::custody::transport::EnclaveTls;

/// `coffer-gateway.toml`. Every field has a documented default; unknown keys are refused.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// HTTP listen address of the API. Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// HTTP listen address of the auth proxy. Default `127.0.0.1:8081`.
    pub auth_proxy_listen: SocketAddr,
    /// Auth proxy calls per second per config id and per client address group (an IPv4 /24, an
    /// IPv6 /64: `limits::address_group`; bursts of one second's worth); past them a JSON 429. 0
    /// turns a limit off. Defaults 100 and 20. The per-config limit counts only calls otherwise
    /// accepted (a known config, an allowed origin, a JSON body, a known route) that do work for
    /// the visitor: not `wallet_kit_config` / `wallet_kit_client_params`. Environment:
    /// `COFFER_AUTH_PROXY_RATE_LIMIT_PER_CONFIG`, `COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP`.
    pub auth_proxy_rate_limit_per_config: u32,
    pub auth_proxy_rate_limit_per_ip: u32,
    /// One-time codes the auth proxy sends (`otp_init`) for one client address group (an IPv4 /24,
    /// an IPv6 /64: `limits::address_group`) an hour, all of
    /// which may go at once (`COFFER_AUTH_PROXY_OTP_SENDS_PER_IP_PER_HOUR`; 0: off). The
    /// enclave's own limits per contact and per organization still apply: this keeps one address
    /// from spending the organization's.
    pub auth_proxy_otp_sends_per_ip_per_hour: u32,
    /// Sign-ups (`signup_v2`, each a new sub-organization) the auth proxy accepts from one client
    /// address group an hour — an IPv4 /24 or an IPv6 /64 (`limits::address_group`) — all of
    /// which may go at once (`COFFER_AUTH_PROXY_SIGNUPS_PER_IP_PER_HOUR`; 0: off). Default 20:
    /// far below what the organization may create in an hour, so that one address cannot spend
    /// it for every other visitor.
    pub auth_proxy_signups_per_ip_per_hour: u32,
    /// How many times a group's allowance the range it is in has, for each of the three per-group
    /// limits above: an IPv4 /16, an IPv6 /48 (`limits::address_range`; a free tunnel broker
    /// hands out a /48, 65,536 /64 groups). Default 10: a /48 or /16 signs up 200 times an hour,
    /// sends 300 codes an hour and makes 200 calls a second. 0: no range limit. Environment:
    /// `COFFER_AUTH_PROXY_RANGE_FACTOR`.
    pub auth_proxy_range_factor: u32,
    /// Store URL: `sqlite://PATH`, or `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (a Unix socket
    /// directory as a percent-encoded host, e.g. `postgres://coffer@%2Frun%2Fpostgresql/coffer`).
    /// Default `sqlite://./.coffer/coffer.db`. Environment: `COFFER_STORE_URL`.
    pub store_url: String,
    /// The enclave's Unix socket. Default `./.coffer/enclave.sock`.
    pub enclave_socket: PathBuf,
    /// Several enclaves sharing one HSM's keys, each call going to the next one that is up
    /// (`custody::transport::Failover`); when set, `enclave_socket` is not used. Environment:
    /// `COFFER_ENCLAVE_SOCKETS`, comma-separated. Default: none.
    pub enclave_sockets: Vec<PathBuf>,
    /// Enclaves over TCP, `https://HOST:PORT` each, reached with mutual TLS (`enclave_tls`);
    /// used beside `enclave_sockets` (and instead of `enclave_socket`). Environment:
    /// `COFFER_ENCLAVE_URLS`, comma-separated. Default: none.
    pub enclave_urls: Vec<String>,
    /// The gateway's TLS files for `enclave_urls`, required with them. Environment:
    /// `COFFER_ENCLAVE_CLIENT_TLS_CA`, `COFFER_ENCLAVE_CLIENT_TLS_CERT`, `COFFER_ENCLAVE_CLIENT_TLS_KEY`.
    pub enclave_tls: Option<EnclaveTls>,
    /// Which of the store and the enclaves were named (in the file, the environment or a flag)
    /// rather than left to their defaults: operator commands never work on a default.
    #[serde(skip)]
    pub named: Named,
    /// Largest request body accepted, in bytes. Default 1 MiB (a 400 KiB contract ABI fits).
    pub body_limit: usize,
    /// Log filter (tracing `EnvFilter` syntax). Default `info`.
    pub log: String,
    /// Longest wait for a request body once its headers arrived, in milliseconds; a slower
    /// client gets a JSON 408 and its request slot back. Default 10,000.
    pub body_read_timeout_ms: u64,
    /// Requests served at once per class — signing (`submit/sign_*`), other submissions, queries;
    /// beyond that a request is answered at once with a JSON 503 and `Retry-After: 1` instead of
    /// queueing. Health and discovery have no limit. Defaults 64, 256, 1,024: a slot should not
    /// wait longer than the latency a client accepts, so size signing as (signatures per second
    /// the machine sustains) × (target latency) / 2 — 64 fits a 2-core machine's ~1,200/s and a
    /// 250 ms p99 (see docs/performance.md "Performance").
    pub max_in_flight_signing: usize,
    pub max_in_flight_writes: usize,
    pub max_in_flight_reads: usize,
    /// Open API connections at once, and from one client address; past them a connection gets a
    /// JSON 503 and is closed. The global cap is lowered to fit the open-file limit. Defaults
    /// 10,000 and 5,000 (a load balancer funnels many clients through one address).
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// Proxies whose `X-Forwarded-For` names the client (CIDRs; IPv4 or IPv6): from a peer in
    /// them, the client is the right-most address of the header that is not itself a trusted
    /// proxy; from any other peer, the header is ignored and the client is the peer. Read by the
    /// IP allowlists (README "IP allowlists"). Default: none (the header is never read).
    /// Environment: `COFFER_TRUSTED_PROXIES`, comma-separated.
    pub trusted_proxies: Vec<String>,
    /// Longest wait for a request's headers, from a connection's start or its previous response:
    /// slow-header and idle connections are closed. Default 10,000 ms.
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line plus headers) in bytes, at least 8,192; past it (or
    /// past 100 headers) a JSON 431. Default 65,536.
    pub max_header_bytes: usize,
    /// Longest a write to a client may make no progress (a client that sends requests and never
    /// reads the answers) before its connection is closed. Default 30,000 ms.
    pub write_timeout_ms: u64,
    /// Connections the kernel queues for each listener before the gateway accepts them (capped by
    /// `net.core.somaxconn`). Default 4,096, so a burst of new clients is accepted and answered
    /// (or shed with a JSON 503) instead of dropped and retried by the client's TCP a second
    /// later.
    pub listen_backlog: u32,
    /// Requests per second allowed from one client address and for one credential, with bursts
    /// of one second's worth; past them a JSON 429 with `Retry-After`. 0 turns a limit off.
    /// Defaults 0 and 0 (off: a load balancer funnels many clients through one address, and
    /// the in-flight bounds already shed overload).
    pub rate_limit_per_ip: u32,
    pub rate_limit_per_credential: u32,
    /// A second listener serving only `/healthz`, `/readyz` (and `/metrics`) on its own
    /// connections, so a flood of API traffic can never crowd out a health check. Default: none
    /// (the API listener serves them too, outside the in-flight limits).
    pub ops_listen: Option<SocketAddr>,
    /// Policy dry runs asked of the enclave at once. 0 (the default) is the machine's cores. Env
    /// `COFFER_POLICY_THREADS`.
    pub policy_threads: usize,
    /// Dry runs of one top-level organization (with its sub-organizations) at once, so one
    /// organization cannot take them all.
    /// 0 (the default) is half of `policy_threads`, at least 1; at most `policy_threads`. Env
    /// `COFFER_POLICY_THREADS_PER_ORGANIZATION`.
    pub policy_threads_per_organization: usize,
    /// Longest wait for an evaluation slot (the organization's share, then a slot); past it a
    /// JSON 503 with `Retry-After: 1`. Default 10,000 ms. Env `COFFER_POLICY_QUEUE_TIMEOUT_MS`.
    pub policy_queue_timeout_ms: u64,
    /// No longer used: the gateway compiles no policy (the enclave evaluates them, its state
    /// cache bounded by `state_cache_mib`). Accepted so that a configuration naming it still
    /// starts; the gateway warns. Env `COFFER_POLICY_CACHE_BYTES`.
    pub policy_cache_bytes: usize,
    /// Policies one organization may have, as the gateway's early check (a 400 before any work;
    /// concurrent creations can all pass it): the cap is the enclave's own
    /// `max_policies_per_organization`, decided as each change commits. Keep the two equal.
    /// Default 100,000. Env `COFFER_MAX_POLICIES_PER_ORGANIZATION`.
    pub max_policies_per_organization: usize,
    /// `[webhooks]`: delivery targets and limits.
    pub webhooks: WebhookSettings,
    /// This gateway's name among several on one database: the webhook deliveries it holds are
    /// leased in this name, and a gateway that starts again under it takes them back at once
    /// (another gateway's lapse after their lease). Env `COFFER_INSTANCE_ID`. Default: the host
    /// name and the listen port.
    pub instance_id: Option<String>,
    /// The operator's private key file, for the operator commands (`init-org`, `init-dev`) that
    /// ask the enclave to bootstrap an organization (`operator_key`). Readable by the operator's
    /// account only; `serve` never reads it. Env `COFFER_OPERATOR_KEY_FILE`. Default: none.
    pub operator_key_file: Option<PathBuf>,
    /// Serve the operator console at `/console` (static pages compiled into the gateway that
    /// stamp every request in the browser: README "The console"). Env `COFFER_CONSOLE=true`.
    /// Default false: a gateway serves only the API unless its operator asks for the pages.
    pub console: bool,
}

/// `[webhooks]` of `coffer-gateway.toml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Allow `http://` and loopback/private targets (development only; `make run` turns it on).
    /// Env `COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS=true`. Default false.
    pub allow_private_targets: bool,
    /// Endpoints one organization may have, as the gateway's early check (a 400 before any work;
    /// concurrent creations can all pass it): the cap is the enclave's own
    /// `max_webhook_endpoints_per_organization`, decided as each change commits. Default 10.
    pub max_endpoints_per_organization: usize,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self { allow_private_targets: false, max_endpoints_per_organization: 10 }
    }
}

/// What a configuration names explicitly ([`GatewayConfig::named`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Named {
    /// `store_url`, `COFFER_STORE_URL` or `--store-url`.
    pub store: bool,
    /// `enclave_socket(s)`, `enclave_urls`, their `COFFER_` variables or `--enclave-socket`.
    pub enclaves: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("valid default"),
            auth_proxy_listen: "127.0.0.1:8081".parse().expect("valid default"),
            auth_proxy_rate_limit_per_config: 100,
            auth_proxy_rate_limit_per_ip: 20,
            auth_proxy_otp_sends_per_ip_per_hour: 30,
            auth_proxy_signups_per_ip_per_hour: 20,
            auth_proxy_range_factor: 10,
            store_url: "sqlite://./.coffer/coffer.db".into(),
            enclave_socket: PathBuf::from("./.coffer/enclave.sock"),
            enclave_sockets: Vec::new(),
            enclave_urls: Vec::new(),
            enclave_tls: None,
            named: Named::default(),
            body_limit: 1024 * 1024,
            log: "info".into(),
            body_read_timeout_ms: 10_000,
            max_in_flight_signing: 64,
            max_in_flight_writes: 256,
            max_in_flight_reads: 1024,
            max_connections: 10_000,
            max_connections_per_ip: 5_000,
            trusted_proxies: Vec::new(),
            header_read_timeout_ms: 10_000,
            write_timeout_ms: 30_000,
            max_header_bytes: 64 * 1024,
            listen_backlog: 4096,
            rate_limit_per_ip: 0,
            rate_limit_per_credential: 0,
            ops_listen: None,
            policy_threads: 0,
            policy_threads_per_organization: 0,
            policy_queue_timeout_ms: crate::evaluation_share::DEFAULT_QUEUE_TIMEOUT_MS,
            policy_cache_bytes: 0,
            max_policies_per_organization: crate::evaluation_share::DEFAULT_MAX_POLICIES,
            webhooks: WebhookSettings::default(),
            instance_id: None,
            operator_key_file: None,
            console: false,
        }
    }
}

impl GatewayConfig {
    /// The operator's key from `operator_key_file` (operator commands only).
    pub fn operator_key(&self) -> anyhow::Result<crate::operator_key::OperatorKey> {
        let path = self.operator_key_file.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "no operator key: set COFFER_OPERATOR_KEY_FILE (or operator_key_file) to the operator's key file \
                 (`coffer-gateway operator-keygen --out FILE` makes one; the enclave lists its public key in operator_public_keys)"
            )
        })?;
        crate::operator_key::OperatorKey::from_file(path)
    }

    /// [`GatewayConfig::instance_id`], or the host name and the listen port.
    pub fn instance(&self) -> String {
        match &self.instance_id {
            Some(id) if !id.trim().is_empty() => id.trim().to_string(),
            _ => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "gateway".into());
                format!("{host}:{}", self.listen.port())
            }
        }
    }

    /// Reads `path` if given (a missing file is an error), then applies environment overrides.
    pub fn load(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        Self::load_with(path, &|name| std::env::var(name).ok())
    }

    /// [`GatewayConfig::load`] with the environment `env` answers (a variable that is not
    /// UTF-8 is unset).
    pub fn load_with(path: Option<&std::path::Path>, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let mut cfg: Self = coffer_process::read_config(path)?;
        // What was named, as the values it left (an empty one names nothing; one not read, a
        // variable that is not UTF-8, names nothing either).
        let in_file = coffer_process::config_keys(path)?;
        let named =
            |key: &str, var: &str| in_file.iter().any(|f| f == key) || env(var).is_some_and(|v| !v.trim().is_empty());
        let (store_named, socket_named) =
            (named("store_url", "COFFER_STORE_URL"), named("enclave_socket", "COFFER_ENCLAVE_SOCKET"));
        if let Some(v) = env("COFFER_LISTEN") {
            cfg.listen = v.parse().map_err(|e| anyhow::anyhow!("COFFER_LISTEN: {e}"))?;
        }
        for (var, field) in [
            ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_CONFIG", &mut cfg.auth_proxy_rate_limit_per_config),
            ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", &mut cfg.auth_proxy_rate_limit_per_ip),
            ("COFFER_AUTH_PROXY_OTP_SENDS_PER_IP_PER_HOUR", &mut cfg.auth_proxy_otp_sends_per_ip_per_hour),
            ("COFFER_AUTH_PROXY_SIGNUPS_PER_IP_PER_HOUR", &mut cfg.auth_proxy_signups_per_ip_per_hour),
            ("COFFER_AUTH_PROXY_RANGE_FACTOR", &mut cfg.auth_proxy_range_factor),
        ] {
            if let Some(v) = env(var) {
                *field = v.trim().parse().map_err(|e| anyhow::anyhow!("{var}: {e}"))?;
            }
        }
        if let Some(v) = env("COFFER_AUTH_PROXY_LISTEN") {
            cfg.auth_proxy_listen = v.parse().map_err(|e| anyhow::anyhow!("COFFER_AUTH_PROXY_LISTEN: {e}"))?;
        }
        if let Some(v) = env("COFFER_OPS_LISTEN") {
            cfg.ops_listen = match v.trim() {
                "" => None,
                addr => Some(addr.parse().map_err(|e| anyhow::anyhow!("COFFER_OPS_LISTEN: {e}"))?),
            };
        }
        if let Some(v) = env("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS") {
            cfg.webhooks.allow_private_targets = match v.trim() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                other => anyhow::bail!("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS: {other:?} is not true or false"),
            };
        }
        if let Some(v) = env("COFFER_CONSOLE") {
            cfg.console = match v.trim() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                other => anyhow::bail!("COFFER_CONSOLE: {other:?} is not true or false"),
            };
        }
        if let Some(v) = env("COFFER_OPERATOR_KEY_FILE") {
            cfg.operator_key_file = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = env("COFFER_STORE_URL") {
            cfg.store_url = v;
        }
        if let Some(v) = env("COFFER_ENCLAVE_SOCKET") {
            cfg.enclave_socket = v.into();
        }
        if let Some(v) = env("COFFER_ENCLAVE_SOCKETS") {
            cfg.enclave_sockets = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(PathBuf::from).collect();
        }
        if let Some(v) = env("COFFER_ENCLAVE_URLS") {
            cfg.enclave_urls = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        }
        let tls_env =
            ["COFFER_ENCLAVE_CLIENT_TLS_CA", "COFFER_ENCLAVE_CLIENT_TLS_CERT", "COFFER_ENCLAVE_CLIENT_TLS_KEY"]
                .map(|k| env(k).map(PathBuf::from));
        if let [Some(ca), Some(cert), Some(key)] = tls_env {
            cfg.enclave_tls = Some(EnclaveTls { ca, cert, key });
        } else if tls_env.iter().any(Option::is_some) {
            anyhow::bail!("COFFER_ENCLAVE_CLIENT_TLS_CA, _CERT and _KEY go together");
        }
        cfg.named = Named {
            store: store_named,
            enclaves: (socket_named && !cfg.enclave_socket.as_os_str().is_empty())
                || !cfg.enclave_sockets.is_empty()
                || !cfg.enclave_urls.is_empty(),
        };
        if let Some(url) = cfg.enclave_urls.iter().find(|u| !u.starts_with("https://")) {
            anyhow::bail!("enclave URL {url:?}: enclaves over TCP are reached with mutual TLS, https:// only");
        }
        if !cfg.enclave_urls.is_empty() && cfg.enclave_tls.is_none() {
            anyhow::bail!("enclave_urls need enclave_tls (ca, cert, key): enclaves over TCP use mutual TLS");
        }
        if let Some(v) = env("COFFER_TRUSTED_PROXIES") {
            cfg.trusted_proxies = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        }
        if let Some(bad) = cfg.trusted_proxies.iter().find(|p| crate::client_address::parse_network(p).is_none()) {
            anyhow::bail!("trusted_proxies: {bad:?} is not an address or a CIDR (such as 10.0.0.0/8)");
        }
        if let Some(v) = env("COFFER_INSTANCE_ID") {
            cfg.instance_id = Some(v);
        }
        if let Some(v) = env("COFFER_BODY_LIMIT") {
            cfg.body_limit = v.parse().map_err(|e| anyhow::anyhow!("COFFER_BODY_LIMIT: {e}"))?;
        }
        for (name, field) in [
            ("COFFER_BODY_READ_TIMEOUT_MS", &mut cfg.body_read_timeout_ms as &mut dyn SetFromEnv),
            ("COFFER_MAX_IN_FLIGHT_SIGNING", &mut cfg.max_in_flight_signing),
            ("COFFER_MAX_IN_FLIGHT_WRITES", &mut cfg.max_in_flight_writes),
            ("COFFER_MAX_IN_FLIGHT_READS", &mut cfg.max_in_flight_reads),
            ("COFFER_MAX_CONNECTIONS", &mut cfg.max_connections),
            ("COFFER_MAX_CONNECTIONS_PER_IP", &mut cfg.max_connections_per_ip),
            ("COFFER_HEADER_READ_TIMEOUT_MS", &mut cfg.header_read_timeout_ms),
            ("COFFER_WRITE_TIMEOUT_MS", &mut cfg.write_timeout_ms),
            ("COFFER_MAX_HEADER_BYTES", &mut cfg.max_header_bytes),
            ("COFFER_LISTEN_BACKLOG", &mut cfg.listen_backlog),
            ("COFFER_RATE_LIMIT_PER_IP", &mut cfg.rate_limit_per_ip),
            ("COFFER_RATE_LIMIT_PER_CREDENTIAL", &mut cfg.rate_limit_per_credential),
            ("COFFER_POLICY_THREADS", &mut cfg.policy_threads),
            ("COFFER_POLICY_THREADS_PER_ORGANIZATION", &mut cfg.policy_threads_per_organization),
            ("COFFER_POLICY_QUEUE_TIMEOUT_MS", &mut cfg.policy_queue_timeout_ms),
            ("COFFER_POLICY_CACHE_BYTES", &mut cfg.policy_cache_bytes),
            ("COFFER_MAX_POLICIES_PER_ORGANIZATION", &mut cfg.max_policies_per_organization),
        ] {
            if let Some(v) = env(name) {
                field.set(&v).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            }
        }
        Ok(cfg)
    }

    /// The enclaves the gateway talks to: `enclave_sockets` and `enclave_urls`, or else
    /// `enclave_socket`.
    pub fn enclave_endpoints(&self) -> Vec<crate::custody::transport::EnclaveEndpoint> {
        use crate::custody::transport::EnclaveEndpoint;
        let mut out: Vec<EnclaveEndpoint> = self.enclave_sockets.iter().cloned().map(EnclaveEndpoint::Unix).collect();
        if let Some(tls) = &self.enclave_tls {
            out.extend(self.enclave_urls.iter().map(|url| EnclaveEndpoint::Tls { url: url.clone(), tls: tls.clone() }));
        }
        if out.is_empty() {
            out.push(EnclaveEndpoint::Unix(self.enclave_socket.clone()));
        }
        out
    }

    /// The policy evaluation settings (slots, per-organization share, policy cap).
    pub fn policy_settings(&self) -> crate::evaluation_share::PolicySettings {
        crate::evaluation_share::PolicySettings::new(
            self.policy_threads,
            self.policy_threads_per_organization,
            self.policy_queue_timeout_ms,
            self.max_policies_per_organization,
        )
    }

    /// Opens the store `store_url` names: `sqlite://PATH`, or `postgres://…` for a database that
    /// several gateways share.
    pub fn open_store(&self) -> anyhow::Result<std::sync::Arc<dyn crate::store::Store>> {
        Ok(crate::store::open(&self.store_url)?)
    }

    /// The store an operator command works on: named explicitly, and existing (never created).
    pub fn operator_store(&self) -> anyhow::Result<std::sync::Arc<dyn crate::store::Store>> {
        Ok(crate::store::open_existing(self.named_store_url()?)?)
    }

    /// The store URL an operator command may use: one named, as something (an empty name names
    /// nothing), never the default.
    pub fn named_store_url(&self) -> anyhow::Result<&str> {
        if !self.named.store || self.store_url.trim().is_empty() {
            anyhow::bail!(
                "no gateway store named: pass --store-url, set COFFER_STORE_URL, or give store_url in --config \
                 (operator commands never use the default {})",
                GatewayConfig::default().store_url
            );
        }
        Ok(&self.store_url)
    }

    /// The enclaves an operator command asks: named explicitly.
    pub fn operator_enclaves(&self) -> anyhow::Result<Vec<crate::custody::transport::EnclaveEndpoint>> {
        if !self.named.enclaves {
            anyhow::bail!(
                "no enclave named: pass --enclave-socket, set COFFER_ENCLAVE_SOCKET (or COFFER_ENCLAVE_SOCKETS, \
                 COFFER_ENCLAVE_URLS), or give enclave_socket in --config (operator commands never use the default {})",
                GatewayConfig::default().enclave_socket.display()
            );
        }
        Ok(self.enclave_endpoints())
    }
}

/// A numeric setting overridden from the environment.
trait SetFromEnv {
    fn set(&mut self, v: &str) -> Result<(), std::num::ParseIntError>;
}

impl<T: std::str::FromStr<Err = std::num::ParseIntError>> SetFromEnv for T {
    fn set(&mut self, v: &str) -> Result<(), std::num::ParseIntError> {
        *self = v.trim().parse()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one list of environment variables (`coffer_process::environment`) names exactly those
    /// this crate reads as the gateway's: one read here and not listed would never be warned
    /// about as unknown, and would be missing from the documentation; one listed and not read
    /// would be silently ignored.
    #[test]
    fn the_environment_list_names_exactly_what_the_gateway_reads() {
        use coffer_process::environment::{read_and_listed, Reader};
        let (read, listed) = read_and_listed(env!("CARGO_MANIFEST_DIR"), Reader::Gateway);
        assert_eq!(read, listed);
    }

    /// docs/configuration.md's gateway table is this code's: every key with its default, the
    /// variable that sets it (found by setting each variable the gateway reads), and the
    /// variables that set no key.
    #[test]
    fn the_configuration_table_is_the_code() {
        use coffer_process::config_table::{check_documented, Exceptions};
        const CA: (&str, &str) = ("COFFER_ENCLAVE_CLIENT_TLS_CA", "/sample/ca");
        const CERT: (&str, &str) = ("COFFER_ENCLAVE_CLIENT_TLS_CERT", "/sample/cert");
        const KEY: (&str, &str) = ("COFFER_ENCLAVE_CLIENT_TLS_KEY", "/sample/key");
        let exceptions = Exceptions {
            with: &[
                (CA.0, &[CERT, KEY]),
                (CERT.0, &[CA, KEY]),
                (KEY.0, &[CA, CERT]),
                ("COFFER_ENCLAVE_URLS", &[CA, CERT, KEY]),
            ],
            refused_otherwise: &[],
        };
        let load = |env: &dyn Fn(&str) -> Option<String>| {
            let cfg = GatewayConfig::load_with(None, env).map_err(|e| e.to_string())?;
            serde_json::to_value(cfg).map_err(|e| e.to_string())
        };
        let defaults = serde_json::to_value(GatewayConfig::default()).unwrap();
        let doc = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md"));
        let reader = coffer_process::environment::Reader::Gateway;
        let section = "The gateway: `coffer-gateway.toml`";
        if let Err(e) = check_documented(doc, section, &defaults, reader, &load, &exceptions) {
            panic!("{e}");
        }
    }

    #[test]
    fn defaults_unknown_keys_and_store_url() {
        let cfg: GatewayConfig = toml::from_str("body_limit = 10").unwrap();
        assert_eq!(cfg.body_limit, 10);
        assert_eq!(cfg.listen.port(), 8080);
        assert!(toml::from_str::<GatewayConfig>("bodylimit = 10").is_err());
        assert_eq!(cfg.store_url, "sqlite://./.coffer/coffer.db");
        let bad = GatewayConfig { store_url: "mysql://u:secret@x/db".into(), ..GatewayConfig::default() };
        let err = bad.open_store().err().expect("an unknown scheme is refused").to_string();
        assert!(err.contains("unsupported store URL") && !err.contains("secret"), "{err}");
    }
}
