#!/bin/sh
# Entrypoint of the compose stack's gateways: adds the database password (a compose secret file,
# path in STORE_PASSWORD_FILE) to COFFER_STORE_URL (postgres://USER@HOST:PORT/DB in compose.yaml),
# which the gateway reads from its environment, then runs `coffer-gateway "$@"` (`serve`, or e.g.
# `docker compose run --rm gateway-a init-org ...`). Builtins only, so the password is never in
# anyone's argv. It must be URL-safe (dev-secrets.sh makes hex); percent-encode any other.
set -eu
case "$COFFER_STORE_URL" in
  *://*@*) ;;
  *) echo "COFFER_STORE_URL must name the user: postgres://USER@HOST:PORT/DB" >&2; exit 1 ;;
esac
pw=
IFS= read -r pw < "$STORE_PASSWORD_FILE" || [ -n "$pw" ]
COFFER_STORE_URL="${COFFER_STORE_URL%%@*}:$pw@${COFFER_STORE_URL#*@}"
export COFFER_STORE_URL
pw=
unset STORE_PASSWORD_FILE
exec /usr/local/bin/coffer-gateway "$@"
