"""A turn the sweep found stuck and stopped is sent again by the workflow's relaunch.

The run died mid-turn, its step's run still going on Coder past the sweep's
``stuck_after``. The sweep interrupts it, which cuts its answer short, and Coder's
history cannot tell a cut answer from a short one: so the sweep journals the stop
for the workflow's run first, fenced at the epoch the store holds for it, as the run's
own stop would be. The relaunch then sends the step again, never keeping what the
interrupt left as the step's result.
"""

from __future__ import annotations

from coder_chat import ChatClient
from coder_chat.durable.context import DurableOptions
from coder_chat.durable.markers import step_marker
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import SweepPolicy, sweep
from coder_chat.simulator import Simulator

from .support import FAST, step_one_then_two_sent, step_two_again


async def test_a_stuck_turn_the_sweep_stopped_is_sent_again(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant, wf = str(sim.organization_id), "wf-stuck-cut"
    policy = SweepPolicy(stuck_after=0, options=DurableOptions(chat=FAST.chat, poll_interval=0.02))
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, wf)
        chat_id = await step_one_then_two_sent(sim, client, store, fence, wf)  # then it died

        report = await sweep(client, store, tenant, policy, report=print)
        assert [f.action for f in report.findings] == ["interrupted"]
        record = await store.get_chat(tenant, chat_id)
        assert record is not None and record.journal is not None
        assert record.journal.marker == step_marker(wf, 2)
        assert (record.journal.reason, record.journal.stopped_at) == ("abort", None)
        await sim.wait_for_status(chat_id, "waiting")

        result = await step_two_again(client, store, tenant, wf, chat_id)
    assert result.verdict == "resubmitted", result
    assert result.text == f'You said: "{step_marker(wf, 2)} think it over"'
