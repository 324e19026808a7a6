//! Enclave configuration: a TOML file, then environment overrides, then command-line flags.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `coffer-enclave.toml`. Every field has a documented default; unknown keys are refused.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnclaveConfig {
    /// PKCS#11 module. Default: SoftHSM's `/usr/lib/softhsm/libsofthsm2.so`.
    pub pkcs11_module: PathBuf,
    /// Label of the token holding Coffer's keys. Default `coffer`.
    pub token_label: String,
    /// Name of the environment variable holding the user PIN. Default `COFFER_HSM_PIN`.
    pub pin_env: String,
    /// A file holding the user PIN (first line); used when set, instead of `pin_env`.
    pub pin_file: Option<PathBuf>,
    /// Most PKCS#11 sessions open for operations at once (callers past it wait), kept open for
    /// reuse; the module profile's own limit, less the anchor session, caps it. Default 16.
    pub session_pool: usize,
    /// What the enclave may assume about the PKCS#11 module (README "Pointing the enclave at a
    /// real HSM"): `auto` (from the module's manufacturer), `softhsm`, `kryoptic`, `cloudhsm`,
    /// `luna`, `luna-fips`, `nshield`, `nshield-fips`, `yubihsm`, `gcp-kms` or `generic`. Default `auto`.
    /// Environment: `COFFER_HSM_PROFILE`.
    pub hsm_profile: String,
    /// Most HSM-native keys (`FEATURE_NAME_COFFER_HSM_NATIVE_KEYS`: private keys made and used
    /// in the module, never exported) the token may hold, every organization together: each is
    /// an object of the module, whose storage is finite and shared. 0 (the default) offers none:
    /// an organization with the feature then has its `create_private_keys` refused. Environment:
    /// `COFFER_HSM_NATIVE_KEYS_MAX`.
    pub hsm_native_keys_max: u64,
    /// Most HSM-native keys one top-level organization may hold, its sub-organizations' with it
    /// (the auth proxy's sign-ups are sub-organizations of one): no tenant takes the token's
    /// whole bound. Default 100. Environment: `COFFER_HSM_NATIVE_KEYS_PER_ORGANIZATION`.
    pub hsm_native_keys_per_organization: u64,
    /// Unix socket the gRPC service listens on. Default `./.coffer/enclave.sock`.
    pub socket: PathBuf,
    /// Log filter (tracing `EnvFilter` syntax). Default `info`.
    pub log: String,
    /// How far (seconds) a stamped body's `timestampMs` may be from the enclave's clock. Default 300.
    pub freshness_window_secs: u64,
    /// Most stamped bodies remembered for replay refusal, all organizations together (about 150
    /// bytes each in the authority store); when full of live entries, new key operations are
    /// refused as busy (`REFUSAL_REASON_REPLAY_WINDOW_FULL`). Default 2,000,000.
    pub replay_capacity: usize,
    /// Most live replay entries one top-level organization may hold (its requests and its
    /// sub-organizations' of the last freshness window); past it that organization's key
    /// operations are refused as busy (`REFUSAL_REASON_ORGANIZATION_REPLAY_QUOTA`) while the
    /// others go on. Default 100,000 (over 300 requests a second for the default 300 s window).
    /// Environment: `COFFER_REPLAY_QUOTA_PER_ORGANIZATION`.
    pub replay_quota_per_organization: u64,
    /// Most live replay entries of one sign-up's own requests (a sub-organization the auth proxy
    /// made: anyone can get one), inside its top-level organization's share. Default 1,000 (over
    /// 3 requests a second for the default 300 s window): a small part of the sign-ups' lane, so
    /// that it takes many sign-ups to fill it. Environment: `COFFER_REPLAY_QUOTA_PER_SIGNUP`.
    pub replay_quota_per_signup: u64,
    /// The part of a top-level organization's `replay_quota_per_organization`, in percent, that
    /// all its sign-ups' own requests may hold together; the rest is for the organization, its
    /// auth proxy and its other sub-organizations. 0 to 100 (0 leaves them one entry), default
    /// 50. Environment:
    /// `COFFER_REPLAY_SIGNUPS_SHARE_PERCENT`.
    pub replay_signups_share_percent: u64,
    /// Most sign-ups (`create_sub_organization`) the auth proxy's key stamps for one
    /// organization's auth proxy in an hour, counted by the enclave in the authority store (so by
    /// every enclave on it together); past it the proxy's sign-ups are refused as busy
    /// (`REFUSAL_REASON_SIGNUP_QUOTA`). Default 10,000. Environment:
    /// `COFFER_AUTH_PROXY_SIGNUPS_PER_HOUR`.
    pub auth_proxy_signups_per_hour: u64,
    /// The same over a day (so that the hourly quota cannot be taken every hour of it). Default
    /// 100,000. Environment: `COFFER_AUTH_PROXY_SIGNUPS_PER_DAY`.
    pub auth_proxy_signups_per_day: u64,
    /// Webhook endpoints one organization may have. The enclave decides it on the organization's
    /// authority state as each change commits (so concurrent creations, on any gateways and
    /// enclaves, cannot pass it): a creation past it is refused (`REFUSAL_REASON_LIMIT_EXCEEDED`,
    /// a 400 at the gateway). Updates and deletes are never refused by it. Default 10.
    /// Environment: `COFFER_MAX_WEBHOOK_ENDPOINTS_PER_ORGANIZATION`.
    pub max_webhook_endpoints_per_organization: usize,
    /// Policies one organization may have, decided the same way (`create_policy`,
    /// `create_policies`, and the policy `enable_auth_proxy` adds). Default 100,000. Environment:
    /// `COFFER_MAX_POLICIES_PER_ORGANIZATION`.
    pub max_policies_per_organization: usize,
    /// Bytes of policy text (conditions, consensus and time windows together) one organization
    /// may have, decided the same way: a change that adds text past it is refused. It bounds
    /// what every decision of the organization compiles and holds. Default 262,144 (256 KiB).
    /// Environment: `COFFER_MAX_POLICY_TEXT_BYTES_PER_ORGANIZATION`.
    pub max_policy_text_bytes_per_organization: usize,
    /// MiB of organizations' authority states kept in memory (estimated per state from its items
    /// and policy text), the least recently used dropped first: a state not kept is read from the
    /// authority store when it is needed. Default 64. Environment: `COFFER_STATE_CACHE_MIB`.
    pub state_cache_mib: usize,
    /// The enclave tier's authority store (replay window, decision log, authority state):
    /// `sqlite://PATH`, or `postgres://USER@HOST[:PORT]/DB` for several enclaves (a Unix socket
    /// directory as a percent-encoded host), with credentials the gateway never has. Default:
    /// `sqlite://` + `authority.sqlite` in the directory of `socket` (`make run`: `$COFFER_HOME`).
    /// Environment: `COFFER_AUTHORITY_STORE_URL`.
    pub authority_store: Option<String>,
    /// A file whose first line is the authority store's PostgreSQL password (so that it is in
    /// neither argv, nor the URL, nor a log). Default: none. Environment:
    /// `COFFER_AUTHORITY_STORE_PASSWORD_FILE`.
    pub authority_store_password_file: Option<PathBuf>,
    /// Days the decision log keeps a decision (`coffer-enclave reconcile` reads it); 0 keeps them
    /// forever. Default 30.
    pub decision_retention_days: u64,
    /// Kept so that a configuration that names it is understood: the enclave is the only decider
    /// and always enforces the organization's rules. `false` (shadow mode, for the upgrade to the
    /// authority state) is refused at start: with the gateway no longer deciding, it would leave
    /// nothing enforced. Environment: `COFFER_ENFORCE_RULES`.
    pub enforce_rules: bool,
    /// Also serve over TCP at this address, with mutual TLS only (`tls`). Default: none (the Unix
    /// socket alone). Environment: `COFFER_ENCLAVE_TCP_LISTEN`.
    pub tcp_listen: Option<std::net::SocketAddr>,
    /// The TCP listener's TLS files (PEM), all required with `tcp_listen`.
    pub tls: Option<TlsFiles>,
    /// `[login]`: the OIDC issuer URL and the OAuth 2.0 providers' endpoints.
    pub login: LoginSettings,
    /// `[otp]`: how the enclave sends one-time codes, and their limits.
    pub otp: OtpSettings,
    /// The operators' P-256 public keys (compressed, hex): `BootstrapOrganization` runs only for
    /// a body one of them stamped (see `operator.rs`). Default: none, so no organization can be
    /// bootstrapped until one is configured. Environment: `COFFER_OPERATOR_PUBLIC_KEYS`
    /// (comma-separated; replaces the list).
    pub operator_public_keys: Vec<String>,
    /// A file of more operator public keys, one per line (`#` comments and blank lines ignored),
    /// read at start. Default: none. Environment: `COFFER_OPERATOR_PUBLIC_KEYS_FILE`.
    pub operator_public_keys_file: Option<PathBuf>,
}

/// `[login]` of `coffer-enclave.toml`. The provider endpoints come from here and never from a
/// request, so a taken-over gateway cannot send a client secret anywhere else.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoginSettings {
    /// The `iss` of the OIDC tokens Coffer issues: the gateway's public base URL, which serves
    /// `/.well-known/openid-configuration`. Default: none (oauth2_authenticate is refused until
    /// it is set). Environment: `COFFER_OIDC_ISSUER`.
    pub oidc_issuer: Option<String>,
    /// X (Twitter) OAuth 2.0 endpoints. Environment: `COFFER_OAUTH2_X_TOKEN_URL`,
    /// `COFFER_OAUTH2_X_USERINFO_URL`.
    pub x_token_url: String,
    pub x_userinfo_url: String,
    /// Discord OAuth 2.0 endpoints. Environment: `COFFER_OAUTH2_DISCORD_TOKEN_URL`,
    /// `COFFER_OAUTH2_DISCORD_USERINFO_URL`.
    pub discord_token_url: String,
    pub discord_userinfo_url: String,
    /// The longest session (`expirationSeconds` of oauth_login, stamp_login and
    /// create_read_write_session) the enclave certifies. Default 604,800 (7 days). Environment:
    /// `COFFER_MAX_SESSION_SECONDS`.
    pub max_session_seconds: u64,
    /// The issuers (exact URLs, compared without a trailing `/`) of third-party OIDC tokens the
    /// enclave verifies (oauth_login, attested stamps), the only ones whose discovery document and
    /// JWKS it ever fetches. Coffer's own issuer (`oidc_issuer`) needs no entry: its tokens are
    /// verified against the HSM's key, without a fetch. The OAuth 2.0 provider endpoints above
    /// are allowed by being configured. Default: none (only Coffer's own tokens). Each must be an
    /// `https` URL (`http` only to a loopback host). Environment: `COFFER_OIDC_ISSUERS_ALLOWED`
    /// (comma-separated; replaces the list).
    pub oidc_issuers_allowed: Vec<String>,
}

impl LoginSettings {
    /// Whether the enclave verifies tokens of `iss`: Coffer's own issuer or one of
    /// `oidc_issuers_allowed`.
    pub fn issuer_allowed(&self, iss: &str) -> bool {
        self.oidc_issuer.as_deref().is_some_and(|own| own == iss)
            || coffer_auth::oidc::issuer_listed(&self.oidc_issuers_allowed, iss)
    }
}

impl Default for LoginSettings {
    fn default() -> Self {
        Self {
            oidc_issuer: None,
            x_token_url: "https://api.x.com/2/oauth2/token".into(),
            x_userinfo_url: "https://api.x.com/2/users/me".into(),
            discord_token_url: "https://discord.com/api/oauth2/token".into(),
            discord_userinfo_url: "https://discord.com/api/users/@me".into(),
            max_session_seconds: 7 * 24 * 3600,
            oidc_issuers_allowed: Vec::new(),
        }
    }
}

/// `[otp]` of `coffer-enclave.toml`: where one-time codes go and how often. The transport and the
/// sender come from here and never from a request, so a taken-over gateway can neither read a
/// code nor send mail in a name the deployment did not allow.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtpSettings {
    /// The SMTP server codes are sent through: `smtp://HOST[:PORT]` (plain, for a relay on
    /// loopback), `smtp://HOST[:PORT]?tls=required` (STARTTLS) or `smtps://HOST[:PORT]` (implicit
    /// TLS), with `USER@` before the host to authenticate. Default: none. Environment:
    /// `COFFER_SMTP_URL`.
    pub smtp_url: Option<String>,
    /// A file whose first line is the SMTP password (never in the URL, argv or a log). Default:
    /// none. Environment: `COFFER_SMTP_PASSWORD_FILE`.
    pub smtp_password_file: Option<PathBuf>,
    /// Without `smtp_url`: each message is written as an `.eml` file in this directory instead
    /// (development; `make run` sets `$COFFER_HOME/mail`). Default: none, and with neither, email
    /// codes are refused. Environment: `COFFER_MAIL_DIR`.
    pub mail_dir: Option<PathBuf>,
    /// The sender when the body names none. Default `no-reply@localhost`. Environment:
    /// `COFFER_OTP_SENDER`.
    pub sender: String,
    /// The sender's display name when the body names none. Default `Coffer`.
    pub sender_name: String,
    /// Domains a body's `sendFromEmailAddress` may use (exact, case-insensitive); the default
    /// sender's is always allowed. Default: none. Environment: `COFFER_OTP_SENDER_DOMAINS`
    /// (comma-separated).
    pub sender_domains: Vec<String>,
    /// The SMS provider codes are posted to (`https`, or `http` to a loopback host), e.g.
    /// Twilio's `https://api.twilio.com/2010-04-01/Accounts/SID/Messages.json`. Default: none, and
    /// SMS codes are refused. Environment: `COFFER_SMS_URL`.
    pub sms_url: Option<String>,
    /// A file whose first line is the `Authorization` header the provider wants (e.g. `Basic
    /// base64(SID:TOKEN)`). Default: none. Environment: `COFFER_SMS_AUTHORIZATION_FILE`.
    pub sms_authorization_file: Option<PathBuf>,
    /// The request's content type. Default `application/x-www-form-urlencoded`; with
    /// `application/json` the values are JSON-escaped. Environment: `COFFER_SMS_CONTENT_TYPE`.
    pub sms_content_type: String,
    /// The request body, with `{to}` and `{message}` replaced (encoded for the content type).
    /// Default `To={to}&Body={message}` (add Twilio's `&From=%2B1…`). Environment:
    /// `COFFER_SMS_BODY_TEMPLATE`.
    pub sms_body_template: String,
    /// Wrong codes after which a code is dead. Default 3.
    pub max_attempts: u64,
    /// Codes sent to one contact (and for one `userIdentifier`) in an hour. Default 10.
    /// Environment: `COFFER_OTP_SENDS_PER_CONTACT_PER_HOUR`.
    pub sends_per_contact_per_hour: u64,
    /// Codes one organization sends in an hour. Default 1,000. Environment:
    /// `COFFER_OTP_SENDS_PER_ORGANIZATION_PER_HOUR`.
    pub sends_per_organization_per_hour: u64,
    /// Codes and email credentials one marked sub-organization (`auth_proxy_signup`: anyone can
    /// get one by signing up) sends of its own in an hour, charged before its parent's allowance.
    /// Default 10. Environment: `COFFER_OTP_SENDS_PER_SUB_ORGANIZATION_PER_HOUR`.
    pub sends_per_sub_organization_per_hour: u64,
    /// The share of a parent's `sends_per_organization_per_hour`, in percent, that all its marked
    /// sub-organizations' own sends may spend together; the rest is for the parent's own sends
    /// (its auth proxy's login codes). 0 to 100, default 25. Environment:
    /// `COFFER_OTP_SUB_ORGANIZATIONS_SHARE_PERCENT`.
    pub sub_organizations_share_percent: u64,
}

impl Default for OtpSettings {
    fn default() -> Self {
        Self {
            smtp_url: None,
            smtp_password_file: None,
            mail_dir: None,
            sender: "no-reply@localhost".into(),
            sender_name: "Coffer".into(),
            sender_domains: Vec::new(),
            sms_url: None,
            sms_authorization_file: None,
            sms_content_type: "application/x-www-form-urlencoded".into(),
            sms_body_template: "To={to}&Body={message}".into(),
            max_attempts: 3,
            sends_per_contact_per_hour: 10,
            sends_per_organization_per_hour: 1_000,
            sends_per_sub_organization_per_hour: 10,
            sub_organizations_share_percent: 25,
        }
    }
}

impl OtpSettings {
    /// Applies the `COFFER_SMTP_*`, `COFFER_MAIL_DIR` and `COFFER_OTP_*` overrides and checks the
    /// result.
    fn load_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = var("COFFER_SMTP_URL") {
            self.smtp_url = Some(v);
        }
        if let Some(v) = var("COFFER_SMTP_PASSWORD_FILE") {
            self.smtp_password_file = Some(v.into());
        }
        if let Some(v) = var("COFFER_MAIL_DIR") {
            self.mail_dir = Some(v.into());
        }
        if let Some(v) = var("COFFER_OTP_SENDER") {
            self.sender = v.trim().to_string();
        }
        if let Some(v) = var("COFFER_OTP_SENDER_DOMAINS") {
            self.sender_domains = comma_list(&v);
        }
        if let Some(v) = var("COFFER_SMS_URL") {
            self.sms_url = Some(v);
        }
        if let Some(v) = var("COFFER_SMS_AUTHORIZATION_FILE") {
            self.sms_authorization_file = Some(v.into());
        }
        if let Some(v) = var("COFFER_SMS_CONTENT_TYPE") {
            self.sms_content_type = v.trim().to_string();
        }
        if let Some(v) = var("COFFER_SMS_BODY_TEMPLATE") {
            self.sms_body_template = v;
        }
        for (k, field) in [
            ("COFFER_OTP_SENDS_PER_CONTACT_PER_HOUR", &mut self.sends_per_contact_per_hour),
            ("COFFER_OTP_SENDS_PER_ORGANIZATION_PER_HOUR", &mut self.sends_per_organization_per_hour),
            ("COFFER_OTP_SENDS_PER_SUB_ORGANIZATION_PER_HOUR", &mut self.sends_per_sub_organization_per_hour),
            ("COFFER_OTP_SUB_ORGANIZATIONS_SHARE_PERCENT", &mut self.sub_organizations_share_percent),
        ] {
            if let Some(v) = var(k) {
                *field = v.trim().parse().map_err(|e| anyhow::anyhow!("{k}: {e}"))?;
            }
        }
        if let Some(url) = &self.smtp_url {
            let u = url::Url::parse(url).map_err(|_| anyhow::anyhow!("[otp] smtp_url is not a URL"))?;
            if !matches!(u.scheme(), "smtp" | "smtps") || u.password().is_some() {
                anyhow::bail!("[otp] smtp_url must be smtp:// or smtps://, without a password (smtp_password_file)");
            }
        }
        if self.sender.parse::<lettre::Address>().is_err() {
            anyhow::bail!("[otp] sender {:?} is not an email address", self.sender);
        }
        if self.max_attempts == 0 {
            anyhow::bail!("[otp] max_attempts must be at least 1");
        }
        if self.sub_organizations_share_percent > 100 {
            anyhow::bail!("[otp] sub_organizations_share_percent must be 0 to 100");
        }
        for d in &mut self.sender_domains {
            *d = d.trim().trim_start_matches('@').to_ascii_lowercase();
        }
        Ok(())
    }

    /// How many of a parent's hourly sends its marked sub-organizations may spend together:
    /// `sub_organizations_share_percent` of `sends_per_organization_per_hour`, rounded down.
    pub fn sub_organizations_share(&self) -> u64 {
        (u128::from(self.sends_per_organization_per_hour) * u128::from(self.sub_organizations_share_percent.min(100))
            / 100) as u64
    }

    /// The SMTP password, from `smtp_password_file` (first line).
    pub fn smtp_password(&self) -> anyhow::Result<Option<zeroize::Zeroizing<String>>> {
        let Some(p) = &self.smtp_password_file else { return Ok(None) };
        let text = zeroize::Zeroizing::new(
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading smtp_password_file {}: {e}", p.display()))?,
        );
        Ok(Some(zeroize::Zeroizing::new(text.lines().next().unwrap_or("").to_string())))
    }
}

/// A provider URL: `https`, or `http` to a loopback host (`coffer_auth::oidc::https_or_loopback`).
pub fn provider_url(url: &str) -> Result<url::Url, String> {
    coffer_auth::oidc::https_or_loopback(url)
}

/// PEM files for mutual TLS: this side's certificate chain and private key, and the CA that
/// must have issued the other side's certificate.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl Default for EnclaveConfig {
    fn default() -> Self {
        Self {
            pkcs11_module: PathBuf::from("/usr/lib/softhsm/libsofthsm2.so"),
            token_label: "coffer".into(),
            pin_env: "COFFER_HSM_PIN".into(),
            pin_file: None,
            session_pool: 16,
            hsm_profile: "auto".into(),
            hsm_native_keys_max: 0,
            hsm_native_keys_per_organization: 100,
            socket: PathBuf::from("./.coffer/enclave.sock"),
            log: "info".into(),
            freshness_window_secs: 300,
            replay_capacity: 2_000_000,
            replay_quota_per_organization: 100_000,
            replay_quota_per_signup: 1_000,
            replay_signups_share_percent: 50,
            auth_proxy_signups_per_hour: 10_000,
            auth_proxy_signups_per_day: 100_000,
            max_webhook_endpoints_per_organization: coffer_org_rules::limits::DEFAULT_MAX_WEBHOOK_ENDPOINTS,
            max_policies_per_organization: coffer_org_rules::limits::DEFAULT_MAX_POLICIES,
            max_policy_text_bytes_per_organization: coffer_org_rules::limits::DEFAULT_MAX_POLICY_TEXT_BYTES,
            state_cache_mib: crate::decider::DEFAULT_STATE_CACHE_BYTES >> 20,
            authority_store: None,
            authority_store_password_file: None,
            decision_retention_days: 30,
            enforce_rules: true,
            tcp_listen: None,
            tls: None,
            login: LoginSettings::default(),
            otp: OtpSettings::default(),
            operator_public_keys: Vec::new(),
            operator_public_keys_file: None,
        }
    }
}

impl EnclaveConfig {
    /// Reads `path` if given (missing file is an error), then applies `COFFER_*` overrides.
    pub fn load(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        Self::load_with(path, &|name| std::env::var(name).ok())
    }

    /// [`EnclaveConfig::load`] with the environment `env` answers (a variable that is not
    /// UTF-8 is unset).
    pub fn load_with(path: Option<&std::path::Path>, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let mut cfg: Self = coffer_process::read_config(path)?;
        if let Some(v) = env("COFFER_PKCS11_MODULE") {
            cfg.pkcs11_module = v.into();
        }
        if let Some(v) = env("COFFER_TOKEN_LABEL") {
            cfg.token_label = v;
        }
        if let Some(v) = env("COFFER_HSM_PROFILE") {
            cfg.hsm_profile = v.trim().to_string();
        }
        crate::hsm::ModuleProfile::configured(&cfg.hsm_profile)?;
        if let Some(v) = env("COFFER_HSM_PIN_FILE") {
            cfg.pin_file = Some(v.into());
        }
        if let Some(v) = env("COFFER_ENCLAVE_SOCKET") {
            cfg.socket = v.into();
        }
        if let Some(v) = env("COFFER_ENFORCE_RULES") {
            cfg.enforce_rules = !matches!(v.trim(), "0" | "false");
        }
        if !cfg.enforce_rules {
            anyhow::bail!(
                "enforce_rules = false (shadow mode) is retired: the enclave is the only decider of every activity \
                 (README \"Upgrading to the authority state\")"
            );
        }
        if let Some(v) = env("COFFER_AUTHORITY_STORE_URL") {
            cfg.authority_store = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = env("COFFER_AUTHORITY_STORE_PASSWORD_FILE") {
            cfg.authority_store_password_file = Some(v.into());
        }
        if let Some(v) = env("COFFER_HSM_NATIVE_KEYS_MAX") {
            cfg.hsm_native_keys_max =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_HSM_NATIVE_KEYS_MAX: {e}"))?;
        }
        if let Some(v) = env("COFFER_HSM_NATIVE_KEYS_PER_ORGANIZATION") {
            cfg.hsm_native_keys_per_organization =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_HSM_NATIVE_KEYS_PER_ORGANIZATION: {e}"))?;
        }
        if let Some(v) = env("COFFER_REPLAY_QUOTA_PER_ORGANIZATION") {
            cfg.replay_quota_per_organization =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_REPLAY_QUOTA_PER_ORGANIZATION: {e}"))?;
        }
        if let Some(v) = env("COFFER_AUTH_PROXY_SIGNUPS_PER_HOUR") {
            cfg.auth_proxy_signups_per_hour =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_AUTH_PROXY_SIGNUPS_PER_HOUR: {e}"))?;
        }
        if let Some(v) = env("COFFER_AUTH_PROXY_SIGNUPS_PER_DAY") {
            cfg.auth_proxy_signups_per_day =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_AUTH_PROXY_SIGNUPS_PER_DAY: {e}"))?;
        }
        for (var, field) in [
            ("COFFER_MAX_WEBHOOK_ENDPOINTS_PER_ORGANIZATION", &mut cfg.max_webhook_endpoints_per_organization),
            ("COFFER_MAX_POLICIES_PER_ORGANIZATION", &mut cfg.max_policies_per_organization),
            ("COFFER_MAX_POLICY_TEXT_BYTES_PER_ORGANIZATION", &mut cfg.max_policy_text_bytes_per_organization),
            ("COFFER_STATE_CACHE_MIB", &mut cfg.state_cache_mib),
        ] {
            if let Some(v) = env(var) {
                *field = v.trim().parse().map_err(|e| anyhow::anyhow!("{var}: {e}"))?;
            }
        }
        for (var, field) in [
            ("COFFER_REPLAY_QUOTA_PER_SIGNUP", &mut cfg.replay_quota_per_signup),
            ("COFFER_REPLAY_SIGNUPS_SHARE_PERCENT", &mut cfg.replay_signups_share_percent),
        ] {
            if let Some(v) = env(var) {
                *field = v.trim().parse().map_err(|e| anyhow::anyhow!("{var}: {e}"))?;
            }
        }
        if cfg.replay_signups_share_percent > 100 {
            anyhow::bail!("replay_signups_share_percent must be 0 to 100");
        }
        if let Some(v) = env("COFFER_ENCLAVE_TCP_LISTEN") {
            cfg.tcp_listen = Some(v.parse().map_err(|e| anyhow::anyhow!("COFFER_ENCLAVE_TCP_LISTEN: {e}"))?);
        }
        let tls_env = ["COFFER_ENCLAVE_TLS_CERT", "COFFER_ENCLAVE_TLS_KEY", "COFFER_ENCLAVE_TLS_CLIENT_CA"]
            .map(|k| env(k).map(PathBuf::from));
        if let [Some(cert), Some(key), Some(client_ca)] = tls_env {
            cfg.tls = Some(TlsFiles { cert, key, client_ca });
        } else if tls_env.iter().any(Option::is_some) {
            anyhow::bail!("COFFER_ENCLAVE_TLS_CERT, _KEY and _CLIENT_CA go together");
        }
        let login = &mut cfg.login;
        for (var, field) in [
            ("COFFER_OAUTH2_X_TOKEN_URL", &mut login.x_token_url),
            ("COFFER_OAUTH2_X_USERINFO_URL", &mut login.x_userinfo_url),
            ("COFFER_OAUTH2_DISCORD_TOKEN_URL", &mut login.discord_token_url),
            ("COFFER_OAUTH2_DISCORD_USERINFO_URL", &mut login.discord_userinfo_url),
        ] {
            if let Some(v) = env(var) {
                *field = v;
            }
        }
        if let Some(v) = env("COFFER_MAX_SESSION_SECONDS") {
            login.max_session_seconds =
                v.trim().parse().map_err(|e| anyhow::anyhow!("COFFER_MAX_SESSION_SECONDS: {e}"))?;
        }
        if let Some(v) = env("COFFER_OIDC_ISSUER") {
            login.oidc_issuer = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = env("COFFER_OIDC_ISSUERS_ALLOWED") {
            login.oidc_issuers_allowed = comma_list(&v);
        }
        for iss in &mut login.oidc_issuers_allowed {
            provider_url(iss).map_err(|e| anyhow::anyhow!("[login] oidc_issuers_allowed: {e}"))?;
            *iss = iss.trim_end_matches('/').to_string();
        }
        for url in [&login.x_token_url, &login.x_userinfo_url, &login.discord_token_url, &login.discord_userinfo_url] {
            provider_url(url).map_err(|e| anyhow::anyhow!("[login]: {e}"))?;
        }
        if let Some(iss) = &login.oidc_issuer {
            let u = url::Url::parse(iss).map_err(|_| anyhow::anyhow!("oidc_issuer {iss:?} is not a URL"))?;
            if !matches!(u.scheme(), "https" | "http") || u.query().is_some() || u.fragment().is_some() {
                anyhow::bail!("oidc_issuer {iss:?} must be an http(s) URL without query or fragment");
            }
            login.oidc_issuer = Some(iss.trim_end_matches('/').to_string());
        }
        if let Some(v) = env("COFFER_OPERATOR_PUBLIC_KEYS") {
            cfg.operator_public_keys = comma_list(&v);
        }
        if let Some(v) = env("COFFER_OPERATOR_PUBLIC_KEYS_FILE") {
            cfg.operator_public_keys_file = Some(v.into()).filter(|p: &PathBuf| !p.as_os_str().is_empty());
        }
        cfg.otp.load_env(env)?;
        if cfg.tcp_listen.is_some() && cfg.tls.is_none() {
            anyhow::bail!(
                "tcp_listen needs [tls] cert, key and client_ca: the enclave serves TCP with mutual TLS only"
            );
        }
        Ok(cfg)
    }

    /// The per-organization caps the rules check every state change against.
    pub fn limits(&self) -> coffer_org_rules::Limits {
        coffer_org_rules::Limits {
            webhook_endpoints: self.max_webhook_endpoints_per_organization,
            policies: self.max_policies_per_organization,
            policy_text_bytes: self.max_policy_text_bytes_per_organization,
            // Half the state cache: the most the cache keeps of one state; a sign-up a sixteenth.
            state_bytes: self.state_cache_mib.saturating_mul(1 << 20) / 2,
            signup_state_bytes: self.state_cache_mib.saturating_mul(1 << 20) / 16,
        }
    }

    /// The live replay entries all sign-ups of one top-level organization may hold together:
    /// `replay_signups_share_percent` of `replay_quota_per_organization`, rounded down.
    pub fn replay_all_signups(&self) -> u64 {
        (u128::from(self.replay_quota_per_organization) * u128::from(self.replay_signups_share_percent.min(100)) / 100)
            as u64
    }

    /// Where the authority store is (`authority_store`, or its default beside the socket) and
    /// its bounds.
    pub fn store_settings(&self) -> crate::store::StoreSettings {
        crate::store::StoreSettings {
            url: self.authority_store.clone().unwrap_or_else(|| crate::store::default_url(&self.socket)),
            password_file: self.authority_store_password_file.clone(),
            limits: crate::store::StoreLimits {
                replay_capacity: self.replay_capacity as u64,
                replay_per_organization: self.replay_quota_per_organization,
                decision_retention_ms: (self.decision_retention_days.min(100_000) as i64) * 24 * 3600 * 1000,
            },
        }
    }

    /// Every configured operator public key (`operator_public_keys`, then the lines of
    /// `operator_public_keys_file`), each checked to be a compressed P-256 point, lowercase hex.
    pub fn operator_keys(&self) -> anyhow::Result<Vec<String>> {
        let mut keys = self.operator_public_keys.clone();
        if let Some(p) = &self.operator_public_keys_file {
            let text = std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading operator_public_keys_file {}: {e}", p.display()))?;
            keys.extend(
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string),
            );
        }
        keys.iter()
            .map(|k| {
                coffer_auth::grants::api_public_key("API_KEY_CURVE_P256", k.trim())
                    .map(|(k, _)| k)
                    .map_err(|_| anyhow::anyhow!("operator public key {k:?} is not a compressed P-256 key (66 hex)"))
            })
            .collect()
    }

    /// The user PIN, from `pin_file` or the `pin_env` variable; never from argv. Every copy
    /// outside the returned secret is zeroized.
    pub fn pin(&self) -> anyhow::Result<cryptoki::types::AuthPin> {
        let text = zeroize::Zeroizing::new(match &self.pin_file {
            Some(p) => {
                std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading PIN file {}: {e}", p.display()))?
            }
            None => std::env::var(&self.pin_env)
                .map_err(|_| anyhow::anyhow!("no HSM PIN: set {} or pin_file", self.pin_env))?,
        });
        let pin = text.lines().next().unwrap_or("").trim();
        if pin.is_empty() {
            anyhow::bail!("the HSM PIN is empty");
        }
        Ok(cryptoki::types::AuthPin::new(Box::from(pin)))
    }
}

/// The non-empty, trimmed items of a comma-separated environment value.
fn comma_list(v: &str) -> Vec<String> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the gateway's test: the one list names exactly what the enclave reads.
    #[test]
    fn the_environment_list_names_exactly_what_the_enclave_reads() {
        use coffer_process::environment::{read_and_listed, Reader};
        let (read, listed) = read_and_listed(env!("CARGO_MANIFEST_DIR"), Reader::Enclave);
        assert_eq!(read, listed);
    }

    /// docs/configuration.md's enclave table is this code's, as the gateway's is.
    #[test]
    fn the_configuration_table_is_the_code() {
        use coffer_process::config_table::{check_documented, Exceptions};
        const CERT: (&str, &str) = ("COFFER_ENCLAVE_TLS_CERT", "/sample/cert");
        const KEY: (&str, &str) = ("COFFER_ENCLAVE_TLS_KEY", "/sample/key");
        const CA: (&str, &str) = ("COFFER_ENCLAVE_TLS_CLIENT_CA", "/sample/ca");
        let exceptions = Exceptions {
            with: &[
                (CERT.0, &[KEY, CA]),
                (KEY.0, &[CERT, CA]),
                (CA.0, &[CERT, KEY]),
                ("COFFER_ENCLAVE_TCP_LISTEN", &[CERT, KEY, CA]),
            ],
            // `false` is refused at start: shadow mode is retired.
            refused_otherwise: &[("COFFER_ENFORCE_RULES", "enforce_rules")],
        };
        let load = |env: &dyn Fn(&str) -> Option<String>| {
            let cfg = EnclaveConfig::load_with(None, env).map_err(|e| e.to_string())?;
            serde_json::to_value(cfg).map_err(|e| e.to_string())
        };
        let defaults = serde_json::to_value(EnclaveConfig::default()).unwrap();
        let doc = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md"));
        let reader = coffer_process::environment::Reader::Enclave;
        let section = "The enclave: `coffer-enclave.toml`";
        if let Err(e) = check_documented(doc, section, &defaults, reader, &load, &exceptions) {
            panic!("{e}");
        }
    }

    #[test]
    fn proxy_sub_organizations_get_a_share_of_their_parents_sends() {
        let cfg: EnclaveConfig = toml::from_str("token_label = \"t\"").unwrap();
        assert_eq!((cfg.otp.sends_per_sub_organization_per_hour, cfg.otp.sub_organizations_share_percent), (10, 25));
        assert_eq!(cfg.otp.sub_organizations_share(), 250, "25% of 1,000");
        let set: EnclaveConfig = toml::from_str(
            "[otp]\nsends_per_organization_per_hour = 40\nsub_organizations_share_percent = 30\nsends_per_sub_organization_per_hour = 2",
        )
        .unwrap();
        assert_eq!((set.otp.sub_organizations_share(), set.otp.sends_per_sub_organization_per_hour), (12, 2));
        let none = OtpSettings { sub_organizations_share_percent: 0, ..OtpSettings::default() };
        assert_eq!(none.sub_organizations_share(), 0, "0: marked sub-organizations send nothing of their own");
        let huge = OtpSettings {
            sends_per_organization_per_hour: u64::MAX,
            sub_organizations_share_percent: 100,
            ..OtpSettings::default()
        };
        assert_eq!(huge.sub_organizations_share(), u64::MAX, "no overflow");
        let mut over = OtpSettings { sub_organizations_share_percent: 101, ..OtpSettings::default() };
        assert!(over.load_env(&|_| None).is_err(), "a share over 100% is refused at start");
    }

    #[test]
    fn shadow_mode_is_refused_at_start() {
        let dir = std::env::temp_dir().join(format!("coffer-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (on, off) = (dir.join("on.toml"), dir.join("off.toml"));
        std::fs::write(&on, "enforce_rules = true\n").unwrap();
        std::fs::write(&off, "enforce_rules = false\n").unwrap();
        assert!(EnclaveConfig::load(Some(&on)).is_ok_and(|c| c.enforce_rules));
        let e = EnclaveConfig::load(Some(&off)).unwrap_err().to_string();
        assert!(e.contains("shadow mode") && e.contains("retired"), "{e}");
        let over = dir.join("over.toml");
        std::fs::write(&over, "replay_signups_share_percent = 101\n").unwrap();
        let e = EnclaveConfig::load(Some(&over)).unwrap_err().to_string();
        assert!(e.contains("replay_signups_share_percent"), "a sign-ups' share over 100% is refused at start: {e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let cfg: EnclaveConfig = toml::from_str("token_label = \"t\"").unwrap();
        assert_eq!(cfg.token_label, "t");
        assert_eq!(cfg.session_pool, 16);
        assert_eq!(cfg.replay_quota_per_organization, 100_000);
        assert_eq!((cfg.replay_quota_per_signup, cfg.replay_all_signups()), (1_000, 50_000));
        let share: EnclaveConfig =
            toml::from_str("replay_quota_per_organization = 999\nreplay_signups_share_percent = 10").unwrap();
        assert_eq!(share.replay_all_signups(), 99, "rounded down");
        assert_eq!(cfg.auth_proxy_signups_per_hour, 10_000);
        assert_eq!(
            cfg.limits(),
            coffer_org_rules::Limits {
                webhook_endpoints: 10,
                policies: 100_000,
                policy_text_bytes: 256 * 1024,
                state_bytes: 32 << 20,
                signup_state_bytes: 4 << 20
            }
        );
        let small: EnclaveConfig = toml::from_str("state_cache_mib = 8").unwrap();
        assert_eq!(small.limits().state_bytes, 4 << 20, "half the state cache");
        let text: EnclaveConfig = toml::from_str("max_policy_text_bytes_per_organization = 4096").unwrap();
        assert_eq!(text.limits().policy_text_bytes, 4096);
        let capped: EnclaveConfig = toml::from_str("max_webhook_endpoints_per_organization = 3").unwrap();
        assert_eq!(capped.limits().webhook_endpoints, 3);
        assert!(toml::from_str::<EnclaveConfig>("max_webhook_endpoints_per_organization = -1").is_err());
        assert!(toml::from_str::<EnclaveConfig>("max_webhook_endpoints_per_organisation = 3").is_err());
        let store = cfg.store_settings();
        assert_eq!(store.url, "sqlite://./.coffer/authority.sqlite", "beside the socket by default");
        assert_eq!(store.limits.decision_retention_ms, 30 * 24 * 3600 * 1000);
        assert!(toml::from_str::<EnclaveConfig>("tokn_label = \"t\"").is_err());
        let tcp: EnclaveConfig = toml::from_str(
            "tcp_listen = \"127.0.0.1:7443\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"ca.pem\"",
        )
        .unwrap();
        assert_eq!(tcp.tls.unwrap().client_ca, PathBuf::from("ca.pem"));
        assert!(toml::from_str::<EnclaveConfig>("[tls]\ncert = \"c.pem\"").is_err(), "all three files");
    }

    #[test]
    fn issuer_allowlist_and_operator_keys() {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let operator = p256::SecretKey::from_slice(&[1; 32]).unwrap().public_key();
        let operator = hex::encode(operator.to_encoded_point(true).as_bytes());
        let cfg: EnclaveConfig = toml::from_str(&format!(
            "operator_public_keys = [\"{}\"]\n[login]\noidc_issuer = \"https://coffer.example\"\n\
             oidc_issuers_allowed = [\"https://accounts.google.com/\"]",
            operator.to_uppercase()
        ))
        .unwrap();
        assert!(cfg.login.issuer_allowed("https://coffer.example"), "Coffer's own issuer");
        assert!(cfg.login.issuer_allowed("https://accounts.google.com"));
        assert!(!cfg.login.issuer_allowed("http://127.0.0.1:9"));
        assert!(!LoginSettings::default().issuer_allowed("https://accounts.google.com"), "none by default");
        assert!(toml::from_str::<EnclaveConfig>("[login]\noidc_issuers_alowed = []").is_err(), "unknown key");
        let keys = cfg.operator_keys().unwrap();
        assert_eq!(keys, [operator]);
        let bad: EnclaveConfig = toml::from_str("operator_public_keys = [\"04zz\"]").unwrap();
        assert!(bad.operator_keys().is_err());
        assert_eq!(comma_list(" a, ,b "), ["a", "b"]);
    }
}
