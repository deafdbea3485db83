"""The worked example's feature module: one job and one cron."""

from app.clients.crons import SendWeeklySummariesCronJob
from app.clients.jobs import SendClientSummaryJob
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="clients",
    jobs=[SendClientSummaryJob],
    crons=[SendWeeklySummariesCronJob],
)
