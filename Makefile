# The README's commands and CI's are these targets, and only these.
# Every target does its own set-up, idempotently: a second run skips what is already done.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py consumers/decoding/_avro_body.c | cksum | cut -d' ' -f1)
PACKAGES := bridge bridge_shell spark_jobs consumers tests bench

.PHONY: setup demo test lint unit integration fuzz model stack-up stack-down clean

setup: $(STAMP)
	@bash scripts/ensure-system-tools.sh
	@bash scripts/ensure-toxiproxy.sh > /dev/null
	@bash scripts/ensure-composecheck.sh > /dev/null
	@bash scripts/ensure-k8scheck.sh > /dev/null
	@$(BIN)/bridge stack prepare

$(STAMP): pyproject.toml setup.py consumers/decoding/_avro_body.c
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
	$(BIN)/pytest tests/unit

integration: setup
	$(BIN)/pytest tests/integration
	$(BIN)/pytest --secure tests/integration

# The whole pipeline once, verified: sample orders -> Spark -> Kafka -> consumer -> PostgreSQL.
demo: setup
	$(BIN)/bridge demo

# Everything on the plain stack, then the tests marked `secured` again on the secured one
# (TLS, SASL/SCRAM and ACLs on Kafka; TLS and SCRAM on PostgreSQL; a principal per role).
test: setup lint
	$(BIN)/pytest tests
	$(BIN)/pytest --secure tests/integration

# The Avro reader built under ASan and UBSan, fuzzed against fastavro for longer than `make test`
# does (FUZZ_EXAMPLES per property); its figures go to bench/results/fuzz-*.json.
FUZZ_EXAMPLES ?= 20000
fuzz: $(STAMP)
	$(BIN)/python -m bench.fuzz --examples $(FUZZ_EXAMPLES)

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
