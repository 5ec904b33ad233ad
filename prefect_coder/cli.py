"""``prefect-coder``: run the simulator or the durable-chat demo, and manage workflows."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefect-coder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    from coder_chat.simulator import cli as simulator_cli

    simulator_cli.add_parser(commands)
    from . import workflows_cli

    workflows_cli.add_parser(commands)
    demo = commands.add_parser(
        "demo",
        help="run a durable chat, kill its worker mid-payment, and watch it recover",
        description="Run the durable-chat demo: simulator, SQLite store and Prefect's local API.",
    )
    demo.set_defaults(run=_run_demo)
    args = parser.parse_args(argv)
    return int(args.run(args))


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main  # Prefect loads only for the demo

    return demo_main()


if __name__ == "__main__":
    sys.exit(main())
