"""A SaaS developer's own upstream, as docs/jobs.md shows one: a mail provider's API, declared in one line and
called by a job. Loaded into real workers with ``--module tests.queue.upstream_jobs:MODULE``; the provider is the
test's stub at ``MAILER_URL``."""

from __future__ import annotations

import os

import httpx
import msgspec

from app.core.module import FeatureModule
from app.queue.errors import error_for_http_status
from app.queue.job import Job
from app.queue.queues import QueueName
from app.queue.upstreams import Upstream

MAILER = Upstream("mailer", per_second=4)


class SendMailData(msgspec.Struct, frozen=True):
    recipient: str


class SendMailJob(Job[SendMailData]):
    queue = QueueName.DEFAULT
    retry_limit = 2  # a provider down for longer than two retries must not use them up
    backoff_base_seconds = 0.2

    async def handle(self, data: SendMailData) -> None:
        async with MAILER.call(self.resources, subject=data.recipient), httpx.AsyncClient(timeout=5) as client:
            response = await client.post(f"{os.environ['MAILER_URL']}/send", json={"to": data.recipient})
            if response.status_code >= 400:
                raise error_for_http_status(response.status_code, f"The mailer answered sending to {data.recipient}")


MODULE = FeatureModule(name="mailer", jobs=[SendMailJob], upstreams=[MAILER])
