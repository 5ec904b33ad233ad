"""How a workflow's flow runs read in Prefect: named by workflow and epoch, a run that
was replaced marked superseded, and a progress artifact kept up to date.

None of this decides anything durable (the store's epoch does); it is what a person
reads in the UI, so a failure here is logged and never fails the workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.actions import LogCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.logging.loggers import LoggingAdapter
from prefect.states import Cancelled

#: States of a replaced run worth correcting: it never finished, so it looks alive or crashed.
_UNFINISHED = {
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
    StateType.CRASHED,
}


def run_name(workflow_id: str, epoch: int) -> str:
    """``trip-7 · epoch 2``: which workflow a run is, and which of its runs."""
    return f"{workflow_id} · epoch {epoch}"


async def name_and_supersede(
    workflow_id: str, epoch: int, this_run: str, previous_run: str | None, log: LoggingAdapter
) -> str | None:
    """Name this run after its workflow and epoch; mark the run it replaces superseded.

    Returns the replaced run's name, when there was one to mark.
    """
    name = run_name(workflow_id, epoch)
    try:
        async with get_client() as client:
            await client.update_flow_run(UUID(this_run), name=name)
    except Exception as exc:  # noqa: BLE001 - names are for people; the epoch already fences
        log.warning(f"Could not name this run {name!r} ({exc}).")
    return await supersede(previous_run, this_run, name, log)


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
    await client.set_flow_run_state(
        old.id, Cancelled(name="Superseded", message=message), force=True
    )
    tasks = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[old.id]))
    )
    for task_run in tasks:
        if task_run.state_type in _UNFINISHED:
            await client.set_task_run_state(
                task_run.id, Cancelled(name="Superseded", message=message), force=True
            )
    await client.create_logs(
        [
            LogCreate(
                name="prefect.flow_runs.coder",
                level=30,
                message=f"This run was superseded by run {new_name!r} ({new_id}), which carries on.",
                timestamp=datetime.now(UTC),
                flow_run_id=old.id,
            )
        ]
    )


@dataclass
class Progress:
    """A flow run's progress artifact: ``step k of N`` (or workflows), each item's outcome.

    Updated in place as items finish, so the run page always shows where it is.
    """

    title: str
    total: int
    unit: str = "step"
    took_over_from: str | None = None
    lines: list[str] = field(default_factory=list)
    _artifact: UUID | None = None

    async def start(self) -> None:
        await self._publish()

    async def advance(self, line: str) -> None:
        """One more item done; ``line`` says how it ended."""
        self.lines.append(line)
        await self._publish()

    def description(self) -> str:
        head = f"**{self.title}**: {self.unit} {len(self.lines)} of {self.total} done."
        took_over = [f"Took over from run {self.took_over_from!r}."] if self.took_over_from else []
        return "\n".join([head, *took_over, *(f"- {line}" for line in self.lines)])

    async def _publish(self) -> None:
        percent = 100.0 * len(self.lines) / max(self.total, 1)
        if self._artifact is None:
            self._artifact = await acreate_progress_artifact(
                percent, key=f"progress-{slug(self.title)}", description=self.description()
            )
        else:
            await aupdate_progress_artifact(self._artifact, percent, self.description())


def slug(text: str) -> str:
    """An artifact key for ``text``: lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in text.lower())[:80].strip("-") or "workflow"
