"""The command line of a benchmark that takes no options: ``--help`` says what it measures
and an unknown option is refused, instead of either starting a run of several minutes."""

from __future__ import annotations

import argparse


def no_options(doc: str | None) -> None:
    """Parse ``sys.argv`` against no options, with the benchmark's docstring as its help."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args()
