"""The fleet's folders must let the PostgreSQL servers (run as ``postgres``) reach their data.

``python -m tests.fleet`` without ``--workdir`` once failed at once on a fresh machine:
``mkdtemp`` made its folder for root alone, and ``initdb`` could not reach below it.
"""

from __future__ import annotations

import shutil

from .__main__ import default_workdir
from .lab import closed_to_others


def test_the_default_workdir_lets_postgres_through() -> None:
    workdir = default_workdir()
    try:
        assert workdir.stat().st_mode & 0o777 == 0o755
        assert closed_to_others(workdir / "fleet-0" / "store" / "pg") is None
    finally:
        shutil.rmtree(workdir)


def test_a_folder_closed_to_others_is_named() -> None:
    workdir = default_workdir()
    try:
        private = workdir / "private"
        private.mkdir()
        private.chmod(0o700)
        assert closed_to_others(private / "fleet-0") == private.resolve()
    finally:
        shutil.rmtree(workdir)
