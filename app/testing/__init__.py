"""Test support shipped with the app: provider stubs and signed-delivery factories.

Import the submodules directly (``app.testing.deliveries``, ``app.testing.stripe_stub``) so
building a delivery never pulls in the stub server's web stack.
"""
