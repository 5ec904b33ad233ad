"""Fixtures of the docs' tests: a fresh clone of HEAD for each file of lab commands
(:mod:`tests.docs.lab_commands`)."""

from tests.docs.lab_commands import clone

__all__ = ["clone"]
