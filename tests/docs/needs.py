"""What a lab command needs beyond the venv, and whether this machine has it.

As elsewhere in the suite, a test whose command needs what the machine lacks skips and says
why, unless the variable CI sets makes that a failure (``PREFECT_CODER_REQUIRE_POSTGRES=1``,
``PREFECT_CODER_REQUIRE_NETNS=1``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.durable.backends import REQUIRE_ENV, postgres_dsn_from_env, probe
from tests.fleet import capable
from tests.pgcluster import PgClusterUnavailable, _bindir


def _private_postgres_missing() -> str | None:
    try:
        _bindir()
    except PgClusterUnavailable as exc:
        return f"no private PostgreSQL servers: {exc}"
    return None


def _postgres_missing() -> str | None:
    why = probe(postgres_dsn_from_env())
    return None if why is None else f"no PostgreSQL server to measure: {why}"


# Each need: what says why it is missing (None: it is not), and the variable that makes it required.
NEEDS: dict[str, tuple[Callable[[], str | None], str]] = {
    "postgres": (_postgres_missing, REQUIRE_ENV),
    "private postgres": (_private_postgres_missing, REQUIRE_ENV),
    "netns": (capable.missing, capable.REQUIRE),
}


def check_needs(needs: tuple[str, ...]) -> None:
    """Skip the test (or fail it, where required) when the machine lacks one of ``needs``."""
    for need in needs:
        missing, require = NEEDS[need]
        why = missing()
        if why is None:
            continue
        if os.environ.get(require) == "1":
            pytest.fail(f"{why} ({require}=1)")
        pytest.skip(why)
