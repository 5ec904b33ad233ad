"""What a person reads in the Prefect UI while a workflow runs, in a real headless Chromium:
a long turn's task-run log telling what the agent does as it does it, and the progress
artifact of a run paused for a person.

Real processes: ``prefect server start`` (with its UI, its database a private PostgreSQL),
``prefect-coder simulator``, and a runner serving the README's ``refund_order`` (each flow
run a subprocess of its own, as a worker runs it), the fake payments service in this
process. The simulator is scripted as an agent at work: planning the refund, it looks the
order up and reads the customer's mail (server-side tools), thinks for a while, then
answers with a plan above the approval limit.

1. While the plan's turn is still running, the browser opens its task run's page: the log
   shows the prompt sent and each tool call with its result.
2. Once the turn is over, the same page shows its end: the reply and the turn's time.
3. The run pauses for a person's approval; its Artifacts tab shows the progress artifact
   naming the finished step and what the run waits for, and the Resume form describes
   the ``approved`` toggle.
4. Approved through the API, the run goes on and refunds once.

Screenshots (test-output/story-*.png) of each page, for a person to look at.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from playwright.async_api import Page, expect
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, StateType, TaskRun
from prefect.flow_runs import aresume_flow_run
from prefect.settings import PREFECT_API_URL

from prefect_coder.payments import Ledger, serve_payments
from tests.integration.browser import (
    browser_lab,
    chromium,
    open_page,
    screenshot,
)
from tests.integration.procs import (
    NEEDS_PROC,
    Proc,
    Processes,
    until,
    wait_for_line,
)
from tests.integration.stack import home_env, start_server, start_simulator
from tests.integration.ui_support import ROOT, STARTUP_TIMEOUT, UI_TIMEOUT_MS
from tests.prefect_test_api import api_settings

SERVE = "from prefect_coder.examples.refund import refund_order; refund_order.serve(name='refunds')"
ORDER = "42"
WORKFLOW = f"refund-{ORDER}"
PLAN = {"amount_cents": 30_000, "reason": "broken on arrival"}
#: How long the agent "thinks" after its tools ran: the page is read in that time.
THINKING = 45
RUN_TIMEOUT = 240.0

pytestmark = [pytest.mark.timeout(480), NEEDS_PROC]


async def test_a_long_turn_and_a_paused_run_read_in_the_ui(tmp_path: Path) -> None:
    async with browser_lab(tmp_path, "story-") as lab, serve_payments() as (url, ledger):
        await scenario(lab.procs, tmp_path, lab.browser_path, lab.database, url, ledger)


async def scenario(
    procs: Processes, tmp: Path, browser_path: Path, database: str, payments: str, ledger: Ledger
) -> None:
    env = home_env(tmp)
    server = await start_server(procs, tmp, env, database, ui=True)
    simulator, coder = await start_simulator(procs, env, tmp, STARTUP_TIMEOUT)
    await script_the_agent(coder)
    await server.healthy(STARTUP_TIMEOUT)
    api, ui = server.api, server.url
    runner_env = {
        **env,
        **coder,
        "PREFECT_API_URL": api,
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_CODER_SQLITE_PATH": str(tmp / "ledger.sqlite3"),
        "PAYMENTS_URL": payments,
    }
    runner = await procs.start("runner", sys.executable, "-c", SERVE, env=runner_env, cwd=ROOT)
    await wait_for_line(runner, "refunds", STARTUP_TIMEOUT)
    watch = [server.proc, simulator, runner]
    async with (
        api_settings({PREFECT_API_URL: api}),
        get_client() as client,
        chromium(browser_path) as browser,
    ):
        page = await open_page(browser, height=1400, timeout_ms=UI_TIMEOUT_MS)
        run = await launch(client)
        await read_the_turn(page, client, ui, run, watch)
        await read_the_pause(page, client, ui, run, watch)
        await aresume_flow_run(run.id, run_input={"approved": True})
        done = await run_state(client, run.id, StateType.COMPLETED, watch)
    assert done.name == f"{WORKFLOW} · epoch 1"
    assert list(ledger.applied.values()) == [1]


async def script_the_agent(coder: dict[str, str]) -> None:
    """Planning the refund, the agent looks things up, thinks, then plans above the limit."""
    tools = (
        f'/server-tool lookup_order {{"order_id": "{ORDER}"}} '
        '/server-tool read_mail {"customer": "Ada", "about": "the broken lamp"}'
    )
    plan = f"{tools} /sleep {THINKING} /json {json.dumps(PLAN)}"
    refund = json.dumps({"order_id": ORDER, "amount_cents": PLAN["amount_cents"]})
    scripts = [
        {"when": f"Order {ORDER}: ", "then": plan},
        {"when": f"for order {ORDER} with issue_refund", "then": f"/tool issue_refund {refund}"},
    ]
    async with httpx.AsyncClient(
        base_url=coder["CODER_URL"], headers={"Coder-Session-Token": coder["CODER_SESSION_TOKEN"]}
    ) as admin:
        for script in scripts:
            (await admin.post("/simulator/v1/scripts", json=script)).raise_for_status()


async def launch(client: PrefectClient) -> FlowRun:
    deployment = await client.read_deployment_by_name("refund-order/refunds")
    return await client.create_flow_run_from_deployment(
        deployment.id, parameters={"order_id": ORDER, "complaint": "The lamp came broken"}
    )


async def read_the_turn(
    page: Page, client: PrefectClient, ui: str, run: FlowRun, watch: list[Proc]
) -> None:
    """The plan's task run, read while it runs, then once it is over."""

    async def running_turn() -> TaskRun | None:
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
        found = [t for t in tasks if t.name == f"{WORKFLOW} · step 1"]
        return found[0] if found and found[0].state_type == StateType.RUNNING else None

    turn = await until(running_turn, "step 1's task run to run", RUN_TIMEOUT, watch, 0.5)

    async def open_it() -> None:
        await page.goto(f"{ui}/runs/task-run/{turn.id}", timeout=UI_TIMEOUT_MS)

    await open_it()
    lines = [
        f"Step 1: sent the prompt \"Order {ORDER}: the customer wrote 'The lamp came broken'.",
        f"Step 1: the agent calls lookup_order(order_id: {ORDER}).",
        "Step 1: lookup_order returned:",
        "Step 1: the agent calls read_mail(customer: Ada, about: the broken lamp).",
        "Step 1: read_mail returned:",
    ]
    await until_shown(page, lines, watch, open_it)
    # ... all of it while the turn still runs: the agent is thinking still.
    current = await client.read_task_run(turn.id)
    assert current.state_type == StateType.RUNNING, current.state
    await screenshot(page, "story-turn-running")

    async def over() -> TaskRun | None:
        current = await client.read_task_run(turn.id)
        return current if current.state is not None and current.state.is_final() else None

    ended = await until(over, "step 1's task run to end", RUN_TIMEOUT, watch, 0.5)
    assert ended.state_type == StateType.COMPLETED, ended.state
    reply = ["Step 1: ran (sent once and answered) in ", "lookup_order ran on the server."]
    await until_shown(page, reply, watch, open_it)
    await screenshot(page, "story-turn-over")


async def read_the_pause(
    page: Page, client: PrefectClient, ui: str, run: FlowRun, watch: list[Proc]
) -> None:
    """The run waits for a person: its progress artifact says for what, after which steps."""
    paused = await run_state(client, run.id, StateType.PAUSED, watch)
    assert paused.state is not None and paused.state.name == "Paused"

    async def open_artifacts() -> None:
        await page.goto(f"{ui}/runs/flow-run/{run.id}", timeout=UI_TIMEOUT_MS)
        await page.locator("li.p-tab", has_text="Artifacts").click()
        await page.get_by_text(f"progress-{WORKFLOW}", exact=True).first.click()

    await open_artifacts()
    await until_shown(
        page,
        [
            "step 1 done.",
            "Waiting for a person's answer: Approval, input 1.",
            "step 1: ran",
        ],
        watch,
        open_artifacts,
    )
    await screenshot(page, "story-paused-progress")
    await page.goto(f"{ui}/runs/flow-run/{run.id}", timeout=UI_TIMEOUT_MS)
    # The Resume form: its toggle says what on and off mean.
    await page.get_by_role("button", name="Resume", exact=True).click()
    modal = page.get_by_role("dialog")
    await expect(modal.get_by_text("Turn on to approve the refund").first).to_be_visible()
    await screenshot(page, "story-resume-form")
    await page.keyboard.press("Escape")


async def until_shown(
    page: Page, texts: list[str], watch: list[Proc], reopen: Callable[[], Awaitable[None]]
) -> None:
    """Every one of ``texts`` on the page; opened again meanwhile (logs arrive in batches)."""

    async def shown() -> bool:
        for text in texts:
            try:
                await expect(page.get_by_text(text).first).to_be_visible(timeout=3_000)
            except AssertionError:
                await reopen()
                return False
        return True

    try:
        await until(shown, f"the page to show {texts}", RUN_TIMEOUT, watch, 1.0)
    except AssertionError:
        await screenshot(page, "story-failed")
        raise AssertionError(f"not shown: {texts}\n{await page.inner_text('body')}") from None


async def run_state(
    client: PrefectClient, run_id: UUID, state: StateType, watch: list[Proc]
) -> FlowRun:
    async def reached() -> FlowRun | None:
        run = await client.read_flow_run(run_id)
        assert run.state_type not in (StateType.FAILED, StateType.CRASHED), run.state
        return run if run.state_type == state else None

    return await until(reached, f"the run to be {state.value}", RUN_TIMEOUT, watch, 0.5)
