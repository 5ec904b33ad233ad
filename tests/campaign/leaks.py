"""The session token must be nowhere our side wrote: files, store rows, the Prefect API.

Per schedule: the store's files, its Postgres rows (dumped as text), every file
under the children's Prefect homes and result storage, and the children's
output. The API's part (log lines, artifacts, flow-run parameters) is read once
for the whole campaign and searched for every schedule's token at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    LogFilter,
    LogFilterTimestamp,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort, LogSort

from tests.lab.leaks import child_places, home_places

from .arena import Arena

PAGE = 200
#: Runs of the characters a urlsafe token is made of; a token hides in one of them.
_TOKENISH = re.compile(rb"[A-Za-z0-9_-]{16,}")


async def schedule_places(arena: Arena) -> dict[str, bytes]:
    """Everything the schedule's side wrote, by place name."""
    places = {f"store {p.name}": p.read_bytes() for p in arena.site.files()}
    places.update(await arena.site.rows())
    places.update(home_places(arena.root, arena.homes()))
    places.update(child_places(arena.lab.children))
    return places


class TokenIndex:
    """Finds any of many tokens in a text at the cost of a regex scan, not one per token."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = {t.encode(): t for t in tokens}
        self.lengths = sorted({len(t) for t in self.tokens})

    def found(self, data: bytes) -> set[str]:
        hits: set[str] = set()
        for run in _TOKENISH.findall(data):
            for length in self.lengths:
                for start in range(len(run) - length + 1):
                    token = self.tokens.get(run[start : start + length])
                    if token is not None:
                        hits.add(token)
        return hits


async def api_leaks(tokens: Iterable[str], since: datetime) -> dict[str, list[str]]:
    """Where in the Prefect API (since ``since``) each token appears: token -> places."""
    index, leaks = TokenIndex(tokens), dict[str, list[str]]()

    def search(place: str, data: bytes) -> None:
        for token in index.found(data):
            leaks.setdefault(token, []).append(place)

    async with get_client() as client:
        runs: list[FlowRun] = []
        flow_runs = FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(after_=since))
        while page := await client.read_flow_runs(
            flow_run_filter=flow_runs,
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=PAGE,
            offset=len(runs),
        ):
            runs += page
        for run in runs:
            search(f"flow run {run.id} parameters", json.dumps(run.parameters).encode())
        for start in range(0, len(runs), PAGE):
            await _search_artifacts(client, [r.id for r in runs[start : start + PAGE]], search)
        await _search_logs(client, since, search)
    return leaks


async def _search_artifacts(
    client: PrefectClient, flow_runs: list[UUID], search: Callable[[str, bytes], None]
) -> None:
    found = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=flow_runs))
    offset = 0
    while page := await client.read_artifacts(artifact_filter=found, limit=PAGE, offset=offset):
        for artifact in page:
            search(f"artifact {artifact.key or artifact.id}", str(artifact.data).encode())
        offset += PAGE


async def _search_logs(
    client: PrefectClient, since: datetime, search: Callable[[str, bytes], None]
) -> None:
    """Every log line since ``since``, paged by timestamp (an offset would rescan the table)."""
    cursor, offset, seen = since, 0, set[UUID]()
    while page := await client.read_logs(
        log_filter=LogFilter(timestamp=LogFilterTimestamp(after_=cursor)),
        limit=PAGE,
        offset=offset,
        sort=LogSort.TIMESTAMP_ASC,
    ):
        fresh = [log for log in page if log.id not in seen]
        for log in fresh:
            seen.add(log.id)
            search(f"log {log.id}", log.message.encode())
        # Lines of one instant repeat on the next page: page on within it, or move on.
        offset = offset + PAGE if not fresh else 0
        cursor = page[-1].timestamp if fresh else cursor
