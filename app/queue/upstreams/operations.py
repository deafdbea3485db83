"""What an operator does with upstreams, whatever asks (``litestar upstreams ...`` or ``/ops``): list, pause, resume.

Each names upstreams by the names the loaded modules declare; an unknown name
is :class:`UnknownUpstream`, whose message lists the known ones. Each action
returns the line the command prints last and the page shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.core.resources import Resources
from app.queue.upstreams.declaration import Upstream
from app.queue.upstreams.gate import GateStatus


class UnknownUpstream(LookupError):
    """No loaded module declares an upstream by that name."""


@dataclass(frozen=True)
class UpstreamRow:
    name: str
    per_second: int
    in_flight: int | None
    status: GateStatus

    @property
    def rate(self) -> str:
        cap = f", {self.in_flight} in flight" if self.in_flight is not None else ""
        return f"{self.per_second}/s{cap}"

    @property
    def state(self) -> str:
        """``ok``, ``held since <time>: <last error>``, ``paused until <time>`` (or ``until resumed``)."""
        status = self.status
        if status.state == "held":
            return f"held since {moment(status.since)}: {status.last_error or 'no error recorded'}"
        if status.state == "paused":
            return f"paused until {moment(status.until) if status.until else 'resumed'}"
        return "ok"


def moment(at: datetime | None) -> str:
    """A time as the commands and the page print it: ``2026-12-03 14:00:05 UTC``."""
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if at is not None else "an unknown time"


def find(declared: Mapping[str, Upstream], name: str) -> Upstream:
    upstream = declared.get(name)
    if upstream is None:
        known = ", ".join(sorted(declared)) or "none"
        raise UnknownUpstream(f"No upstream named {name!r}; the known upstreams are: {known}.")
    return upstream


async def upstream_rows(resources: Resources, declared: Mapping[str, Upstream]) -> list[UpstreamRow]:
    """Each declared upstream with its rate and its state now, by name."""
    rows = []
    for name in sorted(declared):
        upstream = declared[name]
        status = await upstream.of(resources).status()
        rows.append(UpstreamRow(name, upstream.rate(resources.settings), upstream.in_flight, status))
    return rows


async def pause(resources: Resources, declared: Mapping[str, Upstream], name: str, duration: timedelta | None) -> str:
    """No call of the fleet goes to ``name`` until it is resumed (or for ``duration``); its jobs wait."""
    upstream = find(declared, name)
    seconds = duration.total_seconds() if duration is not None else None
    await upstream.of(resources).pause(seconds)
    until = moment(datetime.now(UTC) + duration) if duration is not None else "resumed"
    return f"Paused {name} until {until}."


async def resume(resources: Resources, declared: Mapping[str, Upstream], name: str) -> str:
    """Its calls go again; its waiting jobs come back within ``UPSTREAM_PROBE_SECONDS`` and drain at its rate."""
    await find(declared, name).of(resources).resume()
    return f"Resumed {name}."
