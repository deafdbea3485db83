"""docs/deploy.md lists the Stripe and Clerk events to subscribe to: exactly the types the loaded modules route."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.runtime import API_MODULES
from app.webhooks.handlers import EventRoutes

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
EVENT_TYPE = re.compile(r"`([a-zA-Z_]+(?:\.(?:[a-zA-Z_]+|\*))+)`")


def subscribed(provider: str) -> list[str]:
    """The event types in backticks of the provider's paragraphs (``**Stripe**:`` up to the next one)."""
    section = GUIDE.read_text(encoding="utf-8").split("## Point the providers at the API", 1)[1]
    paragraph = section.split(f"**{provider}**:", 1)[1].split("\n\n**", 1)[0].split("\n\nThese are the routes", 1)[0]
    return EVENT_TYPE.findall(paragraph)


def routed(provider: str) -> list[str]:
    """The types the API's modules route for the provider: the ones its intake stores."""
    handlers = [module.webhook_handlers[provider] for module in API_MODULES if provider in module.webhook_handlers]
    routes = [handler for handler in handlers if isinstance(handler, EventRoutes)]
    assert routes and routes == handlers, f"a handler that is no EventRoutes takes every {provider} type: {handlers}"
    return [event_type for handler in routes for event_type in handler.routes]


@pytest.mark.parametrize(("provider", "name"), [("stripe", "Stripe"), ("clerk", "Clerk")])
def test_the_deploy_guide_subscribes_to_exactly_the_routed_types(provider: str, name: str) -> None:
    documented = subscribed(name)

    assert sorted(documented) == sorted(routed(provider))
    assert len(documented) == len(set(documented))
