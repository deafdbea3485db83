"""The starter's own queues, named in one place; a feature module names its own in its ``MODULE``.

A queue groups jobs retried and scaled together. Each queue is served by its
own arq Worker with its own slots, so a flood on one never holds up another:
each webhook provider's events have their queue, the Stripe syncs theirs (they
wait for the API budget), crons theirs, and each module that declares one
(``FeatureModule.queues``: the worked example's ``clients-queue``, identity's,
a SaaS developer's) its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from app.core.module import FeatureModule


class QueueName(StrEnum):
    DEFAULT = "default-queue"
    WEBHOOK = "webhook-queue"
    """Events of a provider that names no queue of its own."""
    WEBHOOK_STRIPE = "webhook-stripe-queue"
    WEBHOOK_CLERK = "webhook-clerk-queue"
    STRIPE_SYNC = "stripe-sync-queue"
    """Reads of Stripe, each queued for its reservation of the fleet's API budget."""
    CRON = "cron-queue"


STARTER_QUEUES = frozenset(str(queue) for queue in QueueName)
WEBHOOK_QUEUES = frozenset({QueueName.WEBHOOK, QueueName.WEBHOOK_STRIPE, QueueName.WEBHOOK_CLERK})
"""Polled every ``WORKER_POLL_DELAY_SECONDS``: an event is processed within a poll of its delivery."""
RELAXED_POLL_SECONDS = 0.1
"""Every other queue is polled at most this often: each poll costs CPU and a Redis call even when idle (eight queues
at 0.01 s cost an idle worker about 3% of a core); a background job, a cron tick or a Stripe sync (queued 0.2 s
before its reservation) does not need a job started within 10 ms."""


def queue_names(modules: Iterable[FeatureModule]) -> list[str]:
    """Every queue the modules can use: the starter's own (``QueueName``), then each module's, in their order."""
    names = [str(queue) for queue in QueueName]
    for module in modules:
        names += [queue for queue in module.queues if queue not in names]
    return names


def poll_delay(queue: str, configured: float) -> float:
    """How often a worker looks for due jobs on ``queue``, given ``WORKER_POLL_DELAY_SECONDS``."""
    return configured if queue in WEBHOOK_QUEUES else max(configured, RELAXED_POLL_SECONDS)
