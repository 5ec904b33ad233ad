"""Pasting a guide section's shell blocks as a person would: the blocks, read by their
markers, checked, and run in terminals of a fresh machine."""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.procs import (
    Proc,
    Processes,
    clean_env,
    wait_for_line,
)

ROOT = Path(__file__).resolve().parents[2]
#: The guides whose shell blocks the tests paste (they were README sections once).
SETUP_GUIDE = ROOT / "docs" / "deploying.md"
FLEET_GUIDE = ROOT / "docs" / "fleet.md"
SECTION = "## Run it with a Prefect server and a worker"
#: Generous bounds for cold processes on a loaded machine; no test is timed.
STARTUP_TIMEOUT = 240.0
STEP_TIMEOUT = 400.0
#: The commands that must never block a pasted sequence: each is a background step.
LONG_RUNNING = ("prefect server start", "prefect-coder simulator", "prefect worker start")
#: A marked block: ``<!-- TAG: N attributes -->`` on the line before its ``bash`` fence.
MARKER = r"<!-- {tag}: (?P<step>\d+)(?P<attrs>[^>]*?)-->\n```bash\n(?P<body>.*?)\n```"
ATTRIBUTE = re.compile(r'([a-z-]+)(?:=(?:"([^"]*)"|(\S+)))?')
EXPORT = re.compile(r"^export ([A-Z_][A-Z0-9_]*)=")


@dataclass(frozen=True)
class Block:
    step: int
    body: str
    terminal: int = 1
    install: bool = False
    background: bool = False
    ready: str | None = None
    paste_from: int | None = None


def setup_section(text: str, title: str = SECTION) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end != -1 else len(text)]


def setup_blocks(text: str, tag: str = "setup") -> list[Block]:
    """The ``bash`` blocks of ``text`` marked with ``tag``, in order."""
    blocks = []
    for match in re.finditer(MARKER.format(tag=tag), text, re.DOTALL):
        attrs: dict[str, Any] = {}
        for name, quoted, bare in ATTRIBUTE.findall(match["attrs"]):
            value = quoted or bare
            match name:
                case "terminal" | "paste-from":
                    attrs[name.replace("-", "_")] = int(value)
                case "ready":
                    attrs["ready"] = value
                case "install" | "background":
                    attrs[name] = True
                case _:
                    raise AssertionError(f"unknown setup attribute {name!r} in {match[0]!r}")
        blocks.append(Block(int(match["step"]), match["body"], **attrs))
    return blocks


def check_markup(section: str, blocks: list[Block]) -> None:
    """Numbered from 1, every ``bash`` block marked, long-running commands in the
    background with a line that says they are ready, pasted exports from an earlier step."""
    assert [b.step for b in blocks] == list(range(1, len(blocks) + 1))
    # Every bash block of the section is a marked step: none is skipped by the test.
    assert section.count("```bash") == len(blocks)
    for block in blocks:
        long_running = [c for c in LONG_RUNNING if c in block.body]
        if block.background:
            assert block.ready, f"step {block.step} runs in the background: say when it is ready"
            re.compile(block.ready)
            assert len(long_running) == 1, f"step {block.step}: one long-running command"
            assert block.body.rstrip().splitlines()[-1].startswith(long_running[0])
        else:
            assert not long_running, f"step {block.step} would block: mark it background"
        if block.paste_from is not None:
            source = blocks[block.paste_from - 1]
            assert source.background and source.step < block.step
            assert all(EXPORT.match(line) for line in block.body.splitlines())


def checkout_for(tmp: Path) -> Path:
    """This repository, with ``.venv`` being the virtualenv running the test.

    Every entry is a symlink to the real one, so what the blocks run is this
    checkout's code (the editable install points here too).
    """
    checkout = tmp / "checkout"
    checkout.mkdir()
    skip = {".venv", ".venv-ci", ".git", "test-output", ".mypy_cache", ".ruff_cache"}
    for entry in ROOT.iterdir():
        if entry.name not in skip and not entry.name.startswith(".pytest"):
            (checkout / entry.name).symlink_to(entry)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    return checkout


def fresh_machine_env(tmp: Path, port: int) -> dict[str, str]:
    """An empty home, no virtualenv on PATH, no Prefect or Coder setting; the server's port."""
    home = tmp / "home"
    home.mkdir()
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    return {
        **clean_env(),
        "HOME": str(home),
        "PREFECT_HOME": str(home / ".prefect"),
        "PATH": path,
        "PREFECT_SERVER_API_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }


@dataclass
class Terminals:
    """Shells that keep their exported variables from one pasted block to the next."""

    procs: Processes
    tmp: Path
    checkout: Path
    env: dict[str, str]

    def script(self, terminal: int, body: str, *, save: bool) -> str:
        state = shlex.quote(str(self.tmp / f"terminal-{terminal}.sh"))
        lines = [
            "set -eo pipefail",
            f"if [ -f {state} ]; then . {state}; fi",
            f"cd {shlex.quote(str(self.checkout))}",
            body,
        ]
        if save:
            lines.append(f"export -p > {state}")
        return "\n".join(lines) + "\n"

    async def run(self, name: str, terminal: int, body: str, watch: list[Proc]) -> str:
        script = self.script(terminal, body, save=True)
        return await self.procs.run(
            name,
            "bash",
            "-c",
            script,
            env=self.env,
            cwd=self.checkout,
            timeout=STEP_TIMEOUT,
            watch=watch,
        )

    async def start(self, name: str, terminal: int, body: str) -> Proc:
        script = self.script(terminal, body, save=False)
        return await self.procs.start(name, "bash", "-c", script, env=self.env, cwd=self.checkout)


async def paste(terminals: Terminals, blocks: list[Block]) -> dict[int, Proc]:
    """Paste ``blocks`` in order, as a person would; the background steps' processes."""
    background: dict[int, Proc] = {}
    for block in blocks:
        name = f"step-{block.step}"
        watch = list(background.values())
        if block.install:
            # Not run (see the module's doc); its virtualenv is the test's own.
            await terminals.run(name, block.terminal, ". .venv/bin/activate", watch)
        elif block.background:
            assert block.ready is not None
            proc = await terminals.start(name, block.terminal, block.body)
            background[block.step] = proc
            await wait_for_line(proc, block.ready, STARTUP_TIMEOUT)
        elif block.paste_from is not None:
            printed = exports(background[block.paste_from].output())
            # What the README shows is what was printed: the same variables, in order.
            assert exported_names(block.body) == exported_names("\n".join(printed))
            await terminals.run(name, block.terminal, "\n".join(printed), watch)
        else:
            await terminals.run(name, block.terminal, block.body, watch)
    return background


def exported_names(text: str) -> list[str]:
    return [m[1] for line in text.splitlines() if (m := EXPORT.match(line))]


def exports(output: str) -> list[str]:
    return [line for line in output.splitlines() if EXPORT.match(line)]
