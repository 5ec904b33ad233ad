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
