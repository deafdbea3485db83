"""Imports every feature module's models so Alembic and the tests see all tables."""

from app.billing import models as billing_models
from app.identity import models as identity_models
from app.queue import models as queue_models
from app.webhooks import models as webhook_models

__all__ = ["billing_models", "identity_models", "queue_models", "webhook_models"]
