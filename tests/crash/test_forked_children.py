"""The crash lab's children come from one fork server (tests/lab/forkserver.py), which imported
Prefect before any of them existed: each must still run with its own environment, as a process
started afresh would, and end as the lab says (let go, not needed, killed)."""

from __future__ import annotations

import os
import signal

from prefect import flow
from prefect.settings import get_current_settings

from tests.lab.child import READY
from tests.lab.children import CrashLab

WHAT_PREFECT_READS = "tests.crash.test_forked_children:what_prefect_reads"


@flow
async def what_prefect_reads() -> dict[str, str]:
    """Where this process's Prefect keeps its home and results, and its pid."""
    settings = get_current_settings()
    return {
        "home": str(settings.home),
        "storage": str(settings.results.local_storage_path),
        "pid": str(os.getpid()),
    }


async def test_each_child_runs_with_its_own_environment(lab: CrashLab) -> None:
    here = await lab.start(flow=WHAT_PREFECT_READS)
    there = await lab.start(flow=WHAT_PREFECT_READS, env=lab.machine("there"))
    seen_here = (await lab.finish_flow(here)).value
    seen_there = (await lab.finish_flow(there)).value
    machine = lab.machine("there")
    # The server was started with the first lab's environment: the second machine's values
    # show that a child reads its own, and the storage under each home that Prefect derived
    # them after the fork.
    assert seen_here["home"] == str(lab.home)
    assert seen_here["storage"] == str(lab.home / "storage")
    assert seen_there["home"] == machine["PREFECT_HOME"]
    assert seen_there["storage"] == machine["PREFECT_LOCAL_STORAGE_PATH"]
    assert (seen_here["pid"], seen_there["pid"]) == (str(here.proc.pid), str(there.proc.pid))


async def test_a_child_ends_as_the_lab_says(lab: CrashLab) -> None:
    spawned = await lab.spawn(flow=WHAT_PREFECT_READS)
    assert spawned.output() in ("", f"{READY}\n")  # readable at once, as a polling lab reads it
    unneeded = await lab.ready(spawned)
    killed = await lab.ready(await lab.spawn(flow=WHAT_PREFECT_READS))
    unneeded.proc.not_needed()
    await lab.crash(killed)
    assert await unneeded.proc.wait() == 0
    assert killed.proc.returncode == -signal.SIGKILL
    assert unneeded.proc.pid != killed.proc.pid != os.getpid()
