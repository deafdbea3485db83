"""A real Prometheus scrapes a real API and a real worker with the shipped config and alert rules.

deploy/prometheus/prometheus.yml is run as shipped but for what only the compose network has: the
targets (127.0.0.1 instead of ``app`` and the ``worker`` DNS name), the token file's and the rules'
paths, and a 1 s interval. After known traffic, Prometheus' HTTP API must answer the counts sent,
with both targets up, every alert rule evaluating without error and every dashboard query running:
with METRICS_TOKEN set (the token file holds it) and without (the file is empty).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.core.resources import Resources
from app.testing import signed_stripe_delivery, stripe_event
from app.testing.processes import free_port
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from tests.processes import api_process, wait_for, worker_starter
from tests.webhooks.worker_handlers import PROVIDER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
TOKEN = "scrape-token-8841"
WRONG_SECRET = "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25n"
WITHIN = 20.0  # seconds for Prometheus to see what was sent (it scrapes every second)


def local_config(api: str, worker: str, token_file: Path) -> dict[str, Any]:
    """The shipped config with local targets, paths and a 1 s interval; everything else as shipped."""
    config = yaml.safe_load(CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"api", "worker"}
    assert jobs["api"].pop("static_configs") and jobs["worker"].pop("dns_sd_configs")
    jobs["api"]["static_configs"] = [{"targets": [api]}]
    jobs["worker"]["static_configs"] = [{"targets": [worker]}]
    for job in jobs.values():
        job["authorization"]["credentials_file"] = str(token_file)
    return config


@contextmanager
def prometheus(config: dict[str, Any], folder: Path) -> Iterator[str]:
    """``prometheus`` on a free port with ``config``; yields its URL once ready; killed at the end."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("Debian's prometheus package is not installed: run `make prometheus`", pytrace=False)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = folder / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    try:
        while not ready(url):
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited with {process.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus was not ready within 10 s:\n{log_path.read_text()}")
            with suppress(subprocess.TimeoutExpired):
                process.wait(0.05)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    body = response.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def value(url: str, expr: str) -> float | None:
    """The single sample of an instant query, None when it has none."""
    result = query(url, expr)
    assert len(result) <= 1, (expr, result)
    return float(result[0]["value"][1]) if result else None


def targets(url: str) -> dict[str, dict[str, Any]]:
    active = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    return {target["labels"]["job"]: target for target in active}


async def see(url: str, expr: str, expected: float, what: str) -> None:
    await wait_for(lambda: value(url, expr) == expected, WITHIN, f"Prometheus to see {what}: {expr} == {expected}")


@pytest.mark.parametrize("token", [TOKEN, None], ids=["with-token", "without-token"])
async def test_prometheus_scrapes_the_api_and_a_worker_with_the_shipped_config_and_rules(
    token: str | None,
    settings_env: dict[str, str],
    effects_table: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    resources = effects_table
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    env = {**settings_env, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}  # as compose runs the API
    worker_env = dict(settings_env)
    if token:
        env["METRICS_TOKEN"] = worker_env["METRICS_TOKEN"] = token
    token_file = tmp_path / "metrics_token"
    token_file.write_text(f"{token}\n" if token else "")  # Prometheus trims the newline
    worker_port = free_port()
    module = "tests.webhooks.worker_handlers:MODULE"

    with api_process(env) as api_url:
        api = api_url.removeprefix("http://")
        config = local_config(api, f"127.0.0.1:{worker_port}", token_file)
        with prometheus(config, tmp_path) as url:
            async with worker_starter(worker_env, "--module", module, "--queues", "webhook-queue") as start:
                await start(WORKER_METRICS_PORT=str(worker_port))

                # One event of the test provider, processed by the worker.
                stored = await Inbox(resources.db).store(PROVIDER, "evt_scrape_1", "test.event", "{}")
                await queue_processing(resources.queue, PROVIDER, stored.row_id)
                pipeline = f'sum(webhook_pipeline_seconds_count{{provider="{PROVIDER}"}})'
                await see(url, pipeline, 1, "the worker's pipeline histogram")
                # The metric's own job label survives the scrape (honor_labels), not as exported_job.
                await see(url, 'sum(job_runs_total{job="ProcessWebhookEventJob", outcome="ok"})', 1, "job runs")
                await see(url, "max(workers_alive)", 1, "the worker's heartbeat through the API")
                quantile = value(
                    url,
                    f'histogram_quantile(0.99, sum by (le) (webhook_pipeline_seconds_bucket{{provider="{PROVIDER}"}}))',
                )
                assert quantile is not None and math.isfinite(quantile) and 0 < quantile <= 60, quantile

                def both_up() -> bool:
                    found = targets(url)
                    return all(found.get(job, {}).get("health") == "up" for job in ("api", "worker"))

                await wait_for(both_up, WITHIN, f"both targets up: {json.dumps(targets(url), default=str)[:2000]}")
                found = targets(url)
                assert found["api"]["scrapeUrl"] == f"http://{api}/metrics"
                assert found["worker"]["scrapeUrl"] == f"http://127.0.0.1:{worker_port}/metrics"

            # The worker is gone now: nothing processes what the API stores below.
            secret = webhook_secrets["stripe"]
            async with httpx.AsyncClient(base_url=api_url) as client:
                for n in range(3):
                    delivery = signed_stripe_delivery(
                        stripe_event("customer.subscription.updated", {"id": f"sub_scrape_{n}"}), secret
                    )
                    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
                    assert response.status_code == 200, response.text
                wrong = signed_stripe_delivery(stripe_event("invoice.paid", {"id": "in_scrape"}), WRONG_SECRET)
                for _ in range(2):
                    response = await client.post("/webhooks/stripe", content=wrong.body, headers=wrong.headers)
                    assert response.status_code == 400, response.text
            deliveries = 'sum(webhook_deliveries_total{{provider="stripe", outcome="{}"}})'
            await see(url, deliveries.format("stored"), 3, "the stored deliveries")
            await see(url, deliveries.format("rejected_signature"), 2, "the refused signatures")
            await see(url, deliveries.format("too_large"), 0, "an outcome at 0 from the start")
            pending = 'max(webhook_inbox_events{provider="stripe", state="pending"})'
            await see(url, pending, 3, "the inbox's pending events read at scrape time")

            # Every shipped rule has been evaluated against these series without an error.
            def rules_healthy() -> list[dict[str, Any]] | None:
                groups = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
                rules = [rule for group in groups for rule in group["rules"]]
                return rules if rules and all(rule["health"] == "ok" for rule in rules) else None

            rules = await wait_for(rules_healthy, WITHIN, "every alert rule evaluated without error")
            assert len(rules) == len([r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]])

            # Every dashboard query runs on the live series (Grafana's variables as it sends them).
            dashboard = json.loads(DASHBOARD.read_text())
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    query(url, target["expr"].replace("$__rate_interval", "1m").replace("$provider", ".*"))
