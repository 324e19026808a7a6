#!/usr/bin/env bash
# DEVELOPMENT ONLY: creates, once, the random secrets deploy/compose.yaml reads as compose secret
# files (HSM user PIN, SoftHSM SO PIN, the gateways' PostgreSQL password, the enclave tier's
# PostgreSQL password) in deploy/secrets/, which git ignores.
# Existing files are kept, so the token and the database stay usable across runs.
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/secrets"
install -d -m 0700 "$dir"
for name in hsm-pin hsm-so-pin postgres-password authority-db-password; do
  f="$dir/$name"
  [ -s "$f" ] && continue
  # Hex, as deploy/run.sh makes PINs: also safe inside a database URL. Mode 0644 on purpose:
  # compose bind-mounts a file secret as it is (outside Swarm it applies no uid/gid/mode) and the
  # containers read it as their own non-root users; the 0700 directory keeps other host users out,
  # and inside, only the services that list a secret see it.
  (umask 022 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$f.tmp" && mv "$f.tmp" "$f")
  echo "created $f (development only)" >&2
done
# The operator's key pair (P-256): the enclave bootstraps organizations only for a body this key
# stamped. operator-public-keys (compressed hex) is the enclave's secret file
# (COFFER_OPERATOR_PUBLIC_KEYS_FILE); operator-key (the private scalar, hex) is for the operator's
# `init-org` runs only (deploy/README.md), mounted into no service.
if [ ! -s "$dir/operator-key" ] || [ ! -s "$dir/operator-public-keys" ]; then
  pem="$(openssl ecparam -name prime256v1 -genkey -noout)"
  text="$(printf '%s\n' "$pem" | openssl ec -text -noout -conv_form compressed 2>/dev/null)"
  hexof() { printf '%s\n' "$text" | sed -n "/^$1:/,/^[A-Za-z]/p" | sed '1d;$d' | tr -d ' :\n'; }
  priv="$(hexof priv)"; priv="${priv: -64}"
  (umask 077 && printf '%s\n' "$priv" > "$dir/operator-key.tmp" && mv "$dir/operator-key.tmp" "$dir/operator-key")
  (umask 022 && hexof pub > "$dir/operator-public-keys.tmp" && echo >> "$dir/operator-public-keys.tmp" \
    && mv "$dir/operator-public-keys.tmp" "$dir/operator-public-keys")
  priv='' pem='' text=''
  echo "created $dir/operator-key and operator-public-keys (development only)" >&2
fi
