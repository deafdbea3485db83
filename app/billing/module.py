"""The billing feature module: Stripe events, the workspace's billing state and its mirrors."""

from app.billing.budget import STRIPE
from app.billing.cli import billing_group
from app.billing.crons import BillingReconcileCronJob
from app.billing.handlers import STRIPE_EVENTS
from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund, BillingSync
from app.billing.sync import StripeSyncJob
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="billing",
    jobs=[StripeSyncJob],
    crons=[BillingReconcileCronJob],
    cli_groups=[billing_group],
    upstreams=[STRIPE],
    webhook_handlers={"stripe": STRIPE_EVENTS},
    models=[BillingDispute, BillingRefund, BillingFraudWarning, BillingSync],
)
