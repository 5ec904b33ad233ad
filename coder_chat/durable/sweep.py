"""The orphan sweep: retire every chat no checkpoint owns, unstick stuck turns, find stranded workflows.

A hard crash runs no ``finally``. It can leave a chat whose id never reached the
checkpoint, a chat paused on a client tool (holding its workspace until the
server's tool deadline fails the call), or a workflow that simply stopped. The
sweep widens the plain fleet sweep as the reference says:

* it lists *every* chat carrying the deployment's label and this store's id, in
  any status, all pages read before acting (archiving shifts pages); chats of
  another store are another sweep's business;
* a chat no checkpoint accounts for and older than ``orphan_age`` is retired
  (unless its workflow still runs: that workflow adopts it, keeping its ledger),
  and so is the chat of a workflow that ended without archiving it; retiring is
  :func:`.retire.retire_chat`, the one path every archive takes (a pause is
  answered from the ledger first and never interrupted away while an effect is
  in flight);
* a checkpointed chat ``running``/``interrupting`` for longer than ``stuck_after``
  is interrupted and reported, the stop journaled for its workflow first (:mod:`.stops`);
* a workflow the store holds as running with a stale heartbeat is reported as
  stranded, for the Prefect layer to relaunch.

With ``dry_run`` it only reports. Requests grow with pages, not with chats:
the listing is paged and only chats that need action get further calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..client.rest import ChatClient
from ..errors import CoderError
from ..protocol.models import Chat
from .context import DurableOptions, StepContext, StepTools
from .fence import FenceGuard
from .markers import LABEL_STEP, LABEL_WORKFLOW, owner_labels, step_number
from .reconcile import interrupt_quietly
from .records import Fence, WorkflowRecord, WorkflowState, utcnow
from .retire import Retired, retire_as_journaled, retire_chat
from .store import DurableStore

SWEEP_WORKFLOW = "prefect-coder-sweep"


@dataclass
class SweepPolicy:
    deployment: str = "local"
    #: A chat younger than this may belong to a step that has not checkpointed yet
    #: (a step writes its checkpoint when it ends): at least the longest step
    #: deadline plus a margin.
    orphan_age: float = 900.0
    #: A checkpointed turn live for longer than this is stuck.
    stuck_after: float = 900.0
    #: A running workflow whose heartbeat is older than this is stranded.
    stale_heartbeat: float = 120.0
    dry_run: bool = False
    page_size: int = 200
    #: Timers of the retire path (interrupt bound, archive's 409 window, polling).
    options: DurableOptions = field(default_factory=DurableOptions)


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


@dataclass
class _Pass:
    """One sweep pass: what it reads once and its hold on the sweep, taken when it first
    acts (or the lease its caller took): one guard for all its chats, whose check of the
    fence serves every chat for a second."""

    client: ChatClient
    store: DurableStore
    tenant: str
    policy: SweepPolicy
    tools: StepTools
    guard: FenceGuard | None = None

    async def act(
        self, chat: Chat, finding: ChatFinding, owner: WorkflowRecord | None = None
    ) -> ChatFinding:
        if self.guard is None:
            fence = await self.store.begin_run(
                self.tenant,
                sweep_workflow_id(self.policy.deployment),
                deployment=self.policy.deployment,
            )
            self.guard = FenceGuard(self.store, fence)
        guard, workflow_id = self.guard, chat.labels.get(LABEL_WORKFLOW, "")
        step, options = _step_label(chat), self.policy.options
        ctx = StepContext(self.client, guard, workflow_id, step, self.tools, options)
        try:
            if finding.action == "interrupt":
                # A stuck turn is found on its owner's checkpoint (see _classify).
                assert owner is not None, finding
                await guard("interrupt")  # this pass still holds the sweep
                async with asyncio.timeout(self.policy.options.chat.interrupt_timeout):
                    await interrupt_quietly(await self._owners_step(chat, owner), chat.id)
                finding.action = "interrupted"
                return finding
            retired = await retire_chat(ctx, chat.id)
        except (CoderError, TimeoutError) as exc:
            finding.action = "failed"
            finding.reason += f"; {type(exc).__name__}: {exc}"
            return finding
        finding.action = retired.action
        if retired.detail:
            finding.reason += f"; {retired.detail}"
        return finding

    async def _owners_step(self, chat: Chat, owner: WorkflowRecord) -> StepContext:
        """The step of ``owner``'s run whose attempt a stuck turn is, fenced at the epoch
        the store holds for it: its stop is journaled as that run's own would be
        (:mod:`.stops`), and a run that took the workflow since refuses it (FencedOut)."""
        record = await self.store.get_chat(self.tenant, chat.id)
        journaled = record.journal.marker if record and record.journal else ""
        step = step_number(journaled) or _step_label(chat)
        fence = Fence(tenant=self.tenant, workflow_id=owner.workflow_id, epoch=owner.epoch)
        return StepContext.fenced(
            self.client, self.store, fence, owner.workflow_id, step, self.tools, self.policy.options
        )


async def sweep(
    client: ChatClient,
    store: DurableStore,
    tenant: str,
    policy: SweepPolicy,
    tools: StepTools | None = None,
    report: Callable[[str], None] = print,
    fence: Fence | None = None,
) -> SweepReport:
    """One pass: classify every chat of this deployment and store, act on orphans and stuck turns.

    ``fence``: the pass's own hold on the sweep (a lease its caller took and ends); without
    it the pass takes one when it first acts, and ends it.
    """
    labels = owner_labels(policy.deployment, await store.store_id())
    chats = [c async for c in client.iter_chats(labels=labels, page_size=policy.page_size)]
    workflows = await store.list_workflows(tenant, deployment=policy.deployment)
    owners = {w.chat_id: w for w in workflows if w.chat_id}
    by_id = {w.workflow_id: w for w in workflows}
    now = utcnow()
    result = SweepReport(chats_seen=len(chats))
    held = FenceGuard(store, fence) if fence is not None else None
    sweep_pass = _Pass(client, store, tenant, policy, tools or StepTools(), held)
    for chat in chats:
        workflow = by_id.get(chat.labels.get(LABEL_WORKFLOW, ""))
        finding = _classify(chat, owners.get(chat.id), workflow, policy, now)
        if finding.action in ("retire", "interrupt"):
            if policy.dry_run:
                finding.action = f"would {finding.action}"
            else:
                finding = await sweep_pass.act(chat, finding, owners.get(chat.id))
        report(f"Chat {chat.id} ({chat.status}) {finding.action}: {finding.reason}.")
        result.findings.append(finding)
    if sweep_pass.guard is not None and fence is None:
        await store.finish(sweep_pass.guard.fence, WorkflowState.FINISHED)
    cutoff = now - timedelta(seconds=policy.stale_heartbeat)
    result.stranded = [
        w
        for w in workflows
        if w.state == WorkflowState.RUNNING
        and (w.heartbeat_at is None or w.heartbeat_at < cutoff)
        and not w.workflow_id.startswith(SWEEP_WORKFLOW)
    ]
    for w in result.stranded:
        report(
            f"Workflow {w.workflow_id} looks stranded: it is running, but its last heartbeat "
            f"was at {w.heartbeat_at}."
        )
    return result


def sweep_workflow_id(deployment: str) -> str:
    """The store's record of one deployment's sweep: its epoch is the lease of a pass."""
    return f"{SWEEP_WORKFLOW}/{deployment}"


async def take_sweep_lease(
    store: DurableStore, tenant: str, deployment: str, flow_run_id: str | None, fresh_for: float
) -> Fence | WorkflowRecord:
    """Hold the deployment's sweep for one pass, unless another pass holds it: its record
    running, with a heartbeat younger than ``fresh_for`` seconds. Returns the lease, or
    the record of the pass that holds it. A pass whose host died stops beating, and the
    next pass takes over once its heartbeat is older than that."""
    sweep_id = sweep_workflow_id(deployment)
    held = await store.get_workflow(tenant, sweep_id)
    alive = held is not None and held.state == WorkflowState.RUNNING
    if alive and held is not None and not _older(held.heartbeat_at, utcnow(), fresh_for):
        return held
    return await store.begin_run(tenant, sweep_id, deployment=deployment, flow_run_id=flow_run_id)


async def take_over(store: DurableStore, workflow: WorkflowRecord) -> Fence:
    """The workflow's next epoch, taken as it stands (its deployment, flow run and wish to
    be archived): the run that held it is fenced out, should it still be writing."""
    return await store.begin_run(
        workflow.tenant,
        workflow.workflow_id,
        deployment=workflow.deployment,
        flow_run_id=workflow.flow_run_id,
        archive_at_end=workflow.archive_at_end,
    )


async def mark_failed(store: DurableStore, workflow: WorkflowRecord) -> None:
    """Record that a workflow's last run failed, when that run could not say so itself.

    Taking the next epoch first fences that run out, should it still be writing.
    """
    fence = await take_over(store, workflow)
    await store.finish(fence, WorkflowState.FAILED)


async def end_cancelled(
    client: ChatClient,
    store: DurableStore,
    workflow: WorkflowRecord,
    labelled: Sequence[str],
    tools: StepTools,
    options: DurableOptions,
    report: Callable[[str], None],
) -> list[Retired]:
    """End a workflow a person cancelled: its turn stopped, its pause answered (recorded
    outputs, else "not run"), its chats archived (the checkpoint's, and ``labelled``: those
    the sweep found carrying its label, such as one a step made but had not checkpointed
    yet), and the workflow stored ``cancelled``, which nothing relaunches. Returns what
    became of each chat.

    Taking the next epoch first fences out the cancelled run, should its process still
    be acting. A chat that cannot be retired now (Coder out of reach, an effect in flight
    whose tool is not here) is left for a later sweep, which retires the chats of ended
    workflows; the workflow is stored cancelled all the same.
    """
    fence = await take_over(store, workflow)

    def context(step: int) -> StepContext:
        return StepContext.fenced(
            client, store, fence, workflow.workflow_id, step, tools, options, report=report
        )

    now = await store.get_workflow(workflow.tenant, workflow.workflow_id)
    checkpointed = [now.chat_id] if now is not None and now.chat_id else []
    if not checkpointed and labelled:
        checkpointed = await _checkpoint_newest(client, store, fence, labelled, report)
    retired: list[Retired] = []
    for chat_id in dict.fromkeys([*checkpointed, *labelled]):
        try:
            retired.append(await retire_as_journaled(store, fence, chat_id, context, report))
        except (CoderError, TimeoutError) as exc:
            report(
                f"Could not archive chat {chat_id} of workflow {workflow.workflow_id} yet ({exc})."
            )
            retired.append(Retired(chat_id, "left", str(exc)))
    await store.finish(fence, WorkflowState.CANCELLED)
    return retired


async def _checkpoint_newest(
    client: ChatClient,
    store: DurableStore,
    fence: Fence,
    labelled: Sequence[str],
    report: Callable[[str], None],
) -> list[str]:
    """Checkpoint the newest labelled chat of a workflow that has none (its first turn's
    process died before writing it), the one a re-run would adopt: a resume then reopens
    it and recovers what its first turn finished there, instead of sending that turn
    again on a new chat (and running its effects again under new tool-call ids)."""
    try:
        chats = [await client.get_chat(chat_id) for chat_id in labelled]
    except (CoderError, TimeoutError) as exc:
        report(f"Could not read the chats of workflow {fence.workflow_id} to keep one ({exc}).")
        return []
    chats.sort(key=lambda c: (c.created_at is not None, c.created_at), reverse=True)
    chosen = str(chats[0].id)
    await store.save_checkpoint(fence, chosen, None)
    return [chosen]


def _classify(
    chat: Chat,
    owner: WorkflowRecord | None,
    workflow: WorkflowRecord | None,
    policy: SweepPolicy,
    now: datetime,
) -> ChatFinding:
    workflow_id = chat.labels.get(LABEL_WORKFLOW)

    def finding(action: str, reason: str) -> ChatFinding:
        return ChatFinding(chat.id, chat.status, workflow_id, action, reason)

    if owner is not None and owner.state != WorkflowState.RUNNING:
        if not owner.archive_at_end:
            return finding("kept", f"workflow {owner.workflow_id} ended and keeps its chat")
        return finding("retire", f"workflow {owner.workflow_id} {owner.state} without archiving it")
    if owner is not None:
        live = chat.status in ("running", "interrupting", "pending")
        if live and _older(chat.updated_at, now, policy.stuck_after):
            return finding("interrupt", f"stuck: {chat.status} for over {policy.stuck_after:.0f}s")
        return finding("kept", f"owned by the checkpoint of workflow {owner.workflow_id}")
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


def _step_label(chat: Chat) -> int:
    value = chat.labels.get(LABEL_STEP, "")
    return int(value) if value.isdigit() else 0
