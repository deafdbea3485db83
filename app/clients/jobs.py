"""The worked example of a job: send one workspace its summary email, once."""

from __future__ import annotations

import logging

import msgspec
from sqlalchemy import func, select

from app.clients.email import EmailMessage, EmailSender, LoggingEmailSender
from app.identity.models import AppUser, Workspace, WorkspaceMember
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
    """Safe to run twice: the email is claimed under (workspace, period) before it is sent."""

    queue = CLIENTS_QUEUE
    retry_limit = 5

    def email_sender(self) -> EmailSender:
        return LoggingEmailSender()

    async def handle(self, data: SendClientSummaryJobData) -> None:
        async with self.resources.db.session() as session:
            workspace = await session.get(Workspace, data.workspace_id)
            if workspace is None or workspace.deleted_at is not None:
                logger.info("Workspace %s is gone: no summary.", data.workspace_id)
                return
            members = (
                await session.execute(
                    select(AppUser.email)
                    .join(WorkspaceMember, WorkspaceMember.user_id == AppUser.id)
                    .where(
                        WorkspaceMember.workspace_id == workspace.id,
                        WorkspaceMember.deleted_at.is_(None),
                        AppUser.deleted_at.is_(None),
                        AppUser.email.is_not(None),
                    )
                    .order_by(func.lower(AppUser.email))
                )
            ).scalars()
            recipients = tuple(email for email in members if email)
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
            self.resources.db,
            f"client-summary:{data.workspace_id}:{data.period}",
            lambda: self.email_sender().send(message),
        )
