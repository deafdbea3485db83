"""The production image, built by `make image` and run on a real container engine as deploy/compose.yml runs it.

Each container gets what Compose would give it, read from deploy/compose.yml rather than copied here:
the service's command, its environment names, `init`, restart policy, logging, tmpfs, stop signal and
grace period, and the healthcheck (the image's own, or none where Compose disables it), as the image's
non-root user. Two things differ, both because the containers use this machine's test Postgres and Redis:

- every container runs on the host network (a dockerd the tests start has no bridge), so nothing is
  published and the API listens on the host's port 8000, as its command says;
- DATABASE_URL and REDIS_URL, which Compose points at its own services, point at the test servers, and
  the settings Compose reads from deploy/.env.production come from a file written for the run.

Then, from outside only (rows in Postgres, /metrics, exit codes, logs): `migrate` completes, the API's
healthcheck turns healthy, signed Stripe and Clerk deliveries are processed by the worker container,
/metrics counts them whichever API process answers, the worker's healthcheck (its heartbeat) turns healthy,
`docker stop` lets the worker finish a job held up by a row lock and exit 0 within its grace period, the
`webhook-retry-abandoned` one-off reopens a set-aside event, nothing in the image is writable by the user it
runs as, and a backup restores: the `backup` service's command dumps the database, the `restore` service's
command restores the dump into a fresh database, and an API container started on it finds the restored
events (a redelivery is a duplicate). No image can be pulled here: those two services' commands run with this
machine's pg_dump and pg_restore in place of the `postgres` image, their `/backups` a folder of the test.

Skipped, with the reason, when no container engine can run here. As root with no engine running, the
test starts `dockerd --bridge=none --iptables=false` itself and stops it at the end. The base image is
the Dockerfile's default when the engine has it or can pull it, else one made once from Debian's
packages (tools/container_engine.py). `-m "not container"` leaves the test out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from alembic.config import Config
from alembic.script import ScriptDirectory
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from app.core.db import ALEMBIC_VERSION_TABLE
from app.testing.deliveries import (
    Delivery,
    clerk_event,
    generate_whsec,
    random_id,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_subscription,
)
from app.testing.processes import free_port
from app.testing.stripe_stub import StripeStub
from tests.conftest import _drop_redis_keys, create_database, drop_database
from tests.deploy.test_compose import COMPOSE, ENV_EXAMPLE, env_example, interpolate, seconds
from tests.processes import wait_for
from tools import container_engine

pytestmark = [pytest.mark.container, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "saas-jobs-inbox:test"
# What Compose would read from deploy/.env: the API's processes, the image. No Postgres runs in a container.
COMPOSE_VARIABLES = {"POSTGRES_PASSWORD": "unused-by-this-test", "WEB_CONCURRENCY": "2", "APP_IMAGE": IMAGE}
# The libpq variables the backup and restore services set, all of which the test points at its own database.
POSTGRES_CLIENT_ENV = {"PGHOST", "PGUSER", "PGDATABASE", "PGPASSWORD"}
# The two settings Compose points at its own services; here they point at the test's servers.
SERVER_URLS = ("DATABASE_URL", "REDIS_URL")
# Keys of a service this test applies to its `docker run`; the others it knows Compose uses for ordering,
# scaling or publishing, which the test does itself or the host network makes moot. Any other key fails
# the test until it is applied here, so the containers cannot drift from the compose file unnoticed.
APPLIED = {"image", "command", "init", "restart", "env_file", "environment", "logging", "tmpfs"}
APPLIED |= {"stop_signal", "stop_grace_period", "healthcheck"}
NOT_APPLIED = {"build", "depends_on", "deploy", "profiles", "ports", "expose"}
# How long the slow job goes on after the worker got SIGTERM (WORKER_SHUTDOWN_GRACE_SECONDS is 60 in the image).
SLOW_JOB_SECONDS = 5.0
# Temp folders every Debian system leaves writable to all (sticky), and the API's metrics tmpfs: with what is in them.
WRITABLE_ON_PURPOSE = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/run/prometheus-multiproc")

WRITABLE_PATHS = """
import os
skip = ("/proc", "/sys", "/dev")
found = []
for folder, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
    for path in [folder, *(os.path.join(folder, name) for name in files)]:
        if not os.path.islink(path) and os.access(path, os.W_OK):
            found.append(path)
print(os.getuid(), os.getgid())
print("\\n".join(found))
"""


# --- the compose file, as `docker run` arguments ---------------------------------------------------


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE.read_text()), COMPOSE_VARIABLES)["services"]
    return services


def option(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} not in {argv}"
    return argv[argv.index(name) + 1]


class Containers:
    """The run's containers, started from the compose file's services; all removed at the end."""

    def __init__(self, run_id: str, env_file: Path, urls: dict[str, str]) -> None:
        self.run_id, self.env_file, self.urls = run_id, env_file, urls
        self.services = compose_services()
        self.names: list[str] = []

    def name(self, service: str) -> str:
        return f"saas-jobs-test-{self.run_id}-{service}"

    def run_args(self, service: str, name: str | None = None) -> list[str]:
        spec = self.services[service]
        unknown = set(spec) - APPLIED - NOT_APPLIED
        assert not unknown, f"deploy/compose.yml's {service} sets {sorted(unknown)}: apply it in Containers.run_args"
        name = name or self.name(service)
        args = ["--name", name, "--network", "host", "--label", f"saas-jobs-inbox.test={self.run_id}"]
        if spec.get("init"):
            args.append("--init")
        args += ["--restart", str(spec.get("restart", "no"))]
        env_files = spec.get("env_file", [])
        assert [entry if isinstance(entry, str) else entry["path"] for entry in env_files] == [".env.production"]
        args += ["--env-file", str(self.env_file)]
        environment = spec.get("environment", {})
        assert set(SERVER_URLS) <= set(environment), f"{service}: compose no longer sets {SERVER_URLS}"
        for key, value in environment.items():
            args += ["--env", f"{key}={self.urls.get(key, value)}"]
        logging = spec.get("logging", {})
        if logging:
            args += ["--log-driver", logging["driver"]]
            args += [
                arg for key, value in logging.get("options", {}).items() for arg in ("--log-opt", f"{key}={value}")
            ]
        args += [arg for mount in spec.get("tmpfs", []) for arg in ("--tmpfs", mount)]
        if "stop_signal" in spec:
            args += ["--stop-signal", spec["stop_signal"]]
        if "stop_grace_period" in spec:
            args += ["--stop-timeout", str(int(seconds(spec["stop_grace_period"])))]
        args += health_args(service, spec.get("healthcheck"))
        command = [str(part) for part in spec["command"]]
        return [*args, spec["image"], *command]

    def command(self, service: str) -> list[str]:
        return [str(part) for part in self.services[service]["command"]]

    def start(self, service: str, name: str | None = None) -> str:
        """`docker compose up -d` of one service (``name``: a second container of it)."""
        name = name or self.name(service)
        self.names.append(name)
        container_engine.docker("run", "--detach", *self.run_args(service, name), timeout=60)
        return name

    def run_once(self, service: str) -> subprocess.CompletedProcess[str]:
        """`docker compose run --rm` of a one-off: its exit code and output."""
        self.names.append(self.name(service))
        return container_engine.docker("run", "--rm", *self.run_args(service), timeout=180, check=False)

    def logs(self, name: str, tail: int = 60) -> str:
        result = container_engine.docker("logs", "--tail", str(tail), name, timeout=30, check=False)
        return f"--- docker logs {name} (last {tail} lines) ---\n{result.stdout}{result.stderr}"

    def state(self, name: str) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(
            container_engine.docker("inspect", "--format", "{{json .State}}", name, timeout=30).stdout
        )
        return state

    def remove_all(self) -> None:
        for name in self.names:
            container_engine.docker("rm", "--force", "--volumes", name, timeout=60, check=False)


def health_args(service: str, healthcheck: dict[str, Any] | None) -> list[str]:
    """A compose healthcheck as `docker run` options (none: the image's own)."""
    if healthcheck is None:
        return []
    if healthcheck == {"disable": True}:
        return ["--no-healthcheck"]
    kind, *test = healthcheck["test"]
    assert kind == "CMD", f"{service}: apply its healthcheck's {kind} form here"
    args = ["--health-cmd", shlex.join(test)]  # docker run takes the shell form; the words are the same
    for key in ("interval", "timeout", "start_period"):
        if key in healthcheck:
            args += [f"--health-{key.replace('_', '-')}", f"{int(seconds(healthcheck[key]))}s"]
    if "retries" in healthcheck:
        args += ["--health-retries", str(healthcheck["retries"])]
    return args


def postgres_client(service: str, url: str, backups: Path, args: list[str] | None = None) -> str:
    """A backup or restore service's command run here, on ``url``'s database, with ``backups`` as ``/backups``.

    The service's entrypoint and command (or ``args`` in place of the command, as `docker compose run --rm
    SERVICE ARGS` gives them), its libpq variables pointed at the test's server and database, Compose's
    ``$$`` made ``$``, and its ``--dbname=saas`` made the database of ``url``."""
    spec = compose_services()[service]
    assert set(spec["environment"]) == POSTGRES_CLIENT_ENV, f"{service}: point {sorted(spec['environment'])} here"
    assert spec["volumes"] == ["./backups:/backups"], spec["volumes"]
    target = make_url(url)
    env = {"PATH": os.environ["PATH"], "PGHOST": str(target.host), "PGPORT": str(target.port or 5432)}
    env |= {"PGUSER": str(target.username), "PGDATABASE": str(target.database), "PGPASSWORD": target.password or ""}
    argv = [str(part) for part in [*spec.get("entrypoint", []), *(args if args is not None else spec["command"])]]
    argv = [part.replace("$$", "$").replace("/backups", str(backups)) for part in argv]
    argv = [
        f"--dbname={target.database}" if part == f"--dbname={spec['environment']['PGDATABASE']}" else part
        for part in argv
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{service}: {shlex.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


# --- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(container_engine.running_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log"))
        except container_engine.EngineUnavailable as exc:
            pytest.skip(f"no container engine can run here: {exc}")
        yield


@pytest.fixture(scope="module")
def image(engine: None) -> str:
    """`make image` on the Dockerfile's default base, or on the Debian-made one when that cannot be pulled."""
    base = container_engine.base_image()
    previous = container_engine.docker("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    started = time.monotonic()
    result = subprocess.run(
        ["make", "--no-print-directory", "image", f"IMAGE={IMAGE}", f"PYTHON_IMAGE={base}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"make image failed on {base}:\n{(result.stdout + result.stderr)[-5000:]}"
    print(f"make image on {base}: {time.monotonic() - started:.0f} s")
    built = container_engine.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    if previous and previous != built:  # the last run's image, untagged now: its layers would pile up run after run
        container_engine.docker("rmi", previous, check=False)
    return IMAGE


@contextlib.asynccontextmanager
async def empty_database(base_url: str, prefix: str) -> AsyncIterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = await create_database(base_url, name)
    try:
        yield url
    finally:
        await drop_database(base_url, name)


@pytest.fixture
async def image_database(base_database_url: str) -> AsyncIterator[str]:
    """An empty database: the `migrate` container creates the schema."""
    async with empty_database(base_database_url, "image") as url:
        yield url


@pytest.fixture
async def restored_database(base_database_url: str) -> AsyncIterator[str]:
    """An empty database the backup is restored into."""
    async with empty_database(base_database_url, "restored") as url:
        yield url


@pytest.fixture
def stripe_api() -> Iterator[StripeStub]:
    """The Stripe API the containers talk to, on loopback: no call leaves the machine, whatever a cron does."""
    with StripeStub() as stub:
        yield stub


# --- helpers ---------------------------------------------------------------------------------------


def plain_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def head_revisions() -> set[str]:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    return set(ScriptDirectory.from_config(config).get_heads())


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def post(api: str, provider: str, delivery: Delivery) -> None:
    """One delivery on its own connection, so the API's processes share them as they share connections."""
    response = httpx.post(f"{api}/webhooks/{provider}", content=delivery.body, headers=delivery.headers, timeout=10)
    assert response.status_code == 200, f"{provider} delivery answered {response.status_code}: {response.text}"


def delivery_counts(api: str, token: str, outcome: str = "stored") -> dict[str, float]:
    response = httpx.get(f"{api}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "webhook_deliveries_total" and sample.labels.get("outcome") == outcome:
                counts[sample.labels["provider"]] = sample.value
    return counts


async def event_row(db: asyncpg.Connection, provider: str, event_id: str) -> asyncpg.Record | None:
    query = "SELECT processed_at, abandoned_at, last_error FROM webhook_event WHERE provider = $1 AND event_id = $2"
    row: asyncpg.Record | None = await db.fetchrow(query, provider, event_id)
    return row


async def processed(db: asyncpg.Connection, events: list[tuple[str, str]]) -> bool:
    for provider, event_id in events:
        row = await event_row(db, provider, event_id)
        if row is None or row["processed_at"] is None:
            return False
    return True


async def wait_healthy(containers: Containers, name: str, within: float) -> None:
    def healthy() -> bool:
        state = containers.state(name)
        assert state["Running"], f"{name} exited ({state['ExitCode']}):\n{containers.logs(name)}"
        status = state.get("Health", {}).get("Status")
        assert status != "unhealthy", f"{name} is unhealthy: {state['Health']['Log'][-1:]}\n{containers.logs(name)}"
        return bool(status == "healthy")

    try:
        await wait_for(healthy, within, f"{name}'s healthcheck to turn healthy", step=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{containers.logs(name)}") from None


# --- the test --------------------------------------------------------------------------------------


async def test_the_image_runs_as_the_compose_file_runs_it(
    image: str,
    image_database: str,
    restored_database: str,
    redis_url: str,
    stripe_api: StripeStub,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    namespace = f"img{run_id}:"
    secrets = {"stripe": generate_whsec(), "clerk": generate_whsec(), "metrics": uuid.uuid4().hex}
    settings = {
        "STRIPE_API_KEY": "sk_test_image_check",
        "STRIPE_WEBHOOK_SECRET": secrets["stripe"],
        "CLERK_WEBHOOK_SIGNING_SECRET": secrets["clerk"],
        "METRICS_TOKEN": secrets["metrics"],
        "STRIPE_API_BASE": stripe_api.base_url,
        "REDIS_NAMESPACE": namespace,
        "WORKER_METRICS_PORT": str(free_port()),
    }
    assert set(settings) <= set(env_example()), (
        f"not settings of {ENV_EXAMPLE.name}: {set(settings) - set(env_example())}"
    )
    env_file = tmp_path / ".env.production"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))
    containers = Containers(run_id, env_file, {"DATABASE_URL": image_database, "REDIS_URL": redis_url})

    api_port = int(option(containers.command("app"), "--port"))
    assert port_is_free(api_port), (
        f"Port {api_port} of this host is taken (a `make dev` or `make api`?): the API container listens there on "
        "the host network, as deploy/compose.yml's command says. Stop what listens there and run the test again."
    )
    api = f"http://127.0.0.1:{api_port}"
    db = await asyncpg.connect(plain_dsn(image_database))
    try:
        # The image's user: not root; compose sets none, so the image's USER is the containers' user.
        config = json.loads(container_engine.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
        assert config["User"] and config["User"].split(":")[0] not in ("0", "root"), config["User"]
        assert config["Healthcheck"]["Test"], "the image has no healthcheck"

        migrate = containers.run_once("migrate")
        assert migrate.returncode == 0, f"migrate exited {migrate.returncode}:\n{migrate.stdout}{migrate.stderr}"
        versions = await db.fetch(f"SELECT version_num FROM {ALEMBIC_VERSION_TABLE}")
        assert {row["version_num"] for row in versions} == head_revisions(), migrate.stdout + migrate.stderr

        app = containers.start("app")
        worker = containers.start("worker")
        await wait_healthy(containers, app, within=120)
        await wait_healthy(containers, worker, within=120)  # its heartbeat, read by app.worker.health
        top = container_engine.docker("top", app, "-eo", "pid,args", timeout=30).stdout
        processes = int(option(containers.command("app"), "--workers"))
        assert sum("spawn_main" in line for line in top.splitlines()) == processes, top

        # Deliveries: a Stripe customer linked to no workspace ("nothing to sync"), Clerk users, one Clerk
        # event that cannot be applied (no updated_at: set aside at once, for the one-off below).
        user_id = random_id("user")
        stripe_events = [
            stripe_event("customer.subscription.updated", stripe_subscription(random_id("cus"))) for _ in range(2)
        ]
        created_ms = int(time.time() * 1000) - 60_000
        clerk_events = [
            clerk_event("user.created", id=user_id, timestamp=created_ms),
            clerk_event("user.created", id=random_id("user")),
        ]
        unusable = signed_clerk_delivery(
            clerk_event("user.updated", id=random_id("user"), updated_at=None), secrets["clerk"]
        )
        stripe_deliveries = [signed_stripe_delivery(event, secrets["stripe"]) for event in stripe_events]
        clerk_deliveries = [signed_clerk_delivery(event, secrets["clerk"]) for event in clerk_events]
        for delivery in stripe_deliveries:
            post(api, "stripe", delivery)
        for delivery in [*clerk_deliveries, unusable]:
            post(api, "clerk", delivery)
        events = [("stripe", d.event_id) for d in stripe_deliveries] + [("clerk", d.event_id) for d in clerk_deliveries]
        try:
            await wait_for(lambda: processed(db, events), 60, "the worker container to process the deliveries", 0.2)

            async def set_aside() -> bool:
                row = await event_row(db, "clerk", unusable.event_id)
                return row is not None and row["abandoned_at"] is not None

            await wait_for(set_aside, 60, "the unusable Clerk event to be set aside", 0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{containers.logs(worker)}") from None

        # Every scrape, on a new connection to whichever process takes it, counts every delivery.
        expected = {"stripe": len(stripe_deliveries), "clerk": len(clerk_deliveries) + 1}
        scrapes = [delivery_counts(api, secrets["metrics"]) for _ in range(3 * processes)]
        assert all(counts == expected for counts in scrapes), f"expected {expected} in each scrape: {scrapes}"

        # A slow job: a Clerk change of a user whose row this test holds locked. `docker stop` during it: the
        # worker takes no new job, lets this one finish once the lock goes, and exits 0 within its grace period.
        grace = seconds(containers.services["worker"]["stop_grace_period"])
        held = await asyncpg.connect(plain_dsn(image_database))
        lock = held.transaction()
        await lock.start()
        await held.execute("SELECT 1 FROM app_user WHERE clerk_user_id = $1 FOR UPDATE", user_id)
        change = signed_clerk_delivery(
            clerk_event("user.updated", id=user_id, timestamp=created_ms + 1000, first_name="Stopped"), secrets["clerk"]
        )
        post(api, "clerk", change)
        blocked = "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
        await wait_for(lambda: db.fetchval(blocked, held.get_server_pid()), 30, "the job to wait for the row lock", 0.1)
        docker = container_engine.client() or "docker"
        stop = await asyncio.create_subprocess_exec(docker, "stop", worker, stdout=PIPE, stderr=STDOUT)
        stop_sent = time.monotonic()
        try:
            await wait_for(
                lambda: "SIGTERM received" in containers.logs(worker), 20, "the worker to log SIGTERM", step=0.2
            )
            # The job outlasts the signal: the worker must keep it running, not cancel it, until it can finish.
            await asyncio.sleep(SLOW_JOB_SECONDS)
            assert containers.state(worker)["Running"], (
                f"the worker ended before its job finished:\n{containers.logs(worker)}"
            )
            assert await db.fetchval(blocked, held.get_server_pid()), "the job stopped waiting for the lock: cancelled?"
            row = await event_row(db, "clerk", change.event_id)
            assert row is not None and row["processed_at"] is None, "the job finished while the row was locked"
        finally:
            await lock.rollback()
            await held.close()
        output, _ = await asyncio.wait_for(stop.communicate(), timeout=grace + 15)
        stopped_in = time.monotonic() - stop_sent
        state = containers.state(worker)
        assert stop.returncode == 0, output.decode(errors="replace")
        assert state["ExitCode"] == 0 and not state["OOMKilled"], f"{state}\n{containers.logs(worker)}"
        assert stopped_in < grace, f"the worker took {stopped_in:.0f} s to stop; its grace period is {grace:.0f} s"
        row = await event_row(db, "clerk", change.event_id)
        assert row is not None and row["processed_at"] is not None, containers.logs(worker)
        assert await db.fetchval("SELECT first_name FROM app_user WHERE clerk_user_id = $1", user_id) == "Stopped"
        assert "Worker stopped." in containers.logs(worker)

        # The operator's one-off reopens the set-aside event.
        reopened = containers.run_once("webhook-retry-abandoned")
        assert reopened.returncode == 0, f"exited {reopened.returncode}:\n{reopened.stdout}{reopened.stderr}"
        assert reopened.stdout.strip().splitlines()[-1] == "Reopened 1 webhook event.", reopened.stdout
        row = await event_row(db, "clerk", unusable.event_id)
        assert row is not None and row["abandoned_at"] is None

        # Nothing in the image is writable by the user it runs as (the code, the venv, the system).
        walked = container_engine.docker("exec", app, "python", "-c", WRITABLE_PATHS, timeout=120).stdout.splitlines()
        uid, gid = (int(number) for number in walked[0].split())
        assert f"{uid}:{gid}" == config["User"] and uid != 0
        writable = [path for path in walked[1:] if path and not path.startswith(WRITABLE_ON_PURPOSE)]
        assert not writable, f"writable by the container's user {uid}: {writable[:20]}"

        # The backup of docs/deploy.md restored into a fresh database, and an API serving from it.
        backups = tmp_path / "backups"
        backups.mkdir()
        postgres_client("backup", image_database, backups)
        (dump,) = backups.glob("saas-*.dump")
        postgres_client("restore", restored_database, backups, [f"/backups/{dump.name}"])
        container_engine.docker("stop", app, timeout=60)  # the restored database's API takes the port
        restored_urls = {"DATABASE_URL": restored_database, "REDIS_URL": redis_url}
        containers.urls = restored_urls
        migrated = containers.run_once("migrate")
        assert migrated.returncode == 0, f"migrate on the restored database:\n{migrated.stdout}{migrated.stderr}"
        restored_app = containers.start("app", name=containers.name("app-restored"))
        await wait_healthy(containers, restored_app, within=120)
        restored = await asyncpg.connect(plain_dsn(restored_database))
        try:
            query = "SELECT provider, event_id FROM webhook_event WHERE processed_at IS NOT NULL"
            assert set(events) <= {(row["provider"], row["event_id"]) for row in await restored.fetch(query)}
            again = signed_stripe_delivery(stripe_events[0], secrets["stripe"])  # signed anew, the same event
            post(api, "stripe", again)
            assert delivery_counts(api, secrets["metrics"], "duplicate") == {"stripe": 1, "clerk": 0}
            count = "SELECT count(*) FROM webhook_event WHERE event_id = $1"
            assert await restored.fetchval(count, again.event_id) == 1
        finally:
            await restored.close()
        print(f"containers: {time.monotonic() - started:.0f} s")
    finally:
        containers.remove_all()
        await db.close()
        await _drop_redis_keys(redis_url, namespace)
