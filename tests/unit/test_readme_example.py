"""The README's example of durable turns in your own flow is the module the tests run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_shows_the_example_module_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(
        r"<!-- example: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```", readme, re.DOTALL
    )
    assert found, "the README has no example block"
    assert found["path"] == "prefect_coder/examples/refund.py"
    assert found["code"] == (ROOT / found["path"]).read_text()


def test_the_approval_form_says_what_its_toggle_means() -> None:
    """The UI's Resume form shows the toggle off: its label says that off declines."""
    from prefect_coder.examples.refund import Approval

    field = Approval.model_json_schema()["properties"]["approved"]
    assert field["default"] is False and "declined" in field["description"]
