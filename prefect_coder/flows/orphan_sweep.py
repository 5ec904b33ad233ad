"""``orphan_sweep``: retire orphaned chats, unstick stuck turns, relaunch stranded workflows,
and end the workflows whose runs a person cancelled.

Run it on a schedule (``deployments/prefect.yaml`` runs it every 5 minutes).
A chat paused on a client tool is timed out by Coder after 5 minutes, and the
model may then call the tool again; a sweep at least that frequent answers such
a pause from the ledger before that happens. The same file starts a pass at once
when Prefect knows of a crash, a cancel or a run gone silent (its triggers): the
schedule is for what no event reports.
"""

from collections.abc import Sequence

from prefect import flow

from coder_chat.durable.sweep import SweepPolicy
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.sweeping import Relaunch, SweepPass


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
        relaunch_start_seconds: A relaunch (or a run Pending or Running) this long without
            beginning its workflow is taken for lost; keep it above the time your flow takes to
            its first turn.
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
    return await sweep.run(
        because=because,
        silent_flow_run=silent_flow_run,
        lease_seconds=lease_seconds,
        wait_for_pass_seconds=wait_for_pass_seconds,
    )


__all__ = ["Relaunch", "SweepPass", "orphan_sweep"]
