"""``prefect-coder demo``: a durable chat that survives its worker being killed mid-payment.

Everything runs on this machine with no setup: the Coder simulator, a fake
payments service, the embedded SQLite store and Prefect's local API. The
workflow has three steps; the second charges a card through a durable client
tool. The demo kills the worker process (SIGKILL: no ``finally`` runs) after the
card was charged and before the tool's result reached Coder, starts a new
worker with the same workflow id, and shows what recovery decided.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coder_chat.simulator import Simulator, SimulatorConfig, serve_simulator

from .payments import Ledger, serve_payments

PROMPTS = [
    "Look up order 1042 and tell me what the customer owes.",
    'Charge the customer 12.99 for order 1042. /tool charge_card {"amount_cents": 1299}',
    "Write the customer a one-line receipt note.",
]
NOISE = ("http:", "ws:", "segment:", "Created task run", "Created flow run", "Beginning flow run")


def say(text: str) -> None:
    print(f"\033[1m==>\033[0m {text}", flush=True)


@contextmanager
def prefect_api() -> Iterator[str]:
    """Prefect's local API (what ephemeral mode starts), shared by both worker processes."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no network here
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=120)
    try:
        yield server.api_url
    finally:
        server.stop()


def spawn_worker(env: dict[str, str], params: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prefect_coder.demo_child", json.dumps(params)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, killed as one
    )


async def relay(worker: subprocess.Popen[str], results: list[Any]) -> None:
    """Echo the worker's decisions (not its transport chatter); keep its results."""
    assert worker.stdout is not None
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, worker.stdout.readline)
        if not line:
            return
        if line.startswith("RESULTS "):
            results.extend(json.loads(line[8:]))
        elif "|" in line and not any(n in line for n in NOISE):
            print("   worker | " + line.split("|")[-1].strip()[:160], flush=True)


async def run_demo() -> int:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="prefect-coder-demo-"))
    workflow_id = f"demo-{uuid.uuid4().hex[:6]}"
    config = SimulatorConfig(delta_interval=0.01, interrupt_winddown=0.2)
    say("starting the Coder simulator, a fake payments service and Prefect's local API")
    async with serve_simulator(config) as sim, serve_payments() as (payments_url, payments):
        with prefect_api() as api_url:
            env = {
                **os.environ,
                **sim.env(),
                "PAYMENTS_URL": payments_url,
                "PREFECT_API_URL": api_url,
                "PREFECT_CODER_SQLITE_PATH": str(workdir / "ledger.sqlite3"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            }
            params = _parameters(workflow_id)
            await _kill_the_first_worker(sim, payments, env, params)
            say("worker 2 starts the same workflow id")
            results: list[Any] = []
            second = spawn_worker(env, params)
            await relay(second, results)
            code = second.wait()
            if code != 0 or len(results) != len(PROMPTS):
                say(f"worker 2 failed (exit {code})")
                return 1
    print()
    for result in results:
        say(f"step {result['step']}: {result['verdict']:<11} {result['text'][:90]}")
    return _charged_once(payments, started, workdir)


def _parameters(workflow_id: str) -> dict[str, Any]:
    return {
        "workflow_id": workflow_id,
        "prompts": PROMPTS,
        "tools": ["prefect_coder.demo_tools:charge_card"],
        "settings": {
            "request_timeout_seconds": 30,
            "step_deadline_seconds": 60,
            "heartbeat_seconds": 5,
        },
    }


async def _kill_the_first_worker(
    sim: Simulator, payments: Ledger, env: dict[str, str], params: dict[str, Any]
) -> None:
    """Worker 1 runs the workflow until the card is charged and the result is on its way
    to Coder: the crash window. Then its whole process group is killed."""
    sim.faults.hold("tool_results", phase="before")
    say(f"worker 1 runs workflow {params['workflow_id']} (3 steps; step 2 charges a card)")
    first = spawn_worker(env, params)
    relay_first = asyncio.create_task(relay(first, []))
    held = await sim.faults.wait_held("tool_results", timeout=90)
    charged = sum(payments.applied.values())
    say(f"the card was charged ({charged} charge applied); the result is on its way to Coder")
    say("SIGKILL the worker's whole process group now: no finally, no cleanup")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    sim.faults.decide(held.id, "drop")  # the killed worker's request never arrives
    await relay_first
    chat = sim.chats()[0]
    say(
        f"the chat is left paused in '{chat.status}', holding the tool call; the card stays charged"
    )


def _charged_once(payments: Ledger, started: float, workdir: Path) -> int:
    charges = payments.applied
    say(
        f"card charges applied: {sum(charges.values())} "
        f"(requests per idempotency key: {list(payments.requests.values())})"
    )
    ok = sum(charges.values()) == 1
    say("the card was charged exactly once" if ok else "the card was charged MORE THAN ONCE")
    say(f"done in {time.monotonic() - started:.0f}s; store at {workdir / 'ledger.sqlite3'}")
    return 0 if ok else 1


def main() -> int:
    return asyncio.run(run_demo())
