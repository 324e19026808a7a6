# Coffer: `make run` starts the development stack, `make test` runs every test.
CARGO ?= cargo

.PHONY: deps run test lint bench
BENCH_ARGS ?=

deps:
	@./deploy/install-deps.sh

run: deps
	./deploy/run.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

test: deps lint
	$(CARGO) build --bins --locked
	$(CARGO) test --workspace --locked

# Throughput and latency against the raw HSM, in one run (release build); see README "Performance".
bench: deps
	$(CARGO) build --release --bins --locked
	COFFER_BIN_DIR=$(CURDIR)/target/release $(CARGO) run --release --locked -p coffer-tests --bin coffer-bench -- $(BENCH_ARGS)
