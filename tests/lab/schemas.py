"""Output schemas the campaign's structured steps name by import path, as a user would."""

from __future__ import annotations

from pydantic import BaseModel

#: How ``durable_chat``'s ``output_schemas`` parameter names :class:`Verdict`.
VERDICT = "tests.lab.schemas:Verdict"


class Verdict(BaseModel):
    """A structured step's answer: the model files it through ``structured_output``."""

    verdict: str
    score: float
