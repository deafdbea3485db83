"""The queue feature module: the crons command group and the tables of crons, side effects and the outbox."""

from app.core.module import FeatureModule
from app.queue.cli import crons_group
from app.queue.models import CronRun, JobOutbox, SideEffectClaim

MODULE = FeatureModule(name="queue", cli_groups=[crons_group], models=[CronRun, SideEffectClaim, JobOutbox])

__all__ = ["MODULE"]
