#!/usr/bin/env bash
# DEVELOPMENT ONLY: creates, once, the random secrets deploy/compose.yaml reads as compose secret
# files (HSM user PIN, SoftHSM SO PIN, PostgreSQL password) in deploy/secrets/, which git ignores.
# Existing files are kept, so the token and the database stay usable across runs.
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/secrets"
install -d -m 0700 "$dir"
for name in hsm-pin hsm-so-pin postgres-password; do
  f="$dir/$name"
  [ -s "$f" ] && continue
  # Hex, as deploy/run.sh makes PINs: also safe inside a database URL. Mode 0644 on purpose:
  # compose bind-mounts a file secret as it is (outside Swarm it applies no uid/gid/mode) and the
  # containers read it as their own non-root users; the 0700 directory keeps other host users out,
  # and inside, only the services that list a secret see it.
  (umask 022 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$f.tmp" && mv "$f.tmp" "$f")
  echo "created $f (development only)" >&2
done
