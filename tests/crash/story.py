"""What the crash tests share: the workflows' prompts, and what they read of the store and
the simulator."""

from __future__ import annotations

from typing import Any

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.durable.records import ChatRecord, LedgerEntry, WorkflowRecord
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator.state import Chat
from tests.lab.children import CrashLab

from .invariants import attempts_of

PROMPTS = ["plan the refund", "confirm the refund"]
CHARGE = '/tool charge_card {"amount_cents": 1299}'
#: Long enough that a run is certainly still going when the rerun recovers it.
STALL = 120.0
#: Long enough to kill the process mid-run; short enough to wait for.
SHORT_STALL = 3.0


def tool_prompts(step: int) -> list[str]:
    """Two steps, the ``step``-th one charging the card through the durable tool."""
    prompts = list(PROMPTS)
    prompts[step - 1] = f"charge the card {CHARGE}"
    return prompts


def labelled(lab: CrashLab, wf: str) -> list[Chat]:
    return [c for c in lab.sim.chats() if c.labels.get(LABEL_WORKFLOW) == wf]


def only_chat(lab: CrashLab, wf: str) -> Chat:
    chats = labelled(lab, wf)
    assert len(chats) == 1, chats
    return chats[0]


async def stored(
    lab: CrashLab, wf: str
) -> tuple[WorkflowRecord | None, ChatRecord | None, list[LedgerEntry]]:
    """What the store holds for the workflow right now (read as a separate process would)."""
    store = SqliteStore(lab.db)
    try:
        workflow = await store.get_workflow(lab.tenant, wf)
        chats = [c for c in lab.sim.chats() if c.labels.get(LABEL_WORKFLOW) == wf]
        record = await store.get_chat(lab.tenant, str(chats[0].id)) if chats else None
        tools = await store.list_tools(lab.tenant, str(chats[0].id)) if chats else []
    finally:
        await store.close()
    return workflow, record, tools


async def crash_with_step_2_running(
    lab: CrashLab, params: dict[str, Any], stall: float, reruns: int = 0
) -> Chat:
    """Start the workflow and kill its run while step 2's turn runs on the server.

    Step 2's send (the workflow's first) is held, then let through with the server's turn
    stalled ``stall`` seconds, and the run is killed once the chat runs step 2; the chat is
    returned. ``reruns``: the reruns :meth:`CrashLab.start` gets ready beforehand.
    """
    sim, wf = lab.sim, params["workflow_id"]
    sim.faults.hold("send_message", "before")
    first = await lab.start(**params, reruns=reruns)
    held = await lab.held(sim.faults.wait_held("send_message", timeout=90), first, "send held")
    sim.config.step_delay = stall
    sim.faults.decide(held.id, "release")
    chat = only_chat(lab, wf)
    marker = step_marker(wf, 2)
    await lab.until(
        lambda: len(attempts_of(sim.messages(chat.id), marker)) == 1 and chat.status == "running",
        first,
        "step 2 running",
    )
    await lab.crash(first)
    return chat
