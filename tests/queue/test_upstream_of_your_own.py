"""A SaaS developer's job on its own upstream, in two real workers: rate-limited across both, and held by its
outage without using up its retries."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from litestar import Litestar, post
from litestar.params import JSONBody
from litestar.response import Response

from app.core.resources import Resources
from app.testing.loopback import LoopbackServer
from tests.billing.test_stripe_budget import most_in_window
from tests.processes import wait_for, worker_starter
from tests.queue.upstream_jobs import MAILER, SendMailData, SendMailJob

pytestmark = pytest.mark.slow(40)
MODULE = "tests.queue.upstream_jobs:MODULE"


class MailerStub(LoopbackServer):
    """The mail provider: records each send it accepted, with its time; ``down`` answers 503 to every one."""

    name = "mailer-stub"

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.sent: list[tuple[str, float]] = []
        self.refused = 0
        self._lock = threading.Lock()

    def _build_app(self) -> Litestar:
        @post("/send", status_code=202)
        async def send(data: JSONBody[dict[str, Any]]) -> Response[dict[str, str]]:
            with self._lock:
                if self.down:
                    self.refused += 1
                    return Response({"error": "down"}, status_code=503)
                self.sent.append((str(data["to"]), time.monotonic()))
            return Response({"queued": "yes"}, status_code=202)

        return Litestar([send])

    def recipients(self) -> list[str]:
        with self._lock:
            return [recipient for recipient, _ in self.sent]

    def calls(self) -> int:
        with self._lock:
            return len(self.sent) + self.refused


@pytest.fixture
def mailer() -> Iterator[MailerStub]:
    with MailerStub() as stub:
        yield stub


async def queue_mails(resources: Resources, recipients: list[str]) -> None:
    for recipient in recipients:
        await resources.queue.add(SendMailJob, SendMailData(recipient))


async def test_your_own_upstream_is_rate_limited_across_two_workers_and_held_by_its_outage(
    settings_env: dict[str, str], resources: Resources, mailer: MailerStub
) -> None:
    env = {**settings_env, "MESSAGE_QUEUE_DRIVER": "arq", "MAILER_URL": mailer.base_url, "UPSTREAM_PROBE_SECONDS": "1"}
    async with worker_starter(env, "--module", MODULE) as start:
        workers = await asyncio.gather(start(), start())
        first = [f"first-{n}@example.com" for n in range(24)]
        await queue_mails(resources, first)
        await wait_for(lambda: len(mailer.sent) == 24, 60, "the first 24 mails")
        assert sorted(mailer.recipients()) == sorted(first)
        # 4 a second across both workers (each alone would send 8): the 24 take about 23 / 4 s, and no 2 s hold
        # more than 2 x 4 + 1 slots, with one more for a call that reached the stub late behind the next one
        arrivals = sorted(at for _, at in mailer.sent)
        assert arrivals[-1] - arrivals[0] >= 23 / 4 - 0.75
        assert most_in_window(arrivals, 2.0) <= 2 * 4 + 1 + 1

        mailer.down = True
        during = [f"during-{n}@example.com" for n in range(12)]
        await queue_mails(resources, during)
        status = MAILER.of(resources)
        await wait_for(lambda: _held(status), 30, "the mailer to be held")
        calls_when_held = mailer.calls()
        await asyncio.sleep(5)  # longer than the jobs' two retries: waiting spends none of them
        assert mailer.calls() - calls_when_held <= 5 + 1  # one probe a second, nothing else

        mailer.down = False
        await wait_for(lambda: len(mailer.sent) == 36, 60, "every mail once the mailer answers")
        lines = "".join(worker.text() for worker in workers)
    assert sorted(mailer.recipients()) == sorted(first + during)  # each sent once
    assert "no retries left" not in lines and "final:" not in lines
    assert lines.count("Upstream mailer is held: 3 different subjects failed in a row") == 1


async def _held(calls: Any) -> bool:
    return bool((await calls.status()).state == "held")
