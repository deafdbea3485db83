"""Pre-signed deliveries, generated at the start of a phase (signatures are valid for 300 s).

A set is one body template with a single placeholder (the event id for Stripe,
the object id for Clerk) plus one line per delivery: the event id, the token
put in the body, the timestamp and the signature. wrk's Lua script and the
Python clients build each request from a line, so a set of 100,000 deliveries
is a few MB, not 100,000 bodies.

Signatures are computed as the providers do (and as their SDKs verify):
Stripe ``t=<ts>,v1=<hex HMAC-SHA256 of "{ts}.{body}" keyed by the whole whsec_>``;
svix ``v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}" keyed by the base64 after whsec_>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.testing.deliveries import clerk_event, stripe_event, stripe_object

PLACEHOLDER = "BENCHTOKEN0PLACEHOLDER"


def _encode(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


@dataclass
class SignedSet:
    kind: str  # "stripe" or "clerk"
    path: str
    prefix: str
    suffix: str
    lines: list[tuple[str, str, int, str]]  # event id, body token, timestamp, signature

    def body(self, token: str) -> bytes:
        return (self.prefix + token + self.suffix).encode()

    def headers(self, line: tuple[str, str, int, str]) -> dict[str, str]:
        event_id, _, ts, signature = line
        if self.kind == "stripe":
            return {"stripe-signature": f"t={ts},v1={signature}"}
        return {"svix-id": event_id, "svix-timestamp": str(ts), "svix-signature": f"v1,{signature}"}

    def raw_requests(self) -> Iterator[tuple[str, bytes]]:
        """(event id, HTTP/1.1 request bytes) for the Python clients."""
        for line in self.lines:
            body = self.body(line[1])
            head = "".join(f"{name}: {value}\r\n" for name, value in self.headers(line).items())
            yield (
                line[0],
                (
                    f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n{head}\r\n"
                ).encode()
                + body,
            )

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """The files wrk's Lua script reads: one line per delivery, and the template split at the placeholder."""
        data, template = directory / f"{name}.lines", directory / f"{name}.template"
        with data.open("w") as out:
            for event_id, token, ts, signature in self.lines:
                out.write(f"{event_id} {token} {ts} {signature}\n")
        template.write_text(f"{self.kind}\n{self.path}\n{self.prefix}\n{self.suffix}\n")
        return data, template


def _split(body: str) -> tuple[str, str]:
    if body.count(PLACEHOLDER) != 1:
        raise AssertionError("the template must hold the placeholder exactly once")
    prefix, _, suffix = body.partition(PLACEHOLDER)
    if "\n" in body:
        raise AssertionError("a template is one line")
    return prefix, suffix


def stripe_set(secret: str, count: int, tag: str) -> SignedSet:
    """``invoice.paid`` events (a handled type, ~4 KB like the real ones), each a new event id."""
    event = stripe_event("invoice.paid", stripe_object("invoice"), event_id=PLACEHOLDER)
    prefix, suffix = _split(_encode(event))
    key, ts = secret.encode(), int(time.time())
    head, tail = f"{ts}.{prefix}".encode(), suffix.encode()
    lines = []
    for n in range(count):
        event_id = f"evt_{tag}{n:09d}"
        digest = hmac.new(key, head + event_id.encode() + tail, hashlib.sha256).hexdigest()
        lines.append((event_id, event_id, ts, digest))
    return SignedSet("stripe", "/webhooks/stripe", prefix, suffix, lines)


def _svix_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def clerk_set(secret: str, count: int, tag: str, event_type: str = "user.updated") -> SignedSet:
    """One Clerk event type (intake: ``user.updated``), a new svix id and user id per delivery."""
    prefix, suffix = _split(_encode(clerk_event(event_type, id=PLACEHOLDER)))
    key, ts = _svix_key(secret), int(time.time())
    lines = []
    for n in range(count):
        event_id, token = f"msg_{tag}{n:09d}", f"user_{tag}{n:09d}"
        signed = f"{event_id}.{ts}.{prefix}{token}{suffix}".encode()
        digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        lines.append((event_id, token, ts, digest))
    return SignedSet("clerk", "/webhooks/clerk", prefix, suffix, lines)


# A plausible Clerk stream: mostly user changes, some organizations, a third memberships.
CLERK_MIX = (
    ("user.created", 15),
    ("user.updated", 30),
    ("organization.created", 5),
    ("organization.updated", 10),
    ("organizationMembership.created", 30),
    ("organizationMembership.updated", 10),
)


@dataclass(frozen=True)
class ClerkEvent:
    event_id: str
    event_type: str
    body: str


def clerk_mix(count: int, tag: str, *, seed: int = 7) -> list[ClerkEvent]:
    """``count`` Clerk events of :data:`CLERK_MIX`, newest last.

    The pools grow with ``count`` so every size has the same shape: a user gets
    about three events, an organization about four memberships (some pass the free
    plan's three seats, so seats get reassigned).
    """
    rng = random.Random(seed)
    users, orgs = max(50, count // 4), max(10, count // 10)
    types = [name for name, weight in CLERK_MIX for _ in range(weight)]
    base_ms = int(time.time() * 1000) - count
    events = []
    for n in range(count):
        event_type = rng.choice(types)
        ms = base_ms + n
        user, org = f"user_b{rng.randrange(users):06d}", f"org_b{rng.randrange(orgs):05d}"
        if event_type.startswith("user."):
            event = clerk_event(event_type, timestamp=ms, id=user)
        elif event_type.startswith("organization."):
            event = clerk_event(event_type, timestamp=ms, id=org, slug=org, name=f"Org {org}")
        else:
            event = clerk_event(event_type, timestamp=ms, id=f"orgmem_{org}_{user}", created_at=ms)
            event["data"]["organization"]["id"] = org
            event["data"]["public_user_data"]["user_id"] = user
        events.append(ClerkEvent(f"msg_{tag}{n:09d}", event_type, _encode(event)))
    return events


def _post(path: str, headers: dict[str, str], body: bytes) -> bytes:
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{head}\r\n"
    ).encode() + body


def sign_clerk(secret: str, events: list[ClerkEvent]) -> list[tuple[str, bytes]]:
    """(svix id, HTTP/1.1 request bytes) of each event, signed now."""
    key, ts = _svix_key(secret), int(time.time())
    requests = []
    for event in events:
        digest = base64.b64encode(
            hmac.new(key, f"{event.event_id}.{ts}.{event.body}".encode(), hashlib.sha256).digest()
        ).decode()
        headers = {"svix-id": event.event_id, "svix-timestamp": str(ts), "svix-signature": f"v1,{digest}"}
        requests.append((event.event_id, _post("/webhooks/clerk", headers, event.body.encode())))
    return requests


def sign_stripe(secret: str, events: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """(event id, HTTP/1.1 request bytes) of each Stripe event, signed now."""
    key, ts = secret.encode(), int(time.time())
    requests = []
    for event in events:
        body = _encode(event)
        digest = hmac.new(key, f"{ts}.{body}".encode(), hashlib.sha256).hexdigest()
        headers = {"stripe-signature": f"t={ts},v1={digest}"}
        requests.append((str(event["id"]), _post("/webhooks/stripe", headers, body.encode())))
    return requests
