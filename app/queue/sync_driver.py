"""The sync driver (``MESSAGE_QUEUE_DRIVER=sync``, for tests): a job runs inside the call that queues it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database
from app.core.request_context import bound_request_id
from app.core.resources import JobOptions, JobState, MessageQueue
from app.core.settings import Settings
from app.queue.encoded import EncodedJob, encode_job, namespaced
from app.queue.errors import UnknownJobError
from app.queue.execution import run_attempt
from app.queue.job import Job, JobContext
from app.queue.outbox import relay_outbox, stage
from app.queue.serialization import as_read_back

ContextFactory = Callable[[str, int, str], JobContext]
"""(job id, retry limit, queue) -> the context a job runs with: the process's resources."""


class SyncQueue(MessageQueue):
    """Runs the job inside ``add`` with the same JSON round trip and validation as the worker.

    A failure is raised to the caller (once: no retries inline), so a test sees
    it. ``add(..., session=...)`` stages the job as the arq driver does;
    :meth:`relay_outbox` then runs the staged jobs inline.
    """

    def __init__(
        self, settings: Settings, db: Database, jobs: Mapping[str, type[Job[Any]]], context: ContextFactory
    ) -> None:
        self.settings = settings
        self.db = db
        self._context = context
        self._running: set[str] = set()
        # Staged rows name their job: the classes of the loaded modules, and any staged through this queue.
        self._classes: dict[str, type[Job[Any]]] = dict(jobs)

    async def _add(
        self, job_cls: type[Job[Any]], data: Any, options: JobOptions, *, session: AsyncSession | None
    ) -> str | None:
        job = encode_job(self.settings, job_cls, data, options)
        if session is not None:
            self._classes.setdefault(job.name, job_cls)
            stage(session, job)
            return job.job_id
        return await self._run(job_cls, job)

    async def _add_many(self, job_cls: type[Job[Any]], jobs: Sequence[tuple[Any, JobOptions]]) -> list[str | None]:
        return [await self._add(job_cls, data, options, session=None) for data, options in jobs]

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        """Run the staged jobs inline and delete their rows; the first failure is raised after all ran."""
        failures: list[Exception] = []

        async def send(jobs: list[EncodedJob]) -> None:
            for job in jobs:
                try:
                    await self._run(self._class_of(job), job)
                except Exception as exc:
                    failures.append(exc)

        relayed = await relay_outbox(self.db, send, session=session)
        if failures:
            raise failures[0]
        return relayed

    async def _run(self, job_cls: type[Job[Any]], job: EncodedJob) -> str | None:
        if job.job_id in self._running:
            return None
        context = dataclasses.replace(
            self._context(job.job_id, job.retry_limit, job_cls.queue), trace_context=job.trace_context
        )
        self._running.add(job.job_id)
        try:
            with bound_request_id(job.request_id):  # as the arq worker binds it
                await run_attempt(context, job_cls, as_read_back(job.data), may_retry=False)
        finally:
            self._running.discard(job.job_id)
        return job.job_id

    def _class_of(self, job: EncodedJob) -> type[Job[Any]]:
        job_cls = self._classes.get(job.name)
        if job_cls is None:
            raise UnknownJobError(
                f"Staged job {job.name} (id {job.job_id}) names a class no module of this process loads: "
                "it was dropped. List its module in the modules this process opens its resources with."
            )
        return job_cls

    async def state(self, deduplication_id: str, queue: str) -> JobState:
        job_id = namespaced(self.settings, deduplication_id)
        return "in_progress" if job_id in self._running else "absent"

    async def close(self) -> None:
        return None
