# Two commands on a fresh machine: `make run` (set up, run the demo) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export LAKEHOUSE_HOME ?= $(CURDIR)/.lakehouse
export DAGSTER_HOME ?= $(LAKEHOUSE_HOME)/dagster
# The Dagster UI's port: `make ui PORT=3001`; the HTTP source's beside it: `make ui HTTP_PORT=8081`.
PORT ?= 3000
HTTP_PORT ?= 8080

.PHONY: run test unit ui lint bench clean

$(BIN)/lakehouse: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: $(BIN)/lakehouse
	$(BIN)/lakehouse demo

test: $(BIN)/lakehouse
	$(BIN)/ruff check lakehouse_assets lakehouse_assets_tests bench
	$(BIN)/mypy
	$(BIN)/pytest

unit: $(BIN)/lakehouse
	$(BIN)/pytest -m "not spark"

ui: $(BIN)/lakehouse
	$(BIN)/python -m lakehouse_assets.instance_settings
	# The HTTP source runs beside the UI and stops with it (without streams that accept HTTP it
	# says so and exits). SIGINT back to its default for dagster dev: started in the background
	# (`make ui &`, a script), it is ignored, and dagster dev, which takes SIGTERM as SIGINT, would
	# then ignore both.
	$(BIN)/lakehouse serve --port $(HTTP_PORT) & server=$$!; trap 'kill $$server 2>/dev/null' EXIT INT TERM; \
	env --default-signal=INT $(BIN)/dagster dev -w workspace.yaml -p $(PORT)

bench: $(BIN)/lakehouse
	$(BIN)/python bench/pipeline_throughput.py

clean:
	rm -rf $(LAKEHOUSE_HOME)
