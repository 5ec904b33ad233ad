"""The Prefect UI, in a real headless Chromium: launch durable-chat from its run form, read the run.

Real processes throughout: ``prefect server start`` (with its UI, its database a private
PostgreSQL), ``prefect deploy``
from deployments/prefect.yaml (into a ``process`` pool made as ``prefect work-pool
create`` makes one), a process worker and ``prefect-coder simulator``. A
CoderCredentials block is saved through the API, as a user would save one; then the
browser does what a person does:

1. opens the durable-chat deployment's custom run form, fills in ``workflow_id`` and
   two prompts, and picks the saved block in the credentials picker;
2. submits, and the worker runs the flow against the simulator;
3. opens the run's page and finds the run's name, the step verdicts in its logs with
   what each turn used, the progress artifact, and the transcript artifact with the
   workflow's total;
4. launches durable-chats from its form with two workflows, and reads the run's name
   (its workflows) and the log lines that each name their workflow;
5. opens the saved block's page, where the token shows only as asterisks and the block's
   logo is drawn from the copy a local web server serves (``PREFECT_CODER_LOGO_URL``, as
   a team whose browsers cannot reach the project's home sets it).

Screenshots of the filled form and of the run page (logs, artifacts) are written to
test-output/ at the repository root. Nothing outside loopback is fetched: the browser
aborts any other request.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, expect
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.objects import FlowRun, StateType

from tests.integration.browser import (
    browser_lab,
    open_page,
    screenshot,
)
from tests.integration.procs import (
    NEEDS_PROC,
    Proc,
    Processes,
    clean_env,
    free_port,
    http_ok,
    until,
)
from tests.integration.ui_stack import ui_stack
from tests.names import run_name

from .ui_support import UI_TIMEOUT_MS, Clock

BLOCK = "ui-simulator"
BLOCKS = Path(__file__).resolve().parents[2] / "prefect_coder" / "blocks"
PROMPTS = ["Say hello", "Say goodbye"]

pytestmark = [pytest.mark.timeout(480), NEEDS_PROC]


async def test_launch_durable_chat_from_the_ui_and_read_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with browser_lab(tmp_path, "ui-") as lab:
        logo = await serve_the_logo(lab.procs, tmp_path)
        # Read when the blocks are saved, in this process, before the browser opens them.
        monkeypatch.setenv("PREFECT_CODER_LOGO_URL", logo)
        await scenario(lab.procs, tmp_path, lab.browser_path, lab.database)


async def serve_the_logo(procs: Processes, tmp: Path) -> str:
    """A plain web server on loopback, serving the logo.png the package ships."""
    port = free_port()
    argv = ("-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(BLOCKS))
    proc = await procs.start("logo", sys.executable, *argv, env=clean_env(), cwd=tmp)
    url = f"http://127.0.0.1:{port}/logo.png"

    async def served() -> bool | None:
        return await http_ok(url) or None

    await until(served, "the logo server", 60, [proc])
    return url


async def scenario(procs: Processes, tmp: Path, browser_path: Path, database: str) -> None:
    async with ui_stack(procs, tmp, browser_path, database, BLOCK, {}) as stack:
        page = await open_page(stack.browser, height=2000, timeout_ms=UI_TIMEOUT_MS)
        try:
            await drive(page, stack.client, stack.server.url, stack.watch, stack.clock)
        except BaseException:
            await screenshot(page, "ui-failure")
            raise


def form_property(page: Page, label: str) -> Locator:
    """The run form's input for a parameter, found by its label."""
    title = page.locator(
        ".schema-form-property__label", has_text=re.compile(rf"^{label}( \(Optional\))?$")
    )
    return page.locator(".schema-form-property").filter(has=title).first


async def drive(
    page: Page, client: PrefectClient, ui: str, watch: list[Proc], clock: Clock
) -> None:
    deployment = await client.read_deployment_by_name("durable-chat/durable-chat")
    workflow_id = f"ui-{uuid.uuid4().hex[:8]}"
    await fill_the_form(page, f"{ui}/deployments/deployment/{deployment.id}/run", workflow_id)
    clock.mark("form filled")
    run = await submit_the_form(page, client, workflow_id, watch)
    clock.mark("run completed")
    await read_the_run(page, ui, run, workflow_id)
    clock.mark("run page checked")
    await launch_many(page, client, ui, watch, clock)
    await read_the_block(page, client, ui)


async def fill_the_form(page: Page, form: str, workflow_id: str) -> None:
    """1. The custom run form: workflow_id, one prompt per step, the saved credentials."""
    await page.goto(form, timeout=UI_TIMEOUT_MS)
    await form_property(page, "workflow_id").locator("textarea").fill(workflow_id)
    await fill_prompts(form_property(page, "prompts"))
    await pick_credentials(page)
    await screenshot(page, "ui-run-form")


async def fill_prompts(prompts: Locator) -> None:
    """Fill a form's list of prompts, one "Add item" per prompt, as a person does."""
    for count, prompt in enumerate(PROMPTS, start=1):
        await prompts.get_by_role("button", name="Add item").click()
        await expect(prompts.locator("textarea")).to_have_count(count)
        await prompts.locator("textarea").nth(count - 1).fill(prompt)


async def pick_credentials(page: Page) -> None:
    """Choose the saved credentials block in the run form, as a person does."""
    credentials = form_property(page, "credentials")
    await credentials.get_by_role("button", name="CoderCredentials").click()
    picker = credentials.locator("button.p-select-button__control")
    await expect(picker).to_be_visible(timeout=UI_TIMEOUT_MS)
    await picker.focus()
    await page.keyboard.press("ArrowDown")  # opens the block documents' list
    await page.get_by_role("option", name=BLOCK).click(timeout=UI_TIMEOUT_MS)
    await expect(credentials.locator(".p-select-button__value")).to_have_text(BLOCK)


async def submit_the_form(
    page: Page, client: PrefectClient, workflow_id: str, watch: list[Proc]
) -> FlowRun:
    """2. Launch it; the form's own validation must pass, the run is created and completes."""
    await page.get_by_role("button", name="Submit").click()

    async def created() -> FlowRun | None:
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["durable-chat"]))
        )
        return runs[0] if runs else None

    try:
        run = await until(created, "the run the form launched", 60, watch, interval=0.5)
    except AssertionError:
        await screenshot(page, "ui-run-form-not-submitted")
        errors = await page.locator(".p-label__message--failed").all_inner_texts()
        raise AssertionError(f"the form launched no run; the form says: {errors}") from None
    assert run.parameters["workflow_id"] == workflow_id
    assert run.parameters["prompts"] == PROMPTS
    assert "$ref" in run.parameters["credentials"], run.parameters["credentials"]

    async def ended() -> FlowRun | None:
        current = await client.read_flow_run(run.id)
        state = current.state
        return current if state is not None and state.is_final() else None

    finished = await until(ended, "the run to end", 180, watch, interval=0.5)
    assert finished.state is not None
    assert finished.state.type == StateType.COMPLETED, finished.state
    return run


async def read_the_run(page: Page, ui: str, run: FlowRun, workflow_id: str) -> None:
    """3. The run's page: its name, Completed, each step's verdict in the logs."""
    await page.goto(f"{ui}/runs/flow-run/{run.id}", timeout=UI_TIMEOUT_MS)
    name = run_name(workflow_id, 1)
    await expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await expect(page.get_by_text("Completed", exact=True).first).to_be_visible()
    used = []  # each turn's tokens, as its verdict line says them
    for step in range(1, len(PROMPTS) + 1):
        verdict = page.get_by_text(f"Step {step} of {len(PROMPTS)}: ran")
        await expect(verdict.first).to_be_visible(timeout=UI_TIMEOUT_MS)
        said = await verdict.first.inner_text()
        tokens = re.search(r"answered\) in [\d.]+ s, ([\d,]+) tokens \([\d,]+ in", said)
        assert tokens is not None, said
        used.append(int(tokens.group(1).replace(",", "")))
    await screenshot(page, "ui-run-logs")

    # ... and, under Artifacts, the progress artifact: every step done; and the transcript,
    # with the workflow's total, the sum of its turns'.
    await page.locator("li.p-tab", has_text="Artifacts").click()
    progress = page.get_by_text(f"progress-{workflow_id}", exact=True)
    await expect(progress.first).to_be_visible(timeout=UI_TIMEOUT_MS)
    done = f"step {len(PROMPTS)} of {len(PROMPTS)} done"
    await expect(page.get_by_text(done).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await screenshot(page, "ui-run-artifacts")
    await page.get_by_text(f"transcript-{workflow_id}", exact=True).first.click()
    total = f"Used in all: {sum(used):,} tokens ("
    await expect(page.get_by_text(total).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await screenshot(page, "ui-run-transcript")


async def launch_many(
    page: Page, client: PrefectClient, ui: str, watch: list[Proc], clock: Clock
) -> None:
    """durable-chats from its form: two workflows of two prompts each."""
    deployment = await client.read_deployment_by_name("durable-chats/durable-chats")
    ids = [f"ui-many-{uuid.uuid4().hex[:6]}-{n}" for n in (1, 2)]
    await page.goto(f"{ui}/deployments/deployment/{deployment.id}/run", timeout=UI_TIMEOUT_MS)
    workflows = form_property(page, "workflows")
    for index, workflow_id in enumerate(ids):
        # The list's own "Add item" comes after its items (each has one for its prompts).
        await workflows.get_by_role("button", name="Add item").last.click()
        workflow_field = nested_property(workflows, "Workflow ID", index)
        await workflow_field.locator("textarea").fill(workflow_id)
        await fill_prompts(nested_property(workflows, "Prompts", index))
    await pick_credentials(page)
    await screenshot(page, "ui-many-form")
    await page.get_by_role("button", name="Submit").click()

    async def ended() -> FlowRun | None:
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["durable-chats"]))
        )
        done = [r for r in runs if r.state is not None and r.state.is_final()]
        return done[0] if done else None

    run = await until(ended, "the durable-chats run to end", 180, watch, interval=0.5)
    assert run.state is not None and run.state.type == StateType.COMPLETED, run.state
    clock.mark("durable-chats completed")
    await page.goto(f"{ui}/runs/flow-run/{run.id}", timeout=UI_TIMEOUT_MS)
    name = f"2 workflows: {ids[0]}, {ids[1]}"
    await expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    for workflow_id in ids:
        for step in range(1, len(PROMPTS) + 1):
            line = page.get_by_text(f"{workflow_id}, step {step} of {len(PROMPTS)}: ran")
            await expect(line.first).to_be_visible(timeout=UI_TIMEOUT_MS)
    await screenshot(page, "ui-many-logs")


async def read_the_block(page: Page, client: PrefectClient, ui: str) -> None:
    """The saved credentials' page: the token is not shown, only asterisks."""
    block = await client.read_block_document_by_name(BLOCK, "prefect-coder-credentials")
    secret = await client.read_block_document_by_name(
        BLOCK, "prefect-coder-credentials", include_secrets=True
    )
    token = str(secret.data["token"])
    await page.goto(f"{ui}/blocks/block/{block.id}", timeout=UI_TIMEOUT_MS)
    await expect(page.get_by_text("********").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    assert token not in await page.content()
    logo = page.locator(f'img[src="{os.environ["PREFECT_CODER_LOGO_URL"]}"]').first
    await expect(logo).to_be_visible(timeout=UI_TIMEOUT_MS)
    # Drawn, not a broken image: the browser decoded the picture the server sent.
    drawn = "img => img.complete && img.naturalWidth > 0"
    await page.wait_for_function(drawn, arg=await logo.element_handle(), timeout=UI_TIMEOUT_MS)
    await screenshot(page, "ui-block")


def nested_property(scope: Locator, title: str, index: int) -> Locator:
    """The ``index``-th property titled ``title`` inside ``scope`` (a list of objects): the
    nearest property around that label, not the item that also holds it."""
    label = scope.locator(
        ".schema-form-property__label", has_text=re.compile(rf"^{title}( \(Optional\))?$")
    ).nth(index)
    return label.locator(
        "xpath=ancestor::*[contains(concat(' ', normalize-space(@class), ' '),"
        " ' schema-form-property ')][1]"
    )
