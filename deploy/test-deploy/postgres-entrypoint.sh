#!/bin/sh
# `make test-deploy` only (postgres.Containerfile). As root: makes the data and socket directories
# (fresh volumes are root's) the server's own, then runs itself again as postgres. As postgres:
# on an empty data directory, initdb as the registry image does (the superuser POSTGRES_USER with
# the password of POSTGRES_PASSWORD_FILE, POSTGRES_INITDB_ARGS, every TCP connection asked for its
# password, listening on every address), then the database POSTGRES_DB; then runs the command. The
# password is never in argv.
set -eu
if [ "$(id -u)" = 0 ]; then
  install -d -o postgres -g postgres -m 0700 "$PGDATA"
  chown -R postgres:postgres "$PGDATA"
  install -d -o postgres -g postgres -m 3777 /var/run/postgresql
  chown postgres:postgres /var/run/postgresql
  chmod 3777 /var/run/postgresql
  exec setpriv --reuid=postgres --regid=postgres --init-groups /bin/sh "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words, as in the registry image
  initdb --username="$POSTGRES_USER" --pwfile="$POSTGRES_PASSWORD_FILE" ${POSTGRES_INITDB_ARGS:-} -D "$PGDATA" >&2
  printf '%s\n' "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  printf '%s\n' "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    printf 'CREATE DATABASE "%s" OWNER "%s";\n' "$POSTGRES_DB" "$POSTGRES_USER" \
      | postgres --single -j -D "$PGDATA" postgres >/dev/null
  fi
fi
exec "$@"
