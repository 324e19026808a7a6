# Coffer: `make run` starts the development stack, `make test` runs every test.
CARGO ?= cargo

.PHONY: deps run test lint bench

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
