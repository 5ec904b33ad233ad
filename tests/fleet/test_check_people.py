"""The people's check (and the fencing check beside it), on hand-made stories.

A cancel: run A holds epoch 1 on w2; a person cancels it at t=8s; the sweep takes
epoch 2 for A itself at t=10s and stores the workflow cancelled at t=12s; the
person's resume, run B, takes epoch 3 at t=30s. A changed prompt: run C, refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from prefect.client.schemas.objects import FlowRun, State, StateType

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.records import WorkflowRecord, WorkflowState
from prefect_coder.tasks.lost_runs import replaces_tag
from tests.lab.steps import Step

from .check_fencing import check_fencing
from .check_outcomes import check_finished
from .check_people import check_people
from .check_recovery import check_recovery
from .coder_requests import Request
from .evidence import Evidence
from .faults import FaultRecord
from .people import PersonRecord
from .plan import CHANGED, Fault, FleetSchedule, FleetWorkflow, Moment, Person
from .play import Played
from .storelog import Write
from .stories import (
    CHAT,
    RUN_A,
    RUN_B,
    SRC_A,
    SRC_B,
    T0,
    WF,
    at,
    begin_run,
    flow_run,
    prompt,
    send,
    stored_state,
    story_evidence,
)
from .truth import ChatTruth, Message
from .witness import Sighting, Witness

RUN_C, SRC_C, SWEEP = str(uuid.uuid4()), "10.231.0.43:50001", "10.231.0.43:50002"
CANCELLED = State(type=StateType.CANCELLED, name="Cancelled", message="Cancelled by a person")
REFUSED = State(
    type=StateType.FAILED,
    name="Failed",
    message="Flow run encountered an exception: PromptChanged: step 1 of workflow 'wf'",
)
WHEN = Moment("step", 0.0, WF, 1)
DONE = State(type=StateType.COMPLETED)


def cancelled_by_a_person() -> PersonRecord:
    record = PersonRecord(WF, Person("cancel-resume", WHEN), done=True, run_id=RUN_A)
    record.acted_at, record.cancelled_seen, record.resumed_run = at(8), at(13), RUN_B
    return record


def changed_prompt() -> PersonRecord:
    return PersonRecord(WF, Person("changed-prompt", WHEN, "w3"), done=True, run_id=RUN_C)


def story(
    people: list[PersonRecord],
    writes: list[Write],
    prompts: Sequence[Message] = (),
    requests: Sequence[Request] = (),
    state_of_a: State = CANCELLED,
    state_of_c: State = REFUSED,
    faults: Sequence[FaultRecord] = (),
    relaunches: Sequence[FlowRun] = (),
    silenced: Sequence[str] = (),
) -> Evidence:
    workflow = FleetWorkflow(WF, (Step("plain", "plan it"), Step("plain", "do it")))
    schedule = FleetSchedule(0, 0, (workflow,), ())
    chat = ChatTruth(CHAT, "waiting", True, {LABEL_WORKFLOW: WF}, T0, tuple(prompts))
    witness = Witness([])
    for src, run, host in ((SRC_A, RUN_A, "w2"), (SRC_B, RUN_B, "w3"), (SRC_C, RUN_C, "w3")):
        ip, _, port = src.rpartition(":")
        seen = Sighting(run, host, at(0).timestamp(), at(60).timestamp())
        witness.sockets[(ip, int(port))] = [seen]
    runs = [
        flow_run(RUN_A, "wf · epoch 1", state_of_a, made=0),
        flow_run(RUN_C, "crafty-otter", state_of_c, made=1),
        flow_run(RUN_B, "wf · resumed", State(type=StateType.COMPLETED), made=29),
        *relaunches,
    ]
    played = Played(schedule, T0, people=people, faults=list(faults), silenced=list(silenced))
    return story_evidence(played, chat, list(requests), writes, runs, witness)


def cancel_writes(*more: Write) -> list[Write]:
    return sorted(
        [
            begin_run(0, RUN_A, SRC_A),
            begin_run(10, RUN_A, SWEEP),  # the sweep takes the epoch for the cancelled run
            stored_state(12, 2, SWEEP, "cancelled"),
            begin_run(30, RUN_B, SRC_B),
            *more,
        ],
        key=lambda w: w.committed,
    )


def test_a_cancel_then_a_resume_as_meant_passes_both_checks() -> None:
    ev = story(
        [cancelled_by_a_person()], cancel_writes(), [prompt(5, "plan it"), prompt(31, "do it", 2)]
    )
    assert check_people(ev).violations == []
    assert check_fencing(ev).violations == []


def test_a_prompt_landing_between_the_cancel_and_the_resume_is_caught() -> None:
    ev = story(
        [cancelled_by_a_person()], cancel_writes(), [prompt(5, "plan it"), prompt(20, "do it", 2)]
    )
    [violation] = check_people(ev).violations
    assert violation.category == "people's actions"
    assert "8.0s after the workflow was stored cancelled" in violation.detail


def test_a_relaunch_after_the_cancel_is_caught() -> None:
    """Run C, made at t=1s, before the cancel, is no relaunch; made at t=15s, it is."""
    relaunch = begin_run(20, RUN_C, SRC_C)
    [violation] = check_people(story([cancelled_by_a_person()], cancel_writes(relaunch))).violations
    assert "epoch 3 was taken after the cancel by run crafty-otter" in violation.detail
    ev = story([cancelled_by_a_person()], cancel_writes())
    assert check_people(ev).violations == []
    ev.runs[WF][1] = flow_run(RUN_C, "crafty-otter", REFUSED, made=15)
    [made] = check_people(ev).violations
    assert "run crafty-otter of it was made after the cancel, before the resume" in made.detail


def test_a_relaunch_of_the_resume_carries_the_resume_out() -> None:
    """Fleet 25/7: the resume's run lost the store before it began the workflow; the
    sweep launched it again (tagged as its replacement), and that run took the epoch.
    It is the person's resume, carried out; any other run taking it is still caught."""
    lost = State(type=StateType.CRASHED, name="Crashed", message="Lost the durable store")
    writes = sorted(
        [
            begin_run(0, RUN_A, SRC_A),
            begin_run(10, RUN_A, SWEEP),
            stored_state(12, 2, SWEEP, "cancelled"),
            begin_run(40, RUN_C, SRC_C),
        ],
        key=lambda w: w.committed,
    )
    ev = story([cancelled_by_a_person()], writes)
    ev.runs[WF][1] = flow_run(RUN_C, "wf · resumed (relaunched)", DONE, 35, [replaces_tag(RUN_B)])
    ev.runs[WF][2] = flow_run(RUN_B, "wf · resumed", lost, made=29)
    assert check_people(ev).violations == []
    ev.runs[WF][1] = flow_run(RUN_C, "wf · resumed (relaunched)", DONE, 35, [replaces_tag(RUN_A)])
    [violation] = check_people(ev).violations
    assert "epoch 3 was taken after the cancel by run wf · resumed (relaunched)" in violation.detail


def test_a_cancelled_run_that_completed_and_an_unarchived_chat_are_caught() -> None:
    record = cancelled_by_a_person()
    record.live_at_cancel = [f"{CHAT} [running]"]
    completed = State(type=StateType.COMPLETED)
    found = check_people(story([record], cancel_writes(), state_of_a=completed)).of(
        "people's actions"
    )
    assert len(found) == 2, found
    assert "ended COMPLETED" in found[0] and "left unarchived by the cancel" in found[1]


def test_a_fault_before_the_resume_is_no_slow_recovery() -> None:
    """A host killed under the cancelled run: the workflow waits for the person, and its
    'successor' (the sweep's epoch for the same run, then the resume) is not judged."""
    kill = FaultRecord(Fault("kill-host", Moment("time", 5.0), "w2"), "w2", at(9).timestamp())
    kill.runs, kill.ended = [RUN_A], at(40).timestamp()
    ev = story([cancelled_by_a_person()], cancel_writes(), faults=[kill])
    findings = check_recovery(ev)
    assert findings.violations == [] and findings.recoveries == []
    assert any("not judged: a person cancelled" in f for f in findings.figures)
    alone = story([], cancel_writes(), faults=[kill])
    assert check_recovery(alone).recoveries or check_recovery(alone).violations


def test_a_refused_changed_prompt_that_took_nothing_passes() -> None:
    ev = story([changed_prompt()], [begin_run(0, RUN_A, SRC_A)], [prompt(5, "plan it")])
    assert check_people(ev).violations == []


def test_a_changed_prompt_run_that_acted_is_caught_each_way() -> None:
    writes = [begin_run(0, RUN_A, SRC_A), begin_run(20, RUN_C, SRC_C)]
    prompts = [prompt(5, "plan it"), prompt(21, CHANGED + "plan it", 2)]
    completed = State(type=StateType.COMPLETED)
    ev = story([changed_prompt()], writes, prompts, [send(21, RUN_C, SRC_C)], state_of_c=completed)
    found = check_people(ev).of("people's actions")
    assert any("ended COMPLETED" in f for f in found), found
    assert any("took epoch 2" in f for f in found), found
    assert any("wrote" in f for f in found), found
    assert any("reached Coder" in f for f in found), found
    assert any("reworded prompt landed" in f for f in found), found


def test_a_changed_prompt_run_lost_with_its_host_is_judged_by_its_relaunch() -> None:
    """Fleet campaign 28/4: the person's run landed on a host cut off before it began, so
    the sweep marked it lost and launched it again, reworded prompt and all. The relaunch
    must be refused and act in nothing; it stands for the person's run."""
    lost = State(
        type=StateType.CRASHED,
        name="Crashed",
        message="Lost before it began its workflow (it never left Pending); relaunched.",
    )
    again, tags = str(uuid.uuid4()), [replaces_tag(RUN_C)]
    refused = flow_run(again, "wf · already finished", REFUSED, made=40, tags=tags)
    writes = [begin_run(0, RUN_A, SRC_A)]
    ev = story(
        [changed_prompt()], writes, [prompt(5, "plan it")], state_of_c=lost, relaunches=[refused]
    )
    assert check_people(ev).violations == []
    ran = flow_run(again, "wf · epoch 2", DONE, made=40, tags=tags)
    writes.append(begin_run(41, again, "10.231.0.41:50009"))
    ev = story(
        [changed_prompt()], writes, [prompt(5, "plan it")], state_of_c=lost, relaunches=[ran]
    )
    found = check_people(ev).of("people's actions")
    assert any("ended COMPLETED" in f for f in found), found
    assert any("took epoch 2" in f for f in found), found


def test_a_changed_prompt_run_the_lab_killed_is_not_judged_but_told() -> None:
    """ci seed 16: the person's run was slow to begin, so the sweep relaunched it; the
    relaunch was still starting when the quiet phase ran out, and the lab killed it. Its
    Crashed end is the lab's doing: a figure, not the product's violation."""
    killed = State(type=StateType.CRASHED, name="Crashed", message="Process exited with -9.")
    again, tags = str(uuid.uuid4()), [replaces_tag(RUN_C)]
    relaunch = flow_run(again, "wf · replaying (relaunched)", killed, made=40, tags=tags)
    writes = [begin_run(0, RUN_A, SRC_A)]
    judged = story([changed_prompt()], writes, [prompt(5, "plan it")], relaunches=[relaunch])
    assert any("ended CRASHED" in f for f in check_people(judged).of("people's actions"))
    told = story(
        [changed_prompt()], writes, [prompt(5, "plan it")], relaunches=[relaunch], silenced=[again]
    )
    findings = check_people(told)
    assert findings.violations == []
    assert any("the lab killed it" in f for f in findings.figures), findings.figures


def test_a_run_cancelled_as_its_workflow_finished_is_the_workflows_end() -> None:
    """Fleet campaign 33/5: the person cancelled the run 2 s after the workflow's last step
    began; the workflow finished and the cancel then stopped the run, which ended
    Cancelled, as asked. The workflow is finished; a run cancelled otherwise is not its end."""
    record = cancelled_by_a_person()
    record.cancelled_seen, record.resumed_run, record.finished_first = None, "", True
    ev = story([record], [begin_run(0, RUN_A, SRC_A)])
    ev.runs[WF] = [flow_run(RUN_A, "wf · epoch 1", CANCELLED, made=0)]
    ev.workflows[WF] = WorkflowRecord(
        tenant="tenant", workflow_id=WF, state=WorkflowState.FINISHED, flow_run_id=RUN_A
    )
    assert check_finished(ev).violations == []
    record.finished_first = False
    assert check_finished(ev).of("unfinished workflows"), "a cancelled run taken for the end"
