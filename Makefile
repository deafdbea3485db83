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

# Root installs Debian packages itself; anyone else through sudo. The script installs without recommends and
# leaves no service started or enabled; apt's output is shown only when it fails.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) tools/install-debian-packages
# The container engine's client: Debian's when installed (a newer one elsewhere on the PATH may require the
# buildx plugin, which Debian does not ship).
DOCKER ?= $(firstword $(wildcard /usr/bin/docker) docker)
# The release's tag: `git describe` (v1.4.0, v1.4.0-3-gabc1234, a commit, -dirty when the tree has changes).
IMAGE ?= saas-jobs-inbox:$(shell git describe --tags --always --dirty 2>/dev/null || echo latest)
PYTHON_IMAGE ?=
# The CA bundle pip trusts while building the image, passed as a build secret (not kept in the image): the
# system's, which holds a TLS-intercepting proxy's CA too. CA_BUNDLE= builds with pip's own.
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
comma := ,

.PHONY: install system-deps browser prometheus docker image wrk dev api worker test test-fast screenshots lint format migrate \
	retry-abandoned cli psql send-test-webhook stripe-stub bench soak clean

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
	@command -v chromium >/dev/null || $(APT_INSTALL) "the operations page's browser tests use it" chromium

prometheus:  ## Debian's prometheus and promtool, for the metrics and alert-rule tests (installed when missing)
	@command -v promtool >/dev/null || $(APT_INSTALL) "the metrics and alert-rule tests use it" prometheus

docker:  ## Debian's docker.io (dockerd 20.10, BuildKit) and mmdebstrap, for the image test (installed when missing)
	@missing=; { command -v dockerd || test -x /usr/sbin/dockerd; } >/dev/null || missing=docker.io; \
		command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
		test -z "$$missing" || $(APT_INSTALL) "the image test builds and runs the production image" $$missing

wrk:  ## Debian's wrk, the load generator of make bench's intake phases (installed when missing)
	@command -v wrk >/dev/null || $(APT_INSTALL) "make bench's load generator" wrk

system-deps: browser prometheus docker

image:  ## the production image (deploy/Dockerfile) tagged saas-jobs-inbox:<git describe>, or IMAGE; PYTHON_IMAGE=another base, CA_BUNDLE=the CA pip trusts
	DOCKER_BUILDKIT=1 $(DOCKER) build --network host -f deploy/Dockerfile $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
		$(if $(CA_BUNDLE),--secret id=ca$(comma)src=$(CA_BUNDLE)) -t $(IMAGE) .
	@echo "Built $(IMAGE): APP_IMAGE=$(IMAGE) in deploy/.env runs it (docs/deploy.md, Releasing a new version)."

dev: install  ## API and worker together, embedded Postgres and Redis when no URLs are set
	@HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m tools.dev

api: install  ## the API only
	@$(WITH_DEV_ENV) $(BIN)/uvicorn --factory app.asgi:create_app --host $(HOST) --port $(PORT) --no-proxy-headers

worker: install  ## a worker for every queue, or QUEUES=a,b
	@$(WITH_DEV_ENV) $(BIN)/python -m app.worker $(if $(QUEUES),--queues $(QUEUES))

# NO_SYSTEM_DEPS=1: no Debian package installed, and the tests that need one deselected (tools/make_test.py).
# TEST_PROCESSES pytest processes (xdist workers): the tests spend much of their time waiting on the processes
# they start, so on 2 cores 3 finish about a fifth sooner than 2 (4, little more). Each takes the next test when
# it is free (--maxschedchunk 1), the longest first (tests/conftest.py).
# pytest runs with bytecode caching on even where the environment turns it off (PYTHONDONTWRITEBYTECODE, as
# some containers set): else each of its processes rewrites the asserts of every test module again, about 2 s
# of CPU each, where a rerun reads them from __pycache__ (ignored by git).
TEST_PROCESSES ?= 3
PYTEST_RUN := eval "$$($(BIN)/python -m tools.test_env)" && export TEST_DATABASE_URL TEST_REDIS_URL && \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n $(TEST_PROCESSES) --maxschedchunk 1 -q -p no:cacheprovider -p tools.make_test \
	$(if $(NO_SYSTEM_DEPS),--without-system-deps)
FAST_TESTS := -m "not slow and not browser and not container"

test: install $(if $(NO_SYSTEM_DEPS),,system-deps)  ## the whole suite against real Postgres, Redis, Chromium, Prometheus and a container engine
	@$(PYTEST_RUN) $(PYTEST_ARGS)

test-fast: install $(if $(NO_SYSTEM_DEPS),,prometheus)  ## the suite less its slow, browser and container tests
	@$(PYTEST_RUN) $(FAST_TESTS) $(PYTEST_ARGS)

screenshots: install browser  ## the operations page's pictures in docs/images, taken by its browser test
	@mkdir -p docs/images
	@eval "$$($(BIN)/python -m tools.test_env)" && export TEST_DATABASE_URL TEST_REDIS_URL && \
		OPS_SCREENSHOT_DIR=docs/images $(BIN)/pytest -q -p no:cacheprovider tests/ops \
		-k "overview_shows or phone_sized or try_it or customer_asks_why or timeline_on_a_phone"

lint: install  ## ruff, mypy and vulture (dead code) on the code and the tests, then on every python block of README.md and docs/
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy app bench tools tests
	@$(BIN)/vulture
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

psql: install  ## a psql shell on the development database (embedded when DATABASE_URL is unset); SQL="..." runs one statement
	@$(BIN)/python -m tools.psql

send-test-webhook: install  ## PROVIDER=stripe|clerk, signed with the configured secret, to the running API; SAMPLE=checkout: the try-it pair; SAMPLE=thin: a Stripe thin event
	@$(WITH_DEV_ENV) $(BIN)/python -m tools.send_test_webhook --provider $(PROVIDER) $(if $(SAMPLE),--sample $(SAMPLE)) --url http://$(HOST):$(PORT)

stripe-stub: install  ## the local Stripe API `make dev` uses with its generated key, serving the try-it checkout
	@$(BIN)/python -m tools.dev_stripe

bench: install wrk
	@$(BIN)/python -m bench $(BENCH_ARGS)

soak: install  ## the soak and chaos run (bench/soak/README.md): EVENTS=N deliveries, default 10,000
	@$(BIN)/python -m bench.soak $(if $(EVENTS),--events $(EVENTS))

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
