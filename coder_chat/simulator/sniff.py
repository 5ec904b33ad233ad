"""Content sniffing for uploads: the declared type must match the first 512 bytes."""

from __future__ import annotations

import re

ALLOWED = frozenset(
    {
        "application/json",
        "application/pdf",
        "image/gif",
        "image/jpeg",
        "image/png",
        "image/webp",
        "text/csv",
        "text/markdown",
        "text/plain",
    }
)
_TEXTUAL = frozenset({"application/json", "text/csv", "text/markdown", "text/plain"})
_FILENAME = re.compile(r'filename="?([^";]+)"?')
MAX_FILENAME_BYTES = 255


def detect(head: bytes) -> str:
    """A small subset of the WHATWG sniffing algorithm, enough for the allowlist."""
    signatures = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"%PDF-", "application/pdf"),
    ]
    for magic, kind in signatures:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if any(b < 0x09 or (0x0E <= b < 0x20 and b != 0x1B) for b in head):
        return "application/octet-stream"
    return "text/plain"


def matches(declared: str, head: bytes) -> bool:
    sniffed = detect(head)
    if declared in _TEXTUAL:
        return sniffed == "text/plain"
    return sniffed == declared


def filename(disposition: str) -> str:
    match = _FILENAME.search(disposition)
    name = match.group(1) if match else "upload"
    return name.encode()[:MAX_FILENAME_BYTES].decode(errors="ignore")
