//! Every environment variable a Coffer process reads, and which process reads it: one list, which
//! each binary's tests check against the variables its code reads, and by which a `COFFER_`
//! variable no process reads (a misspelt one, silently ignored before) is warned about at start.

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    Gateway,
    Enclave,
    /// Both binaries.
    Both,
    /// The development launcher, the test harness or the benchmark, never a Coffer process:
    /// known, so not warned about when they reach one.
    Tooling,
}

/// Every variable, sorted by name.
pub const VARIABLES: &[(&str, Reader)] = &[
    ("COFFER_AUTHORITY_STORE_PASSWORD_FILE", Reader::Enclave),
    ("COFFER_AUTHORITY_STORE_URL", Reader::Enclave),
    ("COFFER_AUTH_PROXY_LISTEN", Reader::Gateway),
    ("COFFER_AUTH_PROXY_OTP_SENDS_PER_IP_PER_HOUR", Reader::Gateway),
    ("COFFER_AUTH_PROXY_PORT", Reader::Tooling),
    ("COFFER_AUTH_PROXY_RANGE_FACTOR", Reader::Gateway),
    ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_CONFIG", Reader::Gateway),
    ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", Reader::Gateway),
    ("COFFER_AUTH_PROXY_SIGNUPS_PER_DAY", Reader::Enclave),
    ("COFFER_AUTH_PROXY_SIGNUPS_PER_HOUR", Reader::Enclave),
    ("COFFER_AUTH_PROXY_SIGNUPS_PER_IP_PER_HOUR", Reader::Gateway),
    ("COFFER_BENCH_PIDS", Reader::Tooling),
    ("COFFER_BIN_DIR", Reader::Tooling),
    ("COFFER_BODY_LIMIT", Reader::Gateway),
    ("COFFER_BODY_READ_TIMEOUT_MS", Reader::Gateway),
    ("COFFER_CACHE_DIR", Reader::Tooling),
    ("COFFER_CONSOLE", Reader::Gateway),
    ("COFFER_CRASH_POINT_FILE", Reader::Both),
    ("COFFER_DEPLOY_API_KEY_FILE", Reader::Tooling),
    ("COFFER_DEPLOY_BINARIES", Reader::Tooling),
    ("COFFER_DEPLOY_ORGANIZATION_ID", Reader::Tooling),
    ("COFFER_DEPLOY_STATE_FILE", Reader::Tooling),
    ("COFFER_DEPLOY_URL", Reader::Tooling),
    ("COFFER_ENCLAVE_CLIENT_TLS_CA", Reader::Gateway),
    ("COFFER_ENCLAVE_CLIENT_TLS_CERT", Reader::Gateway),
    ("COFFER_ENCLAVE_CLIENT_TLS_KEY", Reader::Gateway),
    ("COFFER_ENCLAVE_CONFIG", Reader::Enclave),
    ("COFFER_ENCLAVE_SOCKET", Reader::Both),
    ("COFFER_ENCLAVE_SOCKETS", Reader::Gateway),
    ("COFFER_ENCLAVE_TCP_LISTEN", Reader::Enclave),
    ("COFFER_ENCLAVE_TLS_CERT", Reader::Enclave),
    ("COFFER_ENCLAVE_TLS_CLIENT_CA", Reader::Enclave),
    ("COFFER_ENCLAVE_TLS_KEY", Reader::Enclave),
    ("COFFER_ENCLAVE_URLS", Reader::Gateway),
    ("COFFER_ENFORCE_RULES", Reader::Enclave),
    ("COFFER_GATEWAY_CONFIG", Reader::Gateway),
    ("COFFER_HEADER_READ_TIMEOUT_MS", Reader::Gateway),
    ("COFFER_HOME", Reader::Tooling),
    ("COFFER_HSM_NATIVE_KEYS_MAX", Reader::Enclave),
    ("COFFER_HSM_NATIVE_KEYS_PER_ORGANIZATION", Reader::Enclave),
    ("COFFER_HSM_PIN", Reader::Enclave),
    ("COFFER_HSM_PIN_FILE", Reader::Enclave),
    ("COFFER_HSM_PROFILE", Reader::Enclave),
    ("COFFER_HSM_SO_PIN", Reader::Enclave),
    ("COFFER_INSTANCE_ID", Reader::Gateway),
    ("COFFER_KRYOPTIC_MODULE", Reader::Tooling),
    ("COFFER_LISTEN", Reader::Gateway),
    ("COFFER_LISTEN_BACKLOG", Reader::Gateway),
    ("COFFER_LOG", Reader::Both),
    ("COFFER_MAIL_DIR", Reader::Enclave),
    ("COFFER_MAX_CONNECTIONS", Reader::Gateway),
    ("COFFER_MAX_CONNECTIONS_PER_IP", Reader::Gateway),
    ("COFFER_MAX_HEADER_BYTES", Reader::Gateway),
    ("COFFER_MAX_IN_FLIGHT_READS", Reader::Gateway),
    ("COFFER_MAX_IN_FLIGHT_SIGNING", Reader::Gateway),
    ("COFFER_MAX_IN_FLIGHT_WRITES", Reader::Gateway),
    ("COFFER_MAX_POLICIES_PER_ORGANIZATION", Reader::Both),
    ("COFFER_MAX_POLICY_TEXT_BYTES_PER_ORGANIZATION", Reader::Enclave),
    ("COFFER_MAX_SESSION_SECONDS", Reader::Enclave),
    ("COFFER_MAX_WEBHOOK_ENDPOINTS_PER_ORGANIZATION", Reader::Enclave),
    ("COFFER_OAUTH2_DISCORD_TOKEN_URL", Reader::Enclave),
    ("COFFER_OAUTH2_DISCORD_USERINFO_URL", Reader::Enclave),
    ("COFFER_OAUTH2_X_TOKEN_URL", Reader::Enclave),
    ("COFFER_OAUTH2_X_USERINFO_URL", Reader::Enclave),
    ("COFFER_OIDC_ISSUER", Reader::Enclave),
    ("COFFER_OIDC_ISSUERS_ALLOWED", Reader::Enclave),
    ("COFFER_OPERATOR_KEY_FILE", Reader::Gateway),
    ("COFFER_OPERATOR_PUBLIC_KEYS", Reader::Enclave),
    ("COFFER_OPERATOR_PUBLIC_KEYS_FILE", Reader::Enclave),
    ("COFFER_OPS_LISTEN", Reader::Gateway),
    ("COFFER_OTP_SENDER", Reader::Enclave),
    ("COFFER_OTP_SENDER_DOMAINS", Reader::Enclave),
    ("COFFER_OTP_SENDS_PER_CONTACT_PER_HOUR", Reader::Enclave),
    ("COFFER_OTP_SENDS_PER_ORGANIZATION_PER_HOUR", Reader::Enclave),
    ("COFFER_OTP_SENDS_PER_SUB_ORGANIZATION_PER_HOUR", Reader::Enclave),
    ("COFFER_OTP_SUB_ORGANIZATIONS_SHARE_PERCENT", Reader::Enclave),
    ("COFFER_PKCS11_MODULE", Reader::Enclave),
    ("COFFER_POLICY_CACHE_BYTES", Reader::Gateway),
    ("COFFER_POLICY_QUEUE_TIMEOUT_MS", Reader::Gateway),
    ("COFFER_POLICY_THREADS", Reader::Gateway),
    ("COFFER_POLICY_THREADS_PER_ORGANIZATION", Reader::Gateway),
    ("COFFER_PORT", Reader::Tooling),
    ("COFFER_RATE_LIMIT_PER_CREDENTIAL", Reader::Gateway),
    ("COFFER_RATE_LIMIT_PER_IP", Reader::Gateway),
    ("COFFER_REPLAY_QUOTA_PER_ORGANIZATION", Reader::Enclave),
    ("COFFER_REPLAY_QUOTA_PER_SIGNUP", Reader::Enclave),
    ("COFFER_REPLAY_SIGNUPS_SHARE_PERCENT", Reader::Enclave),
    ("COFFER_REQUIRE_KRYOPTIC", Reader::Tooling),
    ("COFFER_SMS_AUTHORIZATION_FILE", Reader::Enclave),
    ("COFFER_SMS_BODY_TEMPLATE", Reader::Enclave),
    ("COFFER_SMS_CONTENT_TYPE", Reader::Enclave),
    ("COFFER_SMS_URL", Reader::Enclave),
    ("COFFER_SMTP_PASSWORD_FILE", Reader::Enclave),
    ("COFFER_SMTP_URL", Reader::Enclave),
    ("COFFER_STATE_CACHE_MIB", Reader::Enclave),
    ("COFFER_STORE", Reader::Tooling),
    ("COFFER_STORE_URL", Reader::Gateway),
    ("COFFER_TEST_HSM", Reader::Tooling),
    ("COFFER_TEST_STORE", Reader::Tooling),
    ("COFFER_TOKEN_LABEL", Reader::Enclave),
    ("COFFER_TRUSTED_PROXIES", Reader::Gateway),
    ("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", Reader::Gateway),
    ("COFFER_WRITE_SEEDS", Reader::Tooling),
    ("COFFER_WRITE_TIMEOUT_MS", Reader::Gateway),
];

/// What `coffer-process` itself reads for both binaries (logging, crash points), not their crates.
pub const PROCESS_WIDE: &[&str] = &["COFFER_CRASH_POINT_FILE", "COFFER_LOG"];

/// The variables `reader`'s code must read: its own and those both binaries read.
pub fn read_by(reader: Reader) -> impl Iterator<Item = &'static str> {
    VARIABLES.iter().filter(move |(_, r)| *r == reader || *r == Reader::Both).map(|(name, _)| *name)
}

/// The `COFFER_` variables among `names` that no Coffer process or tool reads, except `also`
/// (a name the configuration chose, such as the enclave's `pin_env`).
pub fn unknown<'a>(names: impl IntoIterator<Item = &'a str>, also: &[&str]) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|n| n.starts_with("COFFER_") && !also.contains(n))
        .filter(|n| VARIABLES.binary_search_by(|(v, _)| v.cmp(n)).is_err())
        .collect()
}

/// Warns (once per variable, at start) about each `COFFER_` variable of this process's
/// environment that nothing reads: a misspelt setting is otherwise silently ignored.
pub fn warn_unknown(also: &[&str]) {
    let names: Vec<String> = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect();
    for name in unknown(names.iter().map(String::as_str), also) {
        tracing::warn!(variable = name, "no Coffer process reads this environment variable (misspelt?): ignored");
    }
}

/// Every `"COFFER_…"` string literal of the Rust sources under `dir`, outside tests (files named
/// `tests.rs`, and each file from its first `#[cfg(test)]` on): what a crate's code reads.
pub fn literals_in(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for piece in code.split("\"COFFER_").skip(1) {
                let name: String =
                    piece.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
                if !name.is_empty() && piece[name.len()..].starts_with('"') {
                    found.insert(format!("COFFER_{name}"));
                }
            }
        }
    }
    found
}

/// The variables the crate at `manifest_dir` reads (its `src/`) and those [`VARIABLES`] lists for
/// `reader` (less [`PROCESS_WIDE`]), for a test that asserts they are the same.
pub fn read_and_listed(
    manifest_dir: &str,
    reader: Reader,
) -> (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>) {
    let read = literals_in(&std::path::Path::new(manifest_dir).join("src"));
    let listed = read_by(reader).filter(|n| !PROCESS_WIDE.contains(n)).map(String::from).collect();
    (read, listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_once_and_unknown_names_are_found() {
        assert!(VARIABLES.windows(2).all(|w| w[0].0 < w[1].0), "sorted, each name once");
        let env = ["COFFER_STORE_URL", "COFFER_STORE_ULR", "PATH", "COFFER_MY_PIN"];
        assert_eq!(unknown(env, &["COFFER_MY_PIN"]), ["COFFER_STORE_ULR"]);
        // This crate reads these two.
        let here = literals_in(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
        assert!(here.contains("COFFER_LOG") && here.contains("COFFER_CRASH_POINT_FILE"), "{here:?}");
    }
}
