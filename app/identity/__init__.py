"""Identity: Clerk users, organizations (our workspaces) and memberships, copied from Clerk's webhooks."""

from app.core.module import FeatureModule
from app.identity.handlers import handle_clerk_event

MODULE = FeatureModule(name="identity", webhook_handlers={"clerk": handle_clerk_event})

__all__ = ["MODULE", "handle_clerk_event"]
