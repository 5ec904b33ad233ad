"""How a workflow's flow runs read in Prefect: named by workflow and epoch, a run that
was replaced marked superseded, and a progress artifact kept up to date.

None of this decides anything durable (the store's epoch does); it is what a person
reads in the UI, so a failure here is logged and never fails the workflow.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.actions import LogCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.context import FlowRunContext
from prefect.logging.loggers import LoggingAdapter
from prefect.states import Cancelled, Crashed

from coder_chat.durable.step import StepResult

#: Deployment names by id, read once per process.
_DEPLOYMENT_NAMES: dict[UUID, str] = {}

#: The name of the state a replaced run ends in (a kind of Cancelled).
SUPERSEDED = "Superseded"

#: The tag of a run refused because its code asks a step another prompt than it ran
#: (``PromptChanged``): the sweep does not relaunch a workflow again on the same code.
REFUSED = "prefect-coder:refused"

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


#: Names Prefect makes up for a run (``crafty-otter``; the run form fills in ones like
#: ``xi3-aguateca-g``), and names of ours from an earlier try of the same run (a suspended
#: run resumes under the name it had).
_OURS = re.compile(r" · (epoch \d+|already finished|replaying)$|^\d+ workflows?: ")
_MADE_UP = re.compile(
    r"^[a-z0-9]+(-[a-z0-9]+)+$| · (epoch \d+|already finished|replaying|resumed)$"
)


def began_a_workflow(run_name: str) -> bool:
    """Whether a run's name is one a run gets once it began its workflow."""
    return bool(_OURS.search(run_name))


def workflow_tag(workflow_id: str) -> str:
    """The tag every flow run of a workflow carries: the UI's tag filter lists them all."""
    return f"workflow:{workflow_id}"


async def name_the_run(
    this_run: str, current_name: str, name: str, log: LoggingAdapter, *, tag: str | None = None
) -> str:
    """Name this run ``name`` (and give it ``tag``): runs are found by their workflow and
    epoch. A name that looks given by a person (nothing tells it apart from the one the run
    form fills in) is replaced with a word in the log, never silently. Returns the run's
    name."""
    tags = _current_tags()
    missing = tag is not None and tag not in tags
    if current_name == name and not missing:
        return name
    if current_name and current_name != name and not _MADE_UP.search(current_name):
        log.info(
            f"This run was named {current_name!r}; it is renamed {name!r}, after its "
            "workflow and epoch, so that its runs are found together."
        )
    await rename(this_run, name, log, tags=[*tags, tag] if missing and tag else None)
    return name


def _current_tags() -> list[str]:
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    return list(run.tags) if run is not None else []


async def rename(
    this_run: str, name: str, log: LoggingAdapter, *, tags: list[str] | None = None
) -> None:
    try:
        async with get_client() as client:
            await client.update_flow_run(UUID(this_run), name=name, tags=tags)
    except Exception as exc:  # noqa: BLE001 - names are for people; the epoch already fences
        log.warning(f"Could not name this run {name!r} ({exc}).")
        return
    _renamed_here(this_run, name, tags)


async def tag_refused(this_run: str, log: LoggingAdapter) -> None:
    """Tag this run :data:`REFUSED` (a word for the sweep; nothing durable hangs on it)."""
    tags = _current_tags()
    if REFUSED in tags:
        return
    try:
        async with get_client() as client:
            await client.update_flow_run(UUID(this_run), tags=[*tags, REFUSED])
    except Exception as exc:  # noqa: BLE001 - the sweep then relaunches it, and it is refused again
        log.warning(f"Could not tag this run refused ({exc}).")


def _renamed_here(this_run: str, name: str, tags: list[str] | None) -> None:
    """This process's own record of its run, renamed too (as Prefect does when it names a
    run itself): the loggers made from now on, task runs' included, say the new name on
    the console, not the one Prefect made up."""
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None or str(run.id) != this_run:
        return
    run.name = name
    if tags is not None:
        run.tags = tags


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


async def end_superseded(this_run: str, successor: str | None, log: LoggingAdapter) -> None:
    """This run lost its workflow to ``successor`` (a newer flow run): say so, and end it
    Cancelled/Superseded, naming that run, rather than failed."""
    name = successor or "a newer run"
    try:
        async with get_client() as client:
            if successor:
                name = repr((await client.read_flow_run(UUID(successor))).name)
            message = f"Superseded by run {name} ({successor}), which carries the workflow on."
            await client.set_flow_run_state(
                UUID(this_run), Cancelled(name=SUPERSEDED, message=message), force=True
            )
    except Exception as exc:  # noqa: BLE001 - the store's epoch already stopped this run
        log.warning(f"Could not mark this run superseded ({exc}).")
        return
    log.warning(f"This run was superseded by run {name}; it stops here and does nothing more.")


async def end_cancelled_run(this_run: str, workflow_id: str, log: LoggingAdapter) -> None:
    """A person cancelled this run and its workflow was ended for it: end the run Cancelled,
    saying so (its process was still going, so nothing had ended it yet)."""
    message = (
        f"Cancelled by a person: workflow {workflow_id} is ended (its chat archived, stored "
        "cancelled); this run does nothing more."
    )
    try:
        async with get_client() as client:
            await client.set_flow_run_state(UUID(this_run), Cancelled(message=message), force=True)
    except Exception as exc:  # noqa: BLE001 - the store's epoch already stopped this run
        log.warning(f"Could not mark this run cancelled ({exc}).")
        return
    log.warning(message)


async def end_lost(this_run: str, why: str, log: LoggingAdapter, workflows: int = 1) -> bool:
    """The store stayed out of reach through every retry: nothing of the workflow failed,
    its run is lost. End it Crashed, saying so, for the orphan sweep to relaunch (a run
    that ended Failed is never relaunched: it would only fail again). ``False`` when
    Prefect's API is out of reach too, and the run fails as it would have. A run of many
    workflows says how many it left."""
    left = "the workflow was" if workflows == 1 else f"{workflows} workflows were"
    message = (
        f"Lost the durable store ({why}); {left} left running for the orphan sweep to relaunch."
    )
    try:
        async with get_client() as client:
            await client.set_flow_run_state(UUID(this_run), Crashed(message=message), force=True)
    except Exception as exc:  # noqa: BLE001 - then it fails, as it would have
        log.warning(f"Could not mark this run lost ({exc}).")
        return False
    log.error(f"This run stops here: {message}")
    return True


async def marked_superseded(flow_run_id: str) -> bool:
    """Whether the run was marked superseded by the run that took its workflow over."""
    try:
        async with get_client() as client:
            state = (await client.read_flow_run(UUID(flow_run_id))).state
    except Exception:  # noqa: BLE001 - Prefect's API out of reach: not known to be
        return False
    return state is not None and state.name == SUPERSEDED


@dataclass
class Progress:
    """A flow run's progress artifact: ``step k of N`` (or workflows), each item's outcome.

    Updated in place as items finish, at most about once a second (each update is a call
    to Prefect's API, which a fleet shares), and once more at the end.
    """

    title: str
    total: int | None
    key: str
    unit: str = "step"
    took_over_from: str | None = None
    lines: list[str] = field(default_factory=list)
    #: What the run waits for now (a person's answer, say), if anything.
    waiting_for: str | None = None
    every: float = 1.0
    _artifact: UUID | None = None
    _published_at: float = -float("inf")
    _dirty: bool = False

    async def start(self) -> None:
        await self._publish()

    async def advance(self, line: str) -> None:
        """One more item done; ``line`` says how it ended."""
        self.lines.append(line)
        self._dirty = True
        if time.monotonic() - self._published_at >= self.every or len(self.lines) == self.total:
            await self._publish()

    async def wait(self, what: str | None) -> None:
        """The run waits for ``what`` now (``None``: no longer): said at once, with every
        item done so far, since a waiting run may wait for days."""
        self.waiting_for = what
        await self._publish()

    async def flush(self, *, finished: bool = False) -> None:
        """Publish what changed since the last update (``finished``: all of it is done; that
        last word is tried again a few times, as no later update would mend it)."""
        if finished and not self.total:
            self.total = max(len(self.lines), 1)
            self._dirty = True
        for pause in (0.5, 2.0, None) if finished else (None,):
            if not self._dirty:
                return
            await self._publish()
            if self._dirty and pause is not None:
                await asyncio.sleep(pause)

    def description(self) -> str:
        of = f" of {self.total}" if self.total else ""
        head = f"**{self.title}**: {self.unit} {len(self.lines)}{of} done."
        took_over = [f"Took over from run {self.took_over_from!r}."] if self.took_over_from else []
        waiting = [f"Waiting for {self.waiting_for}."] if self.waiting_for else []
        items = (f"- {line}" for line in self.lines)
        return "\n".join([head, *took_over, *waiting, *items])

    async def _publish(self) -> None:
        # With no total known (a flow that decides its turns as it goes) there is no share
        # to show until the end.
        percent = 100.0 * min(len(self.lines), self.total) / self.total if self.total else 0.0
        self._published_at, self._dirty = time.monotonic(), False
        try:
            if self._artifact is None:
                self._artifact = await acreate_progress_artifact(
                    percent, key=self.key, description=self.description()
                )
            else:
                await aupdate_progress_artifact(self._artifact, percent, self.description())
        except Exception:  # noqa: BLE001 - for people: Prefect's API down must not fail the work
            self._dirty = True  # the next update, or the last, tries again


async def publish_transcript(
    workflow_id: str, prompts: Sequence[str], results: Sequence[StepResult], log: LoggingAdapter
) -> None:
    """A markdown artifact of the workflow's steps: prompt, verdict and answer of each.

    Built from what the steps returned, so it costs no request to Coder.
    """
    rows = [
        f"| {r.step} | {r.verdict} | {_cell(p)} | {_cell(r.text)} |"
        for p, r in zip(prompts, results, strict=True)
    ]
    lines = [
        f"# Workflow `{workflow_id}`",
        f"Chat `{results[-1].chat_id}`.",
        "",
        "| step | verdict | prompt | answer |",
        "| --- | --- | --- | --- |",
        *rows,
    ]
    try:
        await acreate_markdown_artifact(
            markdown="\n".join(lines),
            key=f"transcript-{slug(workflow_id)}",
            description=f"Durable chat {workflow_id}",
        )
    except Exception as exc:  # noqa: BLE001 - for people, like the progress artifact
        log.warning(f"Could not publish the transcript of workflow {workflow_id} ({exc}).")


def _cell(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def slug(text: str) -> str:
    """An artifact key for ``text``: lowercase ASCII letters, digits and dashes (any other
    letter too would make a key Prefect refuses, and a file name too long for its bytes)."""
    kept = (c if c.isascii() and c.isalnum() else "-" for c in text.lower())
    return "".join(kept)[:80].strip("-") or "workflow"


async def deployment_name() -> str:
    """The name of the deployment this flow run was started from; ``local`` for a run
    started otherwise (a subflow too: a relaunch from its parent's deployment would not
    take its parameters).

    Read from the run's context, and the name from the API once per deployment and
    process: ``prefect.runtime.deployment.name`` asks the API from another thread on
    every call, and the event loop waits for it (for a run with no deployment, too).
    """
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None or run.deployment_id is None:
        return "local"
    name = _DEPLOYMENT_NAMES.get(run.deployment_id)
    if name is None:
        async with get_client() as client:
            name = (await client.read_deployment(run.deployment_id)).name
        _DEPLOYMENT_NAMES[run.deployment_id] = name
    return name
