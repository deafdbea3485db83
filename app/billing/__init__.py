"""Billing: the workspace's subscription state and Stripe mirrors, always read from the Stripe API."""
