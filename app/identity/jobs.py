"""Identity's job: re-seat a workspace after its member limit changed (``seats.set_member_limit`` stages it)."""

from __future__ import annotations

import logging

import msgspec

from app.identity.services import SeatService
from app.queue.job import Job

logger = logging.getLogger(__name__)
IDENTITY_QUEUE = "identity-queue"
"""The module's own queue (declared in its ``MODULE``): seat changes never wait behind billing's jobs."""


class ApplyWorkspaceMemberLimitData(msgspec.Struct, frozen=True):
    workspace_id: int


class ApplyWorkspaceMemberLimitJob(Job[ApplyWorkspaceMemberLimitData]):
    """Suspend the newest active members beyond the workspace's limit; lift suspensions, oldest first, as it grows.

    It reads the limit when it runs (under the workspace's row lock), not from
    its data, so a late or repeated run applies the current limit and a second
    run changes nothing.
    """

    queue = IDENTITY_QUEUE
    # A few statements under one row lock. The timeout also bounds how long a run lost with its worker (SIGKILL,
    # or a Redis restart while it ran) waits to run again: with the 300 s default, seats stayed unenforced ~5 min.
    timeout_seconds = 30

    async def handle(self, data: ApplyWorkspaceMemberLimitData) -> None:
        async with self.resources.db.session() as session:
            result = await SeatService(session).apply_member_limit(data.workspace_id)
            await session.commit()
        if result.changed:
            logger.info(
                "Workspace %s member limit applied: suspended members %s, restored members %s.",
                data.workspace_id,
                result.suspended,
                result.restored,
            )
