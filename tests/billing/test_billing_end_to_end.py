"""End to end in process: a signed webhook at the API, processed by the pipeline, changes the workspace row."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity.models import Workspace
from app.testing import deliver_and_wait
from app.testing.stripe_stub import StripeStub
from tests.billing.conftest import subscription_delivery, workspace_row


@pytest.fixture
async def api(billing_env: dict[str, str]) -> AsyncIterator[AsyncTestClient[Any]]:
    """The API as production builds it (``api_modules()``), with the sync driver processing inside the request."""
    async with AsyncTestClient(build_app(load_settings(billing_env))) as client:
        yield client


async def test_signed_webhook_at_the_api_updates_the_workspace(
    api: AsyncTestClient[Any],
    worker: Resources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    stripe_stub.put_subscription("cus_linked", id="sub_team", quantity=12, price_id="price_team")
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked", "customer.subscription.created")

    row = await deliver_and_wait(api, delivery, db=worker.db)

    assert row.attempts == 1 and row.last_error is None
    workspace = await workspace_row(worker, linked_workspace.id)
    assert (workspace.subscription_id, workspace.price_id, workspace.member_limit) == ("sub_team", "price_team", 12)
    assert workspace.billing_synced_at is not None
