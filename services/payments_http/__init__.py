"""Payments over HTTP: a Stripe-like API (``api``) and the adapter variant that calls it."""
