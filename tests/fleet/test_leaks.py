"""The fleet's leak search finds the token wherever our side wrote it, and only there.

The CI scenario finds nothing (see ``test_fleet``); these show that finding nothing
means something: a token in a worker's file or in a database row is found, and Coder's
own side (the simulator's folder and output) is not searched.
"""

from __future__ import annotations

from pathlib import Path

from tests.lab.leaks import leaking
from tests.pgcluster import PgCluster

from .leaks import files_holding, ours

TOKEN = "tok-VERY-SECRET-123"


def test_a_file_of_ours_holding_the_token_is_found_and_coders_side_is_not_searched(
    tmp_path: Path,
) -> None:
    files = {
        "w1/prefect-home/storage/result-1": f"... {TOKEN} ...",
        "ctl/pg/data/base/5/1259": f"\x00{TOKEN}\x00",
        "logs/07-worker-w2.log": "nothing here",
        "logs/03-simulator.log": f"export CODER_SESSION_TOKEN='{TOKEN}'",
        "logs/04-relay.log": TOKEN,
        "coder/requests.jsonl": TOKEN,
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = files_holding(tmp_path, TOKEN.encode(), ours)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "ctl/pg/data/base/5/1259",
        "w1/prefect-home/storage/result-1",
    ]


def test_a_database_row_holding_the_token_is_found_in_its_dump() -> None:
    with PgCluster() as pg:
        pg.admin_sql("CREATE TABLE logs (message text); INSERT INTO logs VALUES ('nothing');")
        assert leaking({"db": pg.dump("postgres")}, TOKEN) == []
        pg.admin_sql(f"INSERT INTO logs VALUES ('the token is {TOKEN}');")
        assert leaking({"db": pg.dump("postgres")}, TOKEN) == ["db"]
