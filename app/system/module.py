"""The system feature module: liveness and readiness probes."""

from app.core.module import FeatureModule
from app.system.controllers import HealthController

MODULE = FeatureModule(name="system", route_handlers=[HealthController])
