"""The webhook providers the API accepts: one line per provider."""

from app.webhooks.providers.base import WebhookProvider
from app.webhooks.providers.clerk import CLERK
from app.webhooks.providers.stripe import STRIPE

PROVIDERS: tuple[WebhookProvider, ...] = (STRIPE, CLERK)

__all__ = ["PROVIDERS", "WebhookProvider"]
