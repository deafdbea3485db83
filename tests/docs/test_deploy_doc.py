"""docs/deploy.md: the Stripe and Clerk events to subscribe to are exactly the types the loaded modules route,
its build commands are the ones `make image` and the image test run, and its proxy bounds what the API does not."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import API_MODULES
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from app.webhooks.guards import BODY_TIMEOUT_SECONDS
from app.webhooks.handlers import EventRoutes, SyncedEvents
from app.webhooks.inbox import Inbox
from tests.processes import logged_api_process, wait_for, worker_starter
from tools import container_engine
from tools.dev_stripe import TRY_SUBSCRIPTION, seed

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
EVENT_TYPE = re.compile(r"`([a-zA-Z_][a-zA-Z0-9_]*(?:\.(?:[a-zA-Z_]+|\*))+)`")


def subscribed(provider: str) -> list[str]:
    """The event types in backticks of the provider's paragraphs (``**Stripe**:`` up to the next one)."""
    section = GUIDE.read_text(encoding="utf-8").split("## Point the providers at the API", 1)[1]
    paragraph = section.split(f"**{provider}**:", 1)[1].split("\n\n**", 1)[0].split("\n\nThese are the routes", 1)[0]
    return EVENT_TYPE.findall(paragraph)


def routed(provider: str) -> list[str]:
    """The types the API's modules route for the provider: the ones its intake stores."""
    handlers = [module.webhook_handlers[provider] for module in API_MODULES if provider in module.webhook_handlers]
    routes = [handler for handler in handlers if isinstance(handler, EventRoutes | SyncedEvents)]
    assert routes and routes == handlers, f"a handler that lists no types takes every {provider} type: {handlers}"
    return [
        event_type
        for handler in routes
        for event_type in (handler.routes if isinstance(handler, EventRoutes) else handler.subjects)
    ]


@pytest.mark.parametrize(("provider", "name"), [("stripe", "Stripe"), ("clerk", "Clerk")])
def test_the_deploy_guide_subscribes_to_exactly_the_routed_types(provider: str, name: str) -> None:
    documented = subscribed(name)

    assert sorted(documented) == sorted(routed(provider))
    assert len(documented) == len(set(documented))


# --- building the image, and the proxy in front ----------------------------------------------------

ROOT = GUIDE.parents[1]
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def section(title: str) -> str:
    """The guide's text from the heading ``title`` up to the next heading of any level."""
    text = GUIDE.read_text(encoding="utf-8")
    start = re.search(rf"^#+ {re.escape(title)}\n", text, re.MULTILINE)
    assert start, f"docs/deploy.md has no section {title!r}"
    rest = text[start.end() :]
    end = re.search(r"^#+ ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def blocks(title: str, language: str) -> list[str]:
    return [code for lang, code in FENCED.findall(section(title)) if lang == language]


def lines(title: str) -> list[str]:
    return [line.split("  #")[0].strip() for code in blocks(title, "bash") for line in code.splitlines()]


def test_the_guides_build_command_is_what_make_image_runs() -> None:
    ran = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "image",
            "IMAGE=saas-jobs-inbox:v1.0.0",
            "DOCKER=/usr/bin/docker",
            "CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (make_runs,) = [" ".join(line.split()) for line in ran.replace("\\\n", " ").splitlines() if " build " in line]
    builds = [" ".join(line.split()) for line in lines("Building the image") if " build " in line]
    assert builds == [make_runs]


def test_the_guides_debian_base_is_the_one_the_image_test_makes() -> None:
    written = lines("Building without Docker Hub")
    mmdebstrap = next(line for line in written if line.startswith("mmdebstrap "))
    assert f"--include={container_engine.DEBIAN_BASE_PACKAGES}" in mmdebstrap.split()
    assert mmdebstrap.split()[-2:] == [container_engine.DEBIAN_SUITE, "base.tar"]
    assert f"docker import base.tar {container_engine.DEBIAN_BASE}" in written
    assert f"make image PYTHON_IMAGE={container_engine.DEBIAN_BASE}" in written


def test_the_proxy_site_bounds_headers_and_bodies_and_reaches_the_published_api() -> None:
    (site,) = blocks("A reverse proxy in front of the API", "nginx")
    statements = [line.split("#")[0].strip() for line in site.splitlines()]
    directives = [statement.rstrip(";").split(None, 1) for statement in statements if statement.endswith(";")]
    single = {name: value for name, value in directives if name != "proxy_set_header"}
    headers = dict(value.split(None, 1) for name, value in directives if name == "proxy_set_header")
    for timeout in ("client_header_timeout", "client_body_timeout"):
        assert re.fullmatch(r"\d+s", single[timeout]) and int(single[timeout][:-1]) <= BODY_TIMEOUT_SECONDS
    assert single["client_max_body_size"] == f"{load_settings({}).webhook_max_body_bytes // 1_048_576}m"
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yml").read_text())["services"]["app"]
    assert compose["ports"] == ["${API_PORT:-127.0.0.1:8000}:8000"]
    port = compose["command"][compose["command"].index("--port") + 1]
    assert single["proxy_pass"] == f"http://127.0.0.1:{port}"
    assert headers["X-Forwarded-For"] == "$proxy_add_x_forwarded_for"


# --- a Stripe event destination with thin payloads, tried locally ------------------------------------------


def thin_sample_line() -> list[str]:
    """The guide's `make send-test-webhook SAMPLE=...` line, as words."""
    (line,) = [line for line in lines("A Stripe event destination with thin payloads") if "send-test-webhook" in line]
    words = shlex.split(line)
    assert words[:2] == ["make", "send-test-webhook"]
    return words


def test_the_guides_thin_test_webhook_is_what_its_make_target_sends() -> None:
    words = thin_sample_line()
    sample = dict(word.split("=", 1) for word in words[2:])["SAMPLE"]
    make_runs = subprocess.run(
        ["make", "--no-print-directory", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert f"-m tools.send_test_webhook --provider stripe --sample {sample} --url http://127.0.0.1:8000" in make_runs


@pytest.mark.slow
async def test_the_guides_thin_test_webhook_is_stored_and_processed_by_a_running_api(
    settings_env: dict[str, str], resources: Resources, tmp_path: Path
) -> None:
    """The guide's `make send-test-webhook SAMPLE=...` line, run as its target runs it, against an API and a worker
    whose Stripe is `make stripe-stub`'s (serving the try-it subscription the thin event names)."""
    sample = dict(word.split("=", 1) for word in thin_sample_line()[2:])["SAMPLE"]
    with StripeStub() as stub:
        seed(stub)
        env = {**settings_env, "STRIPE_API_BASE": stub.base_url}
        async with worker_starter(env) as start:
            await start()
            with logged_api_process(env, tmp_path / "api.log") as base_url:
                sent = send_test_webhook(env, sample, base_url)
                assert sent.startswith("Sent stripe v1.customer.subscription.updated event evt_")
                assert ": HTTP 200 " in sent
                (row,) = await Inbox(resources.db).find(sent.split()[4].rstrip(":"), "stripe")
                assert row.related_object == f"subscription {TRY_SUBSCRIPTION}"
                await wait_for(lambda: _processed(resources, row.id), 30, "the thin event to be processed")
        assert ("GET", f"/v1/subscriptions/{TRY_SUBSCRIPTION}") in stub.requests


def send_test_webhook(env: dict[str, str], sample: str, url: str) -> str:
    """What `make send-test-webhook SAMPLE=...` runs (tools.send_test_webhook, with make's dev environment: ``env``)."""
    command = [
        sys.executable,
        "-m",
        "tools.send_test_webhook",
        "--provider",
        "stripe",
        "--sample",
        sample,
        "--url",
        url,
    ]
    sent = subprocess.run(command, cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    return sent.stdout


async def _processed(resources: Resources, row_id: int) -> bool:
    record = await Inbox(resources.db).get(row_id)
    return record is not None and record.processed_at is not None
