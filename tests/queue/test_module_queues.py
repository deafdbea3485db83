"""A module declares its own queues in its ``MODULE``; the starter's own are in ``app/queue/queues.py``."""

from __future__ import annotations

import msgspec
import pytest

from app.core.module import FeatureModule
from app.core.settings import SettingsError
from app.queue.job import Job
from app.queue.queues import QueueName
from app.queue.registry import JobRegistry
from app.runtime import WORKER_MODULES
from app.worker.cli import select_queues


class NoteData(msgspec.Struct, frozen=True):
    note_id: int


class IndexNoteJob(Job[NoteData]):
    queue = "notes-queue"

    async def handle(self, data: NoteData) -> None:
        pass


NOTES = FeatureModule(name="notes", queues=["notes-queue"], jobs=[IndexNoteJob])


def test_a_module_s_queue_is_served_after_the_starter_s_and_can_be_chosen() -> None:
    registry = JobRegistry.from_modules([*WORKER_MODULES, NOTES])

    assert registry.queues()[-1] == "notes-queue"
    assert registry.queues()[0] == QueueName.WEBHOOK
    assert {"clients-queue", "identity-queue"} <= set(registry.queues())
    assert not {"clients-queue", "identity-queue"} & {str(queue) for queue in QueueName}  # the modules' own
    assert select_queues(registry, "notes-queue, identity-queue") == ["notes-queue", "identity-queue"]


def test_a_job_on_a_queue_its_module_does_not_declare_is_refused_at_start() -> None:
    undeclared = FeatureModule(name="notes", jobs=[IndexNoteJob])

    with pytest.raises(SettingsError, match="IndexNoteJob runs on 'notes-queue', which module 'notes' does not"):
        JobRegistry.from_modules([*WORKER_MODULES, undeclared])


@pytest.mark.parametrize("name", ["clients-queue", "cron-queue", "a,b", ""])
def test_a_queue_taken_already_or_unusable_by_queues_is_refused(name: str) -> None:
    with pytest.raises(SettingsError, match=f"Module 'other' declares queue {name!r}"):
        JobRegistry.from_modules([*WORKER_MODULES, FeatureModule(name="other", queues=[name])])


def test_queues_names_every_known_queue_when_one_is_not() -> None:
    registry = JobRegistry.from_modules(WORKER_MODULES, elsewhere=[NOTES])

    with pytest.raises(
        SettingsError, match=r"'nowhere-queue' is not a queue: use some of .*identity-queue, .*notes-queue"
    ):
        select_queues(registry, "nowhere-queue")
    with pytest.raises(SettingsError, match="no loaded job uses 'notes-queue'"):
        select_queues(registry, "notes-queue")
