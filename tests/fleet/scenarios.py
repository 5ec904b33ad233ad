"""Hand-written schedules: the short one CI runs.

**ci**: three workflows, each started on its own worker host. Once the first has
finished a step, its host (w1) is SIGKILLed whole; its worker comes back 30 s later.
Once the second has finished two steps, its host (w2) is cut off (link down), and
healed 3 s after the second's successor has taken its epoch, so that the run it
replaced comes back, alive, to a workflow that is no longer its own, while that
successor is still at work (its last step is long). The third runs on w3
untouched by faults (and takes over whatever the sweep relaunches).

Two people act among those faults. Two seconds after the first workflow's host was
killed, while that workflow waits for its relaunch, a person runs it again on w3
with its first prompt reworded: a run to be refused, taking nothing. Once the third
has finished its first step, a person cancels its run from the API as the UI does,
in the middle of its second step (a long one), and resumes it once the store says
it is cancelled.

Its fleet runs the sweep on w3's queue alone (:data:`CI_SWEEP_QUEUE`): a host
killed or cut off with a sweep in flight blocks every sweep for minutes (the
sweep's one concurrency slot stays taken; see the README's fleet findings). The
campaign draws that case; CI keeps to a scenario whose outcome does not hang on
whether a sweep happened to be on the faulted host at that instant.
"""

from __future__ import annotations

from tests.lab.drawing import charge_step, plain_step, sleep_step

from .plan import Fault, FleetSchedule, FleetWorkflow, Moment, Person

#: The queue the CI fleet's sweep is deployed to: only w3, which no fault touches, polls it.
CI_SWEEP_QUEUE = "w3"


def ci_schedule(seed: int = 16) -> FleetSchedule:
    killed, cut, calm = (f"ci-{seed}-{name}" for name in ("killed", "cut", "calm"))
    workflows = (
        FleetWorkflow(
            killed,
            (
                plain_step("refund"),
                charge_step("refund", 1601),
                sleep_step("refund", "2.0"),
                plain_step("memo"),
            ),
            "w1",
            person=Person("changed-prompt", Moment("step", 2.0, killed, 1), "w3"),
        ),
        FleetWorkflow(
            cut,
            (
                charge_step("invoice", 1602),
                plain_step("invoice"),
                sleep_step("ledger", "3.0"),
                sleep_step("note", "6.0"),
            ),
            "w2",
        ),
        FleetWorkflow(
            calm,
            (charge_step("payout", 1603), sleep_step("payout", "6.0"), plain_step("audit")),
            "w3",
            person=Person("cancel-resume", Moment("step", 1.0, calm, 1)),
        ),
    )
    kill = Moment("step", 0.5, killed, 1)
    cut_off = Moment("step", 0.3, cut, 2)
    faults = (
        Fault("kill-host", kill, f"running:{killed}", Moment("time", 30.0)),
        Fault("cut-host", cut_off, f"running:{cut}", Moment("epoch", 3.0, cut)),
    )
    return FleetSchedule(seed, 0, workflows, faults)
