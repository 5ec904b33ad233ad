"""The CI slice of the fault campaign: 21 seeded schedules, 0 violations expected.

Replay any schedule it reports with the line it prints
(``python -m tests.campaign --seed S --only I --variant V``); run a bigger campaign
with ``python -m tests.campaign --count 1000 --seed S --parallel 3``.
"""

from __future__ import annotations

from pathlib import Path

import prefect.settings
import pytest

from tests.lab.steps import PERSON_KINDS

from .campaign import CampaignOptions, run_campaign
from .ci_slice import INDEXES, SEED

pytestmark = [pytest.mark.timeout(1500), pytest.mark.usefixtures("prefect_api")]


async def test_a_seeded_fault_campaign_finds_no_violation(tmp_path: Path) -> None:
    api_url = str(prefect.settings.PREFECT_API_URL.value())
    options = CampaignOptions(seed=SEED, only=INDEXES, parallel=3, workdir=tmp_path)
    report = await run_campaign(options, api_url)
    print(report.line)
    assert not report.errors, [r.error for r in report.errors]
    assert report.violations == 0, report.line
    # Each person's action was taken, not only drawn (test_draw): index 19's changed
    # prompt follows a kill in its fourth step, index 94's cancel a kill inside a tool.
    taken = {
        o.person.person.kind
        for r in report.results
        for o in r.outcomes
        if o.person is not None and o.person.done
    }
    assert taken == set(PERSON_KINDS), report.line
