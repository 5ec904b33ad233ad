"""The tool ledger's same-step rule, on a real SQLite store: which key a repeated call uses."""

from __future__ import annotations

from coder_chat.client.tools import ToolCallContext
from coder_chat.durable.records import args_digest
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.tools import LedgerBinding, durable_tool

KEYS: list[str] = []


@durable_tool
async def refund(amount_cents: int, idempotency_key: str) -> str:
    """Refund the customer."""
    KEYS.append(idempotency_key)
    return f"refunded {amount_cents}"


async def test_a_repeated_call_re_drives_the_first_calls_key_never_a_later_ones(
    store: SqliteStore,
) -> None:
    """Call A was applied and killed before ``done``; call B (Coder timed A out, the model
    called again) claimed, went to re-drive A's key, and was killed too. A third call
    must re-drive under A's key: B's key was never used, so driving it would apply the
    refund a second time."""
    KEYS.clear()
    fence = await store.begin_run("org", "wf")
    binding = LedgerBinding(store, fence, "[wf/step-1]")
    args = refund.tool.validate({"amount_cents": 250})
    digest = args_digest(args.model_dump(mode="json"))
    for call in ("call-a", "call-b"):
        await store.claim_tool(
            fence, "chat", call, tool_name="refund", marker=binding.marker, args_digest=digest
        )
    output = await refund.bind(binding).invoke(args, ToolCallContext("org", "chat", "call-c"))
    assert output == "refunded 250"
    assert KEYS == ["org/chat/call-a"]
    entries = {e.tool_call_id: e.state for e in await store.list_tools("org", "chat")}
    assert entries == {"call-a": "done", "call-b": "committing", "call-c": "done"}
