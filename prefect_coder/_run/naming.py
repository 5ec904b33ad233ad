"""How a workflow's flow runs are named and tagged in Prefect, so that a person finds a
workflow's runs together. Names are for people: the store's epoch decides, never a name."""

from __future__ import annotations

import re
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.logging.loggers import LoggingAdapter

#: The tag of a run refused because its code asks a step another prompt than it ran
#: (``PromptChanged``): the sweep does not relaunch a workflow again on the same code.
REFUSED = "prefect-coder:refused"


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
    return f"{_WORKFLOW_TAG}{workflow_id}"


def tagged_workflow(tags: list[str]) -> str | None:
    """The workflow a run's tags say it held (:func:`workflow_tag`), if any."""
    return next((t.removeprefix(_WORKFLOW_TAG) for t in tags if t.startswith(_WORKFLOW_TAG)), None)


_WORKFLOW_TAG = "workflow:"


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


def slug(text: str) -> str:
    """An artifact key for ``text``: lowercase ASCII letters, digits and dashes (any other
    letter too would make a key Prefect refuses, and a file name too long for its bytes)."""
    kept = (c if c.isascii() and c.isalnum() else "-" for c in text.lower())
    return "".join(kept)[:80].strip("-") or "workflow"


#: Deployment names by id, read once per process.
_DEPLOYMENT_NAMES: dict[UUID, str] = {}


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


def replay_name(workflow_id: str) -> str:
    """The name of a run of a workflow that had finished: it takes no epoch."""
    return f"{workflow_id} · already finished"


def replaying_name(workflow_id: str) -> str:
    """The name of a run replaying a workflow that ran before, until it takes it over."""
    return f"{workflow_id} · replaying"
