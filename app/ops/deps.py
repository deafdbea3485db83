"""The providers the ops routes are injected with: ``MODULE.dependencies``, mounted on the app by ``app/asgi.py``.

Each takes what the app provides (``resources``, ``worker_modules``) or
another provider's value, by parameter name. What is kept per process (the
login limiter, the enabled providers) is built once through
``resources.shared``; the rest is built per request, which costs no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from litestar.di import NamedDependency, Provide
from litestar.params import SkipValidation

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.ops.auth import LoginLimiter
from app.ops.metrics import EnabledProviders
from app.ops.pipeline_state import PipelineReader, worker_crons
from app.ops.services import OpsActions, OpsPages
from app.queue.queues import queue_names
from app.webhooks.inbox import Inbox

# Passed as they are: Litestar would validate a sequence of dataclasses field by field.
WorkerModules = SkipValidation[Sequence[FeatureModule]]


def provide_inbox(resources: NamedDependency[Resources]) -> Inbox:
    return Inbox(resources.db)


def provide_login_limiter(resources: NamedDependency[Resources]) -> LoginLimiter:
    return resources.shared(LoginLimiter, lambda: LoginLimiter(resources))


def provide_enabled_providers(resources: NamedDependency[Resources]) -> EnabledProviders:
    return resources.shared(EnabledProviders, lambda: EnabledProviders(resources.settings))


def provide_pipeline(
    resources: NamedDependency[Resources], worker_modules: NamedDependency[WorkerModules]
) -> PipelineReader:
    """The state of the pipeline the workers run: their crons, whichever modules this API loads."""
    return PipelineReader(resources, worker_crons(worker_modules), queue_names(worker_modules))


def provide_ops_pages(
    resources: NamedDependency[Resources],
    inbox: NamedDependency[Inbox],
    pipeline: NamedDependency[PipelineReader],
    worker_modules: NamedDependency[WorkerModules],
) -> OpsPages:
    providers = {provider for module in worker_modules for provider in module.webhook_handlers}
    return OpsPages(resources, inbox, pipeline, sorted(providers))


def provide_ops_actions(
    resources: NamedDependency[Resources], inbox: NamedDependency[Inbox], worker_modules: NamedDependency[WorkerModules]
) -> OpsActions:
    return OpsActions(resources, inbox, worker_crons(worker_modules))


DEPENDENCIES = {
    "inbox": Provide(provide_inbox, sync_to_thread=False),
    "login_limiter": Provide(provide_login_limiter, sync_to_thread=False),
    "enabled_providers": Provide(provide_enabled_providers, sync_to_thread=False),
    "pipeline": Provide(provide_pipeline, sync_to_thread=False),
    "ops_pages": Provide(provide_ops_pages, sync_to_thread=False),
    "ops_actions": Provide(provide_ops_actions, sync_to_thread=False),
}
