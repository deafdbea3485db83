"""The ceiling: the smallest honest Litestar app doing the intake's work, served like the product.

Per request: read the body, verify a Stripe-style signature (HMAC-SHA256 of
``"{t}.{body}"`` keyed by the whole ``whsec_`` secret, 300 s tolerance), parse
the JSON for the event id and type, one ``INSERT ... ON CONFLICT`` through an
asyncpg pool, one arq ``enqueue_job`` deduplicated by the row id, 200. No rate
limit, no logging, no ORM: what is left is the framework, the driver and arq.

    uvicorn --factory bench.ceiling_app:create_app   # same flags and process count as the product

Environment: ``BENCH_CEILING_DSN`` (asyncpg DSN of the bench database),
``REDIS_URL``, ``REDIS_NAMESPACE``, ``STRIPE_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec
from arq.connections import ArqRedis
from litestar import Litestar, Request, Response, post
from litestar.datastructures import State
from litestar.exceptions import ClientException, NotFoundException
from litestar.params import FromPath

TOLERANCE_SECONDS = 300
RECEIVED = b'{"received":true}'
_INSERT = """
INSERT INTO webhook_event (provider, event_id, type, payload) VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT (provider, event_id) DO NOTHING RETURNING id
"""
_json = msgspec.json.Encoder()


def _verify(secret: bytes, body: bytes, header: str) -> None:
    timestamp, signatures = None, []
    for part in header.split(","):
        key, _, value = part.partition("=")
        if key == "t":
            timestamp = value
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or not signatures or abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        raise ClientException(detail="bad signature")
    expected = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, signature) for signature in signatures):
        raise ClientException(detail="bad signature")


@post("/webhooks/{provider:str}", status_code=200)
async def receive(provider: FromPath[str], request: Request, state: State) -> Response[bytes]:
    if provider != "stripe":
        raise NotFoundException()
    body = await request.body()
    _verify(state.secret, body, request.headers.get("stripe-signature", ""))
    event: dict[str, Any] = msgspec.json.decode(body)
    async with state.pool.acquire() as connection:
        row_id = await connection.fetchval(_INSERT, "stripe", event["id"], event["type"], body.decode())
    if row_id is not None:
        await state.redis.enqueue_job(  # what the product's job names: its dispatch function, the class, the data
            "job",
            "ProcessStripeEventJob",
            {"event_row_id": row_id},
            _job_id=f"{state.namespace}webhook-event:{row_id}",
            _queue_name=f"{state.namespace}webhook-stripe-queue",
        )
    return Response(RECEIVED, media_type="application/json")


def create_app() -> Litestar:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Same pool bounds as the product's engine (pool_size 10, max_overflow 10).
        pool = await asyncpg.create_pool(os.environ["BENCH_CEILING_DSN"], min_size=1, max_size=20)
        redis = ArqRedis.from_url(os.environ["REDIS_URL"], socket_timeout=1.0, socket_connect_timeout=1.0)
        redis.job_serializer = _json.encode
        app.state.pool, app.state.redis = pool, redis
        app.state.secret = os.environ["STRIPE_WEBHOOK_SECRET"].encode()
        app.state.namespace = os.environ.get("REDIS_NAMESPACE", "")
        try:
            yield
        finally:
            await redis.aclose()
            await pool.close()

    return Litestar(route_handlers=[receive], lifespan=[lifespan], openapi_config=None, logging_config=None)
