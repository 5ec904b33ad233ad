"""The fencing check, on a hand-made story: a run cut off, replaced, and come back.

Run A holds epoch 1 on w2 and is cut off; run B takes epoch 2 on w3 at t=10s. The
check must blame A for anything it sends to Coder or commits to the store after
t=10s (and nothing before), whatever B does, and must want A marked superseded.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from prefect.client.schemas.objects import FlowRun, State, StateType

from coder_chat.durable.markers import LABEL_WORKFLOW
from tests.campaign.plan import Step

from .check_fencing import check_fencing
from .coder_requests import Request
from .config import Timings
from .evidence import Evidence
from .plan import FleetSchedule, FleetWorkflow
from .play import Played
from .storelog import Write
from .truth import ChatTruth, Truth
from .witness import Sighting, Witness

T0 = datetime(2026, 6, 1, 10, 0, 0, tzinfo=UTC)
WF, CHAT = "wf-fenced", "4b1f9e0e-0000-4000-8000-000000000001"
RUN_A, RUN_B = str(uuid.uuid4()), str(uuid.uuid4())
SRC_A, SRC_B = "10.231.0.42:40000", "10.231.0.43:50000"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def begin_run(seconds: float, run: str, src: str) -> Write:
    """``begin_run``'s one statement (it takes the next epoch), for ``run``."""
    body, fields = json.dumps({"epoch": 1, "flow_run_id": run}), json.dumps({"flow_run_id": run})
    params: dict[int, str | None] = {1: "tenant", 2: WF, 3: "1", 4: "running", 7: body, 8: fields}
    return Write(at(seconds), at(seconds), src, "workflows", params, takes_epoch=True)


def fenced_write(seconds: float, epoch: int, src: str, table: str = "workflows") -> Write:
    """A write fenced at ``epoch`` (``$3``), as every write of the store is."""
    params: dict[int, str | None] = {1: "tenant", 2: WF, 3: str(epoch), 4: '{"heartbeat_at": 1}'}
    return Write(at(seconds), at(seconds), src, table, params)


def send(seconds: float, run: str, src: str) -> Request:
    path = f"/api/v2/chats/{CHAT}/messages"
    return Request(at(seconds), src, "POST", path, run, src.split(":")[0])


def flow_run(run_id: str, name: str, state: State) -> FlowRun:
    return FlowRun(id=uuid.UUID(run_id), name=name, flow_id=uuid.uuid4(), state=state)


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
    return Evidence(
        played=Played(schedule, T0),
        timings=Timings(),
        tenant="tenant",
        truth=Truth({CHAT: chat}, (), (), ()),
        requests=requests,
        writes=[begin_run(0, RUN_A, SRC_A), begin_run(10, RUN_B, SRC_B), *writes],
        runs={WF: runs},
        sweeps=[],
        workflows={WF: None},
        steps={WF: []},
        ledger={},
        applied={},
        receipts={},
        witness=witness,
        logs={},
        submitted={},
    )


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
