"""The system feature module: liveness and readiness probes (``app/system/controllers.py``)."""

from app.core.module import FeatureModule

MODULE = FeatureModule(name="system", api="app.system.controllers:API")
