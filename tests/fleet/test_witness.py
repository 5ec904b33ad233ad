"""The witness, on a real namespace and a real process that execs into a flow run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import slots
from tests.fleet.net import Host
from tests.fleet.witness import Witness

#: Waits for "go", then execs into a process whose environment names a flow run: what a
#: worker's child does between its fork and its exec, held open long enough to be seen.
CHILD = """
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
(folder / "ready").touch()
while not (folder / "go").exists():
    time.sleep(0.05)
env = {**os.environ, "PREFECT__FLOW_RUN_ID": "run-after-exec"}
code = "import sys, time; from pathlib import Path; Path(sys.argv[1]).touch(); time.sleep(60)"
os.execve(sys.executable, [sys.executable, "-c", code, str(folder / "exec'd")], env)
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    slot = slots.claim(tmp_path / "lab")
    try:
        host = Host("w1", slot.name("w1"), slot.address(41))
        subprocess.run(["ip", "netns", "add", host.ns], check=True)
        yield host
    finally:
        slots.release(slot, keep_root=False)


def until(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_process_seen_before_its_exec_is_taken_for_its_run_after_it(
    host: Host, tmp_path: Path
) -> None:
    witness = Witness([host])
    child = subprocess.Popen(
        ["ip", "netns", "exec", host.ns, sys.executable, "-c", CHILD, str(tmp_path)]
    )
    try:
        until(tmp_path / "ready")
        witness.look()
        assert witness.runs == {}  # a process of no flow run yet
        (tmp_path / "go").touch()
        until(tmp_path / "exec'd")
        witness.look()
        assert "run-after-exec" in witness.runs, "the exec'd process was not seen"
        seen = witness.runs["run-after-exec"]
        assert (seen.host, seen.pids) == ("w1", {child.pid})
    finally:
        child.kill()
        child.wait()
