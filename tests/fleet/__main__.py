"""``python -m tests.fleet --count N --seed S [--only I ...] [--workers 2|3] [--fresh]``.

Runs as root (network namespaces). Prints one line per schedule as it ends (to
stderr), then one line per violating schedule and the totals (to stdout); each
schedule's ``timeline-<seed>-<index>.txt`` is under ``--workdir``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import fields
from pathlib import Path


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fleet", description=__doc__)
    parser.add_argument("--count", type=int, default=5, help="schedules to run (0..N-1)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--only", type=int, nargs="+", default=[], help="replay these indexes")
    parser.add_argument("--workers", type=int, choices=[2, 3], default=3)
    parser.add_argument("--workdir", type=Path, help="where fleets and timelines go")
    parser.add_argument("--keep", action="store_true", help="keep the fleets' folders")
    parser.add_argument("--fresh", action="store_true", help="a new fleet for every schedule")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Before Prefect is imported: this process's own Prefect home, and no telemetry.
    home = tempfile.mkdtemp(prefix="pcfleet-driver-home-")
    os.environ["PREFECT_HOME"] = home
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    try:
        return run(args)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    from .campaign import CampaignOptions, CampaignReport, run_campaign
    from .capable import missing

    lacking = missing()
    if lacking is not None:
        print(f"fleet: {lacking}", file=sys.stderr)
        return 2
    # A restarted store's pools refill with warnings and tracebacks: expected here.
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    args.workdir = args.workdir or default_workdir()
    # The command's options are named as the campaign's.
    options = CampaignOptions(**{f.name: getattr(args, f.name) for f in fields(CampaignOptions)})

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def campaign() -> CampaignReport:
        stop_on_signals(asyncio.current_task())
        return await run_campaign(options, out=print, note=note)

    try:
        report = asyncio.run(campaign())
    except asyncio.CancelledError:
        note(
            f"fleet: stopped by a signal; the fleet was torn down (timelines under {options.workdir})"
        )
        return 130
    note(f"fleet: timelines under {options.workdir}")
    return 0 if report.violations == 0 and not report.errors else 1


def default_workdir() -> Path:
    """A new folder for fleets and timelines, that the fleets' PostgreSQL servers (run as
    ``postgres``) may pass through: ``mkdtemp`` makes it for its owner alone."""
    workdir = Path(tempfile.mkdtemp(prefix="pcfleet-campaign-"))
    workdir.chmod(0o755)
    return workdir


def stop_on_signals(task: asyncio.Task[object] | None) -> None:
    """Ctrl-C or a plain ``kill`` cancels the campaign, so that the fleet is torn down
    on the way out (also when the shell started it with SIGINT ignored). Once only: a
    second signal during the teardown is left to the next lab's cleanup of stale slots."""
    assert task is not None
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, cancel)


if __name__ == "__main__":
    sys.exit(main())
