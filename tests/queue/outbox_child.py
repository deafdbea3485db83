"""A pipeline process that dies between its commit and its relay: ``python -m tests.queue.outbox_child EVENT_ID``.

It processes one inbox event whose handler stages a ``RecordJob`` (key: the
event id) in the handler's transaction. Where the pipeline would relay the
staged job, it prints ``committed`` and waits: the test SIGKILLs it there, as a
crash right after the commit. Settings come from the environment.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from app.core.module import FeatureModule
from app.core.settings import load_settings
from app.runtime import open_resources
from app.webhooks.handlers import WebhookContext
from app.webhooks.inbox import Inbox
from app.webhooks.processing import process_event
from tests.queue.sample_jobs import RecordData, RecordJob

PROVIDER = "outbox-test"


async def stage_record(context: WebhookContext) -> None:
    await context.queue(RecordJob, RecordData(key=context.event.event_id))


async def wait_to_be_killed(**_: Any) -> int:
    print("committed", flush=True)
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def main(event_id: str) -> None:
    module = FeatureModule(name="outbox-child", webhook_handlers={PROVIDER: stage_record})
    resources = open_resources(load_settings(), [module])
    resources.queue.relay_outbox = wait_to_be_killed  # type: ignore[method-assign]
    stored = await Inbox(resources.db).store(PROVIDER, event_id, "thing.happened", "{}")
    await process_event(resources, stored.row_id)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
