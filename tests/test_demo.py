"""The README's first command, run as a user runs it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

#: The demo takes about 30 s alone; a CI run's neighbours once made it take over 120.
pytestmark = pytest.mark.timeout(300)


async def test_demo_recovers_and_charges_exactly_once(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "prefect-coder"
    # The demo keeps its work folder for a person to look at; the test's goes in its own
    # temporary directory (TMPDIR), so that each run does not leave one in /tmp.
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "TMPDIR": str(tmp_path)}
    env.pop("PREFECT_API_URL", None)
    process = await asyncio.create_subprocess_exec(
        str(exe), "demo", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 240)
    text = output.decode()
    assert process.returncode == 0, text
    assert "SIGKILL the worker" in text
    assert "step 2: recovered" in text
    assert "card charges applied: 1 " in text
    assert "the card was charged exactly once" in text
