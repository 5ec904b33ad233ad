"""A flow run's hold on one workflow: begun (or replayed), kept alive, and ended as the
flow left it. ``DurableChat`` takes its turns through one and decides nothing of this.

Beginning takes the workflow's next fencing epoch (so a superseded run can never act
again), names the flow run after it, marks the run it replaces superseded, and keeps a
heartbeat for the orphan sweep. A workflow that ran before is replayed first: nothing is
taken until the run goes on past its finished steps (:meth:`Hold.go_on`), so a run
refused on the way leaves the workflow exactly as it was.

Ending is the failure policy, in one place (:meth:`Hold.end`): a finished workflow is
archived and stored finished; a definitive failure archives it and marks it failed; a
newer run's fence ends this run *Superseded*; a store lost through every retry ends it
*Crashed* for the sweep; a crash, a cancellation, a pause or a failure the flow retries
ends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from prefect.context import FlowRunContext
from prefect.exceptions import MissingContextError
from prefect.logging.loggers import LoggingAdapter
from prefect.runtime import flow_run as current_flow_run

from coder_chat import CoderConfigError, CoderError, CoderStoreError, is_retryable
from coder_chat.durable.budget import OverBudget
from coder_chat.durable.context import StepTools
from coder_chat.durable.records import AfterSteps, PromptChanged, WorkflowState
from coder_chat.durable.step import StepResult, check_sent_prompt, labelled_chats
from coder_chat.durable.store import FencedOut
from prefect_coder._run.artifacts import Progress, publish_transcript
from prefect_coder._run.ending import (
    after_last_step,
    archive_idle_chat,
    end_failed_workflow,
    reopen_chat,
    retire_workflow_chat,
)
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import (
    end_cancelled_run,
    end_lost,
    end_over_budget_run,
    end_superseded,
    marked_superseded,
    supersede,
)
from prefect_coder._run.naming import (
    deployment_name,
    name_the_run,
    replay_name,
    replaying_name,
    run_name,
    slug,
    tag_refused,
    workflow_tag,
)
from prefect_coder._run.pulse import Pulse
from prefect_coder._run.runtime import Ledger
from prefect_coder._run.story import progress_line, tally, workflow_usage
from prefect_coder._run.workflow import (
    Began,
    Workflow,
    WorkflowRun,
    begin_workflow,
    finish_workflow,
    heartbeat_forever,
    take_epoch,
)
from prefect_coder.blocks import CoderCredentials
from prefect_coder.exceptions import (
    StoreLost,
    Superseded,
    WorkflowCancelled,
    WorkflowFinished,
    WorkflowOverBudget,
)
from prefect_coder.imports import ToolLike, resolve_tools
from prefect_coder.settings import WorkflowSettings

#: Ends a person may carry a workflow on from (``prefect-coder workflows resume``).
ENDED_BY_FAILURE = frozenset(
    {WorkflowState.FAILED, WorkflowState.CANCELLED, WorkflowState.OVER_BUDGET}
)


class Hold:
    """One flow run's hold on one workflow, from its beginning to its end.

    ``owns_run``: the workflow is its flow run's only one, so the run is named after it,
    has its progress and transcript artifacts, and marks the run it replaces superseded;
    a run of many workflows does those itself.
    """

    def __init__(
        self,
        workflow_id: str,
        *,
        credentials: CoderCredentials | None,
        ledger: Ledger | None,
        tools: Sequence[ToolLike],
        settings: WorkflowSettings,
        expected_turns: int | None,
        owns_run: bool,
    ) -> None:
        self.workflow_id = workflow_id
        self.credentials, self.ledger = credentials, ledger
        self.tools = tuple(tools)
        self.settings = settings
        self.expected_turns = expected_turns
        self.owns_run = owns_run
        #: Each turn's result and prompt, in step order (replayed ones first).
        self.results: list[StepResult] = []
        self.prompts: list[str] = []
        self.began: Began | None = None
        #: The name of the run this one took over from, when it marked it superseded.
        self.took_over_from: str | None = None
        #: The chat this run archived at the workflow's end (its id), if it did.
        self.archived_chat: str | None = None
        #: What the chat ran past the last step, read when the workflow finished here.
        self.after_steps: AfterSteps | None = None
        self._heart: asyncio.Task[None] | None = None
        #: Tells Prefect this run is alive while it holds the workflow (its own flow run's).
        self._pulse: Pulse | None = None
        self._progress: Progress | None = None

    @property
    def run(self) -> WorkflowRun:
        if self.began is None:
            raise CoderConfigError("use the DurableChat in 'async with' before taking turns")
        return self.began.run

    # -- begin --------------------------------------------------------------------------
    async def begin(self) -> None:
        """Begin the workflow, or replay it when it ran before. A failure on the way (its
        tools would not import, say) still ends it, as a failure of the flow would."""
        log = log_here()
        # Begun even when its tools fail to import, so that the failure still ends it
        # (archived, marked failed) rather than leave it to the sweep.
        failure: CoderError | None = None
        try:
            tools = resolve_tools(self.tools, allow_plain=self.settings.allow_plain_tools)
        except CoderError as exc:
            tools, failure = StepTools(), exc
        began = self.began = await self._begin(await self._workflow(tools))
        if began.finished_before:
            log.info(
                f"Workflow {self.workflow_id} finished in an earlier run: its finished steps "
                "come from the store, and nothing is sent or written again."
            )
            await self._name_run(replay_name(self.workflow_id), log)
            return
        if began.replay:
            log.info(
                f"Workflow {self.workflow_id}: {len(began.stored)} step(s) finished in earlier "
                "runs come from the store; this run takes the workflow over at its first new "
                "step, and changes nothing before."
            )
            # Named as ours from the start: a long replay is not taken for a run lost
            # before it began (the sweep relaunches those).
            await self._name_run(replaying_name(self.workflow_id), log)
            if failure is not None:
                await self.end(failure)
                raise failure
            return
        try:
            if failure is not None:
                raise failure
            await self._started(log)
        except BaseException as exc:
            await self.end(exc)
            raise

    async def _workflow(self, tools: StepTools) -> Workflow:
        return Workflow(
            self.workflow_id,
            deployment=await deployment_name(),
            flow_run_id=current_flow_run.id,
            credentials=self.credentials,
            ledger=self.ledger,
            settings=self.settings,
            tools=tools,
            expected_turns=self.expected_turns,
            shares_run=not self.owns_run,
        )

    async def _begin(self, workflow: Workflow) -> Began:
        try:
            return await begin_workflow(workflow)
        except CoderStoreError as exc:
            await self._lost(exc, log_here())
            raise

    async def _name_run(self, name: str, log: LoggingAdapter) -> str:
        """Name this flow run ``name`` and tag it with its workflow, when it owns the run."""
        run_id = self.run.workflow.flow_run_id
        if not self.owns_run or run_id is None:
            return name
        tag = workflow_tag(self.workflow_id)
        return await name_the_run(run_id, current_flow_run.name or "", name, log, tag=tag)

    async def _started(self, log: LoggingAdapter) -> None:
        """This run holds the workflow now: beat, and say so where a person looks."""
        run = self.run
        self._heart = asyncio.create_task(heartbeat_forever(run, log.warning))
        if not self.owns_run:
            return
        first = "its first run" if run.fence.epoch == 1 else f"run {run.fence.epoch}"
        log.info(f"Workflow {self.workflow_id}: this is {first} (epoch {run.fence.epoch}).")
        name = await self._name_run(run_name(self.workflow_id, run.fence.epoch), log)
        if run.workflow.flow_run_id is not None:
            self.took_over_from = await supersede(
                self.previous_run, run.workflow.flow_run_id, name, log
            )
        self._pulse = Pulse(self.settings.pulse_seconds)
        self._pulse.start(name)
        self._progress = Progress(
            self.workflow_id,
            self.expected_turns,
            key=f"progress-{slug(self.workflow_id)}",
            took_over_from=self.took_over_from,
            lines=[progress_line(r) for r in self.results],  # replayed before it took over
        )
        await self._progress.start()

    @property
    def previous_run(self) -> str | None:
        """The flow run that held the workflow before this one, while it was running."""
        return self.began.previous_run if self.began else None

    # -- while it holds the workflow ------------------------------------------------------
    async def go_on(self, prompt: str | None = None) -> None:
        """This run goes past what the workflow's earlier runs did, so it takes the
        workflow over (its next epoch). A workflow that finished goes on only when its
        chat was kept (``archive_at_end`` off). ``prompt``: the turn it goes on with,
        checked first against a send of the same step an earlier run left in flight, so
        that a changed prompt is refused before anything is taken."""
        began = self.held()
        if began.finished_before and (began.before is None or began.before.archive_at_end):
            raise WorkflowFinished(
                f"workflow {self.workflow_id!r} finished after {len(began.stored)} step(s) "
                "and archived its chat, so it takes no more turns; use a new workflow id"
            )
        if prompt is not None:
            await self._refuse_a_changed_send(began, prompt)
        run, before = began.run, began.before
        run.fence = await take_epoch(run.runtime, run.workflow)
        began.replay = False
        await self._started(log_here())
        if before is not None and before.state in ENDED_BY_FAILURE and before.chat_id:
            # Resumed after it failed or was cancelled: its chat was archived then.
            chat_id = before.chat_id
            await run.retried(lambda: reopen_chat(run, chat_id, log_here().info))

    async def _refuse_a_changed_send(self, began: Began, prompt: str) -> None:
        """Raise :class:`PromptChanged` when an earlier run left this step in flight with
        another prompt (one read of the chat's history, only in that case). A first
        step's send made the chat, so when no checkpoint holds a chat yet (its process
        died first), the chat is the newest labelled with the workflow (one more read)."""
        step, before = len(self.results) + 1, began.before
        if before is None or step in began.stored:
            return
        ctx = began.run.step_context(step, log_here().info)
        chat_id = before.chat_id if step == began.last_sent_step else None
        if before.chat_id is None:
            found = await began.run.retried(lambda: labelled_chats(ctx))
            chat_id = str(found[0].id) if found else None
        if chat_id is None:
            return
        sent_on = chat_id
        await began.run.retried(lambda: check_sent_prompt(ctx, prompt, sent_on))

    async def record(self, prompt: str, result: StepResult) -> None:
        """A turn is done (run, recovered or replayed): kept, and shown in the progress."""
        self.results.append(result)
        self.prompts.append(prompt)
        if self._progress is not None:
            await self._progress.advance(progress_line(result))

    @contextlib.asynccontextmanager
    async def waiting(self, what: str, *, suspend: bool) -> AsyncIterator[None]:
        """The run waits for ``what`` (a person's answer): said in its progress at once;
        ``suspend``: its process leaves meanwhile, so its pulse stops (silence is no death)."""
        if self._progress is not None:
            how = " (the run is suspended: it leaves its worker until then)" if suspend else ""
            await self._progress.wait(f"{what}{how}")
        if suspend and self._pulse is not None:
            self._pulse.stop()
        yield
        if suspend and self._pulse is not None:
            self._pulse.restart()  # answered already: this run goes on
        if self._progress is not None:
            self._progress.waiting_for = None  # said with the next step's line

    # -- end ----------------------------------------------------------------------------
    async def end(self, exc: BaseException | None) -> None:
        """End the workflow as ``exc`` says (``None``: the flow left it normally)."""
        log = log_here()
        await self._stop_beating()
        began = self.began
        if began is None:
            return
        if isinstance(exc, PromptChanged | WorkflowFinished):
            log.error(f"{_capitalised(str(exc))} {self._left_as_it_was(began)}")
            if isinstance(exc, PromptChanged) and current_flow_run.id:
                await tag_refused(current_flow_run.id, log)
            return
        if began.replay:
            if began.finished_before or not _ends_workflow(exc):
                return  # nothing was taken, so nothing is left to end
            # It ran before and this run replayed it to its end (or failed on the way):
            # ending it is acting for it, so this run takes it over first.
            try:
                await self.go_on()
            except CoderStoreError as lost:
                await self._lost(lost, log)
                raise
            await self._stop_beating()
        await self._end_held(exc, log)

    async def _end_held(self, exc: BaseException | None, log: LoggingAdapter) -> None:
        """End the workflow this run holds, as ``exc`` (``None``: it finished) says."""
        if exc is None:
            try:
                await self._finished(log)
            except FencedOut as fenced:
                # Its turns all came from the store (a successor had finished them while
                # this run was cut off); ending the workflow is the successor's to do.
                await self._superseded(fenced, log)
            except CoderStoreError as lost:
                # Every turn finished, but the store is gone before the workflow is marked
                # finished: a relaunch finds the turns stored and ends it (Failed would
                # leave it for the sweep to mark failed).
                await self._lost(lost, log)
                raise
        elif isinstance(exc, FencedOut):
            await self._superseded(exc, log)
        elif isinstance(exc, OverBudget):
            await self._over_budget(exc, log)
        elif isinstance(exc, Exception) and not _will_retry():
            await self._failed(exc, log)
        # Anything else ends nothing: a crash, a cancellation, a pause or suspension
        # (the run resumes), or a failure the flow's own retries take again.

    async def _failed(self, exc: Exception, log: LoggingAdapter) -> None:
        """The workflow failed for good: archived and marked failed, unless it was lost
        with the store or a newer run holds it."""
        if await self._was_superseded():
            await self._superseded(exc, log)  # its failure came after it lost the workflow
        await self._lost(exc, log)
        log.error(f"Workflow {self.workflow_id} failed: {exc}")
        try:
            ended = await end_failed_workflow(self.run, log)
        except FencedOut:
            ended = False
        if not ended:  # a newer run took the workflow while this one was ending it
            await self._superseded(exc, log)

    async def _over_budget(self, exc: OverBudget, log: LoggingAdapter) -> None:
        """The workflow reached a limit: archived and stored over budget, and (a run of its
        own) the run ended *Cancelled: Over budget*; it takes no further turn and nothing
        relaunches it. Not retried: the same limit stops it again."""
        if await self._was_superseded():
            await self._superseded(exc, log)
        try:
            ended = await end_failed_workflow(self.run, log, WorkflowState.OVER_BUDGET)
        except FencedOut:
            ended = False
        if not ended:
            await self._superseded(exc, log)
        run_id = current_flow_run.id
        if not self.owns_run or not run_id:
            raise exc
        marked = await end_over_budget_run(run_id, exc, log)
        raise WorkflowOverBudget(str(exc), marked) from exc

    def _left_as_it_was(self, began: Began) -> str:
        """What a refused run says of the workflow it was refused for."""
        if not began.replay:
            return "The workflow is left as it was."
        return (
            "This run took nothing from the workflow: it is left exactly as it was (its runs, "
            "epoch and state), for its own runs to carry on. To change a prompt for workflows "
            'already past it, put the change behind chat.patched("a-name").'
        )

    async def _finished(self, log: LoggingAdapter) -> None:
        run = self.run
        archived = None
        if run.workflow.settings.archive_at_end:
            archived = await run.retried(lambda: self._archive(log))
        self.after_steps = await after_last_step(run, self.results, archived)
        used = workflow_usage(self.results, self.after_steps)
        if self.owns_run and self.results:
            await publish_transcript(self.workflow_id, self.prompts, self.results, used, log)
        await finish_workflow(run, WorkflowState.FINISHED, self.after_steps)
        self.archived_chat = archived
        if self._progress is not None:
            said = f"In all, the workflow used {used.describe()}." if used.messages else None
            await self._progress.end(said)
        if self.owns_run:
            # A run of many workflows says this in its progress artifact, one line each,
            # instead of a log line each (about a millisecond apiece in Prefect's handlers).
            log.info(f"Workflow {self.workflow_id} is finished: {self.summary()}.")

    def summary(self) -> str:
        """``3 step(s), 3 ran; its chat … is archived``: how the workflow ended here."""
        chat = f"; its chat {self.archived_chat} is archived" if self.archived_chat else ""
        return f"{tally(self.results, self.after_steps)}{chat}"

    async def _archive(self, log: LoggingAdapter) -> str | None:
        """Archive the chat once, and return its id when it is archived: one request when
        this run's last turn left it idle; else (no turn ran here, or a prompt that landed
        late is running) settle and answer it first, from the ledger, and say what was done."""
        last = self.results[-1] if self.results else None
        # A turn of this run saw the chat settle: archiving it is one request.
        if (
            last is not None
            and last.verdict in ("ran", "recovered", "resubmitted")
            and await archive_idle_chat(self.run, last.chat_id)
        ):
            return last.chat_id
        retired = await retire_workflow_chat(self.run, log.info)
        return retired.chat_id if retired is not None and retired.done else None

    async def _lost(self, exc: Exception, log: LoggingAdapter) -> None:
        """If the store was out of reach through every retry, end the run lost (Crashed,
        for the sweep to relaunch), not failed. Returns when it cannot be said so (not
        the store's passing error, the flow's own retries take it again, or Prefect's
        API is out of reach too). In a run of many workflows, :class:`StoreLost` tells
        that run, which ends itself once the others are done."""
        run_id = current_flow_run.id
        passing = isinstance(exc, CoderStoreError) and is_retryable(exc)
        if not passing or not run_id or _will_retry():
            return
        if not self.owns_run:
            raise StoreLost(str(exc)) from exc
        if (ended := await end_lost(run_id, str(exc), log)) is not None:
            raise StoreLost(str(exc), ended) from exc

    async def _superseded(self, exc: Exception, log: LoggingAdapter) -> None:
        """A newer run holds the workflow: this one does nothing more, and says so.

        Raised out as :class:`Superseded`, so Prefect ends the run *Cancelled:
        Superseded* (naming the run that took over) instead of failed; in a flow run of
        many workflows, as :class:`FencedOut`, for that flow to count.
        """
        run = self.run
        if not self.owns_run or run.workflow.flow_run_id is None:
            if isinstance(exc, FencedOut):
                return
            raise FencedOut(run.fence, None) from exc
        successor = None
        with contextlib.suppress(CoderError):  # the store may be out of reach: still over
            newer = await run.guard.newer()
            successor = newer.flow_run_id if newer is not None else None
        if successor == run.workflow.flow_run_id:
            # The sweep took the workflow for this very run: a person cancelled it.
            ended = await end_cancelled_run(run.workflow.flow_run_id, self.workflow_id, log)
            raise WorkflowCancelled(str(exc), ended) from exc
        ended = await end_superseded(run.workflow.flow_run_id, successor, log)
        raise Superseded(str(exc), ended) from exc

    async def _was_superseded(self) -> bool:
        """Whether a newer run took the workflow while this one failed: its flow run was
        marked superseded, or the store holds a newer epoch. Unknown counts as no."""
        run = self.run
        if run.workflow.flow_run_id is not None and await marked_superseded(
            run.workflow.flow_run_id
        ):
            return True
        try:
            return await run.guard.newer() is not None
        except CoderError:
            return False

    async def _stop_beating(self) -> None:
        if self._pulse is not None:
            self._pulse.stop()
            self._pulse = None
        if self._heart is not None:
            self._heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heart
            self._heart = None

    def held(self, doing: str = "taking turns") -> Began:
        """What :meth:`begin` found; refused, naming what was tried, before it ran."""
        if self.began is None:
            raise CoderConfigError(f"use the DurableChat in 'async with' before {doing}")
        return self.began


def _ends_workflow(exc: BaseException | None) -> bool:
    """Whether leaving the chat this way ends the workflow: it finished, or failed for
    good. A crash, a cancellation, a pause or a failure the flow retries ends nothing."""
    return exc is None or (
        isinstance(exc, Exception) and not isinstance(exc, FencedOut) and not _will_retry()
    )


def _will_retry() -> bool:
    """Whether the flow's own retries will run it again after this failure."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow is None:
        return False
    return context.flow_run.run_count <= (context.flow.retries or 0)


def log_here() -> LoggingAdapter:
    """The run's logger, or a plain one outside a flow run."""
    try:
        return run_log()
    except MissingContextError:
        return logging.LoggerAdapter(logging.getLogger("prefect_coder"))


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]
