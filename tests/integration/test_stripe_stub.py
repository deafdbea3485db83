"""The Stripe stub must answer the real async ``stripe`` client as Stripe does, faults included."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import stripe

from app.testing.stripe_stub import StripeStub, stripe_stub_fixture

stripe_stub = pytest.fixture(stripe_stub_fixture, name="stripe_stub")


@pytest.fixture
async def make_client(stripe_stub: StripeStub) -> AsyncIterator[Callable[..., stripe.StripeClient]]:
    """Clients as billing code builds them; closed after the test, on the loop that used them."""
    made: list[stripe.HTTPXClient] = []

    def make(key: str = "sk_test_x", timeout: float = 5) -> stripe.StripeClient:
        made.append(stripe.HTTPXClient(timeout=timeout))
        return stripe.StripeClient(key, base_addresses={"api": stripe_stub.base_url}, http_client=made[-1])

    yield make
    for http_client in made:
        await http_client.close_async()


@pytest.fixture
def client(make_client: Callable[..., stripe.StripeClient]) -> stripe.StripeClient:
    return make_client()


async def test_customer_is_served_as_an_sdk_object(stripe_stub: StripeStub, client: stripe.StripeClient) -> None:
    stripe_stub.put_customer("cus_1", email="owner@example.com")

    customer = await client.v1.customers.retrieve_async("cus_1")

    assert isinstance(customer, stripe.Customer)
    assert (customer.id, customer.email) == ("cus_1", "owner@example.com")
    assert stripe_stub.requests == [("GET", "/v1/customers/cus_1")]


async def test_deleted_customer_answers_200_with_deleted_flag(
    stripe_stub: StripeStub, client: stripe.StripeClient
) -> None:
    stripe_stub.delete_customer("cus_gone")

    customer = await client.v1.customers.retrieve_async("cus_gone")

    assert customer.deleted is True  # a StripeObject is not a dict: no .get()


async def test_subscription_list_filters_by_customer_and_status(
    stripe_stub: StripeStub, client: stripe.StripeClient
) -> None:
    stripe_stub.put_subscription("cus_1", id="sub_old", status="canceled")
    stripe_stub.put_subscription("cus_1", id="sub_new", quantity=5, price_id="price_team")
    stripe_stub.put_subscription("cus_2", id="sub_other")

    every = await client.v1.subscriptions.list_async(params={"customer": "cus_1", "status": "all"})
    default = await client.v1.subscriptions.list_async(params={"customer": "cus_1"})

    assert [s.id for s in every.data] == ["sub_new", "sub_old"]
    assert [s.id for s in default.data] == ["sub_new"]
    assert every.has_more is False
    item = every.data[0].items.data[0]
    assert (item.price.id, item.quantity) == ("price_team", 5)
    assert item.current_period_end == every.data[0]["current_period_end"]


@pytest.mark.parametrize(
    ("put", "retrieve", "object_name"),
    [
        (lambda s: s.put_subscription("cus_1", id="sub_1"), lambda c: c.v1.subscriptions, "subscription"),
        (
            lambda s: s.put_checkout_session("sub_1", customer="cus_1", client_reference_id="ws_1"),
            lambda c: c.v1.checkout.sessions,
            "checkout.session",
        ),
        (lambda s: s.put_dispute("sub_1", charge="ch_1"), lambda c: c.v1.disputes, "dispute"),
        (lambda s: s.put_refund("sub_1", charge="ch_1"), lambda c: c.v1.refunds, "refund"),
        (lambda s: s.put_charge("sub_1", customer="cus_1"), lambda c: c.v1.charges, "charge"),
        (
            lambda s: s.put_early_fraud_warning("sub_1", charge="ch_1"),
            lambda c: c.v1.radar.early_fraud_warnings,
            "radar.early_fraud_warning",
        ),
    ],
)
async def test_each_resource_is_retrieved_by_id(
    stripe_stub: StripeStub,
    client: stripe.StripeClient,
    put: Callable[[StripeStub], Any],
    retrieve: Callable[[stripe.StripeClient], Any],
    object_name: str,
) -> None:
    put(stripe_stub)

    obj = await retrieve(client).retrieve_async("sub_1")

    assert (obj.id, obj.object) == ("sub_1", object_name)


async def test_unknown_id_raises_invalid_request_404(stripe_stub: StripeStub, client: stripe.StripeClient) -> None:
    stripe_stub.put_customer("cus_1")
    stripe_stub.remove("customer", "cus_1")

    with pytest.raises(stripe.InvalidRequestError) as caught:
        await client.v1.customers.retrieve_async("cus_1")

    assert caught.value.http_status == 404
    assert caught.value.code == "resource_missing"
    assert "No such customer: 'cus_1'" in str(caught.value.user_message)


async def test_unknown_route_answers_in_stripe_error_shape(client: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as caught:
        await client.v1.invoices.retrieve_async("in_1")

    assert caught.value.http_status == 404


async def test_a_key_that_is_not_secret_is_refused(make_client: Callable[..., stripe.StripeClient]) -> None:
    client = make_client(key="pk_test_x")

    with pytest.raises(stripe.AuthenticationError) as caught:
        await client.v1.customers.retrieve_async("cus_1")

    assert caught.value.http_status == 401


async def test_fail_answers_5xx_for_the_given_number_of_times(
    stripe_stub: StripeStub, client: stripe.StripeClient
) -> None:
    stripe_stub.put_customer("cus_1")
    stripe_stub.fail("/v1/customers", status=503, times=2)

    for _ in range(2):
        with pytest.raises(stripe.APIError) as caught:
            await client.v1.customers.retrieve_async("cus_1")
        assert caught.value.http_status == 503

    assert (await client.v1.customers.retrieve_async("cus_1")).id == "cus_1"
    assert len(stripe_stub.requests) == 3  # the SDK made no retries of its own


async def test_rate_limit_raises_rate_limit_error_with_retry_after(
    stripe_stub: StripeStub, client: stripe.StripeClient
) -> None:
    stripe_stub.put_subscription("cus_1", id="sub_1")
    stripe_stub.rate_limit("/v1/subscriptions", retry_after=7)

    with pytest.raises(stripe.RateLimitError) as caught:
        await client.v1.subscriptions.list_async(params={"customer": "cus_1", "status": "all"})

    assert caught.value.http_status == 429
    assert caught.value.headers is not None and caught.value.headers["retry-after"] == "7"
    assert (await client.v1.subscriptions.retrieve_async("sub_1")).id == "sub_1"


async def test_slow_answer_past_the_client_timeout_raises_connection_error(
    stripe_stub: StripeStub, make_client: Callable[..., stripe.StripeClient]
) -> None:
    stripe_stub.put_dispute("dp_1")
    stripe_stub.slow("/v1/disputes", seconds=1.5)
    client = make_client(timeout=0.3)

    with pytest.raises(stripe.APIConnectionError):
        await client.v1.disputes.retrieve_async("dp_1")

    assert (await client.v1.disputes.retrieve_async("dp_1")).id == "dp_1"


def test_http_control_endpoints_drive_the_stub(stripe_stub: StripeStub) -> None:
    with httpx.Client(base_url=stripe_stub.base_url) as http:
        state = {"kind": "subscription", "args": {"customer_id": "cus_9", "id": "sub_9", "quantity": 4}}
        assert http.post("/_stub/state", json=state).json()["items"]["data"][0]["quantity"] == 4
        session = {"kind": "checkout_session", "args": {"id": "cs_9", "customer": "cus_9"}}
        assert http.post("/_stub/state", json=session).status_code == 200
        fault = {"path_prefix": "/v1/subscriptions", "status": 500}
        assert http.post("/_stub/fail", json=fault).status_code == 200
        auth = {"Authorization": "Bearer sk_test_x"}
        assert http.get("/v1/subscriptions/sub_9", headers=auth).status_code == 500
        assert http.get("/v1/subscriptions/sub_9", headers=auth).status_code == 200
        assert http.get("/v1/checkout/sessions/cs_9").status_code == 401
        seen = http.get("/_stub/requests").json()["requests"]
        assert seen == [["GET", "/v1/subscriptions/sub_9"]] * 2 + [["GET", "/v1/checkout/sessions/cs_9"]]
        assert http.post("/_stub/remove", json={"kind": "subscription", "id": "sub_9"}).status_code == 200
        assert http.get("/v1/subscriptions/sub_9", headers=auth).status_code == 404
        assert http.post("/_stub/state", json={"kind": "invoice", "args": {}}).status_code == 400
        assert http.post("/_stub/reset", json={}).status_code == 200
        assert http.get("/_stub/requests").json() == {"requests": []}
        assert http.get("/v1/checkout/sessions/cs_9", headers=auth).status_code == 404


def test_reset_clears_objects_faults_and_requests(stripe_stub: StripeStub) -> None:
    stripe_stub.put_customer("cus_1")
    stripe_stub.fail("/v1", times=None)
    auth = {"Authorization": "Bearer sk_test_x"}
    assert httpx.get(f"{stripe_stub.base_url}/v1/customers/cus_1", headers=auth).status_code == 500

    stripe_stub.reset()

    assert stripe_stub.requests == []
    assert httpx.get(f"{stripe_stub.base_url}/v1/customers/cus_1", headers=auth).status_code == 404


@pytest.fixture
def stub_process() -> Iterator[str]:
    """The stub as a separate process, the way a soak run or a demo starts it."""
    command = [sys.executable, "-m", "app.testing.stripe_stub", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().strip()
        finally:
            proc.terminate()


def test_module_runs_as_a_standalone_server(stub_process: str) -> None:
    with httpx.Client(base_url=stub_process) as http:
        http.post("/_stub/state", json={"kind": "customer", "args": {"id": "cus_demo"}})
        answer = http.get("/v1/customers/cus_demo", headers={"Authorization": "Bearer sk_test_x"})

    assert answer.json()["id"] == "cus_demo"
