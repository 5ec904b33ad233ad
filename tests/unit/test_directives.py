"""The scripted model's directive language: the pure parser, then end to end over the wire.

The parser tests call :func:`coder_chat.simulator.parse` directly. The wire tests
drive a real simulator over loopback sockets with plain ``httpx`` and
``websockets`` and check what each directive does to a turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from coder_chat.simulator import DirectiveError, Script, Simulator, parse, serve_simulator
from coder_chat.simulator.directives import ToolCall
from tests.sim_timings import fast_config
from tests.simulator.wire import Wire, declare, kinds, turn_events

# ---------------------------------------------------------------------------
# Pure parser
# ---------------------------------------------------------------------------


def assert_no_directives(script: Script) -> None:
    """The prompt asked for nothing but text: no tools, deltas, sleep, failure or JSON."""
    assert script.client_tools == []
    assert script.server_tools == []
    assert script.deltas is None
    assert script.sleep == 0.0
    assert script.fail is None
    assert script.has_structured is False


def test_plain_prompt_has_no_directives() -> None:
    script = parse("just say hello")
    assert script == Script(text="just say hello")
    assert_no_directives(script)


def test_empty_prompt() -> None:
    assert parse("") == Script(text="")


def test_whitespace_in_plain_text_is_normalised() -> None:
    assert parse("  hello \n\t  world  ").text == "hello world"


def test_tool_with_args() -> None:
    script = parse('/tool lookup {"q": "weather", "n": 3}')
    assert script.client_tools == [ToolCall("lookup", {"q": "weather", "n": 3})]
    assert script.server_tools == []
    assert script.text == ""


def test_tool_without_args_gets_empty_object() -> None:
    script = parse("/tool ping and some text")
    assert script.client_tools == [ToolCall("ping", {})]
    assert script.text == "and some text"


def test_tool_name_charset() -> None:
    script = parse("/tool my_ns.tool:v2-beta {}")
    assert script.client_tools == [ToolCall("my_ns.tool:v2-beta", {})]


def test_tool_args_may_touch_the_name() -> None:
    script = parse('/tool lookup{"q":1}')
    assert script.client_tools == [ToolCall("lookup", {"q": 1})]


def test_several_tools_keep_their_order() -> None:
    script = parse('/tool a {"i": 1} /tool b /tool c {"i": 3}')
    assert [c.name for c in script.client_tools] == ["a", "b", "c"]
    assert [c.args for c in script.client_tools] == [{"i": 1}, {}, {"i": 3}]


def test_server_tool_with_args() -> None:
    script = parse('/server-tool deploy {"env": "prod"}')
    assert script.server_tools == [ToolCall("deploy", {"env": "prod"})]
    assert script.client_tools == []


def test_server_tool_without_args() -> None:
    assert parse("/server-tool reindex").server_tools == [ToolCall("reindex", {})]


def test_deltas() -> None:
    assert parse("/deltas 7").deltas == 7
    assert parse("/deltas 1").deltas == 1


def test_last_deltas_wins() -> None:
    assert parse("/deltas 2 /deltas 9").deltas == 9


def test_sleep_integer_and_fraction() -> None:
    assert parse("/sleep 2").sleep == 2.0
    assert parse("/sleep 0.25").sleep == 0.25


def test_sleeps_add_up() -> None:
    assert parse("/sleep 1 text /sleep 0.5").sleep == 1.5


@pytest.mark.parametrize("mode", ["retryable", "fatal"])
def test_fail_modes(mode: str) -> None:
    assert parse(f"/fail {mode}").fail == mode


def test_json_object() -> None:
    script = parse('/json {"answer": 42, "tags": ["a", "b"]}')
    assert script.has_structured is True
    assert script.structured == {"answer": 42, "tags": ["a", "b"]}


def test_empty_json_object_still_counts() -> None:
    script = parse("/json {}")
    assert script.has_structured is True
    assert script.structured == {}


def test_json_args_with_nested_braces_quotes_and_escaped_quotes() -> None:
    args = {
        "sql": "SELECT \"x\" FROM t WHERE y = '{z}'",
        "nested": {"deep": {"deeper": [1, {"k": "}"}]}},
        "brace_in_string": "{ not a brace } }}",
        "escaped": 'say \\"hi\\" and "bye"',
        "backslash_end": "ends with \\",
    }
    raw = json.dumps(args)
    assert '\\"' in raw and "\\\\" in raw  # really exercises escapes
    script = parse(f"before /tool run {raw} after")
    assert script.client_tools == [ToolCall("run", args)]
    assert script.text == "before after"


def test_json_closing_brace_ends_the_argument() -> None:
    script = parse('/json {"a": 1}} trailing')
    assert script.structured == {"a": 1}
    assert script.text == "} trailing"


def test_combined_directives() -> None:
    prompt = (
        '[wf-1/step-2] please /tool a {"x": 1} then /server-tool b {"y": {"z": 2}}'
        ' /deltas 3 /sleep 0.1 and /json {"k": "v"} /fail retryable done'
    )
    script = parse(prompt)
    assert script.text == "[wf-1/step-2] please then and done"
    assert script.client_tools == [ToolCall("a", {"x": 1})]
    assert script.server_tools == [ToolCall("b", {"y": {"z": 2}})]
    assert script.deltas == 3
    assert script.sleep == 0.0  # written after a /server-tool: waited once the tools ran
    assert script.sleep_after_tools == 0.1
    assert script.structured == {"k": "v"}
    assert script.has_structured is True
    assert script.fail == "retryable"


def test_directive_after_newline_is_recognised() -> None:
    script = parse("first line\n/deltas 2\nsecond line")
    assert script.deltas == 2
    assert script.text == "first line second line"


@pytest.mark.parametrize(
    "prompt",
    [
        "[wf-1/step-2] do the thing",
        "see /usr/bin for tools",
        "/usr/bin/env python",
        "a/tool b",  # no whitespace before the slash
        "/toolbox open",  # longer word
        "/tool/x",  # known word not ending at whitespace
        "/Tool upper",  # directives are lower case
        "/tool-chain x",
        "//tool x",
        "http://example.com/deltas/3",
        "ratio 1/2 and /etc/hosts",
        "/ lonely slash",
    ],
)
def test_things_that_are_not_directives_stay_text(prompt: str) -> None:
    script = parse(prompt)
    assert script.text == " ".join(prompt.split())
    assert_no_directives(script)


def test_step_marker_is_kept_next_to_directives() -> None:
    script = parse("[wf-1/step-2] /deltas 2 hello")
    assert script.text == "[wf-1/step-2] hello"
    assert script.deltas == 2


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ("/tool", "/tool needs a tool name"),
        ("/tool   ", "/tool needs a tool name"),
        ("/tool {}", "/tool needs a tool name"),
        ("/tool na!me", "/tool needs a tool name"),
        ("/server-tool", "/server-tool needs a tool name"),
        ('/tool x {"a": 1', "unbalanced braces"),
        ('/tool x {"a": "}', "unbalanced braces"),
        ("/tool x {a: 1}", "invalid JSON"),
        ('/tool x {"a": 1,}', "invalid JSON"),
        ('/server-tool y {"a": }', "invalid JSON"),
        ("/json", "/json needs a JSON object"),
        ("/json [1, 2]", "/json needs a JSON object"),
        ('/json "text"', "/json needs a JSON object"),
        ("/json {oops}", "invalid JSON"),
        ('/json {"a": {"b": 1}', "unbalanced braces"),
        ("/deltas", "/deltas needs a whole number"),
        ("/deltas abc", "/deltas needs a whole number"),
        ("/deltas 0", "at least 1"),
        ("/deltas 2.5", "at least 1"),
        ("/deltas 3x", "/deltas needs a whole number"),
        ("/deltas -2", "/deltas needs a whole number"),
        ("/sleep", "/sleep needs a number of seconds"),
        ("/sleep soon", "/sleep needs a number of seconds"),
        ("/sleep -1", "/sleep needs a number of seconds"),
        ("/sleep 1s", "/sleep needs a number of seconds"),
        ("/fail", "/fail needs retryable or fatal"),
        ("/fail maybe", "/fail takes retryable or fatal, not 'maybe'"),
        ("/fail 42", "/fail needs retryable or fatal"),
    ],
)
def test_malformed_arguments_raise(prompt: str, fragment: str) -> None:
    with pytest.raises(DirectiveError) as caught:
        parse(f"some text {prompt}")
    assert fragment in str(caught.value)


def test_directive_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse("/deltas none")


def test_error_in_a_later_directive_is_not_ignored() -> None:
    with pytest.raises(DirectiveError):
        parse('/tool ok {"a": 1} /deltas 2 /fail sometimes')


# ---------------------------------------------------------------------------
# End to end over the wire
# ---------------------------------------------------------------------------


@pytest.fixture
async def wire(sim: Simulator) -> AsyncIterator[Wire]:
    async with Wire(sim) as peer:
        yield peer


async def _idle_chat(wire: Wire, reader_prompt: str = "warm up") -> str:
    """Create a chat and let its first turn finish."""
    chat = await wire.create(reader_prompt)
    await wire.sim.wait_for_status(chat["id"], "waiting")
    return str(chat["id"])


async def _send_ok(wire: Wire, chat_id: str, text: str) -> dict[str, Any]:
    response = await wire.send(chat_id, text)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["queued"] is False
    return body


async def test_malformed_directive_fails_the_turn(wire: Wire) -> None:
    chat = await wire.create("please /deltas zero")
    await wire.sim.wait_for_status(chat["id"], "error")
    response = await wire.http.get(f"{wire.prefix}/{chat['id']}")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "error"
    assert body["last_error"]["kind"] == "config"
    assert body["last_error"]["retryable"] is False
    assert "/deltas needs a whole number" in body["last_error"]["message"]
    # The failed turn produced no assistant reply.
    roles = [m["role"] for m in (await wire.messages(chat["id"]))["messages"]]
    assert roles == ["user"]
    async with wire.stream(chat["id"]) as reader:
        error = await reader.until(lambda e: e["type"] == "error")
    assert "Simulator: /deltas" in error["error"]["message"]
    assert "status:error" in kinds(reader.events)


async def test_malformed_json_directive_fails_a_later_turn(wire: Wire) -> None:
    chat_id = await _idle_chat(wire)
    async with wire.stream(chat_id) as reader:
        await reader.until_status("waiting")
        start = len(reader.events)
        await _send_ok(wire, chat_id, '/json {"broken": }')
        error = await reader.until(lambda e: e["type"] == "error")
    assert kinds(reader.events[start:])[-2:] == ["status:error", "error"]
    assert "invalid JSON" in error["error"]["message"]
    assert wire.sim.chat(chat_id).status == "error"


@pytest.mark.parametrize("count", [1, 3, 7])
async def test_deltas_gives_exactly_n_deltas(wire: Wire, count: int) -> None:
    chat_id = await _idle_chat(wire)
    async with wire.stream(chat_id) as reader:
        await reader.until_status("waiting")
        await _send_ok(wire, chat_id, f"/deltas {count} counting deltas")
        events = await turn_events(reader, "waiting")
    parts = [e["message_part"] for e in events if e["type"] == "message_part"]
    assert len(parts) == count
    assert [p["seq"] for p in parts] == list(range(1, count + 1))
    assert all(p["part"]["text"] for p in parts)
    assistant = [e["message"] for e in events if e["type"] == "message"][-1]
    assert assistant["role"] == "assistant"
    joined = "".join(p["part"]["text"] for p in parts)
    assert assistant["content"] == [{"type": "text", "text": joined}]
    assert joined == 'You said: "counting deltas"'


async def test_more_deltas_than_characters_pads_the_reply(wire: Wire) -> None:
    chat_id = await _idle_chat(wire)
    async with wire.stream(chat_id) as reader:
        await reader.until_status("waiting")
        await _send_ok(wire, chat_id, "/deltas 40 hi")
        events = await turn_events(reader, "waiting")
    parts = [e["message_part"]["part"]["text"] for e in events if e["type"] == "message_part"]
    assert len(parts) == 40
    assert all(len(p) == 1 for p in parts)
    assert "".join(parts).startswith('You said: "hi"')


async def test_sleep_keeps_the_run_running(sim: Simulator, wire: Wire) -> None:
    sleeper = await wire.create("think hard /sleep 30")
    # A turn without /sleep, started later, finishes while the sleeper still runs.
    quick = await wire.create("quick")
    await sim.wait_for_status(quick["id"], "waiting")
    response = await wire.http.get(f"{wire.prefix}/{sleeper['id']}")
    assert response.json()["status"] == "running"
    roles = [m["role"] for m in (await wire.messages(sleeper["id"]))["messages"]]
    assert roles == ["user"]
    async with wire.stream(sleeper["id"]) as reader:
        frame = await reader.frame()
    assert "status:running" in kinds(frame)
    assert "message:assistant" not in kinds(frame)
    # Interrupting ends the sleep at once and settles the chat.
    interrupted = await wire.http.post(f"{wire.prefix}/{sleeper['id']}/interrupt")
    assert interrupted.status_code == 200
    assert interrupted.json()["status"] == "interrupting"
    await sim.wait_for_status(sleeper["id"], "waiting")


async def test_json_calls_structured_output(sim: Simulator, wire: Wire) -> None:
    value = {"verdict": "ok", "score": 0.9, "nested": {"list": [1, "}"]}}
    chat = await wire.create(f"summarise /json {json.dumps(value)}", **declare("structured_output"))
    await sim.wait_for_status(chat["id"], "requires_action")
    async with wire.stream(chat["id"]) as reader:
        action = await reader.until(lambda e: e["type"] == "action_required")
    calls = action["action_required"]["tool_calls"]
    assert len(calls) == 1
    assert calls[0]["tool_name"] == "structured_output"
    assert json.loads(calls[0]["args"]) == value
    page = await wire.messages(chat["id"])
    tool_call = page["messages"][0]["content"][0]
    assert tool_call["type"] == "tool-call"
    assert tool_call["tool_name"] == "structured_output"
    assert tool_call["args"] == value
    # Answering the call finishes the turn.
    results = {"results": [{"tool_call_id": calls[0]["tool_call_id"], "output": {"ok": True}}]}
    submitted = await wire.http.post(f"{wire.prefix}/{chat['id']}/tool-results", json=results)
    assert submitted.status_code == 204
    await sim.wait_for_status(chat["id"], "waiting")
    final = sim.messages(chat["id"])[-1]
    assert final.role == "assistant"
    assert 'structured_output returned {"ok": true}.' in final.text()
    assert 'You said: "summarise"' in final.text()


async def test_tool_directive_pauses_on_a_client_tool(sim: Simulator, wire: Wire) -> None:
    chat = await wire.create('/tool lookup {"q": "a \\"quoted\\" {thing}"}', **declare("lookup"))
    await sim.wait_for_status(chat["id"], "requires_action")
    record = sim.chat(chat["id"])
    assert [(c.tool_name, c.args) for c in record.pending_calls] == [
        ("lookup", {"q": 'a "quoted" {thing}'})
    ]


async def test_server_tool_records_an_effect(sim: Simulator, wire: Wire) -> None:
    chat = await wire.create('deploy it /server-tool deploy {"env": "prod", "n": {"x": 1}}')
    await sim.wait_for_status(chat["id"], "waiting")
    effects = sim.records.effects
    assert len(effects) == 1
    effect = effects[0]
    assert str(effect.chat_id) == chat["id"]
    assert effect.tool_name == "deploy"
    assert effect.args == {"env": "prod", "n": {"x": 1}}
    # The call and its result are in the history, under the recorded call id.
    parts = [p for m in sim.messages(chat["id"]) for p in m.content]
    call = next(p for p in parts if p["type"] == "tool-call")
    result = next(p for p in parts if p["type"] == "tool-result")
    assert call["tool_call_id"] == result["tool_call_id"] == effect.tool_call_id
    assert result["result"]["ok"] is True
    assert "deploy ran on the server." in sim.messages(chat["id"])[-1].text()


@pytest.mark.parametrize(("mode", "retryable"), [("retryable", True), ("fatal", False)])
async def test_fail_directive_errors_the_turn(
    sim: Simulator, wire: Wire, mode: str, retryable: bool
) -> None:
    chat = await wire.create(f"/fail {mode}")
    await sim.wait_for_status(chat["id"], "error")
    body = (await wire.http.get(f"{wire.prefix}/{chat['id']}")).json()
    assert body["last_error"]["retryable"] is retryable
    assert body["last_error"]["detail"] == f"simulated /fail {mode}"


async def test_step_marker_and_paths_are_echoed_as_text(sim: Simulator, wire: Wire) -> None:
    chat = await wire.create("[wf-1/step-2] run /usr/bin/env")
    await sim.wait_for_status(chat["id"], "waiting")
    assert sim.messages(chat["id"])[-1].text() == 'You said: "[wf-1/step-2] run /usr/bin/env"'


async def test_directives_work_on_a_fresh_simulator_over_httpx() -> None:
    """No fixtures: a plain httpx client against its own simulator."""
    async with serve_simulator(fast_config()) as sim:
        headers = {"Coder-Session-Token": sim.token}
        async with httpx.AsyncClient(base_url=sim.base_url, headers=headers) as http:
            body = {
                "organization_id": str(sim.organization_id),
                "content": [{"type": "text", "text": "/deltas 2 /server-tool ping"}],
            }
            created = await http.post("/api/v2/chats", json=body)
            assert created.status_code == 201
            await sim.wait_for_status(created.json()["id"], "waiting")
        assert [e.tool_name for e in sim.records.effects] == ["ping"]


def test_a_sleep_waits_before_the_server_tools_or_after_them_as_written() -> None:
    before = parse("think /sleep 2 /server-tool look {}")
    after = parse("look /server-tool look {} /sleep 2 then /sleep 1")
    assert (before.sleep, before.sleep_after_tools) == (2.0, 0.0)
    assert (after.sleep, after.sleep_after_tools) == (0.0, 3.0)
