"""The worked example for SaaS developers: one job and one cron (see the README, "Add a job")."""

from app.clients.crons import SendWeeklySummariesCronJob
from app.clients.jobs import SendClientSummaryJob, SendClientSummaryJobData
from app.core.module import FeatureModule

MODULE = FeatureModule(
    name="clients",
    jobs=[SendClientSummaryJob],
    crons=[SendWeeklySummariesCronJob],
)

__all__ = ["MODULE", "SendClientSummaryJob", "SendClientSummaryJobData", "SendWeeklySummariesCronJob"]
