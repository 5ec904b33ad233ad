"""``prefect-coder workflows``: look for workflows, read one, cancel or resume one, clear out
old ones.

Every subcommand works on one store and one tenant, chosen by the same options
(:func:`add_store_options`, :func:`open_target`), so a new subcommand is an ``async``
function of ``(args, target)`` added with :func:`add_subcommand`. Expected errors are
one line on stderr and exit code 2; no DSN password or token is ever printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from coder_chat.durable.base import ENDED_STATES, SWEEP_PREFIX
from coder_chat.durable.records import ChatRecord, StepRecord, WorkflowRecord, WorkflowState
from coder_chat.durable.retention import parse_age, prune_sentence
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderError
from coder_chat.settings import CoderSettings

#: Exit code of an expected error (argparse's own, for bad arguments, too).
EXIT_ERROR = 2

STORE_HELP = """\
Which store (one of):
  --ledger-block NAME   a saved ledger block: sqlite/NAME or postgres/NAME, or a bare NAME
                        (a Coder SQLite Ledger, else a Coder Postgres Ledger, by that name)
  --sqlite PATH         a SQLite store file
  --postgres            Postgres at the DSN in PREFECT_CODER_POSTGRES_DSN (never on the
                        command line: it holds a password), schema --schema
  (none)                the embedded store: PREFECT_CODER_SQLITE_PATH, or
                        ~/.prefect-coder/ledger.sqlite3 (what a flow given no ledger uses)
Whose workflows: --org ORG_ID, or CODER_ORG_ID.
"""


class WorkflowsError(Exception):
    """An expected failure, told to the person as one line."""


@dataclass(frozen=True)
class StoreTarget:
    """The store a subcommand works on, the tenant, and where it is (for messages)."""

    store: DurableStore
    tenant: str
    where: str


#: A subcommand: reads its arguments, works on the target, returns the exit code.
Action = Callable[[argparse.Namespace, StoreTarget], Awaitable[int]]


# -- the parser ------------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "workflows",
        help="list, show, cancel, resume and prune the workflows of a store",
        description="List, show, cancel, resume and prune durable workflows.",
        epilog=STORE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subcommands = parser.add_subparsers(dest="workflows_command", required=True, metavar="COMMAND")
    _add_reading(subcommands)
    _add_prune(subcommands)
    _add_cancel_and_resume(subcommands)


def _add_reading(subcommands: Any) -> None:
    listing = add_subcommand(
        subcommands, "list", _list, help="the workflows of a tenant, newest first", json=True
    )
    _add_filters(listing, WorkflowState, "only workflows in this state (repeat for several)")
    add_subcommand(
        subcommands,
        "show",
        _show,
        help="one workflow: its state, steps and chats",
        takes_id=True,
        json=True,
    )


def _add_prune(subcommands: Any) -> None:
    prune = add_subcommand(
        subcommands,
        "prune",
        _prune,
        help="delete ended workflows (with their steps, chats and ledger) older than an age",
        json=True,
    )
    prune.add_argument(
        "--older-than",
        required=True,
        metavar="AGE",
        help="ended more than this long ago: 30d, 12h, 90m, 2w, 1d12h",
    )
    _add_filters(
        prune, ENDED_STATES, "only workflows that ended in this state (repeat; default: all three)"
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")


def _add_filters(parser: argparse.ArgumentParser, states: Iterable[str], help: str) -> None:
    """``--state`` (one of ``states``, repeatable) and ``--deployment``."""
    parser.add_argument("--state", action="append", choices=[str(s) for s in states], help=help)
    parser.add_argument("--deployment", help="only workflows of this deployment")


def _add_cancel_and_resume(subcommands: Any) -> None:
    cancel = add_subcommand(
        subcommands,
        "cancel",
        _cancel,
        help="end a running workflow for good, also one whose run is gone: its run cancelled, "
        "its turn stopped, its chat archived; nothing relaunches it",
        takes_id=True,
    )
    cancel.add_argument(
        "--credentials-block",
        metavar="NAME",
        help="saved Coder credentials (default: CODER_URL, CODER_SESSION_TOKEN, CODER_ORG_ID)",
    )
    cancel.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="a durable tool whose effect in flight may be finished before the chat is "
        "archived (repeat); without it such a chat is left for the sweep",
    )
    resume = add_subcommand(
        subcommands,
        "resume",
        _resume,
        help="carry a failed, cancelled or over-budget workflow on from its last finished "
        "step: its deployment runs again with its last run's parameters",
        takes_id=True,
    )
    for flag, what in BUDGET_FLAGS.items():
        resume.add_argument(
            f"--{flag.replace('_', '-')}",
            type=int,
            metavar="N",
            help=f"raise its {what} (a setting of its flow's WorkflowSettings) for this run on",
        )


#: The budget a resume may raise: ``WorkflowSettings`` fields, and what each limits.
BUDGET_FLAGS = {
    "max_tokens": "token budget",
    "max_cost_micros": "cost budget, in micros",
    "max_turns": "turn budget",
}


def add_subcommand(
    subcommands: Any,
    name: str,
    action: Action,
    *,
    help: str,
    takes_id: bool = False,
    json: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand of ``workflows`` with the store options, running ``action``; with
    ``takes_id`` it names one workflow, with ``json`` it can print JSON."""
    parser: argparse.ArgumentParser = subcommands.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=STORE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if takes_id:
        parser.add_argument("workflow_id", metavar="ID", help="the workflow id")
    if json:
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_store_options(parser)
    parser.set_defaults(run=lambda args: run(args, action))
    return parser


def add_store_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("store")
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--ledger-block",
        metavar="NAME",
        help="a saved ledger block: sqlite/NAME, postgres/NAME, or NAME",
    )
    where.add_argument("--sqlite", metavar="PATH", type=Path, help="a SQLite store file")
    where.add_argument(
        "--postgres",
        action="store_true",
        help="Postgres at the DSN in PREFECT_CODER_POSTGRES_DSN",
    )
    group.add_argument(
        "--schema",
        default="prefect_coder",
        help="the Postgres schema with --postgres (default prefect_coder)",
    )
    group.add_argument("--org", metavar="ORG_ID", help="the tenant (default: CODER_ORG_ID)")


# -- running a subcommand --------------------------------------------------------------------


def run(args: argparse.Namespace, action: Action) -> int:
    """Run ``action`` on the store the options name; an expected error is one line."""
    try:
        return asyncio.run(_on_target(args, action))
    except (WorkflowsError, CoderError) as exc:
        print(f"prefect-coder workflows: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


async def _on_target(args: argparse.Namespace, action: Action) -> int:
    async with open_target(args) as target:
        return await action(args, target)


@asynccontextmanager
async def open_target(args: argparse.Namespace) -> AsyncIterator[StoreTarget]:
    """The store and tenant the options name, closed afterwards."""
    settings = CoderSettings()
    tenant = args.org or settings.organization_id
    if not tenant:
        raise WorkflowsError("no tenant: pass --org ORG_ID or set CODER_ORG_ID")
    store, where = await _open_store(args, settings)
    try:
        yield StoreTarget(store, tenant, where)
    finally:
        await store.close()


async def _open_store(
    args: argparse.Namespace, settings: CoderSettings
) -> tuple[DurableStore, str]:
    from coder_chat.durable.sqlite import SqliteStore

    if args.ledger_block:
        return await _from_block(args.ledger_block)
    if args.postgres:
        if settings.postgres_dsn is None:
            raise WorkflowsError("--postgres reads its DSN from PREFECT_CODER_POSTGRES_DSN; set it")
        return _postgres(settings.postgres_dsn.get_secret_value(), args.schema)
    path = (args.sqlite or settings.sqlite_path).expanduser()
    if not path.is_file():
        hint = "" if args.sqlite else " (set PREFECT_CODER_SQLITE_PATH, or pass --sqlite)"
        raise WorkflowsError(f"no store at {path}{hint}")
    return SqliteStore(path), f"SQLite store {path}"


def _postgres(dsn: str, schema: str) -> tuple[DurableStore, str]:
    from coder_chat.durable.postgres import PostgresStore

    store = PostgresStore(dsn, schema=schema)
    return store, f"Postgres store {store.where}"


async def _from_block(name: str) -> tuple[DurableStore, str]:
    """A saved ledger block's store: ``sqlite/NAME``, ``postgres/NAME``, or a bare NAME."""
    from coder_chat.durable.sqlite import SqliteStore
    from prefect_coder.blocks import PostgresLedger, SqliteLedger

    kind, slash, bare = name.partition("/")
    kinds: list[type[SqliteLedger] | type[PostgresLedger]]
    if slash and kind in ("sqlite", "postgres"):
        kinds = [SqliteLedger if kind == "sqlite" else PostgresLedger]
    else:
        kinds, bare = [SqliteLedger, PostgresLedger], name
    found = [block for kind_ in kinds if (block := await _load(kind_, bare)) is not None]
    if not found:
        what = " or ".join(k.__name__ for k in kinds)
        raise WorkflowsError(f"no {what} block named {bare!r}")
    if len(found) > 1:
        raise WorkflowsError(
            f"both a SqliteLedger and a PostgresLedger block are named {bare!r}: "
            f"pass sqlite/{bare} or postgres/{bare}"
        )
    block = found[0]
    if isinstance(block, PostgresLedger):
        return _postgres(block.dsn.get_secret_value(), block.db_schema)
    path = block.resolved_path()
    if not path.is_file():
        raise WorkflowsError(f"no store at {path} (block sqlite/{bare})")
    return SqliteStore(path), f"SQLite store {path}"


async def _load(kind: Any, name: str) -> Any:
    try:
        return await kind.aload(name)
    except ValueError as exc:
        if "Unable to find block document" in str(exc):
            return None
        raise WorkflowsError(f"cannot load {kind.__name__} block {name!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - Prefect's API out of reach, say: told in a line
        raise WorkflowsError(
            f"cannot load {kind.__name__} block {name!r}: {type(exc).__name__}: {exc}"
        ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- list ------------------------------------------------------------------------------------


async def _list(args: argparse.Namespace, target: StoreTarget) -> int:
    workflows = [
        w
        for w in await target.store.list_workflows(
            target.tenant, deployment=args.deployment, states=args.state
        )
        if not w.workflow_id.startswith(SWEEP_PREFIX)
    ]
    workflows.sort(key=lambda w: w.updated_at, reverse=True)
    steps = [len(await target.store.list_steps(target.tenant, w.workflow_id)) for w in workflows]
    if args.json:
        _print_json([_summary(w, n) for w, n in zip(workflows, steps, strict=True)])
        return 0
    if not workflows:
        print(f"No workflows of tenant {target.tenant} in the {target.where}.")
        return 0
    rows = [
        [w.workflow_id, str(w.state), str(n), str(w.epoch), w.deployment, _when(w.updated_at)]
        for w, n in zip(workflows, steps, strict=True)
    ]
    _print_table(["ID", "STATE", "STEPS", "EPOCH", "DEPLOYMENT", "UPDATED"], rows)
    return 0


def _summary(workflow: WorkflowRecord, steps: int) -> dict[str, Any]:
    return {
        "workflow_id": workflow.workflow_id,
        "state": str(workflow.state),
        "steps": steps,
        "epoch": workflow.epoch,
        "deployment": workflow.deployment,
        "flow_run_id": workflow.flow_run_id,
        "chat_id": workflow.chat_id,
        "heartbeat_at": _iso(workflow.heartbeat_at),
        "updated_at": _iso(workflow.updated_at),
    }


# -- show ------------------------------------------------------------------------------------


async def _show(args: argparse.Namespace, target: StoreTarget) -> int:
    store, tenant = target.store, target.tenant
    workflow = await store.get_workflow(tenant, args.workflow_id)
    if workflow is None:
        raise WorkflowsError(f"no workflow {args.workflow_id!r} of tenant {tenant}")
    steps = await store.list_steps(tenant, workflow.workflow_id)
    chats = await store.list_workflow_chats(tenant, workflow.workflow_id)
    if args.json:
        _print_json(
            {
                "workflow": workflow.model_dump(mode="json"),
                "steps": [s.model_dump(mode="json") for s in steps],
                "chats": [c.model_dump(mode="json") for c in chats],
                "usage": workflow.usage(steps).model_dump(mode="json"),
            }
        )
        return 0
    _print_workflow(workflow, steps, chats)
    return 0


def _print_workflow(
    workflow: WorkflowRecord, steps: Sequence[StepRecord], chats: Sequence[ChatRecord]
) -> None:
    cursor = (
        ""
        if workflow.last_seen_message_id is None
        else f" (cursor {workflow.last_seen_message_id})"
    )
    patches = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in sorted(workflow.patches.items()))
    fields = [
        ("state", str(workflow.state)),
        ("deployment", workflow.deployment),
        ("epoch", str(workflow.epoch)),
        ("flow run", workflow.flow_run_id or "-"),
        ("chat", (workflow.chat_id or "-") + cursor),
        ("heartbeat", _when(workflow.heartbeat_at)),
        ("updated", _when(workflow.updated_at)),
        ("inputs", str(len(workflow.inputs))),
        ("patches", patches or "-"),
        ("archive at end", "yes" if workflow.archive_at_end else "no"),
        ("used", workflow.usage(steps).describe()),
    ]
    print(f"Workflow {workflow.workflow_id} (tenant {workflow.tenant})")
    _print_table([], [[f"  {name}", value] for name, value in fields])
    print()
    if steps:
        print(f"Steps ({len(steps)})")
        rows = [
            [
                f"  {s.step}",
                s.verdict,
                s.chat_id,
                _when(s.finished_at),
                s.usage.brief() if s.usage.messages else "-",
                _short(s.prompt or "-"),
            ]
            for s in steps
        ]
        _print_table(["  STEP", "VERDICT", "CHAT", "FINISHED", "USED", "PROMPT"], rows)
    else:
        print("Steps: none finished yet")
    print()
    if chats:
        print(f"Chats ({len(chats)})")
        rows = [[f"  {c.chat_id}", "yes" if c.discarded else "no", _journal(c)] for c in chats]
        _print_table(["  CHAT", "DISCARDED", "LATEST JOURNAL ENTRY"], rows)
    else:
        print("Chats: none journaled")


def _journal(chat: ChatRecord) -> str:
    entry = chat.journal
    if entry is None:
        return "-"
    return f"{entry.state}, {entry.marker}, attempt {entry.attempt}, {_when(entry.at)}"


# -- prune -----------------------------------------------------------------------------------


async def _prune(args: argparse.Namespace, target: StoreTarget) -> int:
    age = parse_age(args.older_than)
    ended_before = datetime.now(UTC) - age
    states = args.state or list(ENDED_STATES)
    store, tenant = target.store, target.tenant
    if args.dry_run:
        prunable = await store.list_prunable(
            tenant, ended_before=ended_before, states=states, deployment=args.deployment
        )
        removed = [w.workflow_id for w in prunable]
    else:
        removed = await store.prune_workflows(
            tenant, ended_before=ended_before, states=states, deployment=args.deployment
        )
    if args.json:
        _print_json(
            {
                "dry_run": args.dry_run,
                "ended_before": _iso(ended_before),
                "states": [str(s) for s in states],
                "workflow_ids": removed,
            }
        )
        return 0
    print(prune_sentence(removed, age, states, dry_run=args.dry_run))
    return 0


# -- cancel and resume -----------------------------------------------------------------------


async def _cancel(args: argparse.Namespace, target: StoreTarget) -> int:
    from prefect_coder._run.runtime import Runtime
    from prefect_coder.imports import resolve_tools
    from prefect_coder.operations import cancel_workflow

    credentials = await _credentials(args.credentials_block)
    tools = resolve_tools(args.tool)
    async with credentials.get_client() as client:
        rt = Runtime(client, target.store, target.tenant)
        done = await cancel_workflow(rt, args.workflow_id, tools, print)
    left = [r.chat_id for r in done.chats if not r.done]
    tail = f"; chat {', '.join(left)} is left for the orphan sweep to archive" if left else ""
    print(f"Workflow {args.workflow_id} is cancelled{tail}.")
    return 0


async def _credentials(block: str | None) -> Any:
    from prefect_coder.blocks import CoderCredentials

    if block is None:
        return CoderCredentials.from_environment()
    found = await _load(CoderCredentials, block)
    if found is None:
        raise WorkflowsError(f"no CoderCredentials block named {block!r}")
    return found


async def _resume(args: argparse.Namespace, target: StoreTarget) -> int:
    from prefect_coder._run.lease import flow_run_url
    from prefect_coder.operations import resume_workflow

    # Resuming reads only the store and Prefect: no Coder connection is made here.
    raised = {k: getattr(args, k) for k in BUDGET_FLAGS if getattr(args, k) is not None}
    run = await resume_workflow(target.store, target.tenant, args.workflow_id, raised)
    print(
        f"Workflow {args.workflow_id} is resumed as flow run {run.name!r} "
        f"({flow_run_url(run.id)}); its finished steps come from the store."
    )
    return 0


# -- output ----------------------------------------------------------------------------------


def _print_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO | None = None
) -> None:
    """Columns aligned, two spaces apart; the last column is not padded."""
    out = out or sys.stdout
    lines = [list(header), *map(list, rows)] if header else [list(r) for r in rows]
    if not lines:
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.write("  ".join([*cells, line[-1]]).rstrip() + "\n")


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def _short(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
