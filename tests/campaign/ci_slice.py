"""The campaign's CI slice: which schedules of which seed CI plays."""

from __future__ import annotations

SEED = 20260611
COUNT = 20
#: One more schedule of the seed: a person cancels a workflow killed inside its first
#: step's tool, after the charge (surely still running, its chat in no checkpoint), then
#: resumes it. The first 20's cancel (index 9) follows a kill 0.34 s after the last
#: prompt, which a fast machine may beat by finishing the workflow.
EXTRA = (94,)
INDEXES = (*range(COUNT), *EXTRA)
