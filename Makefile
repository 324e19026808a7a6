# Coffer: `make run` starts the development stack, `make test` runs every test.
CARGO ?= cargo

.PHONY: deps run test lint bench fuzz
BENCH_ARGS ?=

deps:
	@./deploy/install-deps.sh

run: deps
	./deploy/run.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Static checks of deploy/ (systemd units, compose, Helm chart, Dockerfile); no docker or helm needed.
.PHONY: lint-deploy
lint-deploy: deps
	./deploy/lint.sh

# Everything on SQLite (the store's conformance suite on SQLite and PostgreSQL), then every
# end-to-end family again on PostgreSQL, with the same binaries, except enclave_authority (it
# rewrites the SQLite file under the gateway, as an attacker with the database would).
E2E_ON_POSTGRES ?= approvals custody errors ip_allowlists kek_rotation login organization otp passkeys policies policy_cost proofs resilience suborgs transactions tvc users webhooks
# The HSM layer's tests run on SoftHSM and on kryoptic (deploy/build-kryoptic.sh, cached), and these
# end-to-end families run again with kryoptic as the enclave's module (README "Pointing the enclave
# at a real HSM").
E2E_ON_KRYOPTIC ?= custody kek_rotation login native_keys otp proofs transactions webhooks
KRYOPTIC_ENV = COFFER_KRYOPTIC_MODULE=$$(cat target/kryoptic-module) COFFER_REQUIRE_KRYOPTIC=1
test: deps lint-deploy lint
	$(CARGO) build --bins --locked
	mkdir -p target && ./deploy/build-kryoptic.sh > target/kryoptic-module
	$(KRYOPTIC_ENV) $(CARGO) test --workspace --locked
	COFFER_TEST_STORE=postgres $(CARGO) test --locked -p coffer-tests $(addprefix --test ,$(E2E_ON_POSTGRES))
	COFFER_TEST_HSM=kryoptic $(KRYOPTIC_ENV) $(CARGO) test --locked -p coffer-tests $(addprefix --test ,$(E2E_ON_KRYOPTIC))
	COFFER_DEPLOY_BINARIES=target/debug ./deploy/test-deploy.sh

# The images and the compose stack run for real with podman: build, sign through HAProxy with the
# official client, restart an enclave, sign again (deploy/test-deploy.sh, as root; deploy/README.md,
# "The compose stack, run for real"). With a release build; `make test` runs it with its own.
.PHONY: test-deploy
test-deploy: deps
	./deploy/test-deploy.sh

# Throughput and latency against the raw HSM, in one run (release build); see docs/performance.md "Performance".
bench: deps
	$(CARGO) build --release --bins --locked
	COFFER_BIN_DIR=$(CURDIR)/target/release $(CARGO) run --release --locked -p coffer-tests --bin coffer-bench -- $(BENCH_ARGS)

# Fuzzing (cargo-fuzz, nightly): every target of fuzz/fuzz_targets/ for FUZZ_SECONDS each. New
# corpus entries go to a temporary directory, the committed corpus and regressions are only read;
# a crash or timeout lands in fuzz/artifacts/<target>/ and, minimized (`cargo +nightly fuzz tmin`),
# belongs in fuzz/regressions/<target>/, which `make test` replays (fuzz-targets/tests/corpus.rs).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(basename $(notdir $(wildcard fuzz/fuzz_targets/*.rs)))
FUZZ_ARGS ?= -timeout=10
FUZZ_CARGO ?= cargo +nightly

fuzz:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	@rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
	@[ -f fuzz/Cargo.lock ] || cp Cargo.lock fuzz/Cargo.lock
	$(FUZZ_CARGO) fuzz build
	@failed=""; for t in $(FUZZ_TARGETS); do \
		work=$$(mktemp -d); seeds=$(CURDIR)/fuzz/corpus/$$t; \
		if [ -d fuzz/regressions/$$t ]; then seeds="$$seeds $(CURDIR)/fuzz/regressions/$$t"; fi; \
		echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
		$(FUZZ_CARGO) fuzz run $$t $$work $$seeds -- -max_total_time=$(FUZZ_SECONDS) $(FUZZ_ARGS) || failed="$$failed $$t"; \
		rm -rf $$work; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failures in:$$failed (inputs in fuzz/artifacts/)" >&2; exit 1; fi
