"""perform_once: a retried job neither repeats a sent effect nor skips an unsent one."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import select, text

from app.core.resources import Resources
from app.queue.effects import perform_once
from app.queue.errors import RetryLater
from app.queue.models import SideEffectClaim


async def _claims(resources: Resources) -> list[tuple[str, bool]]:
    async with resources.db.session() as session:
        rows = (await session.scalars(select(SideEffectClaim).order_by(SideEffectClaim.key))).all()
    return [(row.key, row.done_at is not None) for row in rows]


async def test_an_effect_done_once_is_not_repeated(resources: Resources) -> None:
    sent: list[str] = []

    async def send() -> None:
        sent.append("email")

    assert await perform_once(resources.db, "k", send) is True
    assert await perform_once(resources.db, "k", send) is False
    assert sent == ["email"]
    assert await _claims(resources) == [("k", True)]


async def test_a_failed_effect_releases_its_claim_so_the_retry_performs_it(resources: Resources) -> None:
    tries: list[int] = []

    async def flaky() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("mail server down")

    with pytest.raises(ConnectionError):
        await perform_once(resources.db, "k", flaky)
    assert await _claims(resources) == []
    assert await perform_once(resources.db, "k", flaky) is True
    assert len(tries) == 2 and await _claims(resources) == [("k", True)]


async def test_a_claim_held_by_a_running_job_makes_another_try_later(resources: Resources) -> None:
    release = asyncio.Event()

    async def slow() -> None:
        await release.wait()

    first = asyncio.create_task(perform_once(resources.db, "k", slow))
    await asyncio.sleep(0.3)
    with pytest.raises(RetryLater, match="being performed by another job"):
        await perform_once(resources.db, "k", slow)
    release.set()
    assert await first is True
    assert await perform_once(resources.db, "k", slow) is False


async def test_a_claim_abandoned_by_a_crash_is_skipped_by_default_and_repeated_on_request(
    resources: Resources, caplog: pytest.LogCaptureFixture
) -> None:
    async with resources.db.session() as session:
        await session.execute(
            text("INSERT INTO side_effect_claim (key, claimed_at) VALUES ('k', now() - interval '1 hour')")
        )
        await session.commit()
    sent: list[str] = []

    async def send() -> None:
        sent.append("email")

    with caplog.at_level(logging.ERROR, logger="app.queue.effects"):
        assert await perform_once(resources.db, "k", send) is False
    assert sent == []
    assert "DELETE FROM side_effect_claim WHERE key = 'k'" in caplog.text  # what the operator can do

    assert await perform_once(resources.db, "k", send, after_crash="repeat") is True
    assert sent == ["email"] and await _claims(resources) == [("k", True)]
