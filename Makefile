# Everything a developer runs. `make dev` and `make test` do all the set-up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
QUEUES ?=
PROVIDER ?= stripe
PYTEST_ARGS ?=
LITESTAR := $(BIN)/litestar --app app.asgi:create_app
# Commands that need Postgres/Redis run through this: embedded servers (and dev secrets) when no URLs are set.
WITH_DEV_ENV := $(BIN)/python -m tools.dev_env --

# Root installs Debian packages itself; anyone else through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-deps browser prometheus wrk dev api worker test screenshots lint format migrate \
	retry-abandoned cli send-test-webhook stripe-stub bench soak clean

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -d $(VENV) || { echo "Creating the virtual environment $(VENV)..."; $(PYTHON) -m venv $(VENV); }
	@echo "Upgrading pip in $(VENV)..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "Installing the project's packages into $(VENV) (about a minute)..."
	@$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	@touch $@
	@echo "Installed: $(VENV) is ready."

install: $(VENV)/.installed

browser:  ## Debian's chromium, the browser the operations page is tested in (installed when missing)
	@command -v chromium >/dev/null || { echo "Installing Debian's chromium (the browser tests use it)..."; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

prometheus:  ## Debian's prometheus and promtool, for the metrics and alert-rule tests (installed when missing)
	@command -v promtool >/dev/null || { echo "Installing Debian's prometheus (the metrics tests use it)..."; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }

wrk:  ## Debian's wrk, the load generator of make bench's intake phases (installed when missing)
	@command -v wrk >/dev/null || { echo "Installing Debian's wrk (make bench's load generator)..."; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }

system-deps: browser prometheus

dev: install  ## API and worker together, embedded Postgres and Redis when no URLs are set
	@HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m tools.dev

api: install  ## the API only
	@$(WITH_DEV_ENV) $(BIN)/uvicorn --factory app.asgi:create_app --host $(HOST) --port $(PORT) --no-proxy-headers

worker: install  ## a worker for every queue, or QUEUES=a,b
	@$(WITH_DEV_ENV) $(BIN)/python -m app.worker $(if $(QUEUES),--queues $(QUEUES))

test: install system-deps  ## the whole suite against real Postgres, Redis, Chromium and Prometheus
	@eval "$$($(BIN)/python -m tools.test_env)" && export TEST_DATABASE_URL TEST_REDIS_URL && \
		$(BIN)/pytest -n 2 -q -p no:cacheprovider $(PYTEST_ARGS)

screenshots: install system-deps  ## the operations page's pictures in docs/images, taken by its browser test
	@mkdir -p docs/images
	@eval "$$($(BIN)/python -m tools.test_env)" && export TEST_DATABASE_URL TEST_REDIS_URL && \
		OPS_SCREENSHOT_DIR=docs/images $(BIN)/pytest -q -p no:cacheprovider tests/ops \
		-k "overview_shows or phone_sized or try_it"

lint: install  ## ruff and mypy on the code, then on every python block of README.md and docs/
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy app bench tools
	@$(BIN)/python -m tools.doc_blocks

format: install
	@$(BIN)/ruff format .
	@$(BIN)/ruff check --fix .

migrate: install  ## the same command the production migrate service runs
	@$(WITH_DEV_ENV) $(LITESTAR) database upgrade --no-prompt

retry-abandoned: install
	@$(WITH_DEV_ENV) $(LITESTAR) webhooks retry-abandoned

cli: install  ## any Litestar CLI command against the dev services, e.g. make cli ARGS="webhooks list"
	@$(WITH_DEV_ENV) $(LITESTAR) $(ARGS)

send-test-webhook: install  ## PROVIDER=stripe|clerk, signed with the configured secret, to the running API; SAMPLE=checkout: the try-it pair
	@$(WITH_DEV_ENV) $(BIN)/python -m tools.send_test_webhook --provider $(PROVIDER) $(if $(SAMPLE),--sample $(SAMPLE)) --url http://$(HOST):$(PORT)

stripe-stub: install  ## the local Stripe API `make dev` uses with its generated key, serving the try-it checkout
	@$(BIN)/python -m tools.dev_stripe

bench: install wrk
	@$(BIN)/python -m bench $(BENCH_ARGS)

soak: install  ## the soak and chaos run (bench/soak/README.md): EVENTS=N deliveries, default 10,000
	@$(BIN)/python -m bench.soak $(if $(EVENTS),--events $(EVENTS))

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
