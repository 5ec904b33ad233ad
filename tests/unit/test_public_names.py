"""What users import works from the package roots, as the README shows."""

from __future__ import annotations

import subprocess
import sys

import coder_chat
import coder_chat.durable


def test_every_public_name_of_the_packages_resolves() -> None:
    for package in (coder_chat, coder_chat.durable):
        missing = [name for name in package.__all__ if not hasattr(package, name)]
        assert not missing, (package.__name__, missing)


def test_the_names_the_readme_uses() -> None:
    from coder_chat import ChatClient, ChatSession, CoderApiError, is_retryable
    from coder_chat.durable import PostgresStore, SqliteStore, durable_tool

    assert callable(durable_tool) and callable(is_retryable)
    assert {ChatClient.__name__, ChatSession.__name__, CoderApiError.__name__} == {
        "ChatClient",
        "ChatSession",
        "CoderApiError",
    }
    assert PostgresStore.__module__ == "coder_chat.durable.postgres"
    assert SqliteStore.__module__ == "coder_chat.durable.sqlite"


def test_asyncpg_loads_only_when_postgres_is_used() -> None:
    code = "import sys, coder_chat.durable; print('asyncpg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
