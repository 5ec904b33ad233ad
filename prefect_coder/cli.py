"""``prefect-coder``: run the simulator, or the durable-chat demo."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefect-coder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    from coder_chat.simulator import cli as simulator_cli

    simulator_cli.add_parser(commands)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
