"""Where a ``durable_chats`` fleet spends CPU that the same fleet of plain tasks does not.

Run: ``python -m bench.fleet_profile [--size 200] [--timer cpu|wall|none] [--out DIR] [--top 25]``.

One run of ``bench.fleet``'s row (b), N workflows of plain ``@task(persist_result=True)``
turns, and one of row (c), one ``durable_chats`` flow run of the same N workflows on the
SQLite ledger, each under ``cProfile`` (after a warm-up of both at N=2), against the
same simulator process and Prefect test API. ``cProfile`` sees only the thread that
enables it, here the event loop's (every flow, task and turn runs on it); the other
threads' CPU (Prefect's log and event workers, its loop threads, the SQLite store's
thread) is read from ``/proc`` per thread and shown beside it.

The timer is this thread's CPU time (``--timer cpu``), or wall time (``--timer wall``:
then a call that blocks the event loop, waiting on another thread or the network, shows
as time spent in it, which CPU time hides), or none (``--timer none``: no profiler, only
each thread's CPU, without cProfile's overhead, which about doubles it). Printed per step (a turn): CPU of each
thread; self time by package; then the functions whose cumulative time grew most from
(b) to (c): ours (``prefect_coder``, ``coder_chat``) and Prefect's. Profiles are saved
under ``--out`` for ``python -m pstats``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import cProfile
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import load, prefect_api
from bench._procmem import ThreadCpu, thread_sampling
from bench._simproc import simulator_process
from bench.fleet import PROMPTS, Body, Row, durable, measure, plain

#: (file, line, function) -> (primitive calls, calls, self time, cumulative time, callers)
Key = tuple[str, int, str]
Stats = dict[Key, tuple[int, int, float, float, Any]]


@dataclass
class Profiled:
    row: Row
    threads: ThreadCpu
    profiler: cProfile.Profile | None
    stats: Stats
    #: The same for Prefect's global loop thread.
    global_profiler: cProfile.Profile | None
    global_stats: Stats

    @property
    def steps(self) -> int:
        return self.row.steps


def short(path: str) -> str:
    """A file's path from its package on (``prefect/task_engine.py``)."""
    for marker in ("site-packages/", "/lib/python3.11/", str(Path(__file__).parents[1]) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def package(path: str) -> str:
    name = short(path)
    if name.startswith(("~", "<")):
        return "builtins (C)"
    head = name.split("/", 1)[0]
    return head.removesuffix(".py")


def label(key: Key) -> str:
    path, line, function = key
    return f"{short(path)}:{line}({function})" if line else function


def on_global_loop(call: Callable[[], None]) -> None:
    """Run ``call`` on Prefect's global loop thread, and wait for it."""
    from prefect._internal.concurrency.threads import get_global_loop

    loop = get_global_loop()._loop
    assert loop is not None
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        call()
        done.set_result(None)

    loop.call_soon_threadsafe(run)
    done.result(timeout=30)


def profiled_row(sim: Any, kind: str, how: str, size: int, body: Body, timer: str) -> Profiled:
    if timer == "none":
        with thread_sampling() as threads:
            row = measure(sim, kind, how, size, body)
        return Profiled(row, threads, None, {}, None, {})
    clock: Callable[[], float] = time.thread_time if timer == "cpu" else time.perf_counter
    profiler = cProfile.Profile(clock)
    # Prefect's global loop thread runs what its sync-from-async bridges hand it.
    global_loop = cProfile.Profile(clock)
    on_global_loop(global_loop.enable)
    try:
        with thread_sampling() as threads:
            row = measure(sim, kind, how, size, body, profiler=profiler)
    finally:
        on_global_loop(global_loop.disable)
    stats = pstats.Stats(profiler)
    return Profiled(
        row,
        threads,
        profiler,
        stats.stats,  # type: ignore[attr-defined]
        global_loop,
        pstats.Stats(global_loop).stats,  # type: ignore[attr-defined]
    )


def report_threads(b: Profiled, c: Profiled) -> None:
    print("\n  CPU ms per step by thread (from /proc; the event loop is MainThread):")
    names = sorted(
        set(b.threads.by_name()) | set(c.threads.by_name()),
        key=lambda n: -c.threads.by_name().get(n, 0.0),
    )
    print(f"    {'thread':<40} {'(b)':>8} {'(c)':>8} {'c - b':>8}")
    for name in names:
        tb = b.threads.by_name().get(name, 0.0) / b.steps * 1000
        tc = c.threads.by_name().get(name, 0.0) / c.steps * 1000
        if max(tb, tc) >= 0.05:
            print(f"    {name:<40} {tb:>8.2f} {tc:>8.2f} {tc - tb:>8.2f}")
    for p in (b, c):
        print(
            f"    {p.row.how}: process CPU {p.row.cpu_ms_per_step or 0:.2f} ms/step, "
            f"wall {p.row.wall:.1f} s"
        )


def report_packages(b: Profiled, c: Profiled, unit: str) -> None:
    print(f"\n  self time by package, ms per step ({unit}, the profiled thread):")
    totals: dict[str, list[float]] = {}
    for i, p in enumerate((b, c)):
        for key, (_cc, _nc, tt, _ct, _callers) in p.stats.items():
            totals.setdefault(package(key[0]), [0.0, 0.0])[i] += tt / p.steps * 1000
    print(f"    {'package':<24} {'(b)':>8} {'(c)':>8} {'c - b':>8}")
    for name, (tb, tc) in sorted(totals.items(), key=lambda kv: kv[1][0] - kv[1][1])[:18]:
        print(f"    {name:<24} {tb:>8.2f} {tc:>8.2f} {tc - tb:>8.2f}")
    tb, tc = (sum(v[i] for v in totals.values()) for i in (0, 1))
    print(f"    {'all':<24} {tb:>8.2f} {tc:>8.2f} {tc - tb:>8.2f}")


def growth(
    b: Stats, c: Stats, b_steps: int, c_steps: int, keep: Callable[[str], bool], top: int
) -> None:
    """The functions whose cumulative time per step grew most from ``b`` to ``c``."""
    print(f"    {'c - b':>7} {'(c)':>7} {'(b)':>7} {'calls/step c':>12}  function")
    rows = []
    for key, (_cc, nc, _tt, ct, _callers) in c.items():
        if not keep(short(key[0])):
            continue
        before = b.get(key)
        cb = before[3] / b_steps * 1000 if before else 0.0
        cc = ct / c_steps * 1000
        rows.append((cc - cb, cc, cb, nc / c_steps, key))
    for diff, cc, cb, calls, key in sorted(rows, key=lambda r: -r[0])[:top]:
        print(f"    {diff:>7.2f} {cc:>7.2f} {cb:>7.2f} {calls:>12.2f}  {label(key)}")


def report_functions(
    b: Profiled, c: Profiled, unit: str, top: int, keep: Callable[[str], bool], title: str
) -> None:
    print(f"\n  {title}: cumulative ms per step ({unit}), c - b, largest first:")
    growth(b.stats, c.stats, b.steps, c.steps, keep, top)


def report_global_loop(b: Profiled, c: Profiled, unit: str, top: int) -> None:
    print(
        f"\n  Prefect's global loop thread: cumulative ms per step ({unit}), c - b, largest first:"
    )
    growth(b.global_stats, c.global_stats, b.steps, c.steps, lambda _f: True, top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200, help="workflows in each fleet")
    parser.add_argument("--timer", choices=("cpu", "wall", "none"), default="cpu")
    parser.add_argument("--out", default="/tmp/fleet-profile", help="where the profiles go")
    parser.add_argument("--top", type=int, default=25, help="functions listed per table")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    unit = {"cpu": "CPU of the thread", "wall": "wall time", "none": "none"}[args.timer]
    print(
        f"fleet profile: N={args.size} workflows of {len(PROMPTS)} turns, (b) then (c), "
        f"cProfile timer: {unit}; at start {load()}"
    )
    with simulator_process() as sim, prefect_api() as tmp:
        from prefect_coder.blocks import SqliteLedger

        sqlite = SqliteLedger(path=str(tmp / "fleet.sqlite3"))
        for body in (plain(sim, 2), durable(sim, 2, sqlite)):
            measure(sim, "warm-up", "warm-up", 2, body)
        b = profiled_row(
            sim, "b", "(b) plain @task per turn", args.size, plain(sim, args.size), args.timer
        )
        c = profiled_row(
            sim,
            "c",
            "(c) durable_chats SQLite",
            args.size,
            durable(sim, args.size, sqlite),
            args.timer,
        )
    for p in (b, c):
        if p.row.problems:
            sys.exit(f"{p.row.how}: {len(p.row.problems)} incomplete: {p.row.problems[:3]}")
        if p.profiler is None or p.global_profiler is None:
            continue
        path = out / f"{p.row.kind}-{args.size}-{args.timer}.prof"
        p.profiler.dump_stats(path)
        p.global_profiler.dump_stats(path.with_suffix(".global-loop.prof"))
        print(f"  saved {path} (and .global-loop.prof)")
    report_threads(b, c)
    if args.timer == "none":
        print(f"\n  at end {load()}")
        return
    report_packages(b, c, unit)
    report_functions(
        b,
        c,
        unit,
        args.top,
        lambda f: f.startswith(("prefect_coder/", "coder_chat/")),
        "ours (prefect_coder, coder_chat)",
    )
    report_functions(
        b, c, unit, args.top, lambda f: f.startswith("prefect/"), "Prefect's (prefect/*)"
    )
    report_functions(
        b,
        c,
        unit,
        args.top,
        lambda f: not f.startswith(("prefect_coder/", "coder_chat/", "prefect/")),
        "everything else (pydantic, logging, asyncio, httpx, …)",
    )
    report_global_loop(b, c, unit, args.top)
    print(f"\n  at end {load()}")


if __name__ == "__main__":
    main()
