"""The README's setup, pasted in order: its own ``bash`` blocks, read from README.md, run as written.

The section "Run it with a Prefect server and a worker" marks each block it means to
be pasted with an HTML comment (invisible once rendered) that says how:

- ``<!-- setup: N -->``: step N, pasted into terminal 1 and run to its end;
- ``terminal=T``: pasted into terminal T instead (each terminal is a shell of its own
  that keeps its variables from one block to the next, as a terminal window does);
- ``background ready="REGEX"``: a long-running command (the server, the simulator,
  the worker): started, and left running once a line of its output matches;
- ``paste-from=M``: "paste the ``export`` lines step M printed": the block shows what
  they look like, and the test pastes the real ones, after checking they name the same
  variables in the same order;
- ``install``: the install step. It is not run here (that would be a full install on
  every test run); CI runs the same ``pip install`` on a fresh clone, and the test
  checks that it is the same command. The test's own virtualenv stands for the one it
  makes: the checkout the blocks run in is this repository with ``.venv`` pointing at it.

Everything runs under an empty ``HOME`` (and ``PREFECT_HOME`` in it), with a ``PATH``
that has no virtualenv on it, so nothing of this machine's own setup is used. The one
port chosen for the test is Prefect's own ``PREFECT_SERVER_API_PORT``, which the README's
commands read; the simulator picks a free port itself. The run must complete, with the
step results, logs, name and progress artifact the README promises, and answers the
simulator really committed.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.integration.procs import (
    Proc,
    Processes,
    clean_env,
    free_port,
    http_ok,
    managed_processes,
    wait_for_line,
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Run it with a Prefect server and a worker"
#: What the README's last step runs (step 9): checked against what the run did.
WORKFLOW_ID = "hello-coder"
PROMPTS = ["Say hello", "Count to three", "Say goodbye"]
#: The commands that must never block a pasted sequence: each is a background step.
LONG_RUNNING = ("prefect server start", "prefect-coder simulator", "prefect worker start")
#: Generous bounds for cold processes on a loaded machine; no test is timed.
STARTUP_TIMEOUT = 240.0
STEP_TIMEOUT = 400.0

pytestmark = [
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not Path("/proc/self/stat").exists(), reason="finds a worker's process tree in /proc"
    ),
]

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


def test_the_setup_blocks_are_marked_numbered_and_safe_to_paste_in_order() -> None:
    """Cheap checks of the README's markup (the end-to-end test below runs it)."""
    section = setup_section(README.read_text())
    blocks = setup_blocks(section)
    check_markup(section, blocks)
    [install] = [b for b in blocks if b.install]
    assert install.step == 1
    # The install step is CI's: the same pip command on a fresh clone, every run.
    assert ". .venv/bin/activate" in install.body
    assert 'pip install -c constraints.txt -e ".[dev]"' in install.body
    assert '-c constraints.txt -e ".[dev]"' in (ROOT / ".ci" / "run").read_text()


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


# -- the end-to-end run -------------------------------------------------------------------------


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


async def test_readme_setup_reaches_a_worker_that_completes_a_durable_chat(
    tmp_path: Path,
) -> None:
    async with managed_processes(tmp_path) as procs:
        await scenario(procs, tmp_path)


async def scenario(procs: Processes, tmp: Path) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    terminals = Terminals(procs, tmp, checkout_for(tmp), fresh_machine_env(tmp, port))
    background = await paste(terminals, setup_blocks(setup_section(README.read_text())))
    assert await http_ok(f"{api}/health")
    simulator = dict(shlex.split(line)[1].split("=", 1) for line in exports(background[4].output()))
    with temporary_settings(updates={PREFECT_API_URL: api}):
        async with get_client() as client:
            await check_the_run(client, simulator, list(background.values()))


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


async def check_the_run(
    client: PrefectClient, simulator: dict[str, str], watch: list[Proc]
) -> None:
    runs = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["durable-chat"]))
    )
    [run] = runs
    assert run.state is not None and run.state.type == StateType.COMPLETED, run.state
    assert run.name == f"{WORKFLOW_ID} · epoch 1"
    assert run.parameters["workflow_id"] == WORKFLOW_ID
    assert run.parameters["prompts"] == PROMPTS

    # Each step ran once, in order, and says so in the run's logs.
    logs = await client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), limit=200
    )
    messages = [log.message for log in logs]
    # Prefect's last line of each step's task run, its Completed state saying the verdict.
    said = [
        re.match(r"Finished in state Completed\('(Step \d+ of \d+: .*)'\)$", m) for m in messages
    ]
    verdicts = [m.group(1) for m in said if m]
    assert [v.split(":", 1)[0] for v in verdicts] == ["Step 1 of 3", "Step 2 of 3", "Step 3 of 3"]
    assert all(v.split(": ", 1)[1].startswith("ran") for v in verdicts), verdicts

    # The progress artifact, attached to the run: all done, each step "ran".
    artifacts = await client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
    )
    [progress] = [a for a in artifacts if (a.key or "").startswith("progress-")]
    assert progress.type == "progress" and float(str(progress.data)) == 100.0
    assert "step 3 of 3 done" in (progress.description or "")
    for step in (1, 2, 3):
        assert f"- step {step}: ran" in (progress.description or ""), progress.description

    # The step results the run returned are the answers the simulator committed.
    steps = await turn_results(client, run)
    assert [(s.step, s.verdict) for s in steps] == [(1, "ran"), (2, "ran"), (3, "ran")]
    [chat_id] = {s.chat_id for s in steps}
    committed = await committed_answers(simulator, chat_id)
    assert [s.text for s in steps] == committed
    for prompt, text in zip(PROMPTS, committed, strict=True):
        assert prompt in text  # the scripted model quotes the prompt


async def turn_results(client: PrefectClient, run: FlowRun) -> list[Any]:
    """The persisted results of the run's ``<workflow> · step N of 3`` task runs, in order."""
    task_runs = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
    )
    named = {int(m[1]): t for t in task_runs if (m := re.search(r"· step (\d+) of 3$", t.name))}
    turns = [named[step] for step in sorted(named)]
    assert [t.name for t in turns] == [f"{WORKFLOW_ID} · step {n} of 3" for n in (1, 2, 3)], turns
    return [await t.state.aresult() for t in turns if t.state is not None]


async def committed_answers(simulator: dict[str, str], chat_id: str) -> list[str]:
    """The assistant texts the simulator committed on the chat, oldest first."""
    headers = {"Coder-Session-Token": simulator["CODER_SESSION_TOKEN"]}
    async with httpx.AsyncClient(base_url=simulator["CODER_URL"], headers=headers) as http:
        response = await http.get(f"/api/v2/chats/{uuid.UUID(chat_id)}/messages")
        response.raise_for_status()
    messages = response.json()["messages"]
    texts = []
    for message in sorted(messages, key=lambda m: m["id"]):
        if message["role"] == "assistant":
            text = "".join(p.get("text", "") for p in message["content"] if p["type"] == "text")
            if text:
                texts.append(text)
    return texts
