"""The invariants of DESIGN.md, checked against ground truth after a crash and a recovery.

Ground truth is what the peers themselves recorded: the simulator's chats,
messages, interrupts and tool results, and the payments fake's count of applied
charges per idempotency key; plus the bytes our own side left behind (the
SQLite store, ``PREFECT_HOME``, the children's output, the API's logs and
artifacts), which must never hold the session token.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator.state import Message
from tests.lab.children import CrashLab
from tests.lab.leaks import check_no_token

CLIENT_TOOLS = frozenset({"charge_card"})


@dataclass
class Expect:
    """What a scenario's outcome must be, beyond the invariants every run shares."""

    workflow_id: str
    prompts: list[str]
    #: Submitted attempts per step (user messages carrying its marker); 1 when absent.
    attempts: dict[int, int] = field(default_factory=dict)
    #: Charges the workflow's tool steps must have applied, exactly once each.
    charges: int = 0
    #: The step (if any) whose crashed send landed after the rerun resubmitted (point 10):
    #: its duplicate marker is expected, and the result is the resubmission's.
    late_step: int | None = None
    archived: bool = True
    #: Verdicts the final run must report, per step (unchecked when absent).
    verdicts: dict[int, str] = field(default_factory=dict)


def user_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.role == "user"]


def attempts_of(messages: list[Message], marker: str) -> list[Message]:
    return [m for m in user_messages(messages) if marker in m.text()]


def reply_to(messages: list[Message], user: Message) -> str:
    """What the server committed as the answer to ``user``: the final text after the
    last client-tool call, up to the next user message (as the client computes it)."""
    later = [m for m in messages if m.id > user.id]
    nxt = next((m.id for m in later if m.role == "user"), None)
    parts = [
        p for m in later if m.role == "assistant" and (nxt is None or m.id < nxt) for p in m.content
    ]
    cut = 0
    for index, part in enumerate(parts):
        if part.get("type") == "tool-call" and part.get("tool_name") in CLIENT_TOOLS:
            cut = index + 1
    return "".join(str(p.get("text", "")) for p in parts[cut:] if p.get("type") == "text")


async def check_invariants(lab: CrashLab, results: list[dict[str, Any]], expect: Expect) -> None:
    sim, wf = lab.sim, expect.workflow_id
    # Each step's result is returned once, by the run that completed the workflow.
    assert [r["step"] for r in results] == list(range(1, len(expect.prompts) + 1)), results
    assert {r["workflow_id"] for r in results} == {wf}
    chat_ids = {r["chat_id"] for r in results}
    assert len(chat_ids) == 1, f"the steps ran on several chats: {chat_ids}"
    chat_id = chat_ids.pop()
    messages = sim.messages(chat_id)
    users = user_messages(messages)
    markers = {n: step_marker(wf, n) for n in range(1, len(expect.prompts) + 1)}
    assert all(any(mk in u.text() for mk in markers.values()) for u in users), (
        "a user message without a step marker of this workflow"
    )
    for result in results:
        step = result["step"]
        tries = attempts_of(messages, markers[step])
        wanted = expect.attempts.get(step, 1)
        assert len(tries) == wanted, (
            f"step {step}: {len(tries)} submitted attempts, expected {wanted}: "
            f"{[t.text() for t in tries]}"
        )
        # The result equals what the server committed for the attempt it belongs to.
        answered = tries[0] if step == expect.late_step else tries[-1]
        assert result["text"] == reply_to(messages, answered), (step, result["text"])
        assert result["text"], f"step {step} returned an empty result"
        if step in expect.verdicts:
            assert result["verdict"] == expect.verdicts[step], (step, result["verdict"])
        # A finished attempt is never resubmitted: every earlier attempt was cut short,
        # by an interrupt the server accepted between it and the next attempt.
        if step != expect.late_step:
            for earlier, later in itertools.pairwise(tries):
                assert any(
                    str(i.chat_id) == chat_id
                    and i.http_status == 200
                    and earlier.created_at <= i.at <= later.created_at
                    for i in sim.records.interrupts
                ), f"step {step}: resubmitted without cutting the earlier attempt short"
    await _check_effects(lab, chat_id, expect)
    await _check_store_and_labels(lab, chat_id, expect)
    await check_no_token(lab)


async def _check_effects(lab: CrashLab, chat_id: str, expect: Expect) -> None:
    applied = lab.payments.applied
    assert all(count == 1 for count in applied.values()), f"an effect applied twice: {applied}"
    assert len(applied) == expect.charges, f"expected {expect.charges} charges: {applied}"
    prefix = f"{lab.tenant}/{chat_id}/"
    assert all(key.startswith(prefix) for key in applied), applied
    store = SqliteStore(lab.db)
    try:
        entries = await store.list_tools(lab.tenant, chat_id)
    finally:
        await store.close()
    assert all(e.state == "done" for e in entries), entries
    # One effect per logical call: a call the server re-issued under a new id after its
    # tool deadline (same step, same arguments) shares the first call's effect.
    calls: dict[tuple[str, str], set[str]] = {}
    for entry in entries:
        calls.setdefault((entry.marker, entry.args_digest), set()).add(entry.idempotency_key)
    assert len(calls) == expect.charges, calls
    assert all(len(keys & set(applied)) == 1 for keys in calls.values()), (calls, applied)
    # Every call the server paused on was answered once, with the ledger's own output.
    answers = [
        r
        for r in lab.sim.records.tool_results
        if str(r.chat_id) == chat_id and r.tool_name == "charge_card" and not r.synthetic
    ]
    assert len(answers) == len({r.tool_call_id for r in answers}), answers
    outputs = {e.tool_call_id: e.output for e in entries}
    answered = {r.tool_call_id for r in answers}
    assert answered <= set(outputs), (answers, outputs)
    assert all(outputs[r.tool_call_id] == r.output for r in answers), (answers, outputs)
    assert all(
        any(e.tool_call_id in answered for e in entries if e.idempotency_key in keys)
        for keys in calls.values()
    ), f"a call whose effect ran was never answered with it: {calls}"


async def _check_store_and_labels(lab: CrashLab, chat_id: str, expect: Expect) -> None:
    store = SqliteStore(lab.db)
    try:
        workflow = await store.get_workflow(lab.tenant, expect.workflow_id)
    finally:
        await store.close()
    assert workflow is not None and workflow.chat_id == chat_id, workflow
    assert workflow.state == WorkflowState.FINISHED, workflow
    labelled = [c for c in lab.sim.chats() if c.labels.get(LABEL_WORKFLOW) == expect.workflow_id]
    unarchived = {str(c.id) for c in labelled if not c.archived}
    allowed = set() if expect.archived else {chat_id}
    assert unarchived <= allowed, f"unarchived chats no checkpoint owns: {unarchived - allowed}"
    if expect.archived:
        assert lab.sim.chat(chat_id).archived
