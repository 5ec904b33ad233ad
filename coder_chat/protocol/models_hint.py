"""Resolving a model hint (``"anthropic:claude-x"``, ``"Echo 1"``, a config id) to a config id."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from .models import ModelConfig


def resolve_model_hint(hint: str, configs: Sequence[ModelConfig]) -> str | None:
    """The config id a hint names, or ``None`` to let the server pick its default.

    In order: a UUID as-is; exact ``provider:model``; exact model id; display-name
    substring; model-id substring (case-insensitive). Enabled configs win ties.
    """
    try:
        return str(uuid.UUID(hint))
    except ValueError:
        pass
    ordered = sorted(configs, key=lambda c: not c.enabled)
    needle = hint.lower()
    rules = (
        lambda c: f"{c.provider}:{c.model}".lower() == needle,
        lambda c: c.model.lower() == needle,
        lambda c: needle in c.display_name.lower(),
        lambda c: needle in c.model.lower(),
    )
    for rule in rules:
        match = next((c for c in ordered if rule(c)), None)
        if match is not None:
            return match.id
    return None
