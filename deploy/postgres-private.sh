#!/usr/bin/env bash
# A private PostgreSQL server for development and tests: `start DIR` creates (once) a cluster in
# DIR/data, starts it listening only on a Unix socket in DIR (no TCP), creates the database
# `coffer`, and prints the store URL; `stop DIR` stops it. Used by `COFFER_STORE=postgres make run`
# and by the test harness (tests/src/postgres.rs), so both run PostgreSQL the same way.
#
# PostgreSQL refuses to run as root, and build and CI machines run as root: then the server runs
# as the system user `coffer-pg` (created here once), which owns DIR. DIR's parent must let that
# user through (e.g. /tmp, or a $COFFER_HOME under a world-traversable path).
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

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
  stop)
    [ -f "$dir/data/PG_VERSION" ] || exit 0
    "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
