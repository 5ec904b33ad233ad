"""The fencing check, on a hand-made story: a run cut off, replaced, and come back.

Run A holds epoch 1 on w2 and is cut off; run B takes epoch 2 on w3 at t=10s. The
check must blame A for anything it sends to Coder or commits to the store after
t=10s (and nothing before), whatever B does, and must want A marked superseded.
"""

from __future__ import annotations

from prefect.client.schemas.objects import State, StateType

from coder_chat.durable.markers import LABEL_WORKFLOW
from tests.lab.steps import Step

from .check_fencing import check_fencing
from .coder_requests import Request
from .evidence import Evidence
from .plan import FleetSchedule, FleetWorkflow
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
    fenced_write,
    flow_run,
    send,
    story_evidence,
)
from .truth import ChatTruth
from .witness import Sighting, Witness


def evidence(requests: list[Request], writes: list[Write], state_of_a: State) -> Evidence:
    schedule = FleetSchedule(0, 0, (FleetWorkflow(WF, (Step("plain", "plan it"),)),), ())
    chat = ChatTruth(CHAT, "waiting", True, {LABEL_WORKFLOW: WF}, T0, ())
    witness = Witness([])
    witness.sockets[("10.231.0.42", 40000)] = [
        Sighting(RUN_A, "w2", at(0).timestamp(), at(30).timestamp())
    ]
    witness.sockets[("10.231.0.43", 50000)] = [
        Sighting(RUN_B, "w3", at(9).timestamp(), at(30).timestamp())
    ]
    runs = [
        flow_run(RUN_A, "wf · epoch 1", state_of_a),
        flow_run(RUN_B, "wf · epoch 2", State(type=StateType.COMPLETED)),
    ]
    writes = [begin_run(0, RUN_A, SRC_A), begin_run(10, RUN_B, SRC_B), *writes]
    return story_evidence(Played(schedule, T0), chat, requests, writes, runs, witness)


SUPERSEDED = State(
    type=StateType.CANCELLED,
    name="Superseded",
    message=f"Superseded by run 'wf · epoch 2' ({RUN_B}): its process stopped without finishing.",
)


def test_a_quiet_superseded_run_passes() -> None:
    ev = evidence([send(5, RUN_A, SRC_A), send(12, RUN_B, SRC_B)], [], SUPERSEDED)
    assert check_fencing(ev).violations == []


def test_a_send_after_the_successor_took_the_epoch_is_blamed_on_the_old_run() -> None:
    ev = evidence([send(12, RUN_A, SRC_A)], [], SUPERSEDED)
    [violation] = check_fencing(ev).violations
    assert violation.category == "fenced run reached Coder"
    assert "send" in violation.detail and "2.0s after epoch 2" in violation.detail


def test_a_late_write_fenced_at_the_old_epoch_wrote_nothing_and_an_unfenced_one_is_caught() -> None:
    stale = fenced_write(11, 1, SRC_A)  # the old run's heartbeat: its fence matches nothing
    unfenced = Write(at(12), at(12), SRC_A, "steps", {1: "tenant", 2: WF})
    findings = check_fencing(evidence([], [stale, unfenced], SUPERSEDED))
    [found] = findings.of("fenced run wrote")
    assert "from its connection" in found and findings.fenced_out == 1
    assert check_fencing(evidence([], [stale], SUPERSEDED)).violations == []


def test_a_superseded_run_that_ends_failed_is_reported() -> None:
    failed = State(
        type=StateType.FAILED, name="Failed", message="FencedOut: epoch 1 was superseded"
    )
    [violation] = check_fencing(evidence([], [], failed)).violations
    assert violation.category == "superseded run's state"
    assert "FAILED/Failed" in violation.detail
