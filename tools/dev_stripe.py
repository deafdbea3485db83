"""`make stripe-stub`: the local Stripe API that `make dev` points at while its Stripe key is the generated one.

    python -m tools.dev_stripe          (STRIPE_STUB_PORT: 12111)

The test kit's Stripe stub (``app.testing.stripe_stub``: the real ``stripe`` client talks to it over HTTP),
serving what the try-it checkout names (docs/operations.md, "Try it"): the checkout session of `make
send-test-webhook SAMPLE=checkout`, its customer and their subscription. Runs in the foreground until Ctrl-C.
Nothing leaves the machine: the development key `sk_test_dev` has no Stripe account behind it anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading

from app.testing.stripe_stub import StripeStub
from tools.dev import STRIPE_STUB_PORT

# What the try-it events name: a Clerk organization (a workspace here) that checks out a seat plan in Stripe.
TRY_ORGANIZATION = "org_try_it"
TRY_CHECKOUT = "cs_try_it"
TRY_CUSTOMER = "cus_try_it"
TRY_SUBSCRIPTION = "sub_try_it"
TRY_SEATS = 5


def seed(stub: StripeStub) -> None:
    """The try-it checkout session, completed by a customer whose subscription pays for ``TRY_SEATS`` seats."""
    stub.put_customer(TRY_CUSTOMER, email="try-it@example.com")
    stub.put_subscription(TRY_CUSTOMER, id=TRY_SUBSCRIPTION, quantity=TRY_SEATS)
    stub.put_checkout_session(TRY_CHECKOUT, customer=TRY_CUSTOMER, client_reference_id=TRY_ORGANIZATION)


def main() -> None:
    port = int(os.environ.get("STRIPE_STUB_PORT") or STRIPE_STUB_PORT)
    with StripeStub(port=port) as stub:
        seed(stub)
        print(
            f"Stripe stub: {stub.base_url} (checkout {TRY_CHECKOUT}, customer {TRY_CUSTOMER}, "
            f"{TRY_SEATS} seats); Ctrl-C stops it.",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
