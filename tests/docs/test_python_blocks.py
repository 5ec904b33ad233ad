"""The python blocks of the README and the guides are type-checked, and the runnable ones run.

``<!-- check: types uses=a,b -->``: the block is a module of its own for ``mypy --strict`` with
the project's configuration, as the body of an async function (it may ``await`` at top level, as
in ``python -m asyncio``), after an import of the names it uses from
``tests/docs/fragment_names.py``, where each is declared with its type.
``<!-- check: runs uses=… -->``: type-checked the same way, then executed here against the
simulator, its names bound to live values.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coder_chat import ChatSession, TurnResult
from coder_chat.simulator import Simulator
from tests.docs.blocks import ROOT, Block, of_kind

TYPED = of_kind("types", "runs")
# mypy names the file of each error: "docblock_client_md_5.py:12: error: …"
ERROR = re.compile(r"^(?P<file>[^:\s]+\.py):\d+: error: .*$", re.M)


def module_name(block: Block) -> str:
    return "docblock_" + re.sub(r"\W", "_", block.name)


def module_text(block: Block) -> str:
    """The block as the body of an async function (a fragment may ``await`` or ``async with``
    at top level, as in ``python -m asyncio``), after the import of the names it uses."""
    header = []
    if block.uses:
        header.append(f"from tests.docs.fragment_names import {', '.join(block.uses)}")
    body = textwrap.indent(block.body, "    ")
    return "\n".join([*header, "", "", "async def block() -> None:", body, ""])


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Every typed block checked in one mypy run (one start-up, the project's cache): the
    errors of each, by its module's name."""
    folder = tmp_path_factory.mktemp("blocks")
    files = []
    for block in TYPED:
        files.append(folder / f"{module_name(block)}.py")
        files[-1].write_text(module_text(block))
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            *map(str, files),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a cold cache reads Prefect's whole tree
    )
    # 0: no errors ("Success: …"); 1: errors, each on a line of its own; else mypy itself failed.
    assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    assert ran.returncode == 1 or ran.stdout.startswith("Success: no issues found"), ran.stdout
    errors: dict[str, list[str]] = {}
    for m in ERROR.finditer(ran.stdout):
        errors.setdefault(Path(m["file"]).stem, []).append(m[0])
    return errors


def test_the_guides_have_typed_blocks() -> None:
    assert {b.page for b in of_kind("runs")} >= {"docs/client.md"}
    assert len(TYPED) >= 4


@pytest.mark.parametrize("block", TYPED, ids=lambda b: b.name)
def test_block_type_checks(block: Block, mypy_errors: dict[str, list[str]]) -> None:
    assert block.lang == "python", block.name
    assert mypy_errors.get(module_name(block), []) == [], module_text(block)


class RecordedPayments:
    """A payments service that only records what it was asked to charge."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str]] = []

    async def charge(self, amount_cents: int, *, idempotency_key: str) -> str:
        self.charges.append((amount_cents, idempotency_key))
        return f"receipt-{len(self.charges)}"


def live_names(sim: Simulator, payments: RecordedPayments) -> dict[str, object]:
    """The values a runnable block's names take here (their types: fragment_names.py)."""
    return {
        "url": sim.base_url,
        "token": sim.token,
        "org": str(sim.organization_id),
        "payments": payments,
    }


def charged_once(scope: dict[str, object], payments: RecordedPayments, org: str) -> None:
    # The client guide: the model asks for a charge of 5 dollars; the tool runs once, its key
    # "<org>/<chat_id>/<tool_call_id>", and the turn ends with the chat's answer.
    session, result = scope["session"], scope["result"]
    assert isinstance(session, ChatSession) and isinstance(result, TurnResult)
    [(amount, key)] = payments.charges
    assert amount == 500
    assert key.startswith(f"{org}/{session.chat_id}/"), key
    assert "Charge 5 dollars" in result.text, result


# What each runnable block must have done, by its page.
AFTER_RUNNING = {"docs/client.md": charged_once}


@pytest.mark.parametrize("block", of_kind("runs"), ids=lambda b: b.name)
async def test_block_runs_against_the_simulator(block: Block, sim: Simulator) -> None:
    payments = RecordedPayments()
    # The simulator plays the model: asked to charge 5 dollars, it calls the charge_card tool.
    sim.script("Charge 5 dollars", '/tool charge_card {"amount_cents": 500}')
    names = live_names(sim, payments)
    scope = {name: names[name] for name in block.uses}
    code = compile(block.body, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    awaiting = eval(code, scope)  # a coroutine when the block awaits at top level
    if awaiting is not None:
        await awaiting
    session = scope["session"]
    assert isinstance(session, ChatSession), session
    try:
        AFTER_RUNNING[block.page](scope, payments, str(sim.organization_id))
    finally:
        await session.aclose()  # the guide leaves its session open: the reader goes on with it
