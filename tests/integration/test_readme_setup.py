"""The setup guide (docs/deploying.md), pasted in order: its ``bash`` blocks, run as written.

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

import re
import shlex
import uuid
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
from prefect.settings import PREFECT_API_URL

from tests.integration.procs import (
    Proc,
    Processes,
    free_port,
    http_ok,
    managed_processes,
)
from tests.prefect_test_api import api_settings

from .readme_blocks import (
    ROOT,
    SETUP_GUIDE,
    Terminals,
    check_markup,
    checkout_for,
    exports,
    fresh_machine_env,
    paste,
    setup_blocks,
    setup_section,
)

#: What the README's last step runs (step 9): checked against what the run did.
WORKFLOW_ID = "hello-coder"
PROMPTS = ["Say hello", "Count to three", "Say goodbye"]

pytestmark = [
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not Path("/proc/self/stat").exists(), reason="finds a worker's process tree in /proc"
    ),
]


def test_the_setup_blocks_are_marked_numbered_and_safe_to_paste_in_order() -> None:
    """Cheap checks of the README's markup (the end-to-end test below runs it)."""
    section = setup_section(SETUP_GUIDE.read_text())
    blocks = setup_blocks(section)
    check_markup(section, blocks)
    [install] = [b for b in blocks if b.install]
    assert install.step == 1
    # The install step is CI's: the same pip command on a fresh clone, every run.
    assert ". .venv/bin/activate" in install.body
    assert 'pip install -c constraints.txt -e ".[dev]"' in install.body
    assert '-c constraints.txt -e ".[dev]"' in (ROOT / ".ci" / "run").read_text()


# -- the end-to-end run -------------------------------------------------------------------------


async def test_readme_setup_reaches_a_worker_that_completes_a_durable_chat(
    tmp_path: Path,
) -> None:
    async with managed_processes(tmp_path) as procs:
        await scenario(procs, tmp_path)


async def scenario(procs: Processes, tmp: Path) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    terminals = Terminals(procs, tmp, checkout_for(tmp), fresh_machine_env(tmp, port))
    background = await paste(terminals, setup_blocks(setup_section(SETUP_GUIDE.read_text())))
    assert await http_ok(f"{api}/health")
    simulator = dict(shlex.split(line)[1].split("=", 1) for line in exports(background[4].output()))
    async with api_settings({PREFECT_API_URL: api}), get_client() as client:
        await check_the_run(client, simulator, list(background.values()))


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
