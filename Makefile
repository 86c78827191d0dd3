# Two commands on a fresh machine: `make run` (set up, run the demo) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export LAKEHOUSE_HOME ?= $(CURDIR)/.lakehouse
export DAGSTER_HOME ?= $(LAKEHOUSE_HOME)/dagster
# The Dagster UI's port: `make ui PORT=3001`; the HTTP source's beside it: `make ui HTTP_PORT=8081`.
PORT ?= 3000
HTTP_PORT ?= 8080
UV_VERSION := 0.13.9
# The suite's scratch (pytest's temporary directories, Spark's, the test PostgreSQL's) in memory
# where the machine has it: thousands of small files and fsyncs, about 8 % of a fault file's time.
TEST_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,$(or $(TMPDIR),/tmp))

.PHONY: run kafka-demo object-store-demo test unit ui lint bench clean

# uv installs the packages (downloads in parallel): about half of pip's time from a cold cache
# (docs/benchmarks.md). It reads its own settings, not pip's: behind a package mirror, set
# UV_DEFAULT_INDEX (or UV_INDEX_URL) as you would PIP_INDEX_URL.
# The packages are compiled to bytecode once here (--compile-bytecode): where
# PYTHONDONTWRITEBYTECODE is set (containers, CI) every process would otherwise compile Dagster
# from source as it starts, a second or more of CPU for each `lakehouse` command, run worker and
# code server (docs/benchmarks.md).
# The project's own modules are compiled too: the editable install leaves them in the checkout,
# which uv does not compile, and where PYTHONDONTWRITEBYTECODE is set each process would compile
# them as it starts (0.15 CPU-s; some 40 CPU-s over the suite's processes). Again before the
# tests, for what changed since the install.
PROJECT_BYTECODE = $(BIN)/python -m compileall -q lakehouse_assets lakehouse_assets_tests bench
$(BIN)/lakehouse: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -e '.[dev]'
	$(PROJECT_BYTECODE)
	touch $@

run: $(BIN)/lakehouse
	$(BIN)/lakehouse demo

# The Kafka scenario: a local broker and Spark's Kafka source, both fetched with Maven once
# (~/.cache/lakehouse_assets/jars), a 32-partition topic of ticks, the pipeline on it.
KAFKA_EVENTS ?= 200000
kafka-demo: $(BIN)/lakehouse
	LAKEHOUSE_HOME=$(LAKEHOUSE_HOME)/kafka-demo DAGSTER_HOME=$(LAKEHOUSE_HOME)/kafka-demo/dagster \
	  $(BIN)/lakehouse demo --kafka --events $(KAFKA_EVENTS)

# The tables on a local S3-compatible store (S3Proxy) and in a local Iceberg REST catalog (Iceberg's
# own server), both fetched with Maven once, configured as docs/deploy.md writes it. The servers
# stay up afterwards for `lakehouse sql`, `lakehouse check` and `make ui` from another shell, until
# Ctrl-C.
object-store-demo: $(BIN)/lakehouse
	LAKEHOUSE_HOME=$(LAKEHOUSE_HOME)/object-store-demo DAGSTER_HOME=$(LAKEHOUSE_HOME)/object-store-demo/dagster \
	  $(BIN)/lakehouse demo --object-store --keep-running

# mypy (10 s on one core) runs beside the tests' first step, the class-data archive's build (a
# JVM on about one and a half cores) and the Maven fetches of the test servers' jars; its verdict
# counts as the tests' does.
test: $(BIN)/lakehouse
	$(PROJECT_BYTECODE)
	$(BIN)/ruff check lakehouse_assets lakehouse_assets_tests bench
	$(BIN)/mypy & mypy=$$!; TMPDIR=$(TEST_TMPDIR) $(BIN)/pytest; tests=$$?; wait $$mypy && exit $$tests

unit: $(BIN)/lakehouse
	$(BIN)/pytest -m "not spark"

ui: $(BIN)/lakehouse
	$(BIN)/python -m lakehouse_assets.runtime.instance_settings
	# The HTTP source runs beside the UI and stops with it (without streams that accept HTTP it
	# says so and exits), and so does the home's Spark host once dagster dev has ended (it answers
	# its calls in flight first; a process of its own, it would otherwise idle on for
	# spark_host.idle_timeout). SIGINT back to its default for dagster dev: started in the
	# background (`make ui &`, a script), it is ignored, and dagster dev, which takes SIGTERM as
	# SIGINT, would then ignore both.
	$(BIN)/lakehouse serve --port $(HTTP_PORT) & server=$$!; trap 'kill $$server 2>/dev/null' INT TERM; \
	trap 'kill $$server 2>/dev/null; $(BIN)/lakehouse spark-host stop' EXIT; \
	env --default-signal=INT $(BIN)/dagster dev -w workspace.yaml -p $(PORT)

bench: $(BIN)/lakehouse
	$(BIN)/python bench/pipeline_throughput.py

clean:
	rm -rf $(LAKEHOUSE_HOME)
