"""The worked example of a job: send one workspace its summary email, once.

The workspace and its members are identity's: the job reads them through
identity's reads for other modules (``app/identity/directory.py``), never its
tables, so identity stays free to change them.
"""

from __future__ import annotations

import logging

import msgspec

from app.clients.email import EMAIL, EmailMessage, EmailSender, LoggingEmailSender
from app.identity.directory import active_workspace, member_emails
from app.queue.effects import perform_once
from app.queue.job import Job

logger = logging.getLogger(__name__)
CLIENTS_QUEUE = "clients-queue"
"""The module's own queue (declared in its ``MODULE``): summaries never wait behind another module's jobs."""


class SendClientSummaryJobData(msgspec.Struct, frozen=True):
    """Ids only: the job reads the current state itself when it runs."""

    workspace_id: int
    period: str  # which summary, e.g. the week's date "2025-06-02": one email per workspace and period


class SendClientSummaryJob(Job[SendClientSummaryJobData]):
    """Safe to run twice: the email is claimed under (workspace, period) before it is sent, through ``EMAIL``."""

    queue = CLIENTS_QUEUE
    retry_limit = 5

    def email_sender(self) -> EmailSender:
        return LoggingEmailSender()

    async def handle(self, data: SendClientSummaryJobData) -> None:
        async with self.resources.db.session() as session:
            workspace = await active_workspace(session, data.workspace_id)
            if workspace is None:
                logger.info("Workspace %s is gone: no summary.", data.workspace_id)
                return
            recipients = await member_emails(session, workspace.id)
        message = EmailMessage(
            to=recipients,
            subject=f"Your {workspace.name or 'workspace'} summary for {data.period}",
            body=(
                f"Members: {len(recipients)} (limit {workspace.member_limit}). "
                f"Plan: {workspace.subscription_status or 'free'}."
            ),
        )
        if not recipients:
            logger.info("Workspace %s has no member with an email: no summary.", data.workspace_id)
            return
        await perform_once(
            self.resources.db, f"client-summary:{data.workspace_id}:{data.period}", lambda: self.send(data, message)
        )

    async def send(self, data: SendClientSummaryJobData, message: EmailMessage) -> None:
        """Through the ``email`` upstream: its rate across the fleet; held or paused, the job waits for it."""
        async with EMAIL.call(self.resources, subject=f"workspace:{data.workspace_id}"):
            await self.email_sender().send(message)
