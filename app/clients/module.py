"""The worked example's feature module: one job on its own queue, and one cron."""

from app.clients.crons import SendWeeklySummariesCronJob
from app.clients.jobs import CLIENTS_QUEUE, SendClientSummaryJob
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="clients",
    queues=[CLIENTS_QUEUE],
    jobs=[SendClientSummaryJob],
    crons=[SendWeeklySummariesCronJob],
)
