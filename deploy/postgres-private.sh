#!/usr/bin/env bash
# A private PostgreSQL server for development and tests: `start DIR` creates (once) a cluster in
# DIR/data, starts it listening only on a Unix socket in DIR (no TCP), creates the database
# `coffer`, and prints the store URL; `stop DIR` stops it. Used by `COFFER_STORE=postgres make run`
# and by the test harness (tests/src/postgres.rs), so both run PostgreSQL the same way.
#
# `authority DIR PASSWORD_FILE` (server started) adds the enclave tier's database
# `coffer_authority`, owned by the role `coffer_enclave` whose password is PASSWORD_FILE's first
# line (made, 0600, if missing), which is the only way into that database (scram-sha-256 in
# pg_hba.conf; every other role is rejected there), and prints its URL without the password: the
# enclave's COFFER_AUTHORITY_STORE_URL, with COFFER_AUTHORITY_STORE_PASSWORD_FILE=PASSWORD_FILE.
# The gateway is given neither. On this development server the gateway's role is the cluster's
# superuser, which could still change that password from its own database: a separation for
# hygiene here; production gives the enclave tier a server of its own (docs/security.md, "Authority state").
#
# PostgreSQL refuses to run as root, and build and CI machines run as root: then the server runs
# as the system user `coffer-pg` (created here once), which owns DIR. DIR's parent must let that
# user through (e.g. /tmp, or a $COFFER_HOME under a world-traversable path).
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR | authority DIR PASSWORD_FILE" >&2; exit 2; }

bin="$(dirname "$(readlink -f "$(command -v pg_ctl 2>/dev/null || echo /nonexistent)")")"
if [ ! -x "$bin/pg_ctl" ]; then
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
fi
[ -x "$bin/pg_ctl" ] || { echo "PostgreSQL server binaries not found: run deploy/install-deps.sh" >&2; exit 1; }

as_owner=()
user="$(id -un)"
if [ "$(id -u)" -eq 0 ]; then
  user=coffer-pg
  id -u "$user" >/dev/null 2>&1 ||
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user" 2>/dev/null ||
    id -u "$user" >/dev/null  # another process created it meanwhile
  as_owner=(runuser -u "$user" --)
fi

case "$cmd" in
  start)
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if [ "$(id -u)" -eq 0 ]; then
      chown "$user" "$dir"
      # The server's user must pass through DIR's parent (e.g. a 0700 $COFFER_HOME): let its
      # group in, to traverse only (0710), rather than opening the parent to everyone.
      parent="$(dirname "$dir")"
      if ! runuser -u "$user" -- test -x "$parent"; then
        chgrp "$user" "$parent"
        chmod g+x,g-rw "$parent"
      fi
    fi
    chmod 700 "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      # trust on the socket: who can reach it is decided by DIR's mode (0700, the owner's; root
      # passes too), which is the whole point of a private server.
      "${as_owner[@]}" "$bin/initdb" -D "$dir/data" -U "$user" --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1
    fi
    if ! "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      # No network listener; the socket in DIR (0700, the owner's) is the only way in.
      "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -c unix_socket_directories='$dir' -c max_connections=200" start >/dev/null
    fi
    "${as_owner[@]}" "$bin/psql" -h "$dir" -U "$user" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'coffer'" | grep -q 1 ||
      "${as_owner[@]}" "$bin/createdb" -h "$dir" -U "$user" coffer
    # The socket directory as a percent-encoded host (the URL form tokio-postgres reads).
    printf 'postgres://%s@%s/coffer\n' "$user" "$(printf '%s' "$dir" | sed 's|/|%2F|g')"
    ;;
  authority)
    pwfile="${3:-}"
    [ -n "$pwfile" ] || { echo "usage: $0 authority DIR PASSWORD_FILE" >&2; exit 2; }
    dir="$(cd "$dir" && pwd)"
    if [ ! -s "$pwfile" ]; then
      (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$pwfile")
    fi
    IFS= read -r pw < "$pwfile" || [ -n "$pw" ]
    case "$pw" in
      *[!A-Za-z0-9._~-]* | "") echo "$pwfile: the password must be letters, digits and ._~- only" >&2; exit 2 ;;
    esac
    psql_as_owner=("${as_owner[@]}" "$bin/psql" -h "$dir" -U "$user" -v ON_ERROR_STOP=1 -q)
    # The password goes through stdin (printf is a builtin): never in argv.
    printf '%s\n' \
      "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'coffer_enclave') THEN CREATE ROLE coffer_enclave LOGIN; END IF; END \$\$;" \
      "ALTER ROLE coffer_enclave LOGIN NOSUPERUSER PASSWORD '$pw';" | "${psql_as_owner[@]}" -d postgres >/dev/null
    "${psql_as_owner[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'coffer_authority'" | grep -q 1 ||
      "${as_owner[@]}" "$bin/createdb" -h "$dir" -U "$user" -O coffer_enclave coffer_authority
    "${psql_as_owner[@]}" -d postgres -c "REVOKE ALL ON DATABASE coffer_authority FROM PUBLIC" >/dev/null
    hba="$dir/data/pg_hba.conf"
    if ! "${as_owner[@]}" grep -q '^local coffer_authority coffer_enclave scram-sha-256' "$hba"; then
      "${as_owner[@]}" sh -c 'f="$1"; { printf "%s\n" "local coffer_authority coffer_enclave scram-sha-256" "local coffer_authority all reject"; cat "$f"; } > "$f.new" && mv "$f.new" "$f"' sh "$hba"
      "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" reload >/dev/null
    fi
    printf 'postgres://coffer_enclave@%s/coffer_authority\n' "$(printf '%s' "$dir" | sed 's|/|%2F|g')"
    ;;
  stop)
    [ -f "$dir/data/PG_VERSION" ] || exit 0
    "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 start|stop DIR | authority DIR PASSWORD_FILE" >&2
    exit 2
    ;;
esac
