"""Code that changes under running workflows, deployed as a team deploys it.

A flow of the team's own, in a file of its own, is served as a deployment by a runner in a
process of its own (each flow run a subprocess, as a worker runs it), against Prefect's API
and the simulator. Each version of the file is deployed by stopping the runner and serving
the new file under the same deployment name.

1. v1 runs workflow A; it is SIGKILLed (the runner and its flow run, as a host dies) while
   step 2 is in flight, and its run reported Crashed.
2. v2 puts a new step-2 prompt behind ``chat.patched("shorter-review")``. The orphan sweep
   relaunches A on v2: A keeps v1's prompt (its step 2 was already sent) and finishes, each
   prompt sent once; a new workflow B on v2 takes the new prompt.
3. v2 runs workflow C, killed the same way. v3 changes step 1's prompt with no patch: the
   sweep's relaunch of C is refused (``PromptChanged``), the stored workflow is left byte for
   byte as it was (its epoch, state and runs), and the next pass neither marks it failed nor
   relaunches it again on the same code. v2 deployed again, the next pass relaunches C and it
   finishes, nothing sent twice.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.states import Crashed

from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder.flows.orphan_sweep import orphan_sweep
from tests.integration.procs import (
    Proc,
    Processes,
    managed_processes,
    until,
    wait_for_line,
)
from tests.integration.team import REVIEW_SOURCE, serving_env

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(600)]

#: A name no other test deploys: the sweep finds runs by their deployment's name.
DEPLOYMENT = "versioned-reviews"
READ = "Read the change"
CAREFULLY = "Read the change carefully"
#: Long enough that the kill lands while step 2 is in flight.
REVIEW = "Review it /sleep 15"
SHORTER = "Review it in three lines /sleep 10"
SUM = "Sum it up"
TIMEOUT = 180.0

SOURCE = functools.partial(REVIEW_SOURCE.format, flow="versioned-review", version=None)
PLAIN_SECOND = f"        await chat.turn({REVIEW!r})"
PATCHED_SECOND = textwrap.indent(
    textwrap.dedent(
        f"""\
        if chat.patched("shorter-review"):
            await chat.turn({SHORTER!r})
        else:
            await chat.turn({REVIEW!r})"""
    ),
    " " * 8,
)
V1 = SOURCE(read=READ, second=PLAIN_SECOND, sum=SUM)
V2 = SOURCE(read=READ, second=PATCHED_SECOND, sum=SUM)
V3 = SOURCE(read=CAREFULLY, second=PATCHED_SECOND, sum=SUM)


class Team:
    """The team's project folder and its one runner, deploying a version at a time."""

    def __init__(self, procs: Processes, folder: Path, env: dict[str, str]) -> None:
        self.procs, self.folder, self.env = procs, folder, env
        self.runner: Proc | None = None

    async def deploy(self, source: str) -> None:
        self.stop()
        (self.folder / "review_flow.py").write_text(source)
        serve = f"from review_flow import review; review.serve(name={DEPLOYMENT!r})"
        self.runner = await self.procs.start(
            f"runner-{len(self.procs.started)}",
            sys.executable,
            "-c",
            serve,
            env=self.env,
            cwd=self.folder,
        )
        await wait_for_line(self.runner, DEPLOYMENT, TIMEOUT)

    def stop(self) -> None:
        """The runner and every flow run it started, SIGKILLed (a deploy or a dead host)."""
        if self.runner is not None:
            self.procs.kill(self.runner)
            self.runner = None


async def test_deployed_code_changes_under_running_workflows(
    sim: Simulator, coder_env: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "team"
    folder.mkdir()
    env = serving_env(sim, tmp_path / "prefect-home", coder_env)
    tenant = str(sim.organization_id)
    async with managed_processes(tmp_path) as procs:
        team = Team(procs, folder, env)

        # 1. v1, workflow A killed with step 2 in flight.
        await team.deploy(V1)
        a = await launch("review-a")
        await killed_in_step_2(team, sim, a, "review-a")

        # 2. v2 behind a patch: A keeps v1's prompt, B takes v2's.
        await team.deploy(V2)
        assert (await orphan_sweep(target_deployment=DEPLOYMENT))["relaunched"] == 1
        await finished(tenant, coder_env, "review-a", procs)
        assert sent(sim, "review-a", REVIEW) == 1 and sent(sim, "review-a", SHORTER) == 0
        assert sent(sim, "review-a", READ) == 1 and sent(sim, "review-a", SUM) == 1
        b = await launch("review-b")
        await ended(b.id, procs)
        await finished(tenant, coder_env, "review-b", procs)
        assert sent(sim, "review-b", SHORTER) == 1 and sent(sim, "review-b", REVIEW) == 0
        assert await patches(tenant, coder_env) == {
            "review-a": {"shorter-review": False},
            "review-b": {"shorter-review": True},
        }

        # 3. v2 runs C, killed; v3 changes step 1 with no patch.
        c = await launch("review-c")
        await killed_in_step_2(team, sim, c, "review-c", prompt=SHORTER)
        before = rows(coder_env, "review-c")
        await team.deploy(V3)
        assert (await orphan_sweep(target_deployment=DEPLOYMENT))["relaunched"] == 1
        [refused] = await relaunches("review-c")
        refused = await ended(refused.id, procs)
        assert refused.state is not None and "PromptChanged" in (refused.state.message or "")
        assert rows(coder_env, "review-c") == before  # epoch, state, runs: as they were
        assert (await orphan_sweep(target_deployment=DEPLOYMENT))["relaunched"] == 0
        assert rows(coder_env, "review-c") == before  # not marked failed either
        assert sent(sim, "review-c", CAREFULLY) == 0

        # The code it ran, deployed again: C is carried on to its end.
        await team.deploy(V2)
        assert (await orphan_sweep(target_deployment=DEPLOYMENT))["relaunched"] == 1
        await finished(tenant, coder_env, "review-c", procs)
        for prompt in (READ, SHORTER, SUM):
            assert sent(sim, "review-c", prompt) == 1, prompt
        team.stop()


async def launch(workflow_id: str) -> FlowRun:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(f"versioned-review/{DEPLOYMENT}")
        return await client.create_flow_run_from_deployment(
            deployment.id, parameters={"workflow_id": workflow_id}
        )


async def killed_in_step_2(
    team: Team, sim: Simulator, run: FlowRun, workflow_id: str, prompt: str = REVIEW
) -> None:
    """Once step 2 is sent, the runner and the flow run die; Prefect is told it Crashed."""

    async def in_flight() -> bool:
        return sent(sim, workflow_id, prompt) == 1

    watch = [team.runner] if team.runner else []
    await until(in_flight, f"{workflow_id}'s step 2 to be sent", TIMEOUT, watch, 0.1)
    team.stop()
    async with get_client() as client:
        await client.set_flow_run_state(
            run.id, Crashed(message="its process was killed"), force=True
        )


def sent(sim: Simulator, workflow_id: str, prompt: str) -> int:
    """How many of the workflow's user messages carry ``prompt`` (its step marker names it)."""
    quoted = json.dumps(prompt)[1:-1]
    return sum(
        1
        for chat in sim.chats()
        for m in sim.messages(chat.id)
        if m.role == "user"
        and f"[{workflow_id}/" in json.dumps(m.content)
        and f"] {quoted}" in json.dumps(m.content)
    )


def rows(db: Path, workflow_id: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [
            *conn.execute("SELECT * FROM workflows WHERE workflow_id = ?", (workflow_id,)),
            *conn.execute(
                "SELECT * FROM steps WHERE workflow_id = ? ORDER BY step", (workflow_id,)
            ),
            *conn.execute(
                "SELECT * FROM chats WHERE workflow_id = ? ORDER BY chat_id", (workflow_id,)
            ),
        ]


async def relaunches(workflow_id: str) -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"prefect-coder:relaunch:{workflow_id}"])
            )
        )


async def ended(run_id: UUID, procs: Processes) -> FlowRun:
    async def done() -> FlowRun | None:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
        return run if run.state is not None and run.state.is_final() else None

    return await until(done, f"run {run_id} to end", TIMEOUT, procs.started[-1:], 0.5)


async def finished(tenant: str, db: Path, workflow_id: str, procs: Processes) -> None:
    async def done() -> bool:
        store = SqliteStore(db)
        try:
            record = await store.get_workflow(tenant, workflow_id)
        finally:
            await store.close()
        return record is not None and record.state == WorkflowState.FINISHED

    await until(done, f"{workflow_id} to finish", TIMEOUT, procs.started[-1:], 0.5)


async def patches(tenant: str, db: Path) -> dict[str, dict[str, bool]]:
    store = SqliteStore(db)
    try:
        found = {}
        for wid in ("review-a", "review-b"):
            record = await store.get_workflow(tenant, wid)
            assert record is not None
            found[wid] = dict(record.patches)
        return found
    finally:
        await store.close()
