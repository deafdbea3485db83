"""The queue feature module: the crons and upstreams command groups, and the tables of crons, side effects and the
outbox."""

from app.core.module import FeatureModule
from app.queue.cli import crons_group
from app.queue.models import CronRun, JobOutbox, SideEffectClaim
from app.queue.upstreams.cli import upstreams_group

MODULE = FeatureModule(
    name="queue", cli_groups=[crons_group, upstreams_group], models=[CronRun, SideEffectClaim, JobOutbox]
)

__all__ = ["MODULE"]
