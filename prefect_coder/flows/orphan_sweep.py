"""``orphan_sweep``: retire orphaned chats, unstick stuck turns, relaunch stranded workflows,
and end the workflows whose runs a person cancelled.

Run it on a schedule (``deployments/prefect.yaml`` runs it every 5 minutes).
A chat paused on a client tool is timed out by Coder after 5 minutes, and the
model may then call the tool again; a sweep at least that frequent answers such
a pause from the ledger before that happens. The same file starts a pass at once
when Prefect knows of a crash, a cancel or a run gone silent (its triggers): the
schedule is for what no event reports.
"""

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prefect import flow
from prefect.runtime import flow_run as current_flow_run

from coder_chat.durable.records import WorkflowRecord
from coder_chat.durable.sweep import SweepPolicy
from prefect_coder._run.lease import SweepLease, hold_the_sweep, take_silent_run_for_dead
from prefect_coder._run.logs import run_log
from prefect_coder._run.naming import name_the_run
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.tasks.lost_runs import relaunch_lost_runs
from prefect_coder.tasks.sweep import relaunch_workflow, sweep_orphans


@flow(name="orphan-sweep", timeout_seconds=240)
async def orphan_sweep(
    target_deployment: str = "durable-chat",
    orphan_age_seconds: float = 900.0,
    stuck_after_seconds: float = 900.0,
    stale_heartbeat_seconds: float = 120.0,
    dry_run: bool = False,
    self_heal: bool = True,
    max_relaunches: int = 3,
    tools: Sequence[str] = (),
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
    lease_seconds: float = 30.0,
    lost_runs_within_seconds: float = 3600.0,
    relaunch_start_seconds: float = 300.0,
    because: str = "",
    silent_flow_run: str = "",
    wait_for_pass_seconds: float = 0.0,
) -> dict[str, int]:
    """Sweep the chats and workflows of one durable-chat deployment.

    Args:
        target_deployment: The durable-chat deployment swept (``local``: runs started outside one).
        orphan_age_seconds: Unowned chats younger are left alone (above the longest step deadline).
        stuck_after_seconds: A checkpointed turn live for longer than this is interrupted.
        stale_heartbeat_seconds: A running workflow silent for longer is stranded.
        dry_run: Only report.
        self_heal: Relaunch stranded workflows from their deployment.
        max_relaunches: At most this many relaunches per workflow.
        tools: Durable tools (import paths) whose committing effects the sweep may re-drive.
        credentials: Saved Coder credentials (none: the worker's environment).
        ledger: The durable-chat deployment's store (none: the embedded SQLite store).
        lease_seconds: One pass at a time: another pass's heartbeat younger than this holds
            this one off (an older one is taken over); keep it below the schedule's interval.
        lost_runs_within_seconds: Relaunch runs lost before their workflow began, due this recently.
        relaunch_start_seconds: A relaunch (or a run Running) this long without beginning its
            workflow is taken for lost; keep it above the time your flow takes to its first turn.
        because: What started this pass, for its log (empty: the schedule, or a person).
        silent_flow_run: A run gone silent (``prefect.flow-run.<id>``): if Running, marked Crashed.
        wait_for_pass_seconds: Wait up to this long for another pass to end, then go.
    """
    # In the policy's order: deployment, orphan age, stuck after, stale heartbeat, dry run.
    policy = SweepPolicy(
        target_deployment, orphan_age_seconds, stuck_after_seconds, stale_heartbeat_seconds, dry_run
    )
    # In the order of its fields: on, at most, lost within, start within.
    relaunch = Relaunch(self_heal, max_relaunches, lost_runs_within_seconds, relaunch_start_seconds)
    sweep = SweepPass(
        policy=policy, relaunch=relaunch, tools=tools, credentials=credentials, ledger=ledger
    )
    await _begin_the_pass(sweep, because, silent_flow_run)
    return await _leased_pass(sweep, lease_seconds, wait_for_pass_seconds)


@dataclass(frozen=True)
class Relaunch:
    """Whether and how a pass relaunches what it finds stranded or lost."""

    on: bool
    #: At most this many relaunches per workflow.
    at_most: int
    #: Runs lost before their workflow began are relaunched when due this recently.
    lost_within: float
    #: A relaunch not begun this long after it was made is taken for lost.
    start_within: float


@dataclass(frozen=True, kw_only=True)
class SweepPass:
    """What one pass was asked to do: the flow's parameters, as the flow documents them."""

    #: Whose chats, and which are orphans, stuck or stranded (the core's own policy).
    policy: SweepPolicy
    relaunch: Relaunch
    tools: Sequence[str]
    credentials: CoderCredentials | None
    ledger: SqliteLedger | PostgresLedger | None


async def _begin_the_pass(sweep: SweepPass, because: str, silent_flow_run: str) -> None:
    """Name the pass, say what started it, and take a run that went silent for dead."""
    target = sweep.policy.deployment
    await _name_the_pass(target)
    if because:
        run_log().info(f"This pass was started by {because}.")
    if silent_flow_run and sweep.relaunch.on and not sweep.policy.dry_run:
        await take_silent_run_for_dead(silent_flow_run, target, because or "silent")


async def _leased_pass(sweep: SweepPass, lease_seconds: float, wait_for: float) -> dict[str, int]:
    """One pass, holding the deployment's sweep lease (a dry run takes none); nothing
    when another pass holds it."""
    lease = None
    if not sweep.policy.dry_run:
        lease = await hold_the_sweep(
            sweep.policy.deployment, lease_seconds, sweep.credentials, sweep.ledger, wait_for
        )
        if lease is None:
            return {"chats": 0, "acted": 0, "stranded": 0, "relaunched": 0, "cancelled": 0}
    beat = asyncio.create_task(lease.keep()) if lease else None
    try:
        return await _one_pass(sweep, lease)
    finally:
        if beat is not None and lease is not None:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await lease.end()


async def _one_pass(sweep: SweepPass, lease: SweepLease | None) -> dict[str, int]:
    summary = await sweep_orphans(
        sweep.policy,
        sweep.tools,
        sweep.credentials,
        sweep.ledger,
        lease.fence if lease else None,
    )
    relaunched = 0
    if sweep.relaunch.on and not sweep.policy.dry_run:
        relaunched = await _relaunch(sweep, summary.stranded)
    elif summary.stranded:
        run_log().info(
            f"{len(summary.stranded)} stranded workflow(s) left as they are (self-healing is off)."
        )
    acted = sum(1 for f in summary.findings if f["action"] not in ("kept", "too young"))
    return {
        "chats": summary.chats_seen,
        "acted": acted,
        "stranded": len(summary.stranded),
        "relaunched": relaunched,
        "cancelled": len(summary.cancelled),
    }


async def _relaunch(sweep: SweepPass, stranded: list[WorkflowRecord]) -> int:
    """Relaunch the stranded workflows, then the runs lost before they began one."""
    relaunched = 0
    for workflow in _one_per_flow_run(stranded):
        if await relaunch_workflow(workflow, sweep.relaunch.at_most, sweep.relaunch.start_within):
            relaunched += 1
    return relaunched + await relaunch_lost_runs(
        sweep.policy.deployment,
        sweep.relaunch.lost_within,
        sweep.policy.stale_heartbeat,
        sweep.relaunch.start_within,
        sweep.credentials,
        sweep.ledger,
    )


async def _name_the_pass(target: str) -> None:
    """``sweep durable-chat · 13:05:00 UTC``: which deployment, and which pass."""
    this_run = current_flow_run.id
    if this_run is not None:
        at = datetime.now(UTC).strftime("%H:%M:%S UTC")
        name = f"sweep {target} · {at}"
        await name_the_run(this_run, current_flow_run.name or "", name, run_log())


def _one_per_flow_run(stranded: list[WorkflowRecord]) -> list[WorkflowRecord]:
    """A flow run of ``durable_chats`` holds many workflows: relaunching it once brings
    them all back, so one stranded workflow per flow run is relaunched."""
    seen: set[str] = set()
    chosen: list[WorkflowRecord] = []
    for workflow in stranded:
        run = workflow.flow_run_id or f"no-run:{workflow.workflow_id}"
        if run not in seen:
            seen.add(run)
            chosen.append(workflow)
    return chosen
