"""A seeded randomized fault campaign against ``durable_chat`` (issue 9).

Each schedule, derived from ``(seed, index)`` alone (:mod:`.draw`), runs a workflow
of 3 to 5 random steps in real child processes (:mod:`tests.lab.children`), arms 0 to
3 transient fault knobs over the simulator's admin routes, SIGKILLs runs at
random moments or inside a durable tool, re-runs until the workflow completes,
sweeps once, and checks every invariant of DESIGN.md against ground truth
(:mod:`.checks`). Variants: SQLite, Postgres restarted mid-run, re-runs on a
second machine, two workflows at once, and (a fifth of the schedules) the README's
own flow ``refund_order`` with a random amount, a person answering its paused
runs through Prefect's API, and kills during the pause and inside its refund
(:mod:`.refunds`, :mod:`.approvals`).

    python -m tests.campaign --count 40 --seed 7 --parallel 3
    python -m tests.campaign --seed 7 --only 12 --variant second-machine   # replay one
    python -m tests.campaign --count 20 --seed 7 --variant refund          # refund flows only
"""
