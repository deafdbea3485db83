"""The ops feature module: the API's /metrics (and, when OPS_PASSWORD is set, the /ops page): ``app/ops/api.py``."""

from app.core.module import FeatureModule

MODULE = FeatureModule(name="ops", api="app.ops.api:API")
