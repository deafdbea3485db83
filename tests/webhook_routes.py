"""Which routes are webhook routes, told by what they are; and a SaaS developer's own POST route beside them.

The tests that hold a property of the webhook routes (the fuzz, the OpenAPI
document, the rate limit) pick them from the OpenAPI document by the tag every
webhook route carries (``app/webhooks/controllers.py``), never as "every POST":
a SaaS developer's own POST routes (docs/jobs.md's ``POST
/invoices/{invoice_id}/remind``) are not webhook routes. ``NOTES`` is such a
module, mounted beside the real ones by those tests, so that they run with a
developer's route present; ``create_app`` is the API with it, for a test's
uvicorn process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Litestar, post
from litestar.params import FromPath, JSONBody

from app.asgi import build_app
from app.core.module import FeatureModule
from app.core.settings import get_settings
from app.runtime import API_MODULES

WEBHOOK_TAG = "webhooks"


@dataclass(frozen=True)
class WebhookOperation:
    path: str
    provider: str
    headers: list[str]
    """The header parameters the route documents (its signature headers)."""


def webhook_operations(document: dict[str, Any]) -> dict[str, WebhookOperation]:
    """The webhook routes of an OpenAPI document, by path: the POST operations tagged ``webhooks``."""
    found: dict[str, WebhookOperation] = {}
    for path, operations in document["paths"].items():
        operation = operations.get("post")
        if operation is None or WEBHOOK_TAG not in operation.get("tags", []):
            continue
        prefix, _, provider = path.rpartition("/")
        assert prefix == "/webhooks" and provider, f"{path}: a webhook route is /webhooks/<provider>"
        headers = [p["name"] for p in operation.get("parameters", []) if p["in"] == "header"]
        found[path] = WebhookOperation(path, provider, headers)
    return found


def other_post_paths(document: dict[str, Any]) -> list[str]:
    """The documented POST routes that are not webhook routes (path templates, e.g. ``/notes/{note_id}/pin``)."""
    webhooks = webhook_operations(document)
    return sorted(
        path for path, operations in document["paths"].items() if "post" in operations and path not in webhooks
    )


class PinNote(msgspec.Struct, frozen=True):
    text: str


@post("/notes/{note_id:int}/pin", status_code=202)
async def pin_note(note_id: FromPath[int], data: JSONBody[PinNote]) -> dict[str, int]:
    """A developer's route with a path parameter and a JSON body: a body that does not fit gets 400."""
    return {"pinned": note_id, "length": len(data.text)}


NOTES = FeatureModule(name="notes", route_handlers=[pin_note])
NOTE_PATH = "/notes/{note_id}/pin"


def create_app() -> Litestar:
    """The production API (``app.asgi:create_app``) with a developer's module beside its own."""
    return build_app(get_settings(), [*API_MODULES, NOTES])
