"""``prefect-coder workflows list|show|prune``, run through ``prefect_coder.cli.main`` on a
SQLite file and on Postgres (each test runs on both), on workflows written through the
store's own write methods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sweep import sweep_workflow_id
from prefect_coder.blocks import PostgresLedger, SqliteLedger
from tests.durable.backends import Backend
from tests.durable.seed import age_workflow, chat_of, seed_workflow

from .support import Cli

T = "org-1"


async def seed_three(backend: Backend) -> None:
    """``old-done`` (finished 40 days ago), ``old-failed`` (failed 40 days ago, staging),
    ``live`` (running, its heartbeat old too) and the sweep's lease."""
    store = backend.open()
    await seed_workflow(store, T, "old-done")
    await seed_workflow(store, T, "old-failed", state=WorkflowState.FAILED, deployment="staging")
    await seed_workflow(store, T, "live", state=None)
    lease = await store.begin_run(T, sweep_workflow_id("prod"))
    await store.finish(lease, WorkflowState.FINISHED)
    for wf in ("old-done", "old-failed", "live", sweep_workflow_id("prod")):
        await age_workflow(backend, T, wf, days=40)


async def test_list_prints_an_aligned_table(
    backend: Backend, cli: Cli, store_args: list[str]
) -> None:
    await seed_three(backend)
    code, out, err = await cli("workflows", "list", *store_args, "--org", T)
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATE", "STEPS", "EPOCH", "DEPLOYMENT", "UPDATED"]
    assert sorted(row.split()[:5] for row in rows) == [
        ["live", "running", "2", "1", "prod"],
        ["old-done", "finished", "2", "1", "prod"],
        ["old-failed", "failed", "2", "1", "staging"],
    ]  # the sweep's own record is left out
    starts = {header.index(name) for name in ("STATE", "STEPS", "DEPLOYMENT", "UPDATED")}
    for row in rows:  # each column starts where its heading does
        assert all(row[i - 2 : i] == "  " and row[i] != " " for i in starts), row


async def test_list_filters_and_prints_json(
    backend: Backend, cli: Cli, store_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_three(backend)
    monkeypatch.setenv("CODER_ORG_ID", T)  # the tenant from the environment
    args = ["workflows", "list", *store_args, "--json"]
    code, out, _ = await cli(*args, "--state", "failed", "--state", "running")
    assert code == 0
    listed = json.loads(out)
    assert sorted(w["workflow_id"] for w in listed) == ["live", "old-failed"]
    live = next(w for w in listed if w["workflow_id"] == "live")
    assert live["state"] == "running" and live["steps"] == 2 and live["epoch"] == 1
    assert live["flow_run_id"] == "run-live" and live["chat_id"] == chat_of("live")
    code, out, _ = await cli(*args, "--deployment", "staging")
    assert [w["workflow_id"] for w in json.loads(out)] == ["old-failed"]
    code, out, _ = await cli(*args, "--org", "org-nobody")
    assert (code, json.loads(out)) == (0, [])


async def test_show_prints_the_workflow_its_steps_and_chats(
    backend: Backend, cli: Cli, store_args: list[str]
) -> None:
    await seed_three(backend)
    code, out, err = await cli("workflows", "show", "old-done", *store_args, "--org", T)
    assert (code, err) == (0, "")
    assert out.startswith(f"Workflow old-done (tenant {T})\n")
    fields = dict(
        line.strip().split(None, 1)
        for line in out.split("\n\n")[0].splitlines()[1:]
        if not line.strip().startswith(("flow run", "archive at end"))
    )
    assert fields["state"] == "finished"
    assert fields["epoch"] == "1"
    assert fields["chat"] == f"{chat_of('old-done')} (cursor 20)"
    assert fields["inputs"] == "1"
    assert fields["patches"] == "shorter-prompts=yes"
    assert fields["used"] == "330 tokens (300 in; 30 out), $0.0030"  # the steps' sum
    assert "flow run        run-old-done" in out
    assert "Steps (2)" in out and "Chats (1)" in out
    step_lines = [line.split() for line in out.splitlines() if line.startswith(("  1 ", "  2 "))]
    assert [(s[0], s[1]) for s in step_lines] == [("1", "ran"), ("2", "recovered")]
    assert [" ".join(s[6:9]) for s in step_lines] == ["110 tokens, $0.0010", "220 tokens, $0.0020"]
    assert "Prompt 1 of old-done: please do it" in out
    assert max(len(line) for line in out.splitlines()) < 160  # prompts are shortened
    assert "…" in out
    assert "submitting, old-done/step-2, attempt 1" in out


async def test_show_json_has_every_record(
    backend: Backend, cli: Cli, store_args: list[str]
) -> None:
    await seed_three(backend)
    code, out, _ = await cli("workflows", "show", "live", "--json", *store_args, "--org", T)
    assert code == 0
    shown = json.loads(out)
    assert shown["workflow"]["state"] == "running"
    assert shown["workflow"]["inputs"] == ["approved"]
    assert [s["step"] for s in shown["steps"]] == [1, 2]
    assert shown["steps"][0]["prompt"].startswith("Prompt 1 of live")
    assert [c["chat_id"] for c in shown["chats"]] == [chat_of("live")]
    assert shown["chats"][0]["journal"]["marker"] == "live/step-2"
    assert [s["usage"]["output_tokens"] for s in shown["steps"]] == [10, 20]
    assert (shown["usage"]["messages"], shown["usage"]["total_cost_micros"]) == (3, 3000)


async def test_prune_dry_run_then_prune(backend: Backend, cli: Cli, store_args: list[str]) -> None:
    await seed_three(backend)
    store = backend.open()
    await seed_workflow(store, T, "recent")  # ended just now
    prune = ["workflows", "prune", *store_args, "--org", T, "--older-than", "30d"]

    code, out, err = await cli(*prune, "--dry-run")
    assert (code, err) == (0, "")
    assert out == (
        "Would remove 2 workflows that ended more than 30 days ago: old-done, old-failed.\n"
    )
    assert await store.get_workflow(T, "old-done") is not None

    code, out, _ = await cli(*prune)
    assert code == 0
    assert out == "Removed 2 workflows that ended more than 30 days ago: old-done, old-failed.\n"
    for wf in ("old-done", "old-failed"):
        assert await store.get_workflow(T, wf) is None
        assert await store.list_steps(T, wf) == []
        assert await store.list_workflow_chats(T, wf) == []
        assert await store.list_tools(T, chat_of(wf)) == []
    for wf in ("live", "recent", sweep_workflow_id("prod")):
        assert await store.get_workflow(T, wf) is not None, wf
    assert len(await store.list_tools(T, chat_of("live"))) == 1

    code, out, _ = await cli(*prune)
    assert (code, out) == (0, "Removed no workflows: none ended more than 30 days ago.\n")


async def test_prune_by_state_and_json(backend: Backend, cli: Cli, store_args: list[str]) -> None:
    await seed_three(backend)
    prune = ["workflows", "prune", *store_args, "--org", T, "--older-than", "1w", "--json"]
    code, out, _ = await cli(*prune, "--state", "failed")
    assert code == 0
    answer = json.loads(out)
    assert (answer["dry_run"], answer["states"], answer["workflow_ids"]) == (
        False,
        ["failed"],
        ["old-failed"],
    )
    code, out, _ = await cli(*prune[:-1], "--state", "cancelled", "--deployment", "prod")
    assert out == "Removed no cancelled workflows: none ended more than 7 days ago.\n"


async def test_expected_errors_are_one_line_and_exit_2(
    backend: Backend, cli: Cli, store_args: list[str], tmp_path: Path
) -> None:
    await seed_three(backend)
    cases: list[tuple[list[str], str]] = [
        (["show", "nope", *store_args, "--org", T], "no workflow 'nope' of tenant org-1"),
        (["list", *store_args], "no tenant: pass --org ORG_ID or set CODER_ORG_ID"),
        (
            ["prune", *store_args, "--org", T, "--older-than", "soon"],
            "'soon' is not an age",
        ),
        (["list", "--sqlite", str(tmp_path / "none.db"), "--org", T], "no store at"),
    ]
    for argv, message in cases:
        code, out, err = await cli("workflows", *argv)
        assert code == 2, argv
        assert out == ""
        assert err.startswith("prefect-coder workflows: ") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "none.db").exists()  # a missing file is not created
    # A running workflow cannot be chosen: argparse refuses the state (its exit code is 2).
    with pytest.raises(SystemExit) as refused:
        await cli("workflows", "prune", *store_args, "--older-than", "1d", "--state", "running")
    assert refused.value.code == 2


async def test_postgres_errors_never_show_the_password(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PREFECT_CODER_POSTGRES_DSN", "postgresql://someone:pw-hush-123@127.0.0.1:9/none"
    )
    code, out, err = await cli("workflows", "list", "--postgres", "--org", T)
    assert (code, out) == (2, "")
    assert "cannot connect to Postgres at 127.0.0.1:9" in err
    assert "pw-hush-123" not in err
    monkeypatch.delenv("PREFECT_CODER_POSTGRES_DSN")
    code, _, err = await cli("workflows", "list", "--postgres", "--org", T)
    assert code == 2 and "PREFECT_CODER_POSTGRES_DSN" in err


@pytest.mark.usefixtures("prefect_api")
async def test_a_saved_ledger_block_picks_the_store(backend: Backend, cli: Cli) -> None:
    await seed_three(backend)
    name = f"cli-{backend.kind}"
    block: SqliteLedger | PostgresLedger
    if backend.is_postgres:
        block = PostgresLedger(dsn=SecretStr(backend.dsn), db_schema=backend.location)
    else:
        block = SqliteLedger(path=backend.location)
    await block.asave(name, overwrite=True)
    for picked in (name, f"{backend.kind}/{name}"):
        code, out, err = await cli("workflows", "list", "--ledger-block", picked, "--org", T)
        assert (code, err) == (0, ""), picked
        assert {"live", "old-done", "old-failed"} == {
            row.split()[0] for row in out.splitlines()[1:]
        }
    other = "postgres" if backend.kind == "sqlite" else "sqlite"
    code, _, err = await cli("workflows", "list", "--ledger-block", f"{other}/{name}", "--org", T)
    assert code == 2 and f"named '{name}'" in err
