"""The ops feature module: the API's /metrics (and, when OPS_PASSWORD is set, the /ops page): ``app/ops/api.py``;
``litestar workspaces timeline``."""

from app.core.module import FeatureModule
from app.ops.cli import workspaces_group

MODULE = FeatureModule(name="ops", api="app.ops.api:API", cli_groups=[workspaces_group])
