"""What a person does to a workflow between two of its runs, and what it must leave.

A person's actions are inputs, not faults (DESIGN.md points 11 and 14). Once the run
a :class:`~.plan.Person` names was killed, and a moment later (:data:`SETTLE`: what the
dead run had in flight has landed), the person:

- **changes a prompt**: runs the workflow again with its first step's prompt reworded,
  once the store holds that step finished. The run must fail with ``PromptChanged``,
  leave the workflow's store rows byte for byte as they were, and reach Coder with
  nothing: no prompt, no chat, no write to the workflow's chats. The planned runs then
  go on;
- **cancels** it with ``prefect_coder.operations.cancel_workflow`` (the campaign's
  durable tool at hand, so an effect in flight is finished, not left), while it is
  running in the store. The store must say ``cancelled``, every chat of the workflow
  be archived (or left paused with an effect in flight, for the sweep: noted), and no
  prompt of it land until the next planned run, which is the resume: the same
  workflow id and prompts, carrying it on to the end.

Anything else is a violation of category ``people's actions``; the usual checks judge
the rest (each step's result once, effects at most once, no finished step resent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from coder_chat import ChatClient
from coder_chat.durable.context import StepTools
from coder_chat.durable.records import WorkflowState
from coder_chat.errors import CoderError, CoderStoreError
from coder_chat.simulator import Simulator
from prefect_coder.demo_tools import charge_card
from prefect_coder.operations import Runtime, cancel_workflow
from tests.lab.children import Child
from tests.lab.steps import Person, WorkflowPlan
from tests.lab.truth import attempts, prompts, workflow_chats
from tests.lab.verdicts import Category, Findings

from .arena import Arena
from .sweeping import payments_env

T = TypeVar("T")

#: Seconds a person takes after a kill: longer than a delayed commit knob holds a send
#: (2 s at most), so what the dead run had in flight has landed before they act.
SETTLE = 2.5
#: Seconds the cancelled workflow is watched for a prompt before the resume runs.
QUIET = 1.0
#: How long the changed-prompt run may take to be refused.
REFUSAL_TIMEOUT = 90.0
#: How long a person waits for a Postgres restart the plan has due before they act.
RESTART_WAIT = 60.0
CATEGORY: Category = "people's actions"


@dataclass
class PersonRecord:
    person: Person
    #: Whether the action was taken (a changed prompt needs a finished first step; a
    #: cancel, a running workflow).
    done: bool = False
    outcome: str = ""
    findings: Findings = field(default_factory=Findings)
    #: What ``cancel_workflow`` reported.
    lines: list[str] = field(default_factory=list)
    #: The chats the cancel said it left for a later sweep (Coder failed their archive).
    left: set[str] = field(default_factory=set)

    def describe(self) -> str:
        return f"person: {self.person.describe()}: {self.outcome}"

    def violation(self, workflow_id: str, detail: str) -> None:
        self.findings.add(CATEGORY, f"{workflow_id} {self.person.describe()}: {detail}")


async def spawn_changed(arena: Arena, plan: WorkflowPlan) -> Child | None:
    """The child of a person's changed-prompt run, spawned up front like the planned ones."""
    if plan.person is None or plan.person.kind != "changed-prompt":
        return None
    params = {**arena.params(plan), "prompts": plan.changed_prompts}
    return await arena.lab.spawn(env=arena.machine_env(plan.person.after_run + 1), **params)


async def act(arena: Arena, plan: WorkflowPlan, child: Child | None, run: int) -> PersonRecord:
    """The person's action after run ``run`` was killed, checked at once."""
    assert plan.person is not None
    record = PersonRecord(plan.person)
    await settle(arena, plan, run)
    if plan.person.kind == "changed-prompt":
        assert child is not None
        await change_prompt(arena, plan, child, record)
    else:
        await cancel(arena, plan, record)
    return record


async def settle(arena: Arena, plan: WorkflowPlan, run: int) -> None:
    """Wait :data:`SETTLE`, and for every Postgres restart due by this run to be done (a
    person's run that met one would fail for it, not for what it was asked)."""
    await asyncio.sleep(SETTLE)
    if plan is not arena.schedule.workflows[0]:
        return
    due = sum(1 for r in arena.schedule.pg_restarts if r.run <= run)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + RESTART_WAIT
    while arena.restarts_done < due and loop.time() < give_up:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def retrying(arena: Arena, read: Callable[[], Awaitable[T]]) -> T:
    """A store read, retried while a restarting Postgres refuses it."""
    for _ in range(40):
        try:
            return await read()
        except CoderStoreError:
            await asyncio.sleep(0.25)
    return await read()


@dataclass(frozen=True)
class SimMark:
    """Where the simulator's records of a workflow stood, to tell what came after."""

    prompts: int
    chats: frozenset[str]
    requests: int

    @classmethod
    def take(cls, sim: Simulator, workflow_id: str) -> SimMark:
        chats = frozenset(str(c.id) for c in workflow_chats(sim, workflow_id))
        return cls(len(prompts(sim, workflow_id)), chats, len(sim.records.requests))

    def new_prompts(self, sim: Simulator, workflow_id: str) -> int:
        return len(prompts(sim, workflow_id)) - self.prompts

    def reached(self, sim: Simulator, workflow_id: str, alone: bool) -> tuple[list[str], int]:
        """What reached Coder for the workflow since the mark (prompts, chats, writes to
        its chats, and chat creations when no other workflow runs), and how many reads."""
        problems, reads = [], 0
        if (landed := self.new_prompts(sim, workflow_id)) > 0:
            problems.append(f"{landed} prompt(s) landed")
        chats = {str(c.id) for c in workflow_chats(sim, workflow_id)}
        if created := sorted(chats - self.chats):
            problems.append(f"chat(s) {', '.join(created)} created")
        for request in sim.records.requests[self.requests :]:
            ours = any(chat in request.path for chat in chats)
            if request.method != "GET" and ours:
                problems.append(f"{request.method} {request.path} ({request.status})")
            elif alone and request.route == "create_chat":
                problems.append(f"a create_chat request ({request.status})")
            elif ours:
                reads += 1
        return problems, reads


async def change_prompt(
    arena: Arena, plan: WorkflowPlan, child: Child, record: PersonRecord
) -> None:
    wf, tenant = plan.workflow_id, arena.tenant
    steps = await retrying(arena, lambda: arena.store.list_steps(tenant, wf))
    if not any(s.step == 1 for s in steps) and not attempts(arena.sim, wf, 1):
        record.outcome = "not tried (its first step never reached Coder)"
        return
    before = await arena.site.workflow_rows(tenant, wf)
    mark = SimMark.take(arena.sim, wf)
    await arena.lab.ready(child)
    arena.lab.go(child)
    record.done = True
    try:
        async with asyncio.timeout(REFUSAL_TIMEOUT):
            code: int | None = await child.proc.wait()
    except TimeoutError:
        await arena.lab.crash(child)
        code = None
    stderr = child.stderr.read_text(errors="replace")
    if code is None:
        record.violation(wf, f"the run with a changed prompt did not end in {REFUSAL_TIMEOUT:.0f}s")
    elif code == 0:
        record.violation(wf, "the run with a changed prompt completed instead of being refused")
    elif "PromptChanged" not in stderr:
        from .drive import failure_of  # drive imports this module

        record.violation(wf, f"the run with a changed prompt failed otherwise: {failure_of(child)}")
    after = await arena.site.workflow_rows(tenant, wf)
    for table in before:
        if before[table] != after[table]:
            gone = [r for r in before[table] if r not in after[table]]
            came = [r for r in after[table] if r not in before[table]]
            record.violation(
                wf,
                f"the refused run changed the store's {table} rows "
                f"(was {[r[:160] for r in gone]}, now {[r[:160] for r in came]})",
            )
    alone = len(arena.schedule.workflows) == 1
    problems, reads = mark.reached(arena.sim, wf, alone)
    for problem in problems:
        record.violation(wf, f"the refused run reached Coder: {problem}")
    said = "refused (PromptChanged)" if code and "PromptChanged" in stderr else f"exit {code}"
    record.outcome = (
        f"{said}, the store's rows {'unchanged' if before == after else 'CHANGED'}, "
        f"{'nothing' if not problems else 'something'} sent to Coder ({reads} read(s))"
    )


async def cancel(arena: Arena, plan: WorkflowPlan, record: PersonRecord) -> None:
    wf, tenant, sim = plan.workflow_id, arena.tenant, arena.sim
    workflow = await retrying(arena, lambda: arena.store.get_workflow(tenant, wf))
    if workflow is None or workflow.state != WorkflowState.RUNNING:
        state = workflow.state if workflow else "not begun in the store"
        record.outcome = f"not tried (the workflow was {state})"
        return
    mark = SimMark.take(sim, wf)
    record.done = True
    failure = await cancel_retrying(arena, wf, record)
    if failure is not None:
        record.violation(wf, f"the cancel failed: {failure}")
    stored = await retrying(arena, lambda: arena.store.get_workflow(tenant, wf))
    if stored is None or stored.state != WorkflowState.CANCELLED:
        record.violation(wf, f"the store says {stored.state if stored else 'nothing'}")
    left = 0
    for chat in workflow_chats(sim, wf):
        if chat.archived:
            continue
        chat_id = str(chat.id)
        ledger = await retrying(arena, partial(arena.store.list_tools, tenant, chat_id))
        if chat.status == "requires_action" and any(e.state == "committing" for e in ledger):
            left += 1
            arena.notes.append(
                f"{wf}: the cancel left chat {chat.id} paused on an effect in flight"
            )
        elif chat_id in record.left:
            left += 1  # the cancel said it could not retire it yet: a later sweep does
            arena.notes.append(f"{wf}: the cancel could not archive chat {chat.id} yet")
        else:
            record.violation(wf, f"chat {chat.id} [{chat.status}] was left unarchived")
    await asyncio.sleep(QUIET)
    if (landed := mark.new_prompts(sim, wf)) > 0:
        record.violation(wf, f"{landed} prompt(s) landed after the cancel, before the resume")
    archived = len(workflow_chats(sim, wf)) - left
    record.outcome = f"cancelled ({archived} chat(s) archived, {left} left paused); resumed next"


async def cancel_retrying(arena: Arena, workflow_id: str, record: PersonRecord) -> str | None:
    """``cancel_workflow`` as the campaign's person calls it (again, after a transient
    failure, as a person would); the last failure, or ``None``."""
    sim, failure = arena.sim, None
    for _ in range(3):
        workflow = await retrying(
            arena, lambda: arena.store.get_workflow(arena.tenant, workflow_id)
        )
        if workflow is not None and workflow.state == WorkflowState.CANCELLED:
            return None  # stored cancelled by the attempt that failed afterwards
        try:
            async with (
                payments_env(arena.lab.payments_url),
                ChatClient(base_url=sim.base_url, token=sim.token) as client,
            ):
                rt = Runtime(client, arena.store, arena.tenant)
                tools = StepTools.build([charge_card])
                cancelled = await cancel_workflow(rt, workflow_id, tools, record.lines.append)
            record.left = {r.chat_id for r in cancelled.chats if not r.done}
            return None
        except (CoderError, TimeoutError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
            arena.notes.append(f"{workflow_id}: a cancel failed, tried again: {failure}")
            await asyncio.sleep(1.0)
    return failure
