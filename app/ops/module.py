"""The ops feature module: the API's /metrics, the /ops page (when OPS_PASSWORD is set), ``workspaces timeline``."""

from collections.abc import Sequence
from pathlib import Path

from litestar.types import ControllerRouterHandler

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.ops.cli import workspaces_group
from app.ops.controllers import ops_routes
from app.ops.deps import DEPENDENCIES
from app.ops.metrics import metrics


def _routes(resources: Resources) -> Sequence[ControllerRouterHandler]:
    """The page exists only with OPS_PASSWORD set: otherwise /ops answers 404."""
    return ops_routes(resources) if resources.settings.ops_password else []


MODULE = FeatureModule(
    name="ops",
    route_handlers=[metrics],
    route_factory=_routes,
    dependencies=DEPENDENCIES,
    cli_groups=[workspaces_group],
    template_dirs=[Path(__file__).parent / "templates"],
)
