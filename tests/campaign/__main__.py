"""``python -m tests.campaign --count N --seed S [--parallel K] [--only I ...] [--variant V ...]``.

It runs against a Prefect test API of its own (tests/prefect_test_api.py), unless
``PREFECT_CODER_LAB_API_URL`` names one to share (the docs' tests give their session's).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: A Prefect API to run against instead of a test API of the campaign's own.
SHARED_API = "PREFECT_CODER_LAB_API_URL"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__)
    parser.add_argument("--count", type=int, default=20, help="schedules to run (0..N-1)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=4, help="schedules at once")
    parser.add_argument("--only", type=int, nargs="+", default=[], help="replay these indexes")
    parser.add_argument(
        "--variant",
        nargs="+",
        default=[],
        choices=["sqlite", "postgres", "second-machine", "concurrent", "refund"],
        help="draw variants only from these (default: all)",
    )
    parser.add_argument("--workdir", type=Path, help="where schedule folders go")
    parser.add_argument("--keep", action="store_true", help="keep clean schedules' folders")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Before Prefect is imported: this process's own Prefect home, and no telemetry.
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-coder-campaign-home-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from tests.lab.steps import VARIANTS

    from .campaign import CampaignOptions, run_campaign

    options = CampaignOptions(
        seed=args.seed,
        count=args.count,
        parallel=args.parallel,
        only=args.only,
        variants=args.variant or VARIANTS,
        workdir=args.workdir,
        keep=args.keep,
    )

    # A restarted Postgres server's pools refill with warnings and tracebacks: expected here.
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with prefect_api() as api_url:
        report = asyncio.run(run_campaign(options, api_url, out=print, note=note))
    print(report.line, flush=True)
    return 0 if report.violations == 0 and not report.errors else 1


@contextmanager
def prefect_api() -> Iterator[str]:
    """The API the campaign's runs report to: the shared one ``SHARED_API`` names, or a
    test API of its own (a server in a subprocess, on a temporary SQLite file)."""
    shared = os.environ.get(SHARED_API)
    if shared:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: shared}):
            yield shared
        return
    from tests.prefect_test_api import prefect_test_api

    with prefect_test_api() as api_url:
        yield api_url


if __name__ == "__main__":
    sys.exit(main())
