"""The ops module's routes: the API's /metrics and, when OPS_PASSWORD is set, the /ops page (``MODULE.api``)."""

from collections.abc import Sequence
from pathlib import Path

from litestar.types import ControllerRouterHandler

from app.core.module import ApiPart
from app.core.resources import Resources
from app.ops.controllers import ops_routes
from app.ops.deps import DEPENDENCIES
from app.ops.metrics import metrics


def _routes(resources: Resources) -> Sequence[ControllerRouterHandler]:
    """The page exists only with OPS_PASSWORD set: otherwise /ops answers 404."""
    return ops_routes(resources) if resources.settings.ops_password else []


API = ApiPart(
    route_handlers=[metrics],
    route_factory=_routes,
    dependencies=DEPENDENCIES,
    template_dirs=[Path(__file__).parent / "templates"],
)
