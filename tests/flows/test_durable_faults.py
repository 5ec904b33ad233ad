"""Faults during a durable workflow end with the right result and no duplicate effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder_chat import CoderApiError
from coder_chat.simulator import Simulator
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.settings import TaskSettings, WorkflowSettings

from .example_tools import CHARGES

#: Settings of a workflow that keeps its chat (a later run adds steps to it).
KEEP_CHAT = WorkflowSettings(archive_at_end=False)

pytestmark = pytest.mark.usefixtures("prefect_api")

CHARGE = 'charge it /deltas 40 /tool charge_card {"amount_cents": 250}'
TOOLS = ["tests.flows.example_tools:charge_card"]


@pytest.fixture(autouse=True)
def no_charges() -> None:
    CHARGES.clear()


def user_messages(sim: Simulator, chat_id: str, marker: str) -> int:
    return sum(1 for m in sim.messages(chat_id) if m.role == "user" and marker in m.text())


async def test_stream_drops_mid_delta_and_mid_pause(sim: Simulator, coder_env: Path) -> None:
    sim.config.delta_interval = 0.002
    sim.faults.drop_streams(after_events=6, times=4)
    results = await durable_chat(workflow_id="wf-drops", prompts=["warm up", CHARGE], tools=TOOLS)
    chat_id = results[1].chat_id
    final = [m for m in sim.messages(chat_id) if m.role == "assistant"][-1]
    assert results[1].text == final.text()  # no lost and no duplicated text
    assert list(CHARGES.values()) == [1]
    assert user_messages(sim, chat_id, "[wf-drops/step-2]") == 1


async def test_a_lost_action_required_is_recovered(sim: Simulator, coder_env: Path) -> None:
    sim.faults.withhold_action_required(times=1)
    results = await durable_chat(workflow_id="wf-lost-action", prompts=[CHARGE], tools=TOOLS)
    assert "charge_card returned" in results[0].text
    assert list(CHARGES.values()) == [1]


async def test_5xx_and_429_bursts_on_reads_and_on_the_send(sim: Simulator, coder_env: Path) -> None:
    sim.faults.fail_next("get_messages", 503, count=2)
    sim.faults.fail_next("list_chats", 429, count=1)
    results = await durable_chat(
        workflow_id="wf-bursts", prompts=["first", CHARGE], tools=TOOLS, settings=KEEP_CHAT
    )
    chat_id = results[0].chat_id
    # The send itself fails once: the task retries; recovery sees it never landed.
    sim.faults.fail_next("send_message", 503, count=1)
    more = await durable_chat(
        workflow_id="wf-bursts", prompts=["first", CHARGE, "third"], tools=TOOLS
    )
    assert [r.verdict for r in more[:2]] == ["stored", "stored"]  # nothing ran again
    assert more[2].text == 'You said: "[wf-bursts/step-3] third"'
    assert user_messages(sim, chat_id, "[wf-bursts/step-3]") == 1
    assert list(CHARGES.values()) == [1]


async def test_a_segment_timeout_is_retried_after_settling(sim: Simulator, coder_env: Path) -> None:
    first = await durable_chat(workflow_id="wf-timeout", prompts=["warm up"], settings=KEEP_CHAT)
    # The stream cannot be opened for a while: the segment's clock runs out while
    # the client backs off (redials never reset it), and the task is retried.
    sim.faults.fail_next("stream", 503, count=3)
    results = await durable_chat(
        workflow_id="wf-timeout",
        prompts=["warm up", "second"],
        settings=WorkflowSettings(request_timeout_seconds=1.5, step_deadline_seconds=30),
    )
    chat_id = first[0].chat_id
    # The timed-out attempt finished server-side: the interrupt its timeout sent found
    # nothing running, so it was not cut short, and the retry takes its answer.
    assert results[1].verdict == "recovered"
    assert user_messages(sim, chat_id, "[wf-timeout/step-2]") == 1
    assert results[1].text == 'You said: "[wf-timeout/step-2] second"'


async def test_a_workflows_task_settings_decide_how_often_its_turns_are_retried(
    sim: Simulator, coder_env: Path
) -> None:
    # Coder refuses the send that makes the chat twice. One retry is not enough: the
    # workflow fails with Coder's error (the defaults, three retries, would ride it out).
    sim.faults.fail_next("create_chat", 503, count=2)
    once = WorkflowSettings(tasks=TaskSettings(retries=1, retry_delay_seconds=[0.0]))
    with pytest.raises(CoderApiError, match="503"):
        await durable_chat(workflow_id="wf-one-retry", prompts=["first"], settings=once)
    # Two retries are: the turn lands once.
    sim.faults.fail_next("create_chat", 503, count=2)
    twice = WorkflowSettings(tasks=TaskSettings(retries=2, retry_delay_seconds=[0.0]))
    results = await durable_chat(workflow_id="wf-two-retries", prompts=["first"], settings=twice)
    assert results[0].text == 'You said: "[wf-two-retries/step-1] first"'
    assert user_messages(sim, results[0].chat_id, "[wf-two-retries/step-1]") == 1


def test_task_settings_give_one_delay_per_retry() -> None:
    assert TaskSettings().delays() == [1.0, 5.0, 15.0]
    assert TaskSettings(retries=4, retry_delay_seconds=[2.0]).delays() == [2.0] * 4
    assert TaskSettings(retries=0).task_options() == {"retries": 0, "retry_delay_seconds": []}
