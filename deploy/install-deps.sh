#!/usr/bin/env bash
# Installs what Coffer needs to build and test on Debian/Ubuntu when it is missing:
# SoftHSM 2 (the PKCS#11 module used in development and CI), protoc (for the gRPC contract), and
# PyYAML for deploy/lint.sh (python3-yaml pulls in python3).
set -euo pipefail

need=()
[ -e /usr/lib/softhsm/libsofthsm2.so ] || need+=(softhsm2)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || need+=(curl)
{ python3 -c 'import yaml' || /usr/bin/python3 -c 'import yaml'; } >/dev/null 2>&1 || need+=(python3-yaml)
[ ${#need[@]} -eq 0 ] && exit 0

echo "installing: ${need[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install ${need[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
