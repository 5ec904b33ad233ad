"""The prune-workflows deployment in ``deployments/prefect.yaml``: the flow it names, its
parameters, and a daily schedule. (tests/integration/test_deployments.py deploys it.)"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from prefect.utilities.callables import parameter_schema
from prefect.utilities.importtools import import_object

from prefect_coder.flows.prune_workflows import prune_workflows

ROOT = Path(__file__).resolve().parents[2]


def deployment(name: str) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    [found] = [d for d in config["deployments"] if d["name"] == name]
    assert isinstance(found, dict)
    return found


def test_the_prune_deployment_runs_the_flow_daily() -> None:
    prune = deployment("prune-workflows")
    module, _, attribute = prune["entrypoint"].partition(":")
    assert import_object(f"{module}:{attribute}") is prune_workflows
    assert prune["enforce_parameter_schema"] is True
    assert prune["work_pool"]["name"] == deployment("orphan-sweep")["work_pool"]["name"]
    signature = inspect.signature(prune_workflows.fn)
    assert set(prune["parameters"]) <= set(signature.parameters)
    assert prune["parameters"] == {"older_than_days": 30}
    [schedule] = prune["schedules"]
    minute, hour, *every = schedule["cron"].split()
    assert every == ["*", "*", "*"] and minute.isdigit() and hour.isdigit()  # once a day
    assert schedule["timezone"] == "UTC"


def test_the_flows_parameters_read_well_in_the_run_form() -> None:
    schema = parameter_schema(prune_workflows.fn).model_dump_for_openapi()
    properties = schema["properties"]
    assert properties["older_than_days"]["default"] == 30
    assert properties["states"]["default"] == ["finished", "failed", "cancelled", "over-budget"]
    assert "running" not in str(properties["states"])
