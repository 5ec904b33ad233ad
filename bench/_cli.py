"""The command line of a benchmark: ``--help`` says what it measures (its docstring), and an
unknown option is refused, instead of either starting a run of several minutes. Its sizes are
options whose defaults are the measured run's, so a test can run it at a tiny size."""

from __future__ import annotations

import argparse


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the benchmark's docstring as its help, laid out as written."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def int_list(text: str) -> tuple[int, ...]:
    """``"10,50,100"`` as (10, 50, 100): an option's list of sizes."""
    return tuple(int(part) for part in text.split(",") if part)
