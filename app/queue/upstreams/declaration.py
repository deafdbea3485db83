"""An upstream as a module declares it: a name, a rate across the fleet, and optionally a cap on calls in flight."""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from app.core.module import FeatureModule, loaded_modules
from app.core.resources import Resources
from app.core.settings import Settings
from app.queue.job import FromSetting
from app.queue.upstreams.calls import Call, HealthCheck, UpstreamCalls
from app.queue.upstreams.rate import Reservation

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
DEFAULT_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Upstream:
    """An external API jobs call, declared once (``EMAIL = Upstream("email", per_second=10)``) and listed in its
    module's ``upstreams``.

    ``per_second``: calls per second across the whole fleet (a whole number, or ``FromSetting(...)``);
    ``in_flight``: at most this many calls at once across the fleet (None: no cap); ``timeout_seconds``: one
    call's time limit (a call past it fails as a timeout, which counts toward a hold); ``health``: optional, a
    call that shows the upstream answers whatever the subject (Stripe's lists one event), raising when it does
    not. With it, subjects failing in a row hold the upstream only if it fails too (a few objects failing while
    nothing else is asked are no outage), and it is the probe of a hold; without it, the probe is a waiting
    job's own call.
    """

    name: str
    per_second: int | FromSetting
    in_flight: int | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    health: HealthCheck | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"Upstream name {self.name!r}: use 1 to 40 lowercase letters, digits, - or _.")
        if isinstance(self.per_second, int) and self.per_second < 1:
            raise ValueError(f"Upstream {self.name}: per_second must be a whole number of at least 1.")
        if self.in_flight is not None and self.in_flight < 1:
            raise ValueError(f"Upstream {self.name}: in_flight must be at least 1, or None for no cap.")

    def rate(self, settings: Settings) -> int:
        """Calls per second across the fleet, read from its setting where it names one."""
        value = self.per_second.resolve(settings) if isinstance(self.per_second, FromSetting) else self.per_second
        return int(value)

    def of(self, resources: Resources) -> UpstreamCalls:
        """This process's way of calling it (its budget, its gate), built once per process."""
        registry = resources.shared(_Registry, lambda: _Registry(resources))
        calls = registry.calls.get(self.name)
        if calls is None:
            calls = registry.calls[self.name] = UpstreamCalls(
                resources,
                name=self.name,
                per_second=self.rate(resources.settings),
                in_flight=self.in_flight,
                timeout_seconds=self.timeout_seconds,
                health=self.health,
            )
            calls.unlisted = bool(loaded_modules(resources)) and self.name not in registry.listed
        return calls

    def call(
        self, resources: Resources, subject: str, *, reservation: Reservation | None = None
    ) -> AbstractAsyncContextManager[Call]:
        """``async with EMAIL.call(self.resources, subject=...)``: one call, through its rate, hold and pause."""
        return self.of(resources).call(subject, reservation=reservation)


def declared_upstreams(modules: Sequence[FeatureModule]) -> dict[str, Upstream]:
    """The upstreams the modules list, by name; two different declarations of one name are refused."""
    found: dict[str, Upstream] = {}
    for module in modules:
        for declared in module.upstreams:
            if not isinstance(declared, Upstream):
                raise TypeError(f"Module {module.name} lists {declared!r} in upstreams: declare it with Upstream(...).")
            if found.setdefault(declared.name, declared) != declared:
                raise ValueError(f"Upstream {declared.name!r} is declared twice, differently (module {module.name}).")
    return found


class _Registry:
    """The process's ``UpstreamCalls``, one per upstream name, and the names its loaded modules list."""

    def __init__(self, resources: Resources) -> None:
        self.calls: dict[str, UpstreamCalls] = {}
        self.listed = set(declared_upstreams(loaded_modules(resources)))
