"""What a person reads in Prefect after a durable_chat run: a few plain log lines, the
transport at DEBUG, a named run with a progress artifact, a superseded run that says
so, and a sweep artifact even when the sweep had nothing to do."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.states import Running

from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.durable_chats import WorkflowSpec, durable_chats
from prefect_coder.flows.orphan_sweep import orphan_sweep
from prefect_coder.settings import WorkflowSettings
from tests.lab.truth import committed_usage, workflow_chats
from tests.names import replay_name, run_name

from .example_tools import CHARGES
from .support import run_logs

pytestmark = pytest.mark.usefixtures("prefect_api")

TOOLS = ["tests.flows.example_tools:charge_card"]
PROMPTS = [
    "plan the refund",
    'charge it /tool charge_card {"amount_cents": 700}',
    "write the receipt",
]
#: Our own lines, as opposed to the ones Prefect's engine writes for every run.
OWN = re.compile(r"^prefect\.(flow|task)_runs\.coder$")
#: Where a turn's story is told (to the run's log in Prefect, not to the console).
STORY = "prefect.task_runs.coder.story"


def verdict_line(said: str) -> str:
    """A step's last line: Prefect's own, its Completed state carrying the verdict."""
    return f"Finished in state Completed('{said}')"


@pytest.fixture
def debug_lines() -> Iterator[None]:
    """Let our DEBUG lines reach the API, as a person debugging a run would."""
    logger = logging.getLogger("prefect.task_runs.coder")
    before = logger.level
    logger.setLevel(logging.DEBUG)
    yield
    logger.setLevel(before)


@pytest.mark.usefixtures("debug_lines")
async def test_a_three_step_run_reads_in_a_few_plain_lines(sim: Simulator, coder_env: Path) -> None:
    CHARGES.clear()
    state = await durable_chat(
        workflow_id="wf-reads", prompts=PROMPTS, tools=TOOLS, return_state=True
    )
    assert state.is_completed()
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    async with get_client() as client:
        logs = await run_logs(client, run_id)
        flow_run = await client.read_flow_run(run_id)
        artifacts = await client.read_latest_artifacts()
    info = [g.message for g in logs if g.level == logging.INFO]
    own_info = [g.message for g in logs if OWN.match(g.name) and g.level == logging.INFO]
    assert 2 <= len(own_info) <= 12, own_info
    for line in own_info:  # sentences, not key=value dumps or internal labels
        assert line[0].isupper() and line.rstrip().endswith((".", ")")), line
        assert not re.search(r"\w+=\S", line), line
    for step in (1, 2, 3):  # one line a step says what became of it: Prefect's last
        said = verdict_line(f"Step {step} of 3: ran (sent once and answered) in ")
        assert sum(line.startswith(said[:-2]) for line in info) == 1, info
    assert not any(": ran (" in line for line in own_info), own_info  # not said twice
    transport = [g.message for g in logs if g.level == logging.DEBUG and "http:" in g.message]
    assert transport and all("duration=" not in m for m in transport)
    assert any("duration_ms=" in m for m in transport), transport
    assert not any("http:" in line for line in own_info)

    assert flow_run.name == run_name("wf-reads", 1)
    [progress] = [a for a in artifacts if a.key == "progress-wf-reads"]
    assert progress.type == "progress" and progress.data == 100.0
    assert "step 3 of 3 done" in (progress.description or "")
    assert "- step 2: ran" in (progress.description or "")


async def test_a_run_that_takes_over_marks_the_one_it_replaces_superseded(
    sim: Simulator, coder_env: Path
) -> None:
    """A run that stopped without finishing (here: a flow run left Running, its workflow
    begun in the store) is superseded, with a message naming the run that took over."""
    async with get_client() as client:
        dead = await client.create_flow_run(durable_chat, name="dead-run", state=Running())
        store = SqliteStore(coder_env)
        await store.begin_run(str(sim.organization_id), "wf-takeover", flow_run_id=str(dead.id))
        await store.close()
        state = await durable_chat(
            workflow_id="wf-takeover",
            prompts=["hello"],
            settings=WorkflowSettings(archive_at_end=False),
            return_state=True,
        )
        assert state.is_completed()
        new_id = state.state_details.flow_run_id
        assert new_id is not None
        replaced = await client.read_flow_run(dead.id)
        new = await client.read_flow_run(new_id)
        dead_logs = [g.message for g in await run_logs(client, dead.id)]
        new_logs = [g.message for g in await run_logs(client, new_id)]
        artifacts = await client.read_latest_artifacts()
    assert new.name == run_name("wf-takeover", 2)
    assert replaced.state is not None and replaced.state.type == StateType.CANCELLED
    assert replaced.state.name == "Superseded"
    assert run_name("wf-takeover", 2) in (replaced.state.message or "")
    assert any("superseded by run" in m and str(new_id) in m for m in dead_logs), dead_logs
    assert any("replaces run 'dead-run'" in m for m in new_logs), new_logs
    [progress] = [a for a in artifacts if a.key == "progress-wf-takeover"]
    assert "Took over from run 'dead-run'" in (progress.description or "")


async def test_a_finished_run_is_never_marked_superseded(sim: Simulator, coder_env: Path) -> None:
    first = await durable_chat(workflow_id="wf-again", prompts=["hello"], return_state=True)
    again = await durable_chat(workflow_id="wf-again", prompts=["hello"], return_state=True)
    async with get_client() as client:
        run_1 = await client.read_flow_run(first.state_details.flow_run_id)  # type: ignore[arg-type]
        run_2 = await client.read_flow_run(again.state_details.flow_run_id)  # type: ignore[arg-type]
    assert run_1.state is not None and run_1.state.type == StateType.COMPLETED
    # The second run replays a finished workflow: it takes no epoch, and says so.
    assert (run_1.name, run_2.name) == (run_name("wf-again", 1), replay_name("wf-again"))


async def test_the_sweep_publishes_an_artifact_when_it_finds_nothing(
    sim: Simulator, coder_env: Path
) -> None:
    summary = await orphan_sweep(target_deployment="quiet")
    assert summary == {"chats": 0, "acted": 0, "stranded": 0, "relaunched": 0, "cancelled": 0}
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    [table] = [a for a in artifacts if a.key == "orphan-sweep-quiet"]
    assert "nothing to do" in str(table.data)


async def test_a_run_of_many_workflows_names_them_in_its_name_and_every_line(
    sim: Simulator, coder_env: Path
) -> None:
    specs = [WorkflowSpec(workflow_id=f"many-{i}", prompts=["plan it", "do it"]) for i in range(3)]
    first = await durable_chats(workflows=specs, return_state=True)
    again = await durable_chats(
        workflows=[WorkflowSpec(workflow_id="many-3", prompts=["hi"])], return_state=True
    )
    assert first.is_completed() and again.is_completed()
    run_id, again_id = first.state_details.flow_run_id, again.state_details.flow_run_id
    assert run_id is not None and again_id is not None
    async with get_client() as client:
        logs = await run_logs(client, run_id)
        flow_run = await client.read_flow_run(run_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id, again_id])
            )
        )
    assert flow_run.name == "3 workflows: many-0, many-1, many-2"
    info = [g.message for g in logs if g.level == logging.INFO]
    steps = [line for line in info if ": ran (" in line]
    assert len(steps) == 6 and len(set(steps)) == 6, info  # one line a step, none alike
    for i in range(3):
        for step in (1, 2):
            said = verdict_line(f"many-{i}, step {step} of 2: ran (sent once and answered)")
            assert sum(line.startswith(said[:-2]) for line in steps) == 1, steps
    # Each run keeps its own progress artifact, where each workflow's end is one line.
    progress = {a.flow_run_id: a for a in artifacts if a.type == "progress"}
    assert set(progress) == {run_id, again_id}, progress
    assert progress[run_id].key != progress[again_id].key
    results = await first.aresult()
    ended = (progress[run_id].description or "").splitlines()
    for i in range(3):
        chat = results[f"many-{i}"][-1].chat_id
        used = committed_usage([sim.chat(chat)]).describe()  # both steps, as Coder reported
        said = f"- many-{i}: 2 step(s), 2 ran; it used {used}; its chat {chat} is archived"
        assert said in ended, ended
    fleet = committed_usage(sim.chat(results[f"many-{i}"][-1].chat_id) for i in range(3))
    assert ended[-1] == f"In all, the workflows used {fleet.describe()}.", ended
    assert not [line for line in info if "is finished" in line], info  # not a line each


async def test_a_name_a_person_gave_the_run_is_replaced_with_a_word(
    sim: Simulator, coder_env: Path
) -> None:
    named = durable_chat.with_options(flow_run_name="refund for Ada")
    state = await named(workflow_id="wf-named", prompts=["hello"], return_state=True)
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    async with get_client() as client:
        flow_run = await client.read_flow_run(run_id)
        lines = [g.message for g in await run_logs(client, run_id)]
    assert flow_run.name == "wf-named · epoch 1"
    assert (
        "This run was named 'refund for Ada'; it is renamed 'wf-named · epoch 1', after its "
        "workflow and epoch, so that its runs are found together."
    ) in lines


async def test_a_sweep_run_is_named_after_its_deployment_and_pass(
    sim: Simulator, coder_env: Path
) -> None:
    state = await orphan_sweep(target_deployment="named", return_state=True)
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    async with get_client() as client:
        flow_run = await client.read_flow_run(run_id)
    assert re.fullmatch(r"sweep named · \d\d:\d\d:\d\d UTC", flow_run.name), flow_run.name


async def test_a_turns_task_run_log_tells_its_story(sim: Simulator, coder_env: Path) -> None:
    """The task run of a turn says, as it happens: the prompt sent, each tool the agent
    calls (on Coder's side or here) and its outcome, and the reply with the turn's time;
    shortened, without the step marker, never a secret."""
    CHARGES.clear()
    prompts = [
        'run the tests /server-tool run_tests {"suite": "unit"}',
        'charge it /tool charge_card {"amount_cents": 700}',
    ]
    state = await durable_chat(
        workflow_id="wf-story", prompts=prompts, tools=TOOLS, return_state=True
    )
    assert state.is_completed()
    async with get_client() as client:
        logs = await run_logs(client, state.state_details.flow_run_id)  # type: ignore[arg-type]
    told = [g.message for g in logs if g.name == STORY]
    step_1 = [line for line in told if line.startswith("Step 1 of 2: ")]
    step_2 = [line for line in told if line.startswith("Step 2 of 2: ")]
    assert step_1[0].startswith("Step 1 of 2: sent the prompt 'run the tests /server-tool")
    assert "the agent calls run_tests(suite: unit)." in step_1[1]
    assert step_1[2].startswith('Step 1 of 2: run_tests returned: \'{"ok":true')
    assert "charge_card(amount_cents: 700); running it here." in step_2[1]
    assert step_2[2].startswith("Step 2 of 2: charge_card returned: 'charged 700")
    assert not any("[wf-story/step-" in line for line in told)  # the marker is left out
    # At its end, the reply: in Prefect's own last line of the task run, with its time.
    ends = [g.message for g in logs if g.message.startswith("Finished in state Completed(")]
    assert re.match(
        r"Finished in state Completed\('Step 1 of 2: ran \(.*\) in \d+\.\d s, "
        r"[\d,]+ tokens \([\d,]+ in, .*; [\d,]+ out\): "
        r'"Calling run_tests\.',
        ends[0],
    ), ends
    assert not any(sim.token in g.message for g in logs)


async def test_a_turns_story_can_be_turned_off_for_fleets(sim: Simulator, coder_env: Path) -> None:
    state = await durable_chat(
        workflow_id="wf-quiet",
        prompts=["hello"],
        settings=WorkflowSettings(tell_turns=False),
        return_state=True,
    )
    async with get_client() as client:
        logs = await run_logs(client, state.state_details.flow_run_id)  # type: ignore[arg-type]
    assert not any(g.name == STORY for g in logs)
    used = committed_usage(workflow_chats(sim, "wf-quiet")).describe()
    said = verdict_line(f"Step 1 of 1: ran (sent once and answered), {used}.")
    assert said in [g.message for g in logs]  # the verdict and its usage, no reply


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_the_console_names_the_run_as_the_ui_does(sim: Simulator, coder_env: Path) -> None:
    """Once a run is named after its workflow, what it writes to the console (its task
    runs' lines included) says that name, not the one Prefect made up at its start."""
    handler = _Records()
    loggers = [logging.getLogger("prefect.task_runs"), logging.getLogger("prefect.flow_runs")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        state = await durable_chat(
            workflow_id="wf-console", prompts=["say hello", "say goodbye"], return_state=True
        )
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert state.is_completed()
    named = run_name("wf-console", 1)
    tasks = [r for r in handler.records if r.name.startswith("prefect.task_runs")]
    assert tasks and {getattr(r, "flow_run_name", None) for r in tasks} == {named}, {
        getattr(r, "flow_run_name", None) for r in tasks
    }
    ours = [r for r in handler.records if r.name == "prefect.flow_runs.coder"]
    last = ours[-1]
    assert getattr(last, "flow_run_name", None) == named, last.getMessage()
