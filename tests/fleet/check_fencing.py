"""A superseded run acts no more, and says that it was superseded (DESIGN.md, contract 12).

For each workflow, the store's log says when each epoch was taken and by which
flow run (:func:`~.storelog.epochs`). Once epoch k+1 is taken, the run that held
epoch k:

- **reaches Coder with nothing**: no action (create, send, submit, interrupt,
  archive) from its sockets lands after that moment. A send the journal showed
  in flight when its host was hit, landing late, is the one open window and is
  counted apart. An action on the workflow's chats from that run's host that no
  glimpse of a socket attributed is listed, not judged;
- **writes nothing**: no write of its connections on the workflow's rows or
  chats commits after that moment with any effect. Every write of the store is one
  statement fenced at the epoch it was made for (``$3``): one made for an older
  epoch matches nothing, and is counted as fenced out, not as a write;
- **ends superseded**: its flow run ends Cancelled, named ``Superseded``, with a
  message naming the run that replaced it.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from prefect.client.schemas.objects import FlowRun, StateType

from .coder_requests import Request
from .evidence import Evidence
from .journal import InFlight
from .storelog import EpochTaken, Write, ended, epochs, fenced_epoch
from .verdicts import Findings

#: A workflow's states that end it: a run that wrote one had ended it, not been superseded
#: (a cancelled workflow is carried on by a person's resume).
ENDED = ("finished", "failed", "cancelled")
#: How long after its request a late send's message may be committed (delays, replays).
LANDING = timedelta(seconds=10)


def check_fencing(ev: Evidence) -> Findings:
    findings = Findings()
    for wf in ev.workflow_ids:
        chats = {c.id for c in ev.truth.workflow_chats(wf)}
        for old, new in itertools.pairwise(epochs(ev.writes, wf)):
            if not old.flow_run_id:
                continue
            findings.merge(_actions(ev, wf, chats, old, new))
            findings.merge(_writes(ev, wf, chats, old, new))
            findings.merge(_final_state(ev, wf, old, new))
    return findings


def _actions(ev: Evidence, wf: str, chats: set[str], old: EpochTaken, new: EpochTaken) -> Findings:
    findings = Findings()
    host, run = ev.host_of(old.flow_run_id), old.flow_run_id
    in_flight = [f for r in ev.played.faults for f in r.in_flight if f.workflow_id == wf]
    for request in ev.requests:
        if request.at <= new.at or request.action is None:
            continue
        ours = request.chat_id in chats or request.action == "create"
        if request.flow_run_id == run and ours:
            if _late_send(ev, request, in_flight):
                findings.late += 1
                continue
            findings.add(
                "fenced run reached Coder",
                f"{wf}: run {ev.run_name(run)} (epoch {old.epoch}, on {host}) {request.action} "
                f"{request.describe()}, {_after(request.at, new)}",
            )
        elif not request.flow_run_id and request.host == host and request.chat_id in chats:
            findings.unattributed.append(f"{wf}: {request.describe()}, {_after(request.at, new)}")
    return findings


def _late_send(ev: Evidence, request: Request, in_flight: list[InFlight]) -> bool:
    """Whether the request is a send the journal showed in flight, landing late."""
    if request.action != "send":
        return False
    chat = ev.truth.chats.get(request.chat_id or "")
    if chat is None:
        return False
    landed = [
        m
        for m in chat.messages
        if m.role == "user" and request.at <= m.created_at <= request.at + LANDING
    ]
    return any(f.chat_id == chat.id and f.marker in m.text() for f in in_flight for m in landed[:1])


def _writes(ev: Evidence, wf: str, chats: set[str], old: EpochTaken, new: EpochTaken) -> Findings:
    findings = Findings()
    for write in ev.writes:
        if write.committed <= new.at or not _concerns(write, wf, chats):
            continue
        epoch = fenced_epoch(write)
        if epoch is not None and epoch < new.epoch:
            # Fenced at an older epoch: the statement matched nothing (the row is at the
            # new one), so it wrote nothing; the store's conformance tests hold it to that.
            findings.fenced_out += 1
            continue
        sighting = ev.witness.who(write.src, write.committed.timestamp())
        if sighting is not None and sighting.flow_run_id == old.flow_run_id:
            why = "from its connection"
            findings.add(
                "fenced run wrote",
                f"{wf}: run {ev.run_name(old.flow_run_id)} (epoch {old.epoch}) wrote "
                f"{write.describe()} {why}, {_after(write.committed, new)}",
            )
    return findings


def _concerns(write: Write, wf: str, chats: set[str]) -> bool:
    return write.params.get(2) == wf or any(write.params.get(2) == c for c in chats)


def _final_state(ev: Evidence, wf: str, old: EpochTaken, new: EpochTaken) -> Findings:
    findings = Findings()
    run = next((r for r in ev.runs[wf] if str(r.id) == old.flow_run_id), None)
    if new.flow_run_id == old.flow_run_id:
        # The sweep took the epoch to end the workflow for a person who cancelled that
        # run: it is no successor (check_people judges how the cancelled run ended).
        findings.figures.append(
            f"{wf}: epoch {new.epoch} was taken at {new.at:%H:%M:%S.%f} for run "
            f"{ev.run_name(old.flow_run_id)} itself (a person cancelled it)"
        )
        return findings
    end = ended(ev.writes, wf, ENDED)
    if end is not None and end.epoch == old.epoch and end.at < new.at:
        # It had ended the workflow before the next epoch was taken: not superseded.
        findings.figures.append(
            f"{wf}: epoch {new.epoch} was taken at {new.at:%H:%M:%S.%f}, after run "
            f"{ev.run_name(old.flow_run_id)} had ended the workflow {end.state} at "
            f"{end.at:%H:%M:%S.%f} ({_carried_on(end.state)})"
        )
        return findings
    if run is None:
        return findings
    successor = ev.run_name(new.flow_run_id)
    if not _superseded_by(run, successor, new.flow_run_id):
        state = run.state
        said = (
            f"{state.type.value}/{state.name}: {(state.message or '')[:200]}"
            if state
            else "no state"
        )
        findings.add(
            "superseded run's state",
            f"{wf}: run {run.name} (epoch {old.epoch}, on {ev.host_of(old.flow_run_id)}) ended "
            f"{said}; its successor {successor} took epoch {new.epoch} at {new.at:%H:%M:%S.%f}",
        )
    return findings


def _carried_on(state: str) -> str:
    return "a person's resume" if state == "cancelled" else "a relaunch of an ended workflow"


def _superseded_by(run: FlowRun, name: str, run_id: str) -> bool:
    state = run.state
    if state is None or state.type != StateType.CANCELLED or state.name != "Superseded":
        return False
    return name in (state.message or "") or run_id in (state.message or "")


def _after(moment: datetime, new: EpochTaken) -> str:
    seconds = (moment - new.at).total_seconds()
    return f"{seconds:.1f}s after epoch {new.epoch} was taken by {new.flow_run_id[:8]}"
