#!/bin/sh
# Entrypoint of the compose stack's first enclave, enclave-a (DEVELOPMENT: SoftHSM; enclave-b only
# serves, once this made the token and the keys). On every start, idempotently:
# create the token if it is missing, create Coffer's service keys if missing, then serve.
# The same commands as deploy/run.sh: `coffer-enclave init-token` does what
# `softhsm2-util --init-token` does, through PKCS#11, taking the SO PIN from its environment and
# the user PIN from COFFER_HSM_PIN_FILE, whereas softhsm2-util takes PINs as arguments or at a
# terminal prompt. PINs come from compose secret files: never in argv, and the SO PIN is in no
# environment but that of init-token.
set -eu
export COFFER_HSM_PIN_FILE=/run/secrets/hsm-pin
so_pin=
# `read` is a builtin; the file has no final newline, hence the `||`.
IFS= read -r so_pin < /run/secrets/hsm-so-pin || [ -n "$so_pin" ]
COFFER_HSM_SO_PIN="$so_pin" coffer-enclave init-token >&2
so_pin=
# Prints enclaveSignerPublicKey, which clients pin: `docker compose logs enclave`.
coffer-enclave init >&2
exec coffer-enclave serve
