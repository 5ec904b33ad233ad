"""The lab and benchmark commands the README, the guides and bench/README.md give, and how a test
runs each of them tiny.

A command is ``python -m tests.…`` or ``python -m bench.…``, on a line of a fenced block (up to
its comment) or in a code span of the prose, where it may wrap a line and bracket its optional
options (``[--tries 10]``). Run tiny, a command keeps its options as written but for the sizes its
module's ``Tiny`` sets: substituted, or added where the command leaves them out (unless
``add_missing`` is off); an option whose value is ``…`` is the reader's own, and is left out.
"""

from __future__ import annotations

import compileall
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL

from tests.docs.needs import check_needs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LAB_MODULE = re.compile(r"(?:tests|bench)\.[a-z_]+")
_SPAN = re.compile(r"`(python -m (?:tests|bench)\.[^`]*)`")
_LINE = re.compile(r"^(python -m (?:tests|bench)\.[^#\n]*)", re.M)
_ELIDED = "…"
#: What a lab that can share a Prefect API reads (tests/campaign/__main__.py's SHARED_API).
LAB_API = "PREFECT_CODER_LAB_API_URL"


@dataclass(frozen=True)
class Tiny:
    """How a module's commands run tiny, and the line of output that proves one ran."""

    sizes: dict[str, str]
    proof: str  # a regex its output (stdout and stderr) must match, ^ and $ at each line
    workdir: bool = False  # given --workdir in a folder others may read (the fleet's servers)
    timeout: float = 600  # a safety net: a tiny run takes seconds to two minutes, more if loaded
    needs: tuple[str, ...] = field(default=())  # beyond the venv: names of tests/docs/needs.py
    add_missing: bool = True
    #: Runs against the Prefect API ``PREFECT_CODER_LAB_API_URL`` names, when given one.
    shares_api: bool = False


def doc_commands() -> list[list[str]]:
    """Every command the pages give, as words, in the order found, without repeats."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text()
        for m in [*_LINE.finditer(text), *_SPAN.finditer(text)]:
            words = m[1].replace("[", " ").replace("]", " ").split()
            found.setdefault(" ".join(words), words)
    return list(found.values())


def options_of(words: list[str]) -> list[tuple[str, list[str]]]:
    """``--a 1 --b x y --c`` as [("--a", ["1"]), ("--b", ["x", "y"]), ("--c", [])]."""
    options: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            options.append((word, []))
        else:
            assert options, f"a value before any option: {words}"
            options[-1][1].append(word)
    return options


def tiny(words: list[str], recipe: Tiny) -> list[str]:
    """The command's words with its sizes set tiny (see the module's docstring)."""
    module, written = words[2], options_of(words[3:])
    argv = ["-m", module]
    for option, values in written:
        if option in recipe.sizes:
            argv += [option, recipe.sizes[option]]
        elif values != [_ELIDED]:
            argv += [option, *values]
    given = {option for option, _ in written}
    for option, value in recipe.sizes.items():
        if recipe.add_missing and option not in given:
            argv += [option, value]
    return argv


# Each module a page names has its recipe: a new command fails its test until it has one.
TINY = {
    # Not added: a command without --count replays the schedules its --only names.
    "tests.campaign": Tiny(
        {"--count": "1"},
        r"^campaign: 1 schedules, 0 violations",
        needs=("private postgres",),
        add_missing=False,
        shares_api=True,
    ),
    # A fleet's processes slow down together on a loaded machine: a CI run whose other tests
    # held both cores took 98 s to bring one up and had not ended its schedule at 600 s
    # (alone: 14 s and 25 s). What the lab waits on is said once a minute meanwhile.
    "tests.fleet": Tiny(
        {"--count": "1"},
        r"^fleet campaign: 1 schedules, 0 violations",
        workdir=True,
        needs=("netns",),
        timeout=1200,
    ),
    "bench.host_recovery": Tiny(
        {"--tries": "1"},
        r"^  kill -> relaunch takes the epoch .*\(n=1:",
        needs=("netns",),
        timeout=1200,
    ),
    "bench.recovery": Tiny(
        {"--tries": "1"},
        r"^  kill -> relaunch takes the epoch .*\(n=1:",
        needs=("private postgres",),
    ),
    "bench.durable_step": Tiny(
        {"--steps": "1", "--chunk": "1"},
        r"^    run_turn body minus run_step \(p50s, above\)",
        needs=("postgres",),
    ),
    "bench.fleet": Tiny(
        {"--sizes": "2", "--repeat": "1", "--repeat-size": "2", "--worker-runs": "1"},
        r"(?s)^  \(c'\) durable_chats PG .*^every workflow answered its 3 turns$",
        needs=("postgres",),
    ),
    "bench.simulator_throughput": Tiny(
        {"--deltas": "200", "--chats": "5"}, r"^ +5 +[\d.]+ +[\d.]+ +\d+ +\d+$"
    ),
    "bench.client_decode": Tiny(
        {"--deltas": "200", "--rounds": "1"}, r"^ +64 +[\d,]+ +[\d,]+ +[\d.]+$"
    ),
    "bench.client_turns": Tiny(
        {"--turns": "3", "--sessions": "10"}, r"^memory per idle session \(10 sessions"
    ),
    "bench.store_latency": Tiny(
        {"--n": "5"}, r"(?s)^postgres \S+ at .*^  8 concurrent writers ", needs=("postgres",)
    ),
    "bench.sweep_scale": Tiny({"--chats": "20"}, r"^ +20 +200 +[\d.]+ +\d+ "),
}


def tiny_commands(modules: re.Pattern[str]) -> list[list[str]]:
    """The pages' commands of these modules, each run tiny; commands of a module that give the
    same options with other values (``--count 12 --seed 3``, ``--count 100 --seed 18``) are one
    run, the first found: tiny, they take the same path, and each fleet costs a minute."""
    runs: dict[tuple[str, ...], list[str]] = {}
    for words in doc_commands():
        if modules.fullmatch(words[2]):
            argv = tiny(words, TINY[words[2]])
            shape = (argv[1], *sorted(w for w in argv if w.startswith("--")))
            runs.setdefault(shape, argv)
    return list(runs.values())


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``git clone`` of HEAD: what a reader has, without the working tree's leftovers.

    Compiled as a reader's first run compiles it: this machine sets PYTHONDONTWRITEBYTECODE,
    and each of the dozens of processes a lab starts would compile the clone again."""
    folder = tmp_path_factory.mktemp("clone") / "prefect-coder"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    for package in ("coder_chat", "prefect_coder", "tests", "bench"):
        compileall.compile_dir(folder / package, quiet=1)
    return folder


def tiny_params(modules: re.Pattern[str]) -> list[Any]:
    """``tiny_commands`` as pytest parameters, each with its recipe's time limit and a minute
    for the test to report it (pytest's own default, 120 s, is shorter than some tiny runs)."""
    return [
        pytest.param(
            argv, id=" ".join(argv[1:]), marks=pytest.mark.timeout(TINY[argv[1]].timeout + 60)
        )
        for argv in tiny_commands(modules)
    ]


def shared_api(
    argv: list[str], modules: re.Pattern[str], request: pytest.FixtureRequest
) -> str | None:
    """The session's Prefect test API for a command of ``modules`` to run against, or None.

    None for the first command of the modules: it starts an API of its own, as a reader's
    run does, so that start stays tested; each of the others saves one (seconds of CPU).
    """
    if not TINY[argv[1]].shares_api or argv == tiny_commands(modules)[0]:
        return None
    request.getfixturevalue("prefect_api")
    return str(PREFECT_API_URL.value())


def run_tiny(argv: list[str], clone: Path, api: str | None = None) -> str:
    """Run the command in the clone with this venv's python (against ``api``, when given:
    see :func:`shared_api`); its output, once it exited 0 and printed its recipe's proof."""
    recipe = TINY[argv[1]]
    check_needs(recipe.needs)
    env = {**os.environ}
    if api is not None:
        assert recipe.shares_api, f"{argv[1]} starts its own Prefect API"
        env[LAB_API] = api
    with tempfile.TemporaryDirectory(prefix="prefect-coder-docs-") as folder:
        if recipe.workdir:
            # The fleet's PostgreSQL servers run as "postgres" and must pass through the
            # folder: pytest's own temporary folders are its owner's alone (mode 700).
            Path(folder).chmod(0o755)
            argv = [*argv, "--workdir", folder]
        code, output = _run(argv, clone, recipe.timeout, env)
    tail = output[-4000:]
    assert code == 0, f"{' '.join(argv)} exited {code}:\n{tail}"
    assert re.search(recipe.proof, output, re.M), f"no line matches {recipe.proof!r}:\n{tail}"
    return output


def _run(argv: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[int, str]:
    """Its exit code and output (stdout and stderr). Past ``timeout`` its process group is
    asked to stop (a lab tears its servers down on SIGTERM), then killed."""
    with subprocess.Popen(
        [sys.executable, *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                output, _ = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, _ = process.communicate()
            raise AssertionError(
                f"{' '.join(argv)} ran past {timeout} s:\n{output[-4000:]}"
            ) from None
    return process.returncode, output
