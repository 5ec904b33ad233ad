"""Flows as a runner serves them: pickled by value into a subprocess of their own.

``flow.serve()`` (and ``python -m prefect_coder.flows.serve``) hand the flow object to a
spawned process with cloudpickle, which carries a function's module globals only as far
as its code names them. Annotations postponed as strings (``from __future__ import
annotations``) would then name types the copy does not have, and Prefect could not
validate a single parameter. Every flow we ship must survive that trip.
"""

from __future__ import annotations

from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import pytest
from prefect import Flow

from prefect_coder.examples.refund import refund_order
from prefect_coder.flows.archive_workflow import archive_workflow
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.durable_chats import durable_chats
from prefect_coder.flows.orphan_sweep import orphan_sweep

CREDENTIALS = {"$ref": {"block_document_slug": "prefect-coder-credentials/any"}}


@pytest.mark.parametrize(
    ("flow", "parameters"),
    [
        (durable_chat, {"workflow_id": "wf", "prompts": ["hi"], "credentials": None}),
        (durable_chats, {"workflows": [{"workflow_id": "wf", "prompts": ["hi"]}]}),
        (orphan_sweep, {"target_deployment": "durable-chat"}),
        (archive_workflow, {"workflow_id": "wf"}),
        (refund_order, {"order_id": "7", "complaint": "late"}),
    ],
    ids=lambda value: value.name if isinstance(value, Flow) else "",
)
def test_a_flow_validates_its_parameters_after_the_trip_to_a_runner(
    flow: Flow[..., Any], parameters: dict[str, Any]
) -> None:
    served = cloudpickle.loads(cloudpickle.dumps(flow))
    assert served.validate_parameters(parameters).keys() >= parameters.keys()
