"""Per-IP, per-route rate limit of signed requests, shared by API processes through Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.testing.deliveries import clerk_event, signed_clerk_delivery, signed_stripe_delivery, stripe_event
from tests.processes import api_process

pytestmark = pytest.mark.slow

UNHANDLED = {"id": "po_1", "object": "payout"}  # acknowledged and dropped: the test measures the limiter only


async def post_many(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], count: int
) -> list[httpx.Response]:
    semaphore = asyncio.Semaphore(16)

    async def one() -> httpx.Response:
        async with semaphore:
            return await client.post(url, content=body, headers=headers)

    return await asyncio.gather(*(one() for _ in range(count)))


async def test_the_601st_request_from_one_ip_gets_429_others_are_unaffected(
    settings_env: dict[str, str], webhook_secrets: dict[str, str]
) -> None:
    env = {**settings_env, "TRUSTED_PROXIES": "127.0.0.1/32"}
    stripe_delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])
    with api_process(env) as base_url:
        async with httpx.AsyncClient(timeout=10) as client:
            url = f"{base_url}/webhooks/stripe"
            first_ip = {**stripe_delivery.headers, "X-Forwarded-For": "203.0.113.7"}
            responses = await post_many(client, url, stripe_delivery.body, first_ip, 600)
            assert {r.status_code for r in responses} == {200}
            over = await client.post(url, content=stripe_delivery.body, headers=first_ip)
            assert over.status_code == 429
            assert int(over.headers["Retry-After"]) >= 1

            other_ip = {**stripe_delivery.headers, "X-Forwarded-For": "203.0.113.8"}
            assert (await client.post(url, content=stripe_delivery.body, headers=other_ip)).status_code == 200
            clerk_delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
            clerk_headers = {**clerk_delivery.headers, "X-Forwarded-For": "203.0.113.7"}
            other_route = await client.post(
                f"{base_url}/webhooks/clerk", content=clerk_delivery.body, headers=clerk_headers
            )
            assert other_route.status_code == 200


async def test_forwarded_for_from_an_untrusted_peer_is_ignored(
    settings_env: dict[str, str], webhook_secrets: dict[str, str]
) -> None:
    env = {**settings_env, "WEBHOOK_RATE_LIMIT_PER_MINUTE": "5"}
    delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])
    with api_process(env) as base_url:
        async with httpx.AsyncClient(timeout=10) as client:
            statuses = []
            for index in range(7):  # a spoofed, changing X-Forwarded-For must not dodge the limit
                headers = {**delivery.headers, "X-Forwarded-For": f"198.51.100.{index}"}
                statuses.append(
                    (
                        await client.post(f"{base_url}/webhooks/stripe", content=delivery.body, headers=headers)
                    ).status_code
                )
    assert statuses == [200] * 5 + [429] * 2


async def test_two_api_processes_together_admit_the_limit(
    settings_env: dict[str, str], webhook_secrets: dict[str, str]
) -> None:
    env = {**settings_env, "WEBHOOK_RATE_LIMIT_PER_MINUTE": "100"}
    delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])
    with api_process(env) as first, api_process(env) as second:
        async with httpx.AsyncClient(timeout=10) as client:
            batches: tuple[list[Any], list[Any]] = await asyncio.gather(
                post_many(client, f"{first}/webhooks/stripe", delivery.body, delivery.headers, 90),
                post_many(client, f"{second}/webhooks/stripe", delivery.body, delivery.headers, 90),
            )
    statuses = [response.status_code for batch in batches for response in batch]
    assert statuses.count(200) == 100
    assert statuses.count(429) == 80


async def test_every_forwarded_for_line_is_read_so_a_spoofed_first_line_cannot_dodge_the_limit(
    settings_env: dict[str, str], webhook_secrets: dict[str, str]
) -> None:
    """A trusted proxy that appends its own X-Forwarded-For line: the client is the last untrusted address."""
    env = {**settings_env, "TRUSTED_PROXIES": "127.0.0.1/32, 10.0.0.0/8", "WEBHOOK_RATE_LIMIT_PER_MINUTE": "3"}
    delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])
    with api_process(env) as base_url:
        async with httpx.AsyncClient(timeout=10) as client:
            statuses = []
            for index in range(5):
                headers = [
                    *delivery.headers.items(),
                    ("X-Forwarded-For", f"198.51.100.{index}"),  # written by the client: a lie that changes
                    ("X-Forwarded-For", "203.0.113.7, 10.0.0.5"),  # the proxies' own line
                ]
                response = await client.post(f"{base_url}/webhooks/stripe", content=delivery.body, headers=headers)
                statuses.append(response.status_code)
    assert statuses == [200] * 3 + [429] * 2


async def test_ipv6_clients_share_a_limit_per_64_network(
    settings_env: dict[str, str], webhook_secrets: dict[str, str]
) -> None:
    env = {**settings_env, "TRUSTED_PROXIES": "127.0.0.1/32", "WEBHOOK_RATE_LIMIT_PER_MINUTE": "2"}
    delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])
    with api_process(env) as base_url:
        async with httpx.AsyncClient(timeout=10) as client:

            async def post_from(address: str) -> int:
                headers = {**delivery.headers, "X-Forwarded-For": address}
                response = await client.post(f"{base_url}/webhooks/stripe", content=delivery.body, headers=headers)
                return response.status_code

            same_network = [await post_from(f"2001:db8:0:1::{host}") for host in (1, 2, 3)]
            other_network = await post_from("2001:db8:0:2::1")
    assert same_network == [200, 200, 429]
    assert other_network == 200
