"""Every queue, named in one place. A queue groups jobs retried and scaled together."""

from enum import StrEnum


class QueueName(StrEnum):
    DEFAULT = "default-queue"
    WEBHOOK = "webhook-queue"
    BILLING = "billing-queue"
    CRON = "cron-queue"
    CLIENTS = "clients-queue"
