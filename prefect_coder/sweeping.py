"""One pass of the orphan sweep, as the ``orphan_sweep`` flow runs it: :class:`SweepPass`.

A pass names its flow run, says what started it, takes a run that went silent for dead,
holds the deployment's sweep lease (one pass at a time), retires orphaned chats, unsticks
stuck turns, ends the workflows a person cancelled, and relaunches the stranded ones. A flow
of your own (one sweeping several deployments, say) runs passes the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prefect.runtime import flow_run as current_flow_run

from coder_chat.durable.records import WorkflowRecord
from coder_chat.durable.sweep import SweepPolicy
from prefect_coder._run.lease import SweepLease, hold_the_sweep, take_silent_run_for_dead
from prefect_coder._run.logs import run_log
from prefect_coder._run.naming import name_the_run
from prefect_coder._run.runtime import Runtime
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.tasks.lost_runs import relaunch_lost_runs
from prefect_coder.tasks.sweep import relaunch_workflow, sweep_orphans


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

    async def run(
        self,
        *,
        because: str = "",
        silent_flow_run: str = "",
        lease_seconds: float = 30.0,
        wait_for_pass_seconds: float = 0.0,
    ) -> dict[str, int]:
        """The pass, in this flow run; what it counted (chats seen, acted on, stranded,
        relaunched, cancelled). ``because``, ``silent_flow_run``, ``lease_seconds`` and
        ``wait_for_pass_seconds`` are the ``orphan_sweep`` flow's parameters of those names."""
        await _begin_the_pass(self, because, silent_flow_run)
        return await _leased_pass(self, lease_seconds, wait_for_pass_seconds)


async def _begin_the_pass(sweep: SweepPass, because: str, silent_flow_run: str) -> None:
    """Name the pass, say what started it, and take a run that went silent for dead."""
    target = sweep.policy.deployment
    await _name_the_pass(target)
    if because:
        run_log().info(f"This pass was started by {because}.")
    if silent_flow_run and sweep.relaunch.on and not sweep.policy.dry_run:
        rt = Runtime.from_blocks(sweep.credentials, sweep.ledger)
        await take_silent_run_for_dead(silent_flow_run, target, because or "silent", rt)


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


__all__ = ["Relaunch", "SweepPass"]
