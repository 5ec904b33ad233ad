"""Fixtures of the campaign tests: the crash lab (:mod:`tests.lab.fixtures`)."""

from tests.lab.fixtures import lab

__all__ = ["lab"]
