#!/usr/bin/env bash
# Builds kryoptic (the Rust PKCS#11 soft token, https://github.com/latchset/kryoptic), Coffer's
# second PKCS#11 module in CI, from its crates.io package and prints the module's path. The build
# is cached by version and features under ${COFFER_CACHE_DIR:-~/.cache/coffer}; a second call
# only prints the path. Needs clang/libclang (bindgen), OpenSSL and SQLite headers
# (deploy/install-deps.sh installs them).
#
# Features: what its own CI calls the dynamic build (system libcrypto), without EdDSA, which needs
# OpenSSL >= 3.2 (Debian 12 has 3.0): on kryoptic the webhook signer is a sealed software key
# (docs/hsm.md "Pointing the enclave at a real HSM"), which this build therefore tests.
set -euo pipefail

version=1.5.4
sha256=21b64b7679ce821f19a7a48b7e40146f26fbb9daa64ee2acb6376788a26d7ae8
features=kryoptic-lib/dynamic,kryoptic-lib/sqlitedb,kryoptic-lib/aes,kryoptic-lib/ecc_min,kryoptic-lib/hash_all
cache=${COFFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/coffer}/kryoptic-$version-$(printf %s "$features" | sha256sum | cut -c1-12)
module=$cache/libkryoptic_pkcs11.so
if [ -s "$module" ]; then
  echo "$module"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -sSfL --retry 3 -o "$work/kryoptic.crate" "https://static.crates.io/crates/kryoptic/kryoptic-$version.crate"
echo "$sha256  $work/kryoptic.crate" | sha256sum -c --quiet - >&2
tar -xzf "$work/kryoptic.crate" -C "$work"
echo "building kryoptic $version ($features)" >&2
# Its own lock file (--locked); its target directory is kept in the cache for rebuilds.
(cd "$work/kryoptic-$version" && CC=clang CARGO_TARGET_DIR="$cache/target" \
  cargo build --release --locked --quiet --no-default-features --features "$features" >&2)
cp "$cache/target/release/libkryoptic_pkcs11.so" "$module.tmp"
mv "$module.tmp" "$module"
rm -rf "$cache/target"
echo "$module"
