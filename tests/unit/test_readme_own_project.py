"""The README's guide for a team's own project: its ``prefect.yaml`` names our flows by module
paths that import, with parameters those flows take, aimed at the team's own deployment."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from prefect import Flow

README = Path(__file__).resolve().parents[2] / "README.md"


def own_project() -> dict[str, Any]:
    found = re.search(
        r"<!-- own-project: prefect.yaml -->\n```yaml\n(?P<yaml>.*?)```", README.read_text(), re.S
    )
    assert found, "the README's own-project prefect.yaml is missing"
    loaded: dict[str, Any] = yaml.safe_load(found["yaml"])
    return loaded


def flow_of(entrypoint: str) -> Flow[..., Any]:
    module, _, name = entrypoint.partition(":")
    found = getattr(importlib.import_module(module), name)
    assert isinstance(found, Flow), entrypoint
    return found


def test_the_guides_deployments_of_ours_import_and_take_their_parameters() -> None:
    deployments = {d["name"]: d for d in own_project()["deployments"]}
    theirs = "code-review"
    assert deployments[theirs]["entrypoint"].endswith(".py:code_review")  # the team's own file
    ours = [d for d in deployments.values() if d["entrypoint"].startswith("prefect_coder.")]
    assert {flow_of(d["entrypoint"]).name for d in ours} == {"orphan-sweep", "prune-workflows"}
    for deployment in ours:
        flow = flow_of(deployment["entrypoint"])
        flow.validate_parameters(deployment["parameters"])  # the names and types it takes
        assert deployment["schedules"], deployment["name"]
        assert deployment["work_pool"] == deployments[theirs]["work_pool"]
    sweep = deployments["code-review-sweep"]["parameters"]
    prune = deployments["code-review-prune"]["parameters"]
    assert sweep["target_deployment"] == prune["deployment"] == theirs
