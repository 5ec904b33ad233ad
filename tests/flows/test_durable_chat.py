"""The durable_chat flow on Prefect's test API, against the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.settings import get_current_settings

from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder.blocks import SqliteLedger
from prefect_coder.flows.archive_workflow import archive_workflow
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.settings import WorkflowSettings

from .example_tools import CHARGES

#: Settings of a workflow that keeps its chat (a later run adds steps to it).
KEEP_CHAT = WorkflowSettings(archive_at_end=False)

pytestmark = pytest.mark.usefixtures("prefect_api")


async def test_three_steps_with_a_durable_tool_and_structured_output(
    sim: Simulator, coder_env: Path
) -> None:
    CHARGES.clear()
    results = await durable_chat(
        workflow_id="wf-flow-1",
        prompts=[
            "plan the refund",
            'charge it /tool charge_card {"amount_cents": 1299}',
            '/json {"verdict": "done", "score": 0.9}',
        ],
        tools=["tests.flows.example_tools:charge_card"],
        output_schemas=["", "", "tests.flows.example_tools:Verdict"],
        settings=WorkflowSettings(heartbeat_seconds=0.2),
    )
    assert [r.verdict for r in results] == ["ran", "ran", "ran"]
    # The workflow's first run, each step's first try: no orphan search and no history
    # read; the transcript artifact is built from the steps' own answers.
    routes = [r.route for r in sim.records.requests]
    assert (routes.count("list_chats"), routes.count("get_messages")) == (0, 0), routes
    assert results[0].text == 'You said: "[wf-flow-1/step-1] plan the refund"'
    assert "charged 1299" in results[1].text
    assert results[2].output == {"verdict": "done", "score": 0.9}
    assert list(CHARGES.values()) == [1]
    chat = sim.chat(results[0].chat_id)
    assert chat.archived  # archived once, at the end
    store = SqliteStore(coder_env)
    record = await store.get_workflow(str(sim.organization_id), "wf-flow-1")
    await store.close()
    assert record is not None and record.state == "finished" and record.chat_id == chat.id.__str__()
    async with get_client() as client:
        artifact = await client.read_latest_artifacts()
    markdown = [a for a in artifact if a.key == "transcript-wf-flow-1"]
    assert markdown, artifact
    table = str(markdown[0].data)
    assert "| 2 | ran | charge it /tool charge_card" in table, table


async def test_a_rerun_of_the_same_workflow_skips_finished_steps(
    sim: Simulator, coder_env: Path
) -> None:
    prompts = ["first", "second"]
    first = await durable_chat(workflow_id="wf-flow-2", prompts=prompts, settings=KEEP_CHAT)
    messages = len(sim.messages(first[0].chat_id))
    again = await durable_chat(workflow_id="wf-flow-2", prompts=prompts, settings=KEEP_CHAT)
    assert [r.text for r in again] == [r.text for r in first]
    assert [r.verdict for r in again] == ["stored", "stored"]  # no task ran: the store answered
    assert len(sim.messages(first[0].chat_id)) == messages  # nothing was sent again


async def test_plain_tools_need_the_explicit_flag(sim: Simulator, coder_env: Path) -> None:
    with pytest.raises(Exception, match="not a durable tool"):
        await durable_chat(
            workflow_id="wf-flow-3",
            prompts=["x"],
            tools=["tests.flows.example_tools:plain_lookup"],
        )
    results = await durable_chat(
        workflow_id="wf-flow-4",
        prompts=['find /tool plain_lookup {"query": "q"}'],
        tools=["tests.flows.example_tools:plain_lookup"],
        settings=WorkflowSettings(allow_plain_tools=True),
    )
    assert "found q" in results[0].text


async def test_archive_workflow_archives_once(sim: Simulator, coder_env: Path) -> None:
    results = await durable_chat(workflow_id="wf-flow-5", prompts=["hi"], settings=KEEP_CHAT)
    assert not sim.chat(results[0].chat_id).archived
    assert await archive_workflow(workflow_id="wf-flow-5") is True
    assert sim.chat(results[0].chat_id).archived
    assert await archive_workflow(workflow_id="wf-flow-5") is True  # already archived is done
    assert await archive_workflow(workflow_id="wf-never-ran") is False
    async with get_client() as client:  # runs named after what they archive, for people
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["archive wf-flow-5"]))
        )
    assert len(runs) == 2


@pytest.mark.parametrize("steps", [1, 4])
async def test_a_workflow_of_n_steps_makes_at_most_2n_plus_1_requests(
    sim: Simulator, coder_env: Path, steps: int
) -> None:
    """Each turn is its send and its stream; beyond the turns, the archive at the end is
    one request (the last turn knows the chat is idle), and nothing else is asked."""
    prompts = [f"step {n}" for n in range(1, steps + 1)]
    results = await durable_chat(workflow_id=f"wf-cost-{steps}", prompts=prompts)
    assert [r.verdict for r in results] == ["ran"] * steps
    routes = [r.route for r in sim.records.requests]
    assert len(routes) <= 2 * steps + 1, routes
    assert routes.count("update_chat") == 1 and sim.chat(results[0].chat_id).archived
    assert routes.count("create_chat") + routes.count("send_message") == steps
    assert routes.count("stream") == steps


async def test_a_step_result_is_one_flat_file_found_again_by_its_key(
    sim: Simulator, coder_env: Path, tmp_path: Path
) -> None:
    """Each step's result is one file named by its key, whatever the workflow id holds
    (no directory per workflow and step, nothing outside the result storage); a run of
    the same workflow on another ledger finds it there, and sends nothing."""
    storage = Path(get_current_settings().results.local_storage_path)
    before = stored_results(storage)
    workflow_id = "team/x/../y"
    first = await durable_chat(workflow_id=workflow_id, prompts=["one", "two"])
    made = {
        name: is_file for name, is_file in stored_results(storage).items() if name not in before
    }
    names = sorted(made)
    assert len(names) == 2 and all(made.values()), made
    assert all(n.startswith("prefect-coder-team-x----y-step-") for n in names), names
    requests = len(sim.records.requests)
    other = SqliteLedger(path=str(tmp_path / "other-ledger.db"))
    again = await durable_chat(workflow_id=workflow_id, prompts=["one", "two"], ledger=other)
    assert [r.verdict for r in again] == ["cached", "cached"]
    assert [r.text for r in again] == [r.text for r in first]
    sent = [r.route for r in sim.records.requests[requests:]]
    assert "send_message" not in sent and "create_chat" not in sent, sent


def stored_results(storage: Path) -> dict[str, bool]:
    """What the result storage holds at its top: each name, and whether it is a file."""
    return {p.name: p.is_file() for p in storage.iterdir()} if storage.exists() else {}
