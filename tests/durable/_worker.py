"""A separate process acting on a store, for the race and crash tests.

``python -m tests.durable._worker KIND LOCATION COMMAND ARGS...`` where KIND is
``sqlite`` (LOCATION a file) or ``postgres`` (LOCATION a schema, the DSN in
``PREFECT_CODER_WORKER_DSN``). Commands:

``claim TENANT WORKFLOW EPOCH COUNT NAME``
    Open the store, print ``ready``, wait for a line on stdin, then claim
    ``call-0`` … ``call-{COUNT-1}`` of chat ``race`` as tool NAME, printing one JSON
    line per claim: ``{"i": …, "won": …, "by": <tool_name of the entry>}``.

``write TENANT WORKFLOW EPOCH``
    Forever: checkpoint ``(chat-w, n)``, claim and complete ``call-n`` with output
    ``{"n": n}``, then print ``written n``. The parent SIGKILLs it at any moment.

``phases TENANT WORKFLOW EPOCH COUNT``
    Make COUNT writes of each kind in turn (heartbeat, write_journal, complete_step,
    claim_tool), one after the other, then COUNT journal writes at once (``together``),
    each kind after a marker syscall ``access("/@@phase-<kind>")`` that a tracer
    watching the process can split its trace by; then print the store's ``commits``
    and ``flushes``, and wait for a line on stdin before closing it.

``store-id``
    Print the store's id.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import Fence, JournalEntry, StepRecord
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import DurableStore


def open_store(kind: str, location: str) -> DurableStore:
    if kind == "postgres":
        return PostgresStore(os.environ["PREFECT_CODER_WORKER_DSN"], schema=location)
    return SqliteStore(location)


async def claim(store: DurableStore, fence: Fence, count: int, name: str) -> None:
    await store.get_workflow(fence.tenant, fence.workflow_id)  # connected, schema checked
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        won, entry = await store.claim_tool(fence, "race", f"call-{i}", tool_name=name)
        print(json.dumps({"i": i, "won": won, "by": entry.tool_name}), flush=True)
    await store.close()


async def write(store: DurableStore, fence: Fence) -> None:
    n = 0
    while True:
        await store.save_checkpoint(fence, "chat-w", n)
        await store.claim_tool(fence, "chat-w", f"call-{n}", tool_name="writer")
        await store.complete_tool(fence, "chat-w", f"call-{n}", output={"n": n})
        print(f"written {n}", flush=True)
        n += 1


def _phases(store: DurableStore, fence: Fence, count: int) -> dict[str, Callable[[int], Any]]:
    return {
        "heartbeat": lambda n: store.heartbeat(fence),
        "write_journal": lambda n: store.write_journal(
            fence, "chat-p", JournalEntry(state="submitting", marker=f"m-{n}", attempt=0)
        ),
        "complete_step": lambda n: store.complete_step(
            fence,
            StepRecord(
                tenant=fence.tenant,
                workflow_id=fence.workflow_id,
                step=n + 1,
                chat_id="chat-p",
                last_seen_message_id=n,
                text=f"answer {n}",
                verdict="ran",
            ),
        ),
        "claim_tool": lambda n: store.claim_tool(fence, "chat-p", f"call-{n}", tool_name="t"),
    }


async def phases(store: DurableStore, fence: Fence, count: int) -> None:
    # Opened, and its log file begun (a new log's header is synced once, whatever the
    # write), before the first phase.
    await store.save_inputs(fence, [])
    writes = _phases(store, fence, count)
    for kind, write in writes.items():
        os.access(f"/@@phase-{kind}", os.F_OK)
        for n in range(count):
            await write(n)
    os.access("/@@phase-together", os.F_OK)
    await asyncio.gather(*(writes["write_journal"](count + n) for n in range(count)))
    os.access("/@@phase-end", os.F_OK)
    print(json.dumps({"commits": store.commits, "flushes": store.flushes}), flush=True)
    sys.stdin.readline()  # the parent may kill it here, before it closes the store
    await store.close()


async def print_store_id(store: DurableStore) -> None:
    print(await store.store_id(), flush=True)
    await store.close()


async def main(argv: list[str]) -> None:
    kind, location, command, *args = argv
    store = open_store(kind, location)
    if command == "store-id":
        await print_store_id(store)
        return
    tenant, workflow_id, epoch, *rest = args
    fence = Fence(tenant=tenant, workflow_id=workflow_id, epoch=int(epoch))
    if command == "claim":
        await claim(store, fence, int(rest[0]), rest[1])
    elif command == "write":
        await write(store, fence)
    elif command == "phases":
        await phases(store, fence, int(rest[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
