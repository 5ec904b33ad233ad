"""The store's own account of every write: its CSV statement log, read back.

The store's PostgreSQL logs every statement (``log_statement=all``) with the
address and port of the connection that sent it and, for the extended protocol
asyncpg speaks, the statement's parameters. A write counts once its transaction
commits: statements are grouped per session between ``BEGIN`` and ``COMMIT`` (a
``ROLLBACK`` or an error in between drops them). A write to ``workflows`` carries
the record's body as a parameter, and with it the epoch and flow run it was
written for: so the log alone says when each epoch was taken, by which run, and
whether any write for an older epoch committed after that.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

WRITES = ("INSERT", "UPDATE", "DELETE")
_PARAM = re.compile(r"\$(\d+) = (NULL|'(?:[^']|'')*')")
#: The table a statement writes: after ``INSERT INTO``, ``UPDATE`` or ``DELETE FROM`` (a
#: ``WITH`` clause before it may read other tables: the fence reads ``workflows``).
_TABLE = re.compile(r'(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?\w+"?\.(\w+)', re.IGNORECASE)
_WRITES_IN_CTE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b")
#: ``begin_run``'s one statement: insert the workflow at epoch 1, or take the next epoch.
_TAKES_EPOCH = "EPOCH = W.EPOCH + 1"
# csvlog columns (PostgreSQL 15) that the reader needs.
TIME, CONNECTION, SESSION, SEVERITY, MESSAGE, DETAIL = 0, 4, 5, 11, 13, 14


@dataclass(frozen=True)
class Write:
    """A committed INSERT, UPDATE or DELETE, as the server saw it."""

    at: datetime
    committed: datetime
    src: str
    table: str
    params: dict[int, str | None]
    #: ``begin_run``'s statement: it took the workflow's next epoch.
    takes_epoch: bool = False

    def mentions(self, value: str) -> bool:
        return any(v == value or (v and f'"{value}"' in v) for v in self.params.values())

    @property
    def body(self) -> dict[str, Any]:
        """The record's JSON body, for the tables that store one."""
        for value in self.params.values():
            if value and value.startswith("{"):
                with_body: dict[str, Any] = json.loads(value)
                return with_body
        return {}

    def describe(self) -> str:
        return f"{self.committed:%H:%M:%S.%f} {self.table} from {self.src}"


def read_writes(folder: Path) -> list[Write]:
    """Every committed write the store logged, in commit order."""
    writes: list[Write] = []
    pending: dict[str, list[Write]] = {}
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="", encoding="utf-8", errors="replace") as handle:
            for row in csv.reader(handle):
                if len(row) > DETAIL:
                    _take(row, pending, writes)
    return sorted(writes, key=lambda w: w.committed)


def _take(row: list[str], pending: dict[str, list[Write]], writes: list[Write]) -> None:
    session, message = row[SESSION], row[MESSAGE]
    at = datetime.fromisoformat(row[TIME].replace(" UTC", "+00:00"))
    statement = message.split(": ", 1)[1].strip().rstrip(";").upper() if ": " in message else ""
    if row[SEVERITY] in ("ERROR", "FATAL", "PANIC"):
        pending.pop(session, None)
    elif statement.startswith(("BEGIN", "START TRANSACTION")):
        pending[session] = []
    elif statement.startswith(("COMMIT", "END")):
        writes += [_committed(w, at) for w in pending.pop(session, [])]
    elif statement.startswith(("ROLLBACK", "ABORT")):
        pending.pop(session, None)
    elif statement.startswith(WRITES) or (
        statement.startswith("WITH") and _WRITES_IN_CTE.search(statement)
    ):
        takes = _TAKES_EPOCH in statement
        write = Write(at, at, row[CONNECTION], _table(message), _params(row[DETAIL]), takes)
        if session in pending:
            pending[session].append(write)
        else:
            writes.append(write)  # outside a transaction: it committed on its own


def _committed(write: Write, at: datetime) -> Write:
    return Write(write.at, at, write.src, write.table, write.params, write.takes_epoch)


def _table(message: str) -> str:
    match = _TABLE.search(message)
    return match.group(1) if match else "?"


def _params(detail: str) -> dict[int, str | None]:
    return {
        int(n): None if v == "NULL" else v[1:-1].replace("''", "'")
        for n, v in _PARAM.findall(detail)
    }


@dataclass(frozen=True)
class EpochTaken:
    workflow_id: str
    epoch: int
    flow_run_id: str
    at: datetime
    src: str


def epochs(writes: list[Write], workflow_id: str) -> list[EpochTaken]:
    """When each epoch of the workflow was taken, and for which flow run.

    ``begin_run`` is one statement that inserts the workflow at epoch 1 or moves it to
    the next: the k-th of them to commit took epoch k. Its run is in its JSON
    parameters (the new row's body, and the fields it changes on a later epoch).
    """
    taken: list[EpochTaken] = []
    for write in writes:
        if write.takes_epoch and write.params.get(2) == workflow_id:
            empty: dict[str, Any] = {}
            run = next((r for r in reversed(_bodies(write)) if r.get("flow_run_id")), empty)
            epoch = len(taken) + 1
            taken.append(
                EpochTaken(
                    workflow_id,
                    epoch,
                    str(run.get("flow_run_id") or ""),
                    write.committed,
                    write.src,
                )
            )
    return taken


def fenced_epoch(write: Write) -> int | None:
    """The epoch a fenced write was made for (``$3`` of every fenced statement), if any."""
    value = write.params.get(3)
    return int(value) if value is not None and value.isdigit() and not write.takes_epoch else None


def _bodies(write: Write) -> list[dict[str, Any]]:
    """The statement's JSON object parameters, by parameter number."""
    found = []
    for _, value in sorted(write.params.items()):
        if value and value.startswith("{"):
            parsed = json.loads(value)
            if isinstance(parsed, dict):
                found.append(parsed)
    return found


@dataclass(frozen=True)
class Ended:
    workflow_id: str
    state: str
    epoch: int
    at: datetime


def ended(
    writes: list[Write], workflow_id: str, states: tuple[str, ...] = ("finished", "failed")
) -> Ended | None:
    """When the workflow was first written in one of ``states`` (finished or failed, by
    default), and by which epoch."""
    for write in writes:
        if write.table != "workflows" or write.params.get(2) != workflow_id:
            continue
        state = next((b["state"] for b in _bodies(write) if "state" in b), None)
        epoch = fenced_epoch(write)
        if state in states and epoch is not None:
            return Ended(workflow_id, str(state), epoch, write.committed)
    return None
