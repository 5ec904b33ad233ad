"""Flows that show the public API at work; the README shows them, and tests run them."""
