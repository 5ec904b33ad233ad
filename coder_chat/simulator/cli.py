"""``prefect-coder simulator``: serve the simulator until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from .config import SimulatorConfig
from .server import run_forever


def _quoted(value: str) -> str:
    """``value`` in single quotes, as a POSIX shell reads it back (a quote inside is escaped)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "simulator",
        help="serve a simulated Coder chat API on loopback",
        description="Serve a simulated Coder chat API (era C) until interrupted.",
    )
    parser.add_argument(
        "--port", type=int, default=3000, help="port to listen on (0: any free port)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--token", help="session token to require (default: a generated one)")
    parser.add_argument(
        "--tool-deadline", type=float, default=300.0, help="seconds a paused client tool waits"
    )
    parser.add_argument(
        "--interrupt-winddown",
        type=float,
        default=0.2,
        help="seconds an interrupted run winds down",
    )
    parser.add_argument(
        "--delta-interval", type=float, default=0.02, help="seconds between streamed deltas"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = SimulatorConfig(
        tool_result_deadline=args.tool_deadline,
        interrupt_winddown=args.interrupt_winddown,
        delta_interval=args.delta_interval,
    )
    if args.token:
        config.token = args.token

    def banner(base_url: str) -> None:
        # The only place the token is ever printed: `export` lines a user pastes into
        # a shell (or evals), each value single-quoted for the shell.
        settings = {
            "CODER_URL": base_url,
            "CODER_SESSION_TOKEN": config.token,
            "CODER_ORG_ID": str(config.organization_id),
        }
        sys.stdout.write("".join(f"export {k}={_quoted(v)}\n" for k, v in settings.items()))
        sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_forever(config, args.host, args.port, banner))
    return 0
