"""A team's own flow redeployed under its running workflows, on a real Prefect stack.

Everything but the Coder simulator is a real process: ``prefect server start`` (its
database a private PostgreSQL), a process worker, and the team's project, each version in
a release folder of its own with its own ``prefect.yaml`` (the flow and the orphan sweep
aimed at it), deployed with ``prefect deploy`` as a team deploys a release. The flow is
three turns; its version is the flow's ``version``, so each flow run says which code ran.

1. v1 runs workflow ``old``; step 2's send reaches Coder and its answer is held, and the
   flow run's process is SIGKILLed there (the worker lives on and reports it Crashed).
2. v2 puts a new step-2 prompt behind ``chat.patched("short-review")``. A sweep pass
   relaunches ``old`` on v2: it keeps v1's prompt (its step 2 was sent) and finishes; a new
   workflow ``new`` on v2 takes v2's prompt. Each prompt is sent once.
3. ``new`` is killed the same way with its step 2 (v2's prompt) in flight. v3 edits that
   prompt in place, with no patch: the sweep's relaunch on v3 is refused (PromptChanged),
   and the store's rows of the workflow are byte for byte as the crash left them (epoch,
   state, runs); the next pass neither marks it failed nor relaunches it on the same code.
   v2 deployed again, the next pass relaunches it and it finishes, nothing sent twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.settings import PREFECT_API_URL

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.durable.records import WorkflowRecord, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from coder_chat.simulator.faults import HeldRequest
from tests.integration.procs import NEEDS_PROC, Proc, Processes, managed_processes, processes, until
from tests.integration.stack import (
    PREFECT,
    create_process_pool,
    home_env,
    start_server,
    start_worker,
)
from tests.integration.team import REVIEW_SOURCE
from tests.names import REFUSED
from tests.pgcluster import PgCluster
from tests.prefect_test_api import api_settings

pytestmark = [pytest.mark.timeout(600), NEEDS_PROC]

POOL = "reviews"
FLOW = "code-review"
DEPLOYMENT = "code-review"
SWEEP = "code-review-sweep"
#: Generous bounds for waiting only (cold Python processes on a loaded machine).
TIMEOUT = 180.0

READ = "Read the change"
REVIEW = "Review it line by line"
SHORT = "Review it in three lines"
EDITED = "Review it in two lines"
SUM = "Sum it up"


def second_step(new: str | None) -> str:
    """Step 2's code: v1's prompt, or a new one behind a patch."""
    if new is None:
        code = f"await chat.turn({REVIEW!r})"
    else:
        code = f"""\
            if chat.patched("short-review"):
                await chat.turn({new!r})
            else:
                await chat.turn({REVIEW!r})"""
    return textwrap.indent(textwrap.dedent(code), " " * 8)


#: version -> step 2's prompt behind the patch (None: no patch, v1's prompt alone).
RELEASES: dict[str, str | None] = {"v1": None, "v2": SHORT, "v3": EDITED}

PREFECT_YAML = """\
name: code-review
prefect-version: 3.9.1
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: {release}

deployments:
  - name: {deployment}
    version: {version}
    entrypoint: review.py:review
    work_pool: {{name: {pool}}}

  - name: {sweep}
    version: {version}
    entrypoint: prefect_coder.flows.orphan_sweep:orphan_sweep
    parameters:
      target_deployment: {deployment}
      orphan_age_seconds: 3600
      stuck_after_seconds: 3600
      # Every running workflow whose run is gone is silent by the time a pass looks.
      stale_heartbeat_seconds: 1
    work_pool: {{name: {pool}}}
"""


@dataclass
class Team:
    """The team's project: a release folder per version, deployed with ``prefect deploy``."""

    procs: Processes
    root: Path
    env: dict[str, str]
    server: Proc

    async def deploy(self, version: str) -> None:
        release = self.root / "releases" / version
        if not release.exists():
            release.mkdir(parents=True)
            flow = REVIEW_SOURCE.format(
                flow=FLOW,
                version=version,
                read=READ,
                second=second_step(RELEASES[version]),
                sum=SUM,
            )
            (release / "review.py").write_text(flow)
            (release / "prefect.yaml").write_text(
                PREFECT_YAML.format(
                    release=json.dumps(str(release)),
                    deployment=DEPLOYMENT,
                    sweep=SWEEP,
                    version=version,
                    pool=POOL,
                )
            )
        await self.procs.run(
            f"deploy-{version}",
            PREFECT,
            "--no-prompt",
            "deploy",
            "--all",
            env=self.env,
            cwd=release,
            timeout=TIMEOUT,
            watch=[self.server],
        )


@dataclass
class Stack:
    procs: Processes
    client: PrefectClient
    server: Proc
    worker: Proc
    sim: Simulator
    db: Path
    tenant: str
    team: Team

    @property
    def watch(self) -> list[Proc]:
        return [self.server, self.worker]

    async def launch(self, workflow_id: str) -> FlowRun:
        deployment = await self.client.read_deployment_by_name(f"{FLOW}/{DEPLOYMENT}")
        return await self.client.create_flow_run_from_deployment(
            deployment.id, parameters={"workflow_id": workflow_id}
        )

    async def ended(self, run_id: uuid.UUID) -> FlowRun:
        async def final() -> FlowRun | None:
            run = await self.client.read_flow_run(run_id)
            return run if run.state is not None and run.state.is_final() else None

        return await until(final, f"run {run_id} to end", TIMEOUT, self.watch, 0.5)

    async def completed(self, run_id: uuid.UUID) -> FlowRun:
        run = await self.ended(run_id)
        assert run.state is not None and run.state.type == StateType.COMPLETED, run.state
        return run

    async def sweep(self) -> FlowRun:
        """One pass of the team's sweep deployment, run by the worker, to its end."""
        deployment = await self.client.read_deployment_by_name(f"orphan-sweep/{SWEEP}")
        run = await self.client.create_flow_run_from_deployment(deployment.id)
        return await self.completed(run.id)

    async def relaunches(self, workflow_id: str) -> list[FlowRun]:
        runs = await self.client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"prefect-coder:relaunch:{workflow_id}"])
            )
        )
        return sorted(runs, key=lambda r: str(r.created))

    async def logs(self, run_id: uuid.UUID, text: str) -> list[str]:
        """The run's log lines holding ``text``, once Prefect has them."""

        async def found() -> list[str] | None:
            logs = await self.client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200
            )
            return [log.message for log in logs if text in log.message] or None

        return await until(found, f"run {run_id} to log {text!r}", 60, [self.server], 0.5)

    async def workflow(self, workflow_id: str) -> WorkflowRecord:
        store = SqliteStore(self.db)
        try:
            record = await store.get_workflow(self.tenant, workflow_id)
        finally:
            await store.close()
        assert record is not None, workflow_id
        return record

    async def killed_in_step_2(self, workflow_id: str, prompt: str) -> FlowRun:
        """A new workflow, run until step 2's send is committed on Coder and its answer held
        on the way back: the flow run's process is SIGKILLed there (the workflow's first
        send of a message: step 1 is sent with the chat's creation), and the worker, alive,
        reports the run Crashed."""
        self.sim.faults.hold("send_message", phase="after")
        run = await self.launch(workflow_id)

        async def held() -> HeldRequest | None:
            return next((h for h in self.sim.faults.held() if h.route == "send_message"), None)

        request = await until(held, f"{workflow_id}'s step 2 to be sent", TIMEOUT, self.watch)
        assert sent(self.sim, workflow_id) == {(1, READ): 1, (2, prompt): 1}
        running = await self.client.read_flow_run(run.id)
        assert running.state is not None and running.state.type == StateType.RUNNING
        group = os.getpgid(flow_run_process(run.id))
        assert group not in (os.getpgrp(), self.worker.proc.pid)
        os.killpg(group, signal.SIGKILL)
        self.sim.faults.decide(request.id, "drop")
        crashed = await self.ended(run.id)
        assert crashed.state is not None and crashed.state.type == StateType.CRASHED, crashed.state
        record = await self.workflow(workflow_id)
        assert record.state == WorkflowState.RUNNING and record.epoch == 1
        assert record.flow_run_id == str(run.id)
        return crashed


def flow_run_process(run_id: uuid.UUID) -> int:
    """The pid of the process the worker started for the flow run (its environment names
    the run)."""
    wanted = f"PREFECT__FLOW_RUN_ID={run_id}".encode()
    found = []
    for pid in processes():
        with contextlib.suppress(OSError):
            if wanted in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    assert len(found) == 1, f"processes of flow run {run_id}: {found}"
    return found[0]


def sent(sim: Simulator, workflow_id: str) -> dict[tuple[int, str], int]:
    """(step, prompt) -> how many user messages of the workflow's one chat carry it."""
    chats = [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == workflow_id]
    assert len(chats) == 1, chats
    counts: dict[tuple[int, str], int] = {}
    for message in sim.messages(chats[0].id):
        if message.role == "user":
            text = message.text()
            [step] = [n for n in (1, 2, 3) if step_marker(workflow_id, n) in text]
            key = (step, text.replace(step_marker(workflow_id, step), "", 1).strip())
            counts[key] = counts.get(key, 0) + 1
    return counts


def rows(db: Path, workflow_id: str) -> list[tuple[Any, ...]]:
    """The store's raw rows of the workflow: its record, its steps and its chats."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [
            *conn.execute("SELECT * FROM workflows WHERE workflow_id = ?", (workflow_id,)),
            *conn.execute(
                "SELECT * FROM steps WHERE workflow_id = ? ORDER BY step", (workflow_id,)
            ),
            *conn.execute(
                "SELECT * FROM chats WHERE workflow_id = ? ORDER BY chat_id", (workflow_id,)
            ),
        ]


@contextlib.asynccontextmanager
async def real_stack(procs: Processes, tmp: Path, sim: Simulator) -> AsyncIterator[Stack]:
    """A Prefect server, the team's pool and v1 deployed, and one process worker."""
    with PgCluster(for_prefect=True) as pg:
        base = home_env(tmp)
        # No scheduler: every run here is one the test or the sweep made.
        server = await start_server(procs, tmp, base, pg.dsn)
        await server.healthy(TIMEOUT)
        api = server.api
        cli = {**base, "PREFECT_API_URL": api}
        db = tmp / "ledger.sqlite3"
        worker_env = {
            **cli,
            **sim.env(),
            "PREFECT_CODER_SQLITE_PATH": str(db),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
        }
        team = Team(procs, tmp / "team", cli, server.proc)
        async with api_settings({PREFECT_API_URL: api}), get_client() as client:
            await create_process_pool(client, POOL)
            worker = await start_worker(procs, worker_env, tmp, "w1", pool=POOL)
            await team.deploy("v1")
            tenant = str(sim.organization_id)
            yield Stack(procs, client, server.proc, worker, sim, db, tenant, team)


async def test_redeployed_code_under_running_workflows(sim: Simulator, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    async with managed_processes(tmp_path) as procs:
        await scenario(procs, tmp_path, sim)


async def scenario(procs: Processes, tmp: Path, sim: Simulator) -> None:
    async with real_stack(procs, tmp, sim) as stack:
        # 1. v1: workflow "old" killed with step 2 in flight.
        await stack.killed_in_step_2("old", REVIEW)

        # 2. v2, the new prompt behind a patch: "old" is relaunched and keeps v1's prompt.
        await stack.team.deploy("v2")
        first_pass = await stack.sweep()
        [relaunch] = await stack.relaunches("old")
        relaunch = await stack.completed(relaunch.id)
        assert relaunch.flow_version == "v2"
        assert relaunch.parameters == {"workflow_id": "old"}
        record = await stack.workflow("old")
        assert record.state == WorkflowState.FINISHED and record.epoch == 2
        assert record.flow_run_id == str(relaunch.id)
        assert dict(record.patches) == {"short-review": False}
        assert sent(sim, "old") == {(1, READ): 1, (2, REVIEW): 1, (3, SUM): 1}
        await stack.logs(first_pass.id, "Relaunched workflow old")

        # ... and a new workflow on v2 takes v2's prompt; it is killed in step 2 too.
        new = await stack.killed_in_step_2("new", SHORT)
        assert new.flow_version == "v2"
        as_crashed = rows(stack.db, "new")
        assert as_crashed, "the store holds the crashed workflow"

        # 3. v3 edits the patched prompt in place, with no patch: the relaunch is refused.
        await stack.team.deploy("v3")
        await stack.sweep()
        [refused] = await stack.relaunches("new")
        refused = await stack.ended(refused.id)
        assert refused.flow_version == "v3"
        assert refused.state is not None and refused.state.type == StateType.FAILED
        assert "PromptChanged" in (refused.state.message or ""), refused.state
        assert REFUSED in refused.tags
        assert rows(stack.db, "new") == as_crashed  # epoch, state, runs: as they were
        assert sent(sim, "new") == {(1, READ): 1, (2, SHORT): 1}

        # The next pass on the same code: not marked failed, not relaunched again.
        second_pass = await stack.sweep()
        assert [r.id for r in await stack.relaunches("new")] == [refused.id]
        assert rows(stack.db, "new") == as_crashed
        assert (await stack.workflow("new")).state == WorkflowState.RUNNING
        [said] = await stack.logs(second_pass.id, "not relaunched on this code again")
        # Its step 2 was in flight, not finished: the pass says what the code did.
        assert "another prompt of a step the workflow had already sent" in said, said

        # The code it ran, deployed again: the next pass relaunches it and it finishes.
        await stack.team.deploy("v2")
        await stack.sweep()
        carried, again = await stack.relaunches("new")
        assert carried.id == refused.id
        again = await stack.completed(again.id)
        assert again.flow_version == "v2"
        record = await stack.workflow("new")
        assert record.state == WorkflowState.FINISHED and record.epoch == 2
        assert record.flow_run_id == str(again.id)
        assert dict(record.patches) == {"short-review": True}
        assert sent(sim, "new") == {(1, READ): 1, (2, SHORT): 1, (3, SUM): 1}
        assert sent(sim, "old") == {(1, READ): 1, (2, REVIEW): 1, (3, SUM): 1}
