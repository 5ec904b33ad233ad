"""The states a workflow's flow runs end in when the workflow leaves them: superseded by
a newer run, cancelled by a person, or lost with the store. The store's epoch already
decided; these say so where a person looks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.actions import LogCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.logging.loggers import LoggingAdapter
from prefect.states import Cancelled, Crashed

from coder_chat.durable.budget import OverBudget

#: The name of the state a replaced run ends in (a kind of Cancelled).
SUPERSEDED = "Superseded"
#: The name of the state a run ends in when its workflow reached a limit of its budget.
OVER_BUDGET = "Over budget"


#: States of a replaced run worth correcting: it never finished, so it looks alive or crashed.
_UNFINISHED = {
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
    StateType.CRASHED,
}


async def supersede(
    previous_run: str | None, this_run: str, this_name: str, log: LoggingAdapter
) -> str | None:
    """Mark ``previous_run`` superseded by this run, if it stopped without finishing.

    Returns its name when it was marked.
    """
    if not previous_run or previous_run == this_run:
        return None
    try:
        async with get_client() as client:
            old = await client.read_flow_run(UUID(previous_run))
            if old.state_type not in _UNFINISHED:
                return None
            await _supersede(client, old, this_name, this_run)
    except Exception as exc:  # noqa: BLE001 - the epoch already fences the old run
        log.warning(f"Could not mark run {previous_run} superseded ({exc}).")
        return None
    log.info(
        f"This run replaces run {old.name!r}, which stopped without finishing; "
        "that run is marked superseded."
    )
    return old.name


async def _supersede(client: PrefectClient, old: FlowRun, new_name: str, new_id: str) -> None:
    """Cancel the replaced run and its unfinished tasks with a message naming the new run."""
    message = f"Superseded by run {new_name!r} ({new_id}): its process stopped without finishing."
    await client.set_flow_run_state(old.id, Cancelled(name=SUPERSEDED, message=message), force=True)
    tasks = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[old.id]))
    )
    for task_run in tasks:
        if task_run.state_type in _UNFINISHED:
            await client.set_task_run_state(
                task_run.id, Cancelled(name=SUPERSEDED, message=message), force=True
            )
    said = f"This run was superseded by run {new_name!r} ({new_id}), which carries on."
    await _log_on_run(client, old.id, said, level=30)


async def note_on_run(flow_run_id: str, message: str, report: Callable[[str], None]) -> None:
    """Write ``message`` into another flow run's log, where a person reading it looks."""
    try:
        async with get_client() as client:
            await _log_on_run(client, UUID(flow_run_id), message, level=20)
    except Exception as exc:  # noqa: BLE001 - for people; the store already says it
        report(f"Could not write to the log of run {flow_run_id} ({exc}).")


async def _log_on_run(client: PrefectClient, run: UUID, message: str, *, level: int) -> None:
    log = LogCreate(
        name="prefect.flow_runs.coder",
        level=level,
        message=message,
        timestamp=datetime.now(UTC),
        flow_run_id=run,
    )
    await client.create_logs([log])


async def _set_final(client: PrefectClient, this_run: str, state: State[Any]) -> State[Any] | None:
    """Set this run's final state (whatever it was); the state Prefect took, if it did."""
    result = await client.set_flow_run_state(UUID(this_run), state, force=True)
    return result.state if result.status == SetStateStatus.ACCEPT else None


async def end_superseded(
    this_run: str, successor: str | None, log: LoggingAdapter
) -> State[Any] | None:
    """This run lost its workflow to ``successor`` (a newer flow run): say so, and end it
    Cancelled/Superseded, naming that run, rather than failed."""
    name = successor or "a newer run"
    try:
        async with get_client() as client:
            if successor:
                name = repr((await client.read_flow_run(UUID(successor))).name)
            message = f"Superseded by run {name} ({successor}), which carries the workflow on."
            ended = await _set_final(client, this_run, Cancelled(name=SUPERSEDED, message=message))
    except Exception as exc:  # noqa: BLE001 - the store's epoch already stopped this run
        log.warning(f"Could not mark this run superseded ({exc}).")
        return None
    log.warning(f"This run was superseded by run {name}; it stops here and does nothing more.")
    return ended


async def end_over_budget_run(
    this_run: str, over: OverBudget, log: LoggingAdapter
) -> State[Any] | None:
    """The run's workflow reached a limit and was ended for it: end the run Cancelled,
    named "Over budget", with the limit and how to carry the workflow on."""
    wf = over.workflow_id
    carry_on = (
        f"resume it once Coder's limit has reset or been raised (prefect-coder workflows "
        f"resume {wf})"
        if over.by_coder
        else f"resume it with a higher limit (prefect-coder workflows resume {wf} {_flag(over)} …)"
    )
    message = (
        f"Over budget: {over.why}. Its chat is archived and nothing relaunches it; "
        f"{carry_on} to carry it on."
    )
    try:
        async with get_client() as client:
            ended = await _set_final(client, this_run, Cancelled(name=OVER_BUDGET, message=message))
    except Exception as exc:  # noqa: BLE001 - the store already says it is over budget
        log.warning(f"Could not mark this run over budget ({exc}).")
        return None
    log.warning(message)
    return ended


def _flag(over: OverBudget) -> str:
    """The ``workflows resume`` option that raises the limit ``over`` reached."""
    return f"--{(over.limit or 'max_tokens').replace('_', '-')}"


async def end_cancelled_run(
    this_run: str, workflow_id: str, log: LoggingAdapter
) -> State[Any] | None:
    """A person cancelled this run and its workflow was ended for it: end the run Cancelled,
    saying so (its process was still going, so nothing had ended it yet)."""
    message = (
        f"Cancelled by a person: workflow {workflow_id} is ended (its chat archived, stored "
        "cancelled); this run does nothing more."
    )
    try:
        async with get_client() as client:
            ended = await _set_final(client, this_run, Cancelled(message=message))
    except Exception as exc:  # noqa: BLE001 - the store's epoch already stopped this run
        log.warning(f"Could not mark this run cancelled ({exc}).")
        return None
    log.warning(message)
    return ended


async def end_lost(
    this_run: str, why: str, log: LoggingAdapter, workflows: int = 1
) -> State[Any] | None:
    """The store stayed out of reach through every retry: nothing of the workflow failed,
    its run is lost. End it Crashed, saying so, for the orphan sweep to relaunch (a run
    that ended Failed is never relaunched: it would only fail again). The state it ended
    in; ``None`` when Prefect's API is out of reach too, and the run fails as it would
    have. A run of many workflows says how many it left."""
    left = "the workflow was" if workflows == 1 else f"{workflows} workflows were"
    message = (
        f"Lost the durable store ({why}); {left} left running for the orphan sweep to relaunch."
    )
    try:
        async with get_client() as client:
            ended = await _set_final(client, this_run, Crashed(message=message))
    except Exception as exc:  # noqa: BLE001 - then it fails, as it would have
        log.warning(f"Could not mark this run lost ({exc}).")
        return None
    log.error(f"This run stops here: {message}")
    return ended


async def marked_superseded(flow_run_id: str) -> bool:
    """Whether the run was marked superseded by the run that took its workflow over."""
    try:
        async with get_client() as client:
            state = (await client.read_flow_run(UUID(flow_run_id))).state
    except Exception:  # noqa: BLE001 - Prefect's API out of reach: not known to be
        return False
    return state is not None and state.name == SUPERSEDED


def stopped_after_its_end(workflow_id: str, state: str) -> State[Any]:
    """The state of a run whose process stopped once its workflow had ended (the store says
    so) but before it told Prefect: nothing was left for it to do, nothing is relaunched."""
    return Crashed(
        message=(
            f"Its process stopped after workflow {workflow_id} {state} (the store says so), "
            "before it could tell Prefect; nothing was left to do."
        )
    )
