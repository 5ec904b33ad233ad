"""Hand-made stories for the checks' own tests: writes, requests and runs at chosen times.

Times are seconds after :data:`T0`; one workflow (:data:`WF`) with one chat
(:data:`CHAT`); runs A and B on hosts w2 and w3, each with one socket.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prefect.client.schemas.objects import FlowRun, State

from .coder_requests import Request
from .config import Timings
from .evidence import Evidence
from .play import Played
from .storelog import Write
from .truth import ChatTruth, Message, Truth
from .witness import Witness

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


def flow_run(
    run_id: str, name: str, state: State, made: float | None = None, tags: Sequence[str] = ()
) -> FlowRun:
    """A flow run in ``state``; ``made``: when it was created (and started a second later)."""
    times = {} if made is None else {"created": at(made), "start_time": at(made + 1)}
    return FlowRun(
        id=uuid.UUID(run_id), name=name, flow_id=uuid.uuid4(), state=state, tags=list(tags), **times
    )


def stored_state(seconds: float, epoch: int, src: str, state: str) -> Write:
    """The workflow's record written ``state`` (fenced at ``epoch``)."""
    params: dict[int, str | None] = {
        1: "tenant",
        2: WF,
        3: str(epoch),
        4: json.dumps({"state": state}),
    }
    return Write(at(seconds), at(seconds), src, "workflows", params)


def prompt(seconds: float, text: str, number: int = 1) -> Message:
    """A user message of :data:`CHAT`, committed by the server then."""
    return Message(number, CHAT, "user", ({"type": "text", "text": text},), at(seconds))


def story_evidence(
    played: Played,
    chat: ChatTruth,
    requests: list[Request],
    writes: list[Write],
    runs: list[FlowRun],
    witness: Witness,
) -> Evidence:
    """The evidence of a one-workflow story, :data:`CHAT` its one chat; nothing else."""
    return Evidence(
        played=played,
        timings=Timings(),
        tenant="tenant",
        truth=Truth({chat.id: chat}, (), (), ()),
        requests=requests,
        writes=writes,
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
        token_found=[],
        door=None,
    )
