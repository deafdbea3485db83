"""The identity feature module: Clerk's users, organizations and memberships."""

from app.core.module import FeatureModule
from app.identity.clerk_gateway import CLERK
from app.identity.cli import identity_group
from app.identity.crons import IdentityReconcileCronJob
from app.identity.handlers import CLERK_EVENTS
from app.identity.jobs import IDENTITY_QUEUE, ApplyWorkspaceMemberLimitJob
from app.identity.journal import delete_old_changes
from app.identity.models import AppUser, Workspace, WorkspaceChange, WorkspaceMember

MODULE = FeatureModule(
    name="identity",
    queues=[IDENTITY_QUEUE],
    jobs=[ApplyWorkspaceMemberLimitJob],
    crons=[IdentityReconcileCronJob],
    cli_groups=[identity_group],
    upstreams=[CLERK],
    webhook_handlers={"clerk": CLERK_EVENTS},
    retention={"workspace change journal row": delete_old_changes},
    models=[Workspace, AppUser, WorkspaceMember, WorkspaceChange],
)
