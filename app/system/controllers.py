"""Liveness and readiness probes: the system module's routes (``MODULE.api``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example
from sqlalchemy import text

from app.core.module import ApiPart
from app.core.resources import Resources

READY_TIMEOUT_SECONDS = 1.0


@dataclass
class Readiness:
    """Each dependency's check: ``ok``, or ``error: `` and what failed."""

    postgres: str
    redis: str


_READY_RESPONSES = {
    200: ResponseSpec(
        data_container=Readiness,
        generate_examples=False,
        description="Postgres and Redis both answered within 1 s.",
        examples=[Example(summary="ready", value={"postgres": "ok", "redis": "ok"})],
    ),
    503: ResponseSpec(
        data_container=Readiness,
        generate_examples=False,
        description="Postgres or Redis did not answer within 1 s: each is named with ok or its error.",
        examples=[Example(summary="Redis down", value={"postgres": "ok", "redis": "error: connection refused"})],
    ),
}


async def _check(probe: Any) -> str:
    try:
        await asyncio.wait_for(probe, READY_TIMEOUT_SECONDS)
    except TimeoutError:
        return f"error: no answer within {READY_TIMEOUT_SECONDS:g}s"
    except Exception as exc:  # any failure is a "not ready" answer, never a 500
        return f"error: {_describe(exc)}"
    return "ok"


def _describe(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "Connect call failed" in message or isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return message[:200]


async def _ping_postgres(resources: Resources) -> None:
    async with resources.db.engine.connect() as connection:
        await connection.execute(text("SELECT 1"))


class HealthController(Controller):
    path = "/"
    include_in_schema = True

    @get("/health", cache=False)
    async def health(self) -> dict[str, str]:
        """200 while the process runs; checks no dependency."""
        return {"status": "ok"}

    @get("/ready", cache=False, responses=_READY_RESPONSES)
    async def ready(self, resources: NamedDependency[Resources]) -> Response[dict[str, str]]:
        """200 when Postgres and Redis answer within 1 s, else 503 naming what failed."""
        postgres, redis = await asyncio.gather(_check(_ping_postgres(resources)), _check(resources.redis.ping()))
        body = {"postgres": postgres, "redis": redis}
        status = 200 if postgres == "ok" and redis == "ok" else 503
        return Response(body, status_code=status)


API = ApiPart(route_handlers=[HealthController])
