"""Reading the store's CSV statement log: what committed, from where, for which epoch."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from coder_chat.durable.postgres import PostgresStore, _Statements
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.store import FencedOut
from tests.fleet.storelog import ended, epochs, fenced_epoch, read_writes
from tests.pgcluster import PgCluster

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


def begin_run(run: str) -> tuple[str, str]:
    """``begin_run``'s statement as the store sends it, for ``run``."""
    sql = _Statements('"fleet"').start_run
    new = json.dumps({"epoch": 1, "flow_run_id": run, "note": "it's"}).replace("'", "''")
    fields = json.dumps({"flow_run_id": run}).replace("'", "''")
    return (
        f"execute __asyncpg_stmt_a__: {sql}",
        f"parameters: $1 = 't', $2 = '{WF}', $3 = '1', $4 = 'running', $5 = 'local', "
        f"$6 = NULL, $7 = '{new}', $8 = '{fields}'",
    )


def write_log(folder: Path, rows: list[list[str]]) -> None:
    with (folder / "statements-1.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_only_committed_writes_count_and_epochs_are_dated_by_their_commit(tmp_path: Path) -> None:
    old, new = begin_run("run-a"), begin_run("run-b")
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
    assert writes[1].body["note"] == "it's" and writes[1].takes_epoch
    taken = epochs(writes, WF)
    assert [(t.epoch, t.flow_run_id, t.src) for t in taken] == [
        (1, "run-a", "10.0.0.41:5000"),
        (2, "run-b", "10.0.0.42:6000"),
    ]


class LoggedPg(PgCluster):
    """A private PostgreSQL that logs every statement as CSV, as the lab's store host does."""

    def _options(self) -> str:
        folder = self.root / "statements"
        return super()._options() + (
            " -c logging_collector=on -c log_destination=csvlog"
            f" -c log_directory={folder} -c log_statement=all"
        )

    def start(self) -> LoggedPg:
        folder = self.root / "statements"
        folder.mkdir(exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
            shutil.chown(folder, "postgres")
        super().start()
        return self


async def test_the_real_stores_writes_read_back_as_epochs_fences_and_an_end() -> None:
    """What the store really sends (one fenced statement a write) read back from the
    server's own log: epoch 1 taken by run-a, epoch 2 by run-b, run-a's later write
    fenced at epoch 1 (a statement that matches nothing), the end at epoch 2."""
    with LoggedPg() as pg:
        store = PostgresStore(pg.dsn, schema="fleet")
        try:
            first = await store.begin_run("t", WF, flow_run_id="run-a")
            await store.heartbeat(first)
            second = await store.begin_run("t", WF, flow_run_id="run-b")
            with pytest.raises(FencedOut):
                await store.heartbeat(first)
            await store.finish(second, WorkflowState.FINISHED)
        finally:
            await store.close()
        pg.stop()  # the log is flushed
        writes = read_writes(pg.root / "statements")
    taken = epochs(writes, WF)
    assert [(t.epoch, t.flow_run_id) for t in taken] == [(1, "run-a"), (2, "run-b")]
    late = [w for w in writes if w.committed > taken[1].at and w.params.get(2) == WF]
    # run-a's refused heartbeat (if its no-op statement is logged as committed) carries
    # epoch 1, which the fencing check counts as fenced out; the end carries epoch 2.
    assert [fenced_epoch(w) for w in late if fenced_epoch(w) != 1] == [2]
    ours = [w for w in writes if w.params.get(2) == WF]
    assert fenced_epoch(ours[1]) == 1  # run-a's heartbeat while it held the workflow
    end = ended(writes, WF)
    assert end is not None and (end.state, end.epoch) == ("finished", 2)
