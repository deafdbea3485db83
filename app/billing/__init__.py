"""Billing: the workspace's subscription state and Stripe mirrors, always read from the Stripe API."""

from app.billing.handlers import handle_stripe_event
from app.billing.jobs import ApplyWorkspaceMemberLimitData, ApplyWorkspaceMemberLimitJob
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="billing",
    jobs=[ApplyWorkspaceMemberLimitJob],
    webhook_handlers={"stripe": handle_stripe_event},
)

__all__ = ["MODULE", "ApplyWorkspaceMemberLimitData", "ApplyWorkspaceMemberLimitJob", "handle_stripe_event"]
