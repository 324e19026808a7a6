#!/usr/bin/env bash
# Installs what Coffer needs to build and test on Debian/Ubuntu when it is missing:
# SoftHSM 2 (the PKCS#11 module used in development and CI), what kryoptic (the second module
# in CI) builds with, protoc (for the gRPC contract), and
# PyYAML for deploy/lint.sh (python3-yaml pulls in python3), aiosmtpd (a real SMTP server the
# one-time code tests send to), and PostgreSQL's server binaries (the
# PostgreSQL store's tests and `COFFER_STORE=postgres make run` start a private server with them),
# and Chromium with its chromedriver (the console's browser tests).
set -euo pipefail

need=()
[ -e /usr/lib/softhsm/libsofthsm2.so ] || need+=(softhsm2)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the e2e tests make throwaway certificates for enclaves over TCP
{ python3 -c 'import yaml' || /usr/bin/python3 -c 'import yaml'; } >/dev/null 2>&1 || need+=(python3-yaml)
# The one-time code tests' SMTP server (aiosmtpd, run as the system python's module).
/usr/bin/python3 -c 'import aiosmtpd' >/dev/null 2>&1 || need+=(python3-aiosmtpd)
command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
# kryoptic, the second PKCS#11 module the HSM tests run on (deploy/build-kryoptic.sh): bindgen
# needs clang and libclang; it links the system's libcrypto and libsqlite3.
command -v clang >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need+=(libclang-dev)
[ -e /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
[ -e /usr/include/openssl/evp.h ] || need+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
# The console's browser tests (tests/tests/console.rs): Debian's Chromium, driven by its
# chromedriver over WebDriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0

echo "installing: ${need[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install ${need[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
if [[ " ${need[*]} " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
  # Only the binaries are wanted: no system-wide cluster created and started by the package.
  $SUDO mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
