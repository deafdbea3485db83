"""The billing feature module: Stripe events, the workspace's billing state and its mirrors."""

from app.billing.handlers import STRIPE_EVENTS
from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="billing",
    webhook_handlers={"stripe": STRIPE_EVENTS},
    models=[BillingDispute, BillingRefund, BillingFraudWarning],
)
