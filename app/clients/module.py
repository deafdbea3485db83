"""The worked example's feature module: one job, one cron and the upstream its job calls."""

from app.clients.crons import SendWeeklySummariesCronJob
from app.clients.email import EMAIL
from app.clients.jobs import SendClientSummaryJob
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="clients",
    jobs=[SendClientSummaryJob],
    crons=[SendWeeklySummariesCronJob],
    upstreams=[EMAIL],
)
