"""The CI slice of the fault campaign: 20 seeded schedules, 0 violations expected.

Replay any schedule it reports with the line it prints
(``python -m tests.campaign --seed S --only I --variant V``); run a bigger campaign
with ``python -m tests.campaign --count 1000 --seed S --parallel 3``.
"""

from __future__ import annotations

from pathlib import Path

import prefect.settings
import pytest

from .campaign import CampaignOptions, run_campaign

SEED = 20260611
COUNT = 20

pytestmark = [pytest.mark.timeout(1500), pytest.mark.usefixtures("prefect_api")]


async def test_a_seeded_fault_campaign_finds_no_violation(tmp_path: Path) -> None:
    api_url = str(prefect.settings.PREFECT_API_URL.value())
    options = CampaignOptions(seed=SEED, count=COUNT, parallel=3, workdir=tmp_path)
    report = await run_campaign(options, api_url)
    print(report.line)
    assert not report.errors, [r.error for r in report.errors]
    assert report.violations == 0, report.line
