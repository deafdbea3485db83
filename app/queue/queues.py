"""Every queue, named in one place. A queue groups jobs retried and scaled together.

Each queue is served by its own arq Worker with its own slots, so a flood on
one never holds up another: each webhook provider's events have their queue,
the Stripe syncs theirs (they wait for the API budget), crons theirs.
"""

from enum import StrEnum


class QueueName(StrEnum):
    DEFAULT = "default-queue"
    WEBHOOK = "webhook-queue"
    """Events of a provider that names no queue of its own."""
    WEBHOOK_STRIPE = "webhook-stripe-queue"
    WEBHOOK_CLERK = "webhook-clerk-queue"
    STRIPE_SYNC = "stripe-sync-queue"
    """Reads of Stripe, each queued for its turn of the fleet's API budget."""
    BILLING = "billing-queue"
    CRON = "cron-queue"
    CLIENTS = "clients-queue"
