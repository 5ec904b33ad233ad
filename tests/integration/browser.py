"""Headless Chromium for the UI test: Debian's ``/usr/bin/chromium``, driven by Playwright.

Playwright is pointed at the system browser (``executable_path``) and never
downloads one of its own. Without the browser the UI test skips and says how to
install it, except where ``PREFECT_CODER_REQUIRE_BROWSER=1`` (CI) makes a missing
browser a failure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.pgcluster import PgCluster

from .procs import Processes, managed_processes
from .ui_support import loopback_only

CHROMIUM = Path(os.environ.get("PREFECT_CODER_CHROMIUM", "/usr/bin/chromium"))
#: Screenshots land here, at the repository root (gitignored).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output"


def require_chromium() -> Path:
    """The browser to drive; skip (or fail, in CI) when it is not installed."""
    if CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    message = f"{CHROMIUM} is not installed: `apt-get install -y chromium` (as root)"
    if os.environ.get("PREFECT_CODER_REQUIRE_BROWSER") == "1":
        pytest.fail(message + " (PREFECT_CODER_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(message)


@contextlib.asynccontextmanager
async def chromium(executable: Path) -> AsyncIterator[Browser]:
    """A headless Chromium, closed on the way out."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(executable),
            headless=True,
            # Root in a container has no user namespaces for the sandbox; /dev/shm is small.
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield browser
        finally:
            await browser.close()


@dataclass(frozen=True)
class BrowserLab:
    """What a browser test begins with: its processes, the browser, and a PostgreSQL of
    its own for Prefect's server (on SQLite, a loaded machine makes the run form's "Run"
    fail with "database is locked")."""

    procs: Processes
    browser_path: Path
    database: str


@contextlib.asynccontextmanager
async def browser_lab(tmp: Path, screenshots: str) -> AsyncIterator[BrowserLab]:
    """Chromium required, the test's earlier ``screenshots*.png`` cleared, a private
    PostgreSQL, and the test's processes, all stopped on the way out."""
    browser_path = require_chromium()
    clear_screenshots(screenshots)
    with PgCluster(for_prefect=True) as pg:
        async with managed_processes(tmp) as procs:
            yield BrowserLab(procs, browser_path, pg.dsn)


def clear_screenshots(prefix: str) -> None:
    """Remove an earlier run's ``prefix*.png``, so every screenshot left is this run's."""
    for old in SCREENSHOTS.glob(f"{prefix}*.png"):
        old.unlink()


async def screenshot(page: Page, name: str) -> Path:
    """A full-page PNG of ``page`` in test-output/, named ``name``."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def open_page(browser: Browser, height: int, timeout_ms: int) -> Page:
    """A page as wide as the UI's desktop layout, kept on loopback (:func:`loopback_only`)."""
    page = await browser.new_page(viewport={"width": 1400, "height": height})
    page.set_default_timeout(timeout_ms)
    # An assertion waits as long as an action: its own default (5 s) failed a suite run whose
    # browser took longer than that to open a dialog on a loaded machine.
    expect.set_options(timeout=timeout_ms)
    await page.route("**/*", loopback_only)
    return page
