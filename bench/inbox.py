"""Inbox rows stored as the intake stores them: the repository's statement, with the keys the handling module
decides from the body (the tenant whose turn the event takes, the subject a sync covers it by)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.runtime import WORKER_MODULES
from app.webhooks.handlers import stored_keys
from app.webhooks.inbox import Inbox
from app.webhooks.payload import normalized_for_inbox

if TYPE_CHECKING:
    from bench.harness import Run

CONCURRENCY = 16  # statements in flight (the harness's pool holds 20 connections)


@dataclass(frozen=True)
class Stored:
    provider: str
    row_id: int
    tenant_key: str | None
    event_id: str


async def store_events(run: Run, provider: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[Stored]:
    """Store each (event id, body) once, in order; returns the rows (every one must be new)."""
    keys_of = stored_keys(WORKER_MODULES, provider)
    inbox = Inbox(run.resources.db)

    async def store(event_id: str, body: dict[str, Any]) -> Stored:
        text = normalized_for_inbox(body)
        keys = await keys_of(run.resources, body["type"], body)
        stored = await inbox.store(
            provider, event_id, body["type"], text, tenant_key=keys.tenant, sync_subject=keys.subject
        )
        return Stored(provider, stored.row_id, keys.tenant, event_id)

    rows: list[Stored] = []
    for start in range(0, len(events), CONCURRENCY):
        part = events[start : start + CONCURRENCY]
        rows += await asyncio.gather(*(store(event_id, body) for event_id, body in part))
    return rows
