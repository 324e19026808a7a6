#!/usr/bin/env bash
# The development launcher (`make run`): the whole stack on the embedded defaults, state in
# $COFFER_HOME, idempotent, in the foreground until interrupted (README "Quickstart").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export COFFER_HOME="${COFFER_HOME:-$ROOT/.coffer}"
COFFER_PORT="${COFFER_PORT:-8080}"
COFFER_AUTH_PROXY_PORT="${COFFER_AUTH_PROXY_PORT:-8081}"
mkdir -p "$COFFER_HOME/tokens" "$COFFER_HOME/logs"
chmod 700 "$COFFER_HOME"
COFFER_HOME="$(cd "$COFFER_HOME" && pwd)"

"$ROOT/deploy/install-deps.sh"
cargo build --release --bins --manifest-path "$ROOT/Cargo.toml"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# SoftHSM: a private config and token directory under $COFFER_HOME.
if [ ! -f "$COFFER_HOME/softhsm2.conf" ]; then
  cat > "$COFFER_HOME/softhsm2.conf" <<CONF
directories.tokendir = $COFFER_HOME/tokens
objectstore.backend = file
log.level = ERROR
slots.removable = false
CONF
fi
export SOFTHSM2_CONF="$COFFER_HOME/softhsm2.conf"

# PINs live in files (0600) and reach the processes through the environment, never argv, and
# only the enclave's: the PIN file path and the SO PIN are set on each coffer-enclave command line
# below and never exported, so the gateway's environment holds neither. (Here both processes run
# as one user, so this is hygiene; deploy/systemd/ separates them for real.)
umask 077
for f in hsm-pin hsm-so-pin; do
  [ -s "$COFFER_HOME/$f" ] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$COFFER_HOME/$f"
done
unset COFFER_HSM_PIN COFFER_HSM_PIN_FILE COFFER_HSM_SO_PIN  # none inherited from the caller either
unset COFFER_AUTHORITY_STORE_URL COFFER_AUTHORITY_STORE_PASSWORD_FILE
HSM_PIN_FILE="$COFFER_HOME/hsm-pin"
export COFFER_TOKEN_LABEL="${COFFER_TOKEN_LABEL:-coffer-dev}"
export COFFER_ENCLAVE_SOCKET="$COFFER_HOME/enclave.sock"
# The store: SQLite in $COFFER_HOME, or with COFFER_STORE=postgres a private PostgreSQL server in
# $COFFER_HOME/postgres (Unix socket only, no network listener), stopped with the stack.
# The enclave tier's authority store (replay window, decision log, authority state): by default
# the SQLite file $COFFER_HOME/authority.sqlite (0600, beside the token and the socket); with
# COFFER_STORE=postgres the database coffer_authority on the same server, owned by the role
# coffer_enclave whose password file ($COFFER_HOME/authority-store-password, 0600) only the
# enclave's command line below names, never exported: the gateway gets neither.
ENCLAVE_STORE_ENV=()
case "${COFFER_STORE:-sqlite}" in
  sqlite) export COFFER_STORE_URL="sqlite://$COFFER_HOME/coffer.db" ;;
  postgres)
    COFFER_STORE_URL="$("$ROOT/deploy/postgres-private.sh" start "$COFFER_HOME/postgres")"
    export COFFER_STORE_URL
    AUTHORITY_PASSWORD_FILE="$COFFER_HOME/authority-store-password"
    AUTHORITY_STORE_URL="$("$ROOT/deploy/postgres-private.sh" authority "$COFFER_HOME/postgres" "$AUTHORITY_PASSWORD_FILE")"
    ENCLAVE_STORE_ENV=(COFFER_AUTHORITY_STORE_URL="$AUTHORITY_STORE_URL" COFFER_AUTHORITY_STORE_PASSWORD_FILE="$AUTHORITY_PASSWORD_FILE")
    ;;
  *) echo "COFFER_STORE=${COFFER_STORE}: expected sqlite or postgres" >&2; exit 2 ;;
esac
export COFFER_LISTEN="127.0.0.1:$COFFER_PORT"
export COFFER_AUTH_PROXY_LISTEN="127.0.0.1:$COFFER_AUTH_PROXY_PORT"
# Coffer's OIDC issuer (the `iss` of the tokens oauth2_authenticate returns, and where its
# discovery document lives) is the gateway's base URL. The OAuth 2.0 provider endpoints
# (COFFER_OAUTH2_X_TOKEN_URL, ..._USERINFO_URL, COFFER_OAUTH2_DISCORD_...) pass through from the
# caller's environment to the enclave, which alone reads them; so does COFFER_OIDC_ISSUERS_ALLOWED,
# the third-party OIDC issuers (e.g. https://accounts.google.com) whose tokens the enclave verifies
# (default none: only Coffer's own).
export COFFER_OIDC_ISSUER="${COFFER_OIDC_ISSUER:-http://127.0.0.1:$COFFER_PORT}"
# Development only: webhooks may target http:// and loopback/private receivers (the gateway's
# default refuses them). Said at start; see docs/features.md "Webhooks".
export COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS="${COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS:-true}"
# The operator console at /console (README "The console"); open it at http://localhost:PORT/console
# (a passkey's origin must be a secure one: localhost is, 127.0.0.1 is not for every browser).
export COFFER_CONSOLE="${COFFER_CONSOLE:-true}"
# One-time codes: the enclave sends them through COFFER_SMTP_URL when set (its password, if any, in
# the file COFFER_SMTP_PASSWORD_FILE); without one, each message is written as an .eml file under
# $COFFER_HOME/mail/, so a developer can log in by email with nothing else installed.
if [ -z "${COFFER_SMTP_URL:-}" ]; then
  export COFFER_MAIL_DIR="${COFFER_MAIL_DIR:-$COFFER_HOME/mail}"
  echo "one-time codes are written as .eml files to $COFFER_MAIL_DIR (set COFFER_SMTP_URL to send them)" >&2
fi

# The operator's key: the enclave bootstraps an organization (init-dev, init-org) only for a body
# this key stamped. Its private half stays in $COFFER_HOME/operator.key (0600, made once) and
# reaches only the operator commands (COFFER_OPERATOR_KEY_FILE on their command line, never
# exported, so `coffer-gateway serve` never has it); the enclave gets the public half.
OPERATOR_KEY_FILE="$COFFER_HOME/operator.key"
OPERATOR_PUBLIC_KEY="$("$BIN/coffer-gateway" operator-keygen --out "$OPERATOR_KEY_FILE" \
  | sed -n 's/.*"operatorPublicKey":"\([0-9a-f]*\)".*/\1/p')"
[ -n "$OPERATOR_PUBLIC_KEY" ] || { echo "could not read the operator key $OPERATOR_KEY_FILE" >&2; exit 1; }
unset COFFER_OPERATOR_KEY_FILE  # not inherited from the caller either

# One line points any command at this stack: `set -a; . "$COFFER_HOME/env"; set +a` (operator
# commands name their store and enclave, never a default). Paths only, no secret; 0600.
{
  echo "COFFER_STORE_URL=$COFFER_STORE_URL"
  echo "COFFER_ENCLAVE_SOCKET=$COFFER_ENCLAVE_SOCKET"
  echo "COFFER_AUTHORITY_STORE_URL=${AUTHORITY_STORE_URL:-sqlite://$COFFER_HOME/authority.sqlite}"
  if [ -n "${AUTHORITY_PASSWORD_FILE:-}" ]; then echo "COFFER_AUTHORITY_STORE_PASSWORD_FILE=$AUTHORITY_PASSWORD_FILE"; fi
  echo "SOFTHSM2_CONF=$SOFTHSM2_CONF"
  echo "COFFER_TOKEN_LABEL=$COFFER_TOKEN_LABEL"
  echo "COFFER_HSM_PIN_FILE=$HSM_PIN_FILE"
  echo "COFFER_OPERATOR_KEY_FILE=$OPERATOR_KEY_FILE"
} > "$COFFER_HOME/env"

COFFER_HSM_PIN_FILE="$HSM_PIN_FILE" COFFER_HSM_SO_PIN="$(cat "$COFFER_HOME/hsm-so-pin")" \
  "$BIN/coffer-enclave" init-token >/dev/null
COFFER_HSM_PIN_FILE="$HSM_PIN_FILE" "$BIN/coffer-enclave" init >/dev/null

pids=()
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${COFFER_STORE:-sqlite}" = postgres ]; then "$ROOT/deploy/postgres-private.sh" stop "$COFFER_HOME/postgres"; fi
}
trap stop INT TERM EXIT

env COFFER_HSM_PIN_FILE="$HSM_PIN_FILE" COFFER_OPERATOR_PUBLIC_KEYS="$OPERATOR_PUBLIC_KEY" "${ENCLAVE_STORE_ENV[@]}" \
  "$BIN/coffer-enclave" serve 2>>"$COFFER_HOME/logs/enclave.log" &
pids+=($!)
COFFER_OPERATOR_KEY_FILE="$OPERATOR_KEY_FILE" "$BIN/coffer-gateway" init-dev --out "$COFFER_HOME/dev-org.json" \
  --base-url "http://127.0.0.1:$COFFER_PORT" --auth-proxy-url "http://127.0.0.1:$COFFER_AUTH_PROXY_PORT" >/dev/null
"$BIN/coffer-gateway" serve 2>>"$COFFER_HOME/logs/gateway.log" &
pids+=($!)

for _ in $(seq 1 200); do
  if curl -fsS "http://127.0.0.1:$COFFER_PORT/healthz" >/dev/null 2>&1; then
    echo "Coffer is up on http://127.0.0.1:$COFFER_PORT (auth proxy :$COFFER_AUTH_PROXY_PORT)"
    echo "development organization: $COFFER_HOME/dev-org.json; logs: $COFFER_HOME/logs/"
    echo "operator commands: set -a; . $COFFER_HOME/env; set +a   (then e.g. coffer-gateway init-org ...)"
    echo "store: ${COFFER_STORE:-sqlite} (enclave tier: ${AUTHORITY_STORE_URL:-sqlite://$COFFER_HOME/authority.sqlite})"
    echo "login keys and OIDC issuer: http://127.0.0.1:$COFFER_PORT/public/v1/discovery/keys"
    [ "$COFFER_CONSOLE" = true ] && echo "console: http://localhost:$COFFER_PORT/console (sign in with dev-org.json's API key or a registered passkey)"
    echo "webhooks: private and http:// targets allowed (COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS=$COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS; never in production)"
    break
  fi
  sleep 0.1
done
# Stay in the foreground until interrupted or until either process exits.
wait -n "${pids[@]}" || true
