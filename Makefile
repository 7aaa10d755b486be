# The README's commands and CI's are these targets, and only these.
# Every target does its own set-up, idempotently: a second run skips what is already done.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py consumers/decoding/_avro_body.c consumers/decoding/_proto_body.c | cksum | cut -d' ' -f1)
PACKAGES := bridge bridge_shell spark_jobs consumers tests bench

.PHONY: setup demo test test-caches check lint unit integration fuzz model stack-up stack-down clean

# The tests run on TEST_WORKERS pytest-xdist workers, each with its own Kafka, PostgreSQL,
# registry and Spark driver on free ports; tests that share a module's cluster stay on one worker
# (`xdist_group`). Each pass ends with its 20 slowest tests.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

setup: $(STAMP)
	@bash scripts/ensure-system-tools.sh
	@bash scripts/ensure-toxiproxy.sh > /dev/null
	@bash scripts/ensure-composecheck.sh > /dev/null
	@bash scripts/ensure-k8scheck.sh > /dev/null
	@$(BIN)/bridge stack prepare

$(STAMP): pyproject.toml setup.py consumers/decoding/_avro_body.c consumers/decoding/_proto_body.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict $(PACKAGES)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) tests/unit

integration: setup
	@$(BIN)/python -m tests.passes --pytest "$(PYTEST)" tests/integration

# The contributor's loop, in under 5 minutes: lint, the unit tests, and the integration tests
# marked `quick` (docs/development.md says which, and what it leaves to `make test`).
check: setup lint
	$(PYTEST) tests/unit
	$(PYTEST) -m quick tests/integration

# The whole pipeline once, verified: sample orders -> Spark -> Kafka -> consumer -> PostgreSQL.
demo: setup
	$(BIN)/bridge demo

# Everything on the plain stack, and beside it the tests marked `secured` again on the secured
# one (TLS, SASL/SCRAM and ACLs on Kafka; TLS and SCRAM on PostgreSQL; a principal per role):
# tests/passes.py says why side by side, and prints the secured pass's report after the other's.
test: setup
	@$(MAKE) --no-print-directory -j2 lint test-caches
	@$(BIN)/python -m tests.passes --pytest "$(PYTEST)" tests

# The caches the tests' Spark drivers read (tests/warm_caches.py: the executors' environment, the
# precompiled Spark home, a class archive dumped once per Spark home), built beside the lint,
# each on a core of its own.
test-caches: $(STAMP)
	@$(BIN)/python -m tests.warm_caches

# The C readers built under ASan and UBSan, fuzzed for longer than `make test` does
# (FUZZ_EXAMPLES per property): Avro against fastavro, Protobuf against the protobuf runtime;
# their figures go to bench/results/fuzz-*.json.
FUZZ_EXAMPLES ?= 20000
fuzz: $(STAMP)
	$(BIN)/python -m bench.fuzz --examples $(FUZZ_EXAMPLES)
	$(BIN)/python -m bench.fuzz --protobuf --examples $(FUZZ_EXAMPLES)

# The keyed modes against their record-by-record model, with MODEL_EXAMPLES random sequences
# per mode (make test runs 2), each through the real consumer with a SIGKILL.
MODEL_EXAMPLES ?= 50
model: setup
	BRIDGE_MODEL_EXAMPLES=$(MODEL_EXAMPLES) $(BIN)/pytest tests/integration/test_record_by_record.py

stack-up: setup
	$(BIN)/bridge stack up

stack-down: $(STAMP)
	$(BIN)/bridge stack down

clean:
	rm -rf $(VENV) .stack .mypy_cache .ruff_cache .pytest_cache
