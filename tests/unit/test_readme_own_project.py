"""The guide for a team's own project (docs/own-project.md): its ``prefect.yaml`` names our flows by module
paths that import, with parameters those flows take, aimed at the team's own deployment."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from prefect import Flow

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-project.md"


def own_project() -> dict[str, Any]:
    found = re.search(
        r"<!-- own-project: prefect.yaml -->\n```yaml\n(?P<yaml>.*?)```", PAGE.read_text(), re.S
    )
    assert found, "the own-project guide's prefect.yaml is missing"
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


def test_the_guides_sweep_triggers_are_the_shipped_ones_aimed_at_the_teams_flow() -> None:
    """The guide's triggers are the shipped YAML's, but for the team's flow and deployment:
    a change to one that is not made to the other fails here."""
    ours = {d["name"]: d for d in own_project()["deployments"]}["code-review-sweep"]["triggers"]
    shipped_file = ROOT / "deployments" / "prefect.yaml"
    shipped = {
        t["name"]: t
        for d in yaml.safe_load(shipped_file.read_text())["deployments"]
        for t in d.get("triggers", [])
    }
    assert {t["name"] for t in ours} == {
        "orphan-sweep on a crash or a cancel",
        "orphan-sweep on a run whose pulse stopped",
    }
    for trigger in ours:
        assert trigger["match_related"]["prefect.resource.name"] == "code-review"
        assert trigger["parameters"]["target_deployment"] == "code-review"
        aimed = {
            **shipped[trigger["name"]],
            "match_related": trigger["match_related"],
            "parameters": {
                **shipped[trigger["name"]]["parameters"],
                "target_deployment": "code-review",
            },
        }
        assert trigger == aimed, trigger["name"]
