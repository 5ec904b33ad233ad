"""Reading the store's CSV statement log: what committed, from where, for which epoch."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.fleet.storelog import epochs, read_writes

WF = "wf-1"


def row(
    at: str, src: str, session: str, message: str, detail: str = "", severity: str = "LOG"
) -> list[str]:
    cells = [""] * 26
    cells[0], cells[4], cells[5], cells[11], cells[13], cells[14] = (
        f"2026-06-01 10:00:{at} UTC",
        src,
        session,
        severity,
        message,
        detail,
    )
    return cells


def workflow_update(epoch: int, run: str) -> tuple[str, str]:
    body = json.dumps({"epoch": epoch, "flow_run_id": run, "note": "it's"}).replace("'", "''")
    return (
        'execute __asyncpg_stmt_a__: UPDATE "fleet".workflows SET epoch = $3, body = $7 '
        "WHERE tenant = $1 AND workflow_id = $2",
        f"parameters: $1 = 't', $2 = '{WF}', $3 = '{epoch}', $4 = 'running', $7 = '{body}'",
    )


def write_log(folder: Path, rows: list[list[str]]) -> None:
    with (folder / "statements-1.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_only_committed_writes_count_and_epochs_are_dated_by_their_commit(tmp_path: Path) -> None:
    old, new = workflow_update(1, "run-a"), workflow_update(2, "run-b")
    write_log(
        tmp_path,
        [
            row("01.000", "10.0.0.41:5000", "s1", "statement: BEGIN;"),
            row("01.100", "10.0.0.41:5000", "s1", *old),
            row("01.200", "10.0.0.41:5000", "s1", "statement: COMMIT;"),
            row("02.000", "10.0.0.42:6000", "s2", "statement: BEGIN;"),
            row("02.100", "10.0.0.42:6000", "s2", *new),
            row("02.200", "10.0.0.42:6000", "s2", "statement: ROLLBACK;"),
            row("03.000", "10.0.0.42:6000", "s2", "statement: BEGIN;"),
            row("03.100", "10.0.0.42:6000", "s2", *new),
            row("03.300", "10.0.0.41:5000", "s1", "statement: BEGIN;"),
            row("03.400", "10.0.0.41:5000", "s1", *old),
            row("03.500", "10.0.0.41:5000", "s1", "could not serialize", severity="ERROR"),
            row("03.900", "10.0.0.42:6000", "s2", "statement: COMMIT;"),
        ],
    )
    writes = read_writes(tmp_path)
    assert [(w.src, w.committed.second, w.committed.microsecond) for w in writes] == [
        ("10.0.0.41:5000", 1, 200000),
        ("10.0.0.42:6000", 3, 900000),
    ]
    assert writes[1].body["note"] == "it's"
    taken = epochs(writes, WF)
    assert [(t.epoch, t.flow_run_id, t.src) for t in taken] == [
        (1, "run-a", "10.0.0.41:5000"),
        (2, "run-b", "10.0.0.42:6000"),
    ]
