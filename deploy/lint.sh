#!/usr/bin/env bash
# `make lint-deploy` (part of `make test`): cheap static checks of deploy/, with no container
# runtime, no helm and no network. What it checks and what it cannot: deploy/README.md, "What
# was checked how". Exits non-zero on the first failing group, after printing its errors.
set -euo pipefail
DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# (a) The systemd units. `systemd-analyze verify` refuses units whose ExecStart binaries are
# missing (they are installed later, to /usr/local/bin), so it runs against a scratch root holding
# the units, stub executables at every Exec*= path and a copy of the system's own units (for
# multi-user.target and friends). It prints warnings (unknown keys, bad values) and still exits
# 0, so any output counts as a failure.
if command -v systemd-analyze >/dev/null 2>&1 && [ -d /usr/lib/systemd/system ]; then
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root/etc/systemd/system" "$root/usr/lib/systemd"
  cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/"
  units=()
  for u in "$DEPLOY"/systemd/*.service; do
    cp "$u" "$root/etc/systemd/system/"
    units+=("/etc/systemd/system/$(basename "$u")")
    # First word of each Exec*= value, without systemd's prefixes (-@:+!).
    sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$u" | while read -r exe; do
      mkdir -p "$root$(dirname "$exe")"
      printf '#!/bin/sh\nexit 0\n' > "$root$exe"
      chmod 0755 "$root$exe"
    done
  done
  out="$(systemd-analyze verify --man=no --root="$root" "${units[@]}" 2>&1)" || true
  if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    echo "deploy/lint.sh: systemd-analyze verify found problems in deploy/systemd/" >&2
    exit 1
  fi
  echo "systemd-analyze verify: ${units[*]##*/} clean"
else
  echo "systemd-analyze verify: SKIPPED (no systemd-analyze or system units on this machine)"
fi

# The tmpfiles.d snippet: systemd-tmpfiles itself creates its directories in a scratch root whose
# passwd and group hold the units' users (lint_deploy.py checks they match the units). Any
# message, or a directory missing, counts as a failure. It sets owners, so it needs root.
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  troot="$(mktemp -d)"
  mkdir -p "$troot/etc" "$troot/run" "$troot/var/lib"
  cp /etc/passwd /etc/group "$troot/etc/"
  printf '%s\n' 'coffer-enclave:x:10001:10001::/nonexistent:/usr/sbin/nologin' \
    'coffer-gateway:x:10002:10002::/nonexistent:/usr/sbin/nologin' >> "$troot/etc/passwd"
  printf '%s\n' 'coffer-ipc:x:10000:coffer-gateway' 'coffer-enclave:x:10001:' 'coffer-gateway:x:10002:' >> "$troot/etc/group"
  out="$(systemd-tmpfiles --root="$troot" --create "$DEPLOY/systemd/coffer.tmpfiles.conf" 2>&1)" || out="${out:-failed}"
  for d in $(awk '$1 == "d" { print $2 }' "$DEPLOY/systemd/coffer.tmpfiles.conf"); do
    [ -d "$troot$d" ] || out="$out${out:+
}$d was not created"
  done
  rm -rf "$troot"
  if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    echo "deploy/lint.sh: systemd-tmpfiles refuses systemd/coffer.tmpfiles.conf" >&2
    exit 1
  fi
  echo "systemd-tmpfiles --create: systemd/coffer.tmpfiles.conf clean"
else
  echo "systemd-tmpfiles --create: SKIPPED (not installed, or not root: it sets owners)"
fi

# Shell syntax of every script here (shellcheck too, when installed).
for s in "$DEPLOY"/*.sh "$DEPLOY"/compose/*.sh "$DEPLOY"/test-deploy/*.sh; do
  case "$(head -n1 "$s")" in
    *bash*) shell="bash" ;;
    *) shell="sh" ;;
  esac
  $shell -n "$s" || { echo "deploy/lint.sh: $s does not parse" >&2; exit 1; }
done
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck --severity=warning "$DEPLOY"/*.sh "$DEPLOY"/compose/*.sh "$DEPLOY"/test-deploy/*.sh
  echo "shell scripts: syntax and shellcheck clean"
else
  echo "shell scripts: syntax clean (shellcheck not installed: not run)"
fi

# HAProxy's own check of its configuration, when installed (the gateways' names only resolve
# inside compose, so it warns about them; only errors fail).
if command -v haproxy >/dev/null 2>&1; then
  if ! haproxy -c -q -f "$DEPLOY/compose/haproxy.cfg" >/dev/null 2>&1; then
    haproxy -c -f "$DEPLOY/compose/haproxy.cfg" >&2 || true
    echo "deploy/lint.sh: haproxy -c refuses compose/haproxy.cfg" >&2
    exit 1
  fi
  echo "haproxy -c: compose/haproxy.cfg valid"
else
  echo "haproxy -c: not installed, not run"
fi

# (b) compose.yaml and haproxy.cfg, (c) the Helm chart, (d) the Dockerfile, and the systemd
# units' TOML files against the config structs.
# PyYAML comes from Debian's python3-yaml (deploy/install-deps.sh), which a python3 earlier on PATH
# (pyenv, a venv) may not see.
PY=python3
"$PY" -c 'import yaml' 2>/dev/null || PY=/usr/bin/python3
"$PY" "$DEPLOY/lint_deploy.py"
