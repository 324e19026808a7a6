#!/usr/bin/env bash
# `make test-deploy`: deploy/compose.yaml run for real, with podman (no docker daemon needed).
#   1. a Debian bookworm root filesystem from Debian's packages (mmdebstrap), as the images' base;
#   2. a release build of the two binaries on this machine, and the images from deploy/Dockerfile
#      with them (`BINARIES=prebuilt`: no Rust toolchain image, no registry);
#   3. deploy/compose/dev-secrets.sh, then the compose stack (two enclaves on one SoftHSM token and
#      one authority store, two gateways, both PostgreSQL servers, HAProxy), with the three registry
#      images it names replaced by ones built from Debian's packages (test-deploy/compose.override.yaml);
#   4. `init-org` as deploy/README.md shows it, then the official Rust client through HAProxy:
#      a wallet is made and signs (tests/tests/deploy.rs); enclave-a is restarted and every wallet
#      signs again; enclave-b is stopped and they sign through enclave-a alone;
#   5. `down -v`, unless KEEP_STACK=1.
# Needs root (apt, podman). deploy/README.md, "The compose stack, run for real".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="$root/target/test-deploy"
mkdir -p "$work"
export CONTAINERS_CONF="$root/deploy/test-deploy/containers.conf"
project=coffer-test-deploy
compose=("$work/venv/bin/podman-compose" -p "$project" -f deploy/compose.yaml -f deploy/test-deploy/compose.override.yaml)
base=localhost/coffer-debian:bookworm
url=http://127.0.0.1:8080
start=$(date +%s)
step() { printf '\n== [%4ds] %s\n' "$(($(date +%s) - start))" "$*"; }

PODMAN_COMPOSE=1.6.0
step "tools: podman, runc, mmdebstrap; podman-compose $PODMAN_COMPOSE from PyPI"
# Debian's podman-compose (1.0.3) also puts a `network_mode: none` service on the project's
# network, which podman refuses; 1.6.0 does not.
need=()
for tool in podman runc mmdebstrap curl; do
  command -v "$tool" >/dev/null || need+=("$tool")
done
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" uidmap >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" uidmap >/dev/null; }
fi
if [ "$("$work/venv/bin/podman-compose" --version 2>/dev/null | sed -n 's/^podman-compose version //p')" != "$PODMAN_COMPOSE" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet "podman-compose==$PODMAN_COMPOSE"
fi
podman --version

step "base image $base (Debian bookworm, minbase, from Debian's packages)"
if ! podman image exists "$base"; then
  mmdebstrap --variant=minbase --quiet bookworm "$work/rootfs.tar"
  podman import --quiet "$work/rootfs.tar" "$base" >/dev/null
  rm -f "$work/rootfs.tar"
fi

# COFFER_DEPLOY_BINARIES names a directory holding both binaries already built for this commit
# (`make test` gives its own debug build: target/debug); by default, a release build.
if [ -n "${COFFER_DEPLOY_BINARIES:-}" ]; then
  binaries="$COFFER_DEPLOY_BINARIES"
  step "the binaries of $binaries"
else
  binaries=target/release
  step "release build of coffer-enclave and coffer-gateway"
  cargo build --release --locked --bins -p coffer-enclave -p coffer-gateway
fi
rm -rf "${work:?}/bin" && mkdir -p "$work/bin"
cp "$binaries/coffer-enclave" "$binaries/coffer-gateway" "$work/bin/"

step "images from deploy/Dockerfile (targets enclave and gateway)"
for target in enclave gateway; do
  podman build --quiet -f deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore --target "$target" \
    --build-arg DEBIAN_IMAGE="$base" --build-arg BINARIES=prebuilt --build-context binaries="$work/bin" \
    -t "coffer-$target:dev" . >/dev/null
done
for name in postgres haproxy; do
  tag=$([ "$name" = postgres ] && echo 15 || echo 2.6)
  podman build --quiet -f "deploy/test-deploy/$name.Containerfile" --build-arg DEBIAN_IMAGE="$base" \
    -t "localhost/coffer-test-$name:$tag" deploy/test-deploy >/dev/null
done
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'coffer-(enclave|gateway|test-)' | sort

cleanup() {
  if [ "${KEEP_STACK:-0}" = 1 ]; then
    echo "KEEP_STACK=1: the stack is left running (${compose[*]} down -v)" >&2
  else
    "${compose[@]}" down -v >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

step "secrets (deploy/compose/dev-secrets.sh), then the compose stack"
"${compose[@]}" down -v >/dev/null 2>&1 || true
deploy/compose/dev-secrets.sh
# What compose's `depends_on: condition: service_healthy` does, done here: podman 4.3 runs health
# checks from systemd timers, and without systemd (this machine, most CI runners) podman-compose
# ignores the conditions, so dependents started at once and failed (enclave-b before the authority
# store listened, the gateways before an enclave). Each group is started once the one before is
# healthy by its own compose health check (`podman healthcheck run`).
healthy() {
  local container="${project}_$1_1" deadline=$(($(date +%s) + $2))
  until podman healthcheck run "$container" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "$1 not healthy after $2 s" >&2
      podman logs --tail 20 "$container" >&2 || true
      return 1
    fi
    sleep 1
  done
}
for group in "postgres authority-db" enclave-a enclave-b "gateway-a gateway-b" lb; do
  # shellcheck disable=SC2086 # a group is a list of services
  if ! out=$("${compose[@]}" up -d --no-deps $group 2>&1); then
    printf '%s\n' "$out" >&2
    exit 1
  fi
  for service in $group; do
    [ "$service" = lb ] || healthy "$service" 180
  done
done

ready() {
  local deadline=$(($(date +%s) + $1))
  until curl -fsS "$url/readyz" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "not ready after $1 s" >&2
      podman ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}} {{.Status}}' >&2
      for c in enclave-a enclave-b gateway-a; do "${compose[@]}" logs --tail 20 "$c" >&2 || true; done
      return 1
    fi
    sleep 1
  done
}
ready 240
step "ready through HAProxy: $(curl -fsS "$url/readyz")"
podman ps --filter "label=io.podman.compose.project=$project" --format '{{.Names}}: {{.Status}}'
signer=$("${compose[@]}" logs enclave-a 2>&1 | grep -o '"enclaveSignerPublicKey": *"[0-9a-f]*"' | tail -1 || true)
echo "enclave-a's init printed ${signer:-no enclaveSignerPublicKey}"

step "init-org with the operator's key, as deploy/README.md shows it"
# The organization's root API key, made with the binary's own `keygen`; the private half only in a
# 0600 file for the client.
pair="$("$work/bin/coffer-gateway" keygen)"
(umask 077 && printf '%s\n' "$pair" | sed -n 's/.*"apiPrivateKey":"\([0-9a-f]*\)".*/\1/p' > "$work/api-key")
public="$(printf '%s\n' "$pair" | sed -n 's/.*"apiPublicKey":"\([0-9a-f]*\)".*/\1/p')"
pair=
org_json=$("${compose[@]}" run --rm -T -e COFFER_OPERATOR_KEY_FILE=/dev/stdin \
  gateway-a init-org --name deploy-check --api-public-key "$public" < deploy/secrets/operator-key 2>"$work/init-org.err" \
  | tail -1) || { cat "$work/init-org.err" >&2; exit 1; }
echo "$org_json"
organization=$(printf '%s' "$org_json" | sed -n 's/.*"organizationId": *"\([^"]*\)".*/\1/p')
[ -n "$organization" ] || { echo "init-org printed no organizationId" >&2; exit 1; }

export COFFER_DEPLOY_URL="$url" COFFER_DEPLOY_ORGANIZATION_ID="$organization" \
  COFFER_DEPLOY_API_KEY_FILE="$work/api-key" COFFER_DEPLOY_STATE_FILE="$work/addresses"
rm -f "$work/addresses"
check() {
  step "official client: $1"
  local out rc=0
  out=$(cargo test --quiet --locked -p coffer-tests --test deploy -- --ignored --nocapture 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -E '^(deploy:|test result)' || true
  if [ "$rc" -ne 0 ]; then
    printf '%s\n' "$out" | tail -40 >&2
    return 1
  fi
}
started() { podman inspect --format '{{.State.StartedAt}}' "${project}_$1_1"; }
check "a new wallet signs"
step "restart enclave-a"
before=$(started enclave-a)
"${compose[@]}" restart enclave-a >/dev/null
healthy enclave-a 120
[ "$(started enclave-a)" != "$before" ] || { echo "enclave-a was not restarted" >&2; exit 1; }
ready 120
check "after enclave-a's restart, a new wallet and every earlier one sign"
# Each enclave alone serves every wallet: one token, one authority store.
for alone in enclave-a enclave-b; do
  other=$([ "$alone" = enclave-a ] && echo enclave-b || echo enclave-a)
  step "stop $other"
  "${compose[@]}" stop "$other" >/dev/null
  ready 60
  check "with $other stopped, through $alone alone"
  "${compose[@]}" start "$other" >/dev/null
  healthy "$other" 120
done
step "passed in $(($(date +%s) - start)) s"
