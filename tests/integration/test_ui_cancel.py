"""A person cancels a running workflow from the Prefect UI, in a real headless Chromium.

The same real processes as tests/integration/test_ui.py: ``prefect server start`` (its
database a private PostgreSQL), ``prefect deploy`` from deployments/prefect.yaml into a
``process`` pool, a process worker (its embedded store a file of the test's own) and
``prefect-coder simulator``; a CoderCredentials block saved through the API.

1. A durable-chat run is launched through the API with two prompts; the first makes the
   simulator's model take minutes, so step 1 stays running.
2. Once its chat is running on the simulator and the run is Running, the browser opens
   the run's page and cancels it as a person does: the header's "Cancel" button, then
   "Confirm" in the "Cancel Flow Run" modal. The worker stops the run's process and the
   run ends Cancelled; the store still holds the workflow running.
3. The shipped ``orphan-sweep`` deployment runs, as its schedule would run it: it ends the
   workflow (one cancelled, nothing relaunched), and says so in the cancelled run's log,
   which the browser reads on the run's page.
4. The store holds the workflow ``cancelled``, its chat is archived on the simulator, step
   2 was never sent, durable-chat has no run but the cancelled one; a second sweep changes
   nothing.

Screenshots (test-output/cancel-*.png): the running run, the confirm modal, the run
Cancelled, its log after the sweep, and the sweep run's artifact.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterName,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import Artifact, FlowRun, StateType

from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import WorkflowRecord, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from tests.fleet.truth import ChatTruth, Truth, read_truth
from tests.integration.browser import (
    browser_lab,
    open_page,
    screenshot,
)
from tests.integration.procs import NEEDS_PROC, Proc, Processes, until
from tests.integration.ui_stack import ui_stack
from tests.integration.ui_support import (
    STARTUP_TIMEOUT,
    UI_TIMEOUT_MS,
    Clock,
)
from tests.names import run_name

BLOCK = "ui-cancel-simulator"
#: Long enough that step 1 is still running whenever the cancel comes, on a loaded machine.
FIRST = "Read it all /sleep 120"
SECOND = "Now write the report"
SWEEP_TIMEOUT = 180.0

pytestmark = [pytest.mark.timeout(480), NEEDS_PROC]


async def test_cancel_a_running_workflow_from_the_ui(tmp_path: Path) -> None:
    # Not "ui-": test_ui.py clears ui-*.png when it starts, maybe while this test runs.
    async with browser_lab(tmp_path, "cancel-") as lab:
        await scenario(lab.procs, tmp_path, lab.browser_path, lab.database)


async def scenario(procs: Processes, tmp: Path, browser_path: Path, database: str) -> None:
    # The worker's flow runs (durable-chat's and the sweep's) share the embedded store:
    # this file, which the test reads afterwards.
    ledger = tmp / "ledger.sqlite3"
    settings = {"PREFECT_CODER_SQLITE_PATH": str(ledger)}
    async with ui_stack(procs, tmp, browser_path, database, BLOCK, settings) as deployed:
        page = await open_page(deployed.browser, height=1600, timeout_ms=UI_TIMEOUT_MS)
        credentials = {"$ref": {"block_document_id": str(deployed.block_id)}}
        client, ui, coder = deployed.client, deployed.server.url, deployed.coder
        watch, clock = deployed.watch, deployed.clock
        stack = Stack(client, page, ui, coder, ledger, credentials, watch, clock)
        try:
            await drive(stack)
        except BaseException:
            await screenshot(page, "cancel-failure")
            raise


@dataclass
class Stack:
    """What the scenario drives: the API, the browser's page, the simulator, the store."""

    client: PrefectClient
    page: Page
    ui: str
    coder: dict[str, str]
    ledger: Path
    credentials: dict[str, Any]
    watch: list[Proc]
    clock: Clock

    async def truth(self) -> Truth:
        return await read_truth(self.coder["CODER_URL"], self.coder["CODER_SESSION_TOKEN"])

    async def chats_of(self, workflow_id: str) -> list[ChatTruth]:
        return (await self.truth()).workflow_chats(workflow_id)

    async def workflow(self, workflow_id: str) -> WorkflowRecord | None:
        store = SqliteStore(self.ledger)
        try:
            return await store.get_workflow(self.coder["CODER_ORG_ID"], workflow_id)
        finally:
            await store.close()

    async def durable_chat_runs(self) -> list[FlowRun]:
        return await self.client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["durable-chat"]))
        )

    async def ended(self, run_id: uuid.UUID, what: str, timeout: float) -> FlowRun:
        async def final() -> FlowRun | None:
            run = await self.client.read_flow_run(run_id)
            return run if run.state is not None and run.state.is_final() else None

        return await until(final, what, timeout, self.watch, interval=0.5)

    async def logs(self, run_id: uuid.UUID) -> list[str]:
        logs = await self.client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200
        )
        return [log.message for log in logs]


def sent(chats: list[ChatTruth], marker: str) -> int:
    """User messages carrying ``marker`` (a step's marker) in any of ``chats``."""
    return sum(1 for c in chats for m in c.messages if m.role == "user" and marker in m.text())


async def drive(stack: Stack) -> None:
    workflow_id = f"ui-cancel-{uuid.uuid4().hex[:8]}"
    launched, chat = await launch_a_long_turn(stack, workflow_id)
    await cancel_in_the_ui(stack, launched, workflow_id)
    await sweep_the_cancel(stack, launched, chat, workflow_id)
    await sweep_again_changes_nothing(stack, launched, workflow_id)


async def launch_a_long_turn(stack: Stack, workflow_id: str) -> tuple[FlowRun, ChatTruth]:
    """1. The launch (through the API): step 1 takes minutes on the simulator; then
    2. its chat is running step 1, and the run is Running."""
    client = stack.client
    deployment = await client.read_deployment_by_name("durable-chat/durable-chat")
    launched = await client.create_flow_run_from_deployment(
        deployment.id,
        parameters={
            "workflow_id": workflow_id,
            "prompts": [FIRST, SECOND],
            "credentials": stack.credentials,
        },
    )

    async def mid_turn() -> ChatTruth | None:
        run = await client.read_flow_run(launched.id)
        assert run.state is None or not run.state.is_final(), run.state
        chats = await stack.chats_of(workflow_id)
        if run.state is None or run.state.type != StateType.RUNNING or len(chats) != 1:
            return None
        chat = chats[0]
        if chat.status != "running" or sent(chats, step_marker(workflow_id, 1)) != 1:
            return None
        return chat

    chat = await until(mid_turn, "step 1 to be running", STARTUP_TIMEOUT, stack.watch)
    stack.clock.mark("step 1 running")
    return launched, chat


async def cancel_in_the_ui(stack: Stack, launched: FlowRun, workflow_id: str) -> None:
    """3. The person's cancel, on the run's page: "Cancel", then "Confirm" in the modal;
    4. the worker stops the run's process (SIGTERM, then SIGKILL); the run ends Cancelled."""
    page, ui = stack.page, stack.ui
    await page.goto(f"{ui}/runs/flow-run/{launched.id}", timeout=UI_TIMEOUT_MS)
    name = run_name(workflow_id, 1)
    await expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await expect(page.get_by_text("Running", exact=True).first).to_be_visible()
    first_run = page.get_by_text(f"Workflow {workflow_id}: this is its first run (epoch 1).")
    await expect(first_run.first).to_be_visible(timeout=UI_TIMEOUT_MS)  # the logs are in
    await screenshot(page, "cancel-1-running")
    await page.get_by_role("button", name="Cancel", exact=True).click()
    modal = page.get_by_role("dialog")
    await expect(modal.get_by_text("Cancel Flow Run")).to_be_visible()
    await screenshot(page, "cancel-2-confirm")
    await modal.get_by_role("button", name="Confirm").click()
    await expect(modal).to_be_hidden()
    cancelled = await stack.ended(launched.id, "the run to end Cancelled", 120)
    assert cancelled.state is not None and cancelled.state.type == StateType.CANCELLED, (
        cancelled.state
    )
    stack.clock.mark("run cancelled")
    await page.reload()
    await expect(page.get_by_text("Cancelled", exact=True).first).to_be_visible(
        timeout=UI_TIMEOUT_MS
    )
    await expect(first_run.first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await screenshot(page, "cancel-3-cancelled")
    # The stopped process did not end the workflow: the store still says running, and the
    # sweep is what tells the cancel from a crash, by the run's state in Prefect.
    record = await stack.workflow(workflow_id)
    assert record is not None and record.state == WorkflowState.RUNNING, record
    assert record.flow_run_id == str(launched.id)


async def sweep_the_cancel(
    stack: Stack, launched: FlowRun, chat: ChatTruth, workflow_id: str
) -> None:
    """5. The shipped sweep, as its schedule runs it: ends the workflow, relaunches nothing;
    6. what a person finds: the workflow ended for good, its chat archived, step 2 never
    sent, no other run of durable-chat, and the cancelled run's log saying why."""
    first = await sweep(stack)
    assert first["end"] == [workflow_id], first
    assert first["relaunch"] == [], first
    assert first["summary"].endswith("0 stranded workflow(s), 1 cancelled by a person."), first
    stack.clock.mark("swept")
    record = await stack.workflow(workflow_id)
    assert record is not None and record.state == WorkflowState.CANCELLED, record
    truth = await stack.truth()
    chats = truth.workflow_chats(workflow_id)
    assert [c.id for c in chats] == [chat.id]
    assert chats[0].archived and chats[0].status != "running", chats[0]
    # The running turn was stopped (by the dying run or by the sweep, whichever came first).
    assert {i.chat_id for i in truth.interrupts} == {chat.id}, truth.interrupts
    assert sent(chats, step_marker(workflow_id, 1)) == 1
    assert sent(chats, step_marker(workflow_id, 2)) == 0
    assert [r.id for r in await stack.durable_chat_runs()] == [launched.id]

    async def noted() -> list[str] | None:
        return [line for line in await stack.logs(launched.id) if "is cancelled" in line] or None

    said = await until(noted, "the note on the cancelled run", 60, stack.watch)
    assert said and said[0].startswith(f"Workflow {workflow_id} is cancelled: "), said
    assert "archived" in said[0], said
    await read_the_note(stack, first["run"], workflow_id)


async def read_the_note(stack: Stack, sweep_run: str, workflow_id: str) -> None:
    """The note on the cancelled run's page and the sweep's own run, under Artifacts."""
    page = stack.page
    await page.reload()
    note = page.get_by_text(f"Workflow {workflow_id} is cancelled:")
    await expect(note.first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await note.first.scroll_into_view_if_needed()
    await screenshot(page, "cancel-4-log")

    # ... and the sweep's own run, under Artifacts: the workflow it ended, and why.
    await page.goto(f"{stack.ui}/runs/flow-run/{sweep_run}", timeout=UI_TIMEOUT_MS)
    await page.locator("li.p-tab", has_text="Artifacts").click()
    await page.get_by_role("link", name=re.compile(r"^table orphan-sweep-durable-chat")).click()
    await expect(page.get_by_text("cancelled by a person").first).to_be_visible(
        timeout=UI_TIMEOUT_MS
    )
    await screenshot(page, "cancel-5-sweep")


async def sweep_again_changes_nothing(stack: Stack, launched: FlowRun, workflow_id: str) -> None:
    """7. However often the sweep comes round, nothing changes."""
    again = await sweep(stack)
    assert again["end"] == [] and again["relaunch"] == [], again
    assert again["summary"].endswith("0 stranded workflow(s)."), again
    record = await stack.workflow(workflow_id)
    assert record is not None and record.state == WorkflowState.CANCELLED, record
    assert [r.id for r in await stack.durable_chat_runs()] == [launched.id]
    chats = await stack.chats_of(workflow_id)
    assert sent(chats, step_marker(workflow_id, 2)) == 0
    stack.clock.mark("swept again")


async def sweep(stack: Stack) -> dict[str, Any]:
    """One run of the orphan-sweep deployment, with the saved credentials (the worker has
    no CODER_* settings): the workflows its table artifact ends and relaunches, and the
    summary line of its log."""
    client = stack.client
    deployment = await client.read_deployment_by_name("orphan-sweep/orphan-sweep")
    run = await client.create_flow_run_from_deployment(
        deployment.id,
        parameters={"target_deployment": "durable-chat", "credentials": stack.credentials},
    )
    done = await stack.ended(run.id, "the sweep to end", SWEEP_TIMEOUT)
    assert done.state is not None and done.state.type == StateType.COMPLETED, done.state

    async def published() -> list[Artifact] | None:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
        return found or None

    # Like its logs, the run's artifact may show up a moment after its final state.
    [artifact] = await until(published, "the sweep's artifact", 60, stack.watch)
    data = artifact.data
    rows: list[dict[str, str]] = json.loads(data) if isinstance(data, str) else data  # type: ignore[assignment]

    def acted(action: str) -> list[str]:
        return [r["workflow_id"] for r in rows if r["action"] == action]

    async def summarised() -> list[str] | None:
        return [line for line in await stack.logs(run.id) if line.startswith("Sweep of ")] or None

    # Logs reach the server in batches.
    [summary] = await until(summarised, "the sweep's summary in its log", 60, stack.watch)
    return {
        "run": run.id,
        "end": acted("end"),
        "relaunch": acted("relaunch"),
        "summary": summary,
        "rows": rows,
    }
