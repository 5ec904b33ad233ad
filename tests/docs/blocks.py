"""The fenced blocks of the README and the guides, with the marker line before each.

A marker is an HTML comment on the line before the fence, hidden on the rendered page:
``<!-- TAG: ARG -->``. For ``check`` markers the first word of ARG is the kind of check and
``uses=a,b`` lists the names a python fragment takes from the prose around it.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A fence at the start of a line, or indented as in a list item (its marker and its closing
# fence indented alike).
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?:<!-- (?P<tag>[a-z-]+):(?P<arg>[^>]*)-->\n(?P=indent))?"
    r"```(?P<lang>\w*)\n(?P<body>.*?)\n(?P=indent)```",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the fence, 1-based
    tag: str | None
    kind: str
    lang: str
    body: str
    uses: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _block(page: Path, text: str, m: re.Match[str]) -> Block:
    words = m["arg"].split() if m["tag"] == "check" else []
    options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    uses = tuple(n for n in options.get("uses", "").split(",") if n)
    line = text.count("\n", 0, m.start("lang")) + 1
    kind = words[0] if words else ""
    page_name = str(page.relative_to(ROOT))
    body = textwrap.dedent(m["body"]) if m["indent"] else m["body"]
    return Block(page_name, line, m["tag"], kind, m["lang"], body, uses)


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [_block(page, text, m) for m in FENCE.finditer(text)]
    return found


def of_kind(*kinds: str) -> list[Block]:
    return [b for b in blocks() if b.tag == "check" and b.kind in kinds]


def commands(body: str, prefix: str) -> list[list[str]]:
    """The block's command lines starting with ``prefix``, continuations joined, comments cut."""
    joined = body.replace("\\\n", " ")
    return [
        shlex.split(line, comments=True)
        for line in joined.splitlines()
        if line.strip().startswith(prefix)
    ]
