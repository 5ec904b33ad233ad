"""The orphan sweep: retire every chat no checkpoint owns, unstick stuck turns, find stranded workflows.

A hard crash runs no ``finally``. It can leave a chat whose id never reached the
checkpoint, a chat paused on a client tool (holding its workspace until the
server's tool deadline fails the call), or a workflow that simply stopped. The
sweep widens the plain fleet sweep as the reference says:

* it lists *every* chat carrying the deployment's label, in any status, all
  pages read before acting (archiving shifts pages);
* a chat no checkpoint accounts for and older than ``orphan_age`` is retired
  (unless its workflow still runs: that workflow adopts it, keeping its ledger),
  a ``requires_action`` pause is first answered from the tool ledger (a pause
  with a committed effect is never interrupted away), anything live is
  interrupted with a bounded wait, then the chat is archived;
* a checkpointed chat ``running``/``interrupting`` for longer than ``stuck_after``
  is interrupted and reported;
* a workflow the store holds as running with a stale heartbeat is reported as
  stranded, for the Prefect layer to relaunch.

With ``dry_run`` it only reports. Requests grow with pages, not with chats:
the listing is paged and only chats that need action get further calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..client.rest import ChatClient
from ..client.session import ChatSession
from ..errors import CoderApiError, CoderError
from ..protocol.models import Chat
from ..protocol.transcript import call_args, to_transcript
from .context import StepTools
from .markers import LABEL_DEPLOYMENT, LABEL_STEP, LABEL_WORKFLOW, step_marker
from .records import Fence, WorkflowRecord, WorkflowState, utcnow
from .store import DurableStore
from .tools import LedgerBinding

SWEEP_WORKFLOW = "prefect-coder-sweep"
NOT_RUN = "Not run: the workflow that owned this call is gone; the sweep retired the chat."


@dataclass
class SweepPolicy:
    deployment: str = "local"
    #: A chat younger than this may belong to a step that has not checkpointed yet
    #: (a step writes its checkpoint in ``finally``): at least the longest step
    #: deadline plus a margin.
    orphan_age: float = 900.0
    #: A checkpointed turn live for longer than this is stuck.
    stuck_after: float = 900.0
    #: A running workflow whose heartbeat is older than this is stranded.
    stale_heartbeat: float = 120.0
    dry_run: bool = False
    page_size: int = 200
    interrupt_timeout: float = 15.0
    settle_timeout: float = 60.0
    poll_interval: float = 1.0
    archive_retry_interval: float = 1.0
    archive_window: float = 15.0


@dataclass
class ChatFinding:
    chat_id: str
    status: str
    workflow_id: str | None
    action: str
    reason: str


@dataclass
class SweepReport:
    chats_seen: int = 0
    findings: list[ChatFinding] = field(default_factory=list)
    stranded: list[WorkflowRecord] = field(default_factory=list)

    def acted(self) -> list[ChatFinding]:
        return [f for f in self.findings if f.action not in ("kept", "too young")]


async def sweep(
    client: ChatClient,
    store: DurableStore,
    tenant: str,
    policy: SweepPolicy,
    tools: StepTools | None = None,
    report: Callable[[str], None] = print,
) -> SweepReport:
    """One pass: classify every labelled chat, act on the orphans and stuck turns."""
    chats = [
        c
        async for c in client.iter_chats(
            labels={LABEL_DEPLOYMENT: policy.deployment}, page_size=policy.page_size
        )
    ]
    workflows = await store.list_workflows(tenant, deployment=policy.deployment)
    owners = {w.chat_id: w for w in workflows if w.chat_id}
    by_id = {w.workflow_id: w for w in workflows}
    discarded = {c.chat_id for c in await store.list_chats(tenant, discarded=True)}
    now = utcnow()
    result = SweepReport(chats_seen=len(chats))
    fence: Fence | None = None
    for chat in chats:
        workflow = by_id.get(chat.labels.get(LABEL_WORKFLOW, ""))
        finding = _classify(chat, owners.get(chat.id), workflow, chat.id in discarded, policy, now)
        if finding.action in ("retire", "interrupt") and not policy.dry_run:
            if fence is None:
                fence = await store.begin_run(
                    tenant, f"{SWEEP_WORKFLOW}/{policy.deployment}", deployment=policy.deployment
                )
            finding = await _act(client, store, fence, chat, finding, policy, tools or StepTools())
        elif policy.dry_run and finding.action in ("retire", "interrupt"):
            finding.action = f"would {finding.action}"
        report(f"chat {chat.id} [{chat.status}] {finding.action}: {finding.reason}")
        result.findings.append(finding)
    if fence is not None:
        await store.finish(fence, WorkflowState.FINISHED)
    cutoff = now - timedelta(seconds=policy.stale_heartbeat)
    result.stranded = [
        w
        for w in workflows
        if w.state == WorkflowState.RUNNING
        and (w.heartbeat_at is None or w.heartbeat_at < cutoff)
        and not w.workflow_id.startswith(SWEEP_WORKFLOW)
    ]
    for w in result.stranded:
        report(f"workflow {w.workflow_id} is stranded: running, last heartbeat {w.heartbeat_at}")
    return result


def _classify(
    chat: Chat,
    owner: WorkflowRecord | None,
    workflow: WorkflowRecord | None,
    discarded: bool,
    policy: SweepPolicy,
    now: datetime,
) -> ChatFinding:
    workflow_id = chat.labels.get(LABEL_WORKFLOW)

    def finding(action: str, reason: str) -> ChatFinding:
        return ChatFinding(chat.id, chat.status, workflow_id, action, reason)

    if owner is not None and not discarded:
        live = chat.status in ("running", "interrupting", "pending")
        if live and _older(chat.updated_at, now, policy.stuck_after):
            return finding("interrupt", f"stuck: {chat.status} for over {policy.stuck_after:.0f}s")
        return finding("kept", f"owned by the checkpoint of workflow {owner.workflow_id}")
    if discarded:
        return finding("retire", "discarded after a stream failure; never adopted")
    if not _older(chat.created_at, now, policy.orphan_age):
        return finding(
            "too young",
            f"younger than {policy.orphan_age:.0f}s; its step may not have checkpointed yet",
        )
    if workflow is not None and workflow.state == WorkflowState.RUNNING:
        # Its workflow (this run, or the relaunch of a stranded one) adopts it on its
        # next empty-checkpoint step, keeping the tool ledger's keys: retiring it and
        # starting over on a new chat could repeat the effects it already applied.
        return finding(
            "kept", f"left for workflow {workflow.workflow_id} to adopt (it is still running)"
        )
    return finding("retire", "no checkpoint owns it")


def _older(moment: datetime | None, now: datetime, seconds: float) -> bool:
    return moment is None or (now - moment).total_seconds() > seconds


async def _act(
    client: ChatClient,
    store: DurableStore,
    fence: Fence,
    chat: Chat,
    finding: ChatFinding,
    policy: SweepPolicy,
    tools: StepTools,
) -> ChatFinding:
    try:
        if finding.action == "interrupt":
            await _interrupt(client, chat.id, policy)
            finding.action = "interrupted"
            return finding
        if chat.status == "requires_action":
            answered = await _answer_from_ledger(client, store, fence, chat, tools)
            if answered is None:
                finding.action, finding.reason = (
                    "left",
                    "a committing tool effect needs its tool to be re-driven; add it to the sweep's tools",
                )
                return finding
            finding.reason += f"; {answered}"
        await _interrupt(client, chat.id, policy)
        await _settle(client, chat.id, policy)
        await _archive(client, chat.id, policy)
        finding.action = "archived"
    except (CoderError, TimeoutError) as exc:
        finding.action, finding.reason = "failed", f"{finding.reason}; {type(exc).__name__}: {exc}"
    return finding


async def _answer_from_ledger(
    client: ChatClient, store: DurableStore, fence: Fence, chat: Chat, tools: StepTools
) -> str | None:
    """Answer every pending call: recorded outputs, re-driven effects, or "not run".

    Returns a summary, or ``None`` when a committing effect cannot be re-driven
    (its tool is not configured), in which case nothing is sent.
    """
    page = await client.get_messages(chat.id, limit=200)
    transcript = to_transcript(page.messages).messages
    last = next((m for m in reversed(transcript) if m.role == "assistant"), None)
    answered = {
        p.tool_call_id
        for m in transcript
        if last and m.id > last.id
        for p in m.parts
        if p.type == "tool-result"
    }
    calls = [
        p
        for p in (last.parts if last else ())
        if p.type == "tool-call" and not p.provider_executed and p.tool_call_id not in answered
    ]
    tenant = fence.tenant
    entries = {
        c.tool_call_id: await store.get_tool(tenant, chat.id, c.tool_call_id or "") for c in calls
    }
    blocked = [
        c
        for c in calls
        if (e := entries[c.tool_call_id])
        and e.state == "committing"
        and c.tool_name not in tools.durable
    ]
    if blocked:
        return None
    results: list[dict[str, Any]] = []
    for call in calls:
        entry = entries[call.tool_call_id]
        if entry is None:
            results.append({"tool_call_id": call.tool_call_id, "output": NOT_RUN, "is_error": True})
        elif entry.state == "done":
            results.append(
                {
                    "tool_call_id": call.tool_call_id,
                    "output": entry.output,
                    "is_error": entry.is_error,
                }
            )
        else:
            tool = tools.durable[call.tool_name or ""]
            marker = step_marker(
                chat.labels.get(LABEL_WORKFLOW, ""), int(chat.labels.get(LABEL_STEP, "0") or 0)
            )
            args = tool.tool.validate(call_args(call.args))
            output = await tool.redrive(LedgerBinding(store, fence, marker), entry, args)
            results.append({"tool_call_id": call.tool_call_id, "output": output, "is_error": False})
    if results:
        await client.submit_tool_results(chat.id, results)
    recorded = sum(1 for e in entries.values() if e is not None)
    return f"answered {len(results)} pending call(s), {recorded} from the ledger"


async def _interrupt(client: ChatClient, chat_id: str, policy: SweepPolicy) -> None:
    with contextlib.suppress(CoderApiError):  # 409: nothing running
        async with asyncio.timeout(policy.interrupt_timeout):
            await client.interrupt_chat(chat_id)


async def _settle(client: ChatClient, chat_id: str, policy: SweepPolicy) -> None:
    async with asyncio.timeout(policy.settle_timeout):
        while (await client.get_chat(chat_id)).status not in ("waiting", "error", "completed"):
            await asyncio.sleep(policy.poll_interval)
            with contextlib.suppress(CoderApiError):
                await client.interrupt_chat(chat_id)


async def _archive(client: ChatClient, chat_id: str, policy: SweepPolicy) -> None:
    session = ChatSession(
        client=client,
        organization_id="sweep",  # archiving needs no organization; the session requires one
        chat_id=chat_id,
        archive_retry_interval=policy.archive_retry_interval,
        archive_window=policy.archive_window,
    )
    await session.archive()  # retries 409 while a run winds down; archived already is done
