"""The application factory: ``litestar --app app.asgi:create_app ...`` and ``uvicorn --factory``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import click
from advanced_alchemy.extensions.litestar import SQLAlchemyPlugin
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.plugins import CLIPluginProtocol
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.template.config import TemplateConfig
from litestar.types import ControllerRouterHandler, Scope

from app.core.commands import mount
from app.core.errors import exit_on_settings_error
from app.core.gc_tuning import settle_after_start_up
from app.core.logging import configure_logging
from app.core.module import FeatureModule
from app.core.request_body import AppRequest
from app.core.request_context import request_context_middleware
from app.core.resources import Resources
from app.core.sentry import init_sentry, report_exception
from app.core.settings import Settings, SettingsError, get_settings
from app.runtime import API_MODULES, Runtime, all_modules, open_resources
from app.worker.cli import worker_group

logger = logging.getLogger(__name__)
# A statement of the API (intake's insert above all) that runs longer is cancelled by Postgres: 503, not a hang.
API_STATEMENT_TIMEOUT_SECONDS = 5.0
# GET /schema is the JSON document itself (also at /schema/openapi.json): no UI loaded from another host.
OPENAPI = OpenAPIConfig(
    title="SaaS jobs and webhook inbox",
    version="1",
    path="/schema",
    render_plugins=[JsonRenderPlugin(path=["/", "/openapi.json"])],
)


class ModuleCLIPlugin(CLIPluginProtocol):
    """Adds the worker's command and each module's command groups (``webhooks``, ``crons``...) to ``litestar``."""

    def on_cli_init(self, cli: click.Group) -> None:
        for group in [worker_group, *(group for module in all_modules() for group in module.cli_groups)]:
            mount(cli, group)


async def _log_server_error(exc: Exception, scope: Scope) -> None:
    """Logs and reports a fault of the API: no Sentry integration sees requests (nor their bodies)."""
    # An HTTPException is an answer we chose (a 503 is logged where it is decided), not a fault.
    if isinstance(exc, HTTPException):
        return
    method, path = scope.get("method"), scope.get("path")
    logger.error("Unhandled error on %s %s", method, path, exc_info=exc)
    report_exception(exc, tags={"method": method, "path": path})


def _lifespan(
    resources: Resources, modules: Sequence[FeatureModule]
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            stack.push_async_callback(resources.close)
            for module in modules:
                if module.lifespan is not None:
                    await stack.enter_async_context(module.lifespan(app.state, resources))
            settle_after_start_up()
            yield

    return lifespan


def build_app(
    settings: Settings,
    modules: Sequence[FeatureModule] = API_MODULES,
    *,
    dependencies: Mapping[str, Provide] | None = None,
) -> Litestar:
    """Build the app from explicit settings (tests use this; production uses ``create_app``).

    ``dependencies``: providers that replace those of the same names (a test's stand-in for a service).
    """
    configure_logging(settings)
    init_sentry(settings, "api")
    resources = open_resources(settings, modules, statement_timeout_seconds=API_STATEMENT_TIMEOUT_SECONDS)
    runtime = Runtime(settings)
    return Litestar(
        route_handlers=_route_handlers(modules, resources),
        dependencies=_dependencies(resources, runtime, modules, dependencies or {}),
        plugins=[SQLAlchemyPlugin(config=resources.db.config), ModuleCLIPlugin()],
        middleware=[request_context_middleware],
        request_class=AppRequest,
        lifespan=[_lifespan(resources, modules)],
        after_exception=[_log_server_error],
        logging_config=None,
        state=State({"runtime": runtime}),
        debug=False,
        request_max_body_size=settings.webhook_max_body_bytes,
        openapi_config=OPENAPI,
        template_config=_templates(modules),
    )


def _templates(modules: Sequence[FeatureModule]) -> TemplateConfig[JinjaTemplateEngine] | None:
    directories: list[Path | PathLike[Any] | str] = [path for module in modules for path in module.template_dirs]
    return TemplateConfig(directory=directories, engine=JinjaTemplateEngine) if directories else None


def _dependencies(
    resources: Resources, runtime: Runtime, modules: Sequence[FeatureModule], replaced: Mapping[str, Provide]
) -> dict[str, Provide]:
    """What a route can be injected with, by parameter name: the process's own, then each module's providers.

    All on the app, the outermost layer, so a test replaces any of them by
    name (``build_app(..., dependencies=...)``). Names are unique: a module
    providing one already provided, or a replacement of no provider, is refused.
    """
    provided: dict[str, Provide] = {
        "resources": Provide(lambda: resources, sync_to_thread=False),
        "worker_modules": Provide(lambda: runtime.worker_modules, sync_to_thread=False),
    }
    for module in modules:
        for name, provider in module.dependencies.items():
            if name in provided:
                raise SettingsError(f"Module {module.name!r} provides {name!r}, which is provided already: rename one.")
            provided[name] = provider
    unknown = sorted(set(replaced) - set(provided))
    if unknown:
        raise SettingsError(f"Nothing provides {', '.join(unknown)}, so nothing can be replaced by that name.")
    return {**provided, **replaced}


def _route_handlers(modules: Sequence[FeatureModule], resources: Resources) -> list[ControllerRouterHandler]:
    handlers: list[ControllerRouterHandler] = []
    for module in modules:
        handlers += module.route_handlers
        if module.route_factory is not None:
            handlers += module.route_factory(resources)
    return handlers


def create_app() -> Litestar:
    with exit_on_settings_error():
        return build_app(get_settings())
