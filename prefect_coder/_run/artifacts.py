"""What a run publishes for people: its progress, and the workflow's transcript. A failure
here is logged and never fails the work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)
from prefect.logging.loggers import LoggingAdapter

from coder_chat.durable.step import (
    StepResult,
)
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.naming import (
    slug,
)


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
    #: A last line, once the work is done (what the workflow used in all).
    footer: str | None = None
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

    async def end(self, footer: str | None = None) -> None:
        """All of it is done; ``footer``: a last line (what the work used in all)."""
        if footer:
            self.footer, self._dirty = footer, True
        await self.flush(finished=True)

    def description(self) -> str:
        of = f" of {self.total}" if self.total else ""
        head = f"**{self.title}**: {self.unit} {len(self.lines)}{of} done."
        took_over = [f"Took over from run {self.took_over_from!r}."] if self.took_over_from else []
        waiting = [f"Waiting for {self.waiting_for}."] if self.waiting_for else []
        items = (f"- {line}" for line in self.lines)
        footer = ["", self.footer] if self.footer else []
        return "\n".join([head, *took_over, *waiting, *items, *footer])

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
    workflow_id: str,
    prompts: Sequence[str],
    results: Sequence[StepResult],
    total: UsageTotals,
    log: LoggingAdapter,
) -> None:
    """A markdown artifact of the workflow's steps: prompt, verdict, answer and usage of
    each, and what the workflow used in all (``total``).

    Built from what the steps returned, so it costs no request to Coder.
    """
    rows = [
        f"| {r.step} | {r.verdict} | {_cell(p)} | {_cell(r.text)} | {_used(r.usage)} |"
        for p, r in zip(prompts, results, strict=True)
    ]
    lines = [
        f"# Workflow `{workflow_id}`",
        f"Chat `{results[-1].chat_id}`.",
        f"Used in all: {total.describe()}." if total.messages else "",
        "",
        "| step | verdict | prompt | answer | used |",
        "| --- | --- | --- | --- | --- |",
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


def _used(usage: UsageTotals) -> str:
    return usage.brief() if usage.messages else "not recorded"


def _cell(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
