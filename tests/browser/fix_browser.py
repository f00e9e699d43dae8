"""Debian's Chromium driven by Playwright, for the browser tests.

Playwright never downloads a browser here: it starts the system's Chromium (``FATURA_CHROMIUM``,
default /usr/bin/chromium), which `make test` and .ci/run install when it is missing. Without it
the tests skip and say so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

CHROMIUM = Path(os.environ.get("FATURA_CHROMIUM", "/usr/bin/chromium"))
# As root, and quiet: no first-run, no background fetches, no QUIC. Playwright adds --headless and a
# fresh profile directory of its own to every launch.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Problems:
    """What went wrong inside the page: uncaught errors and Content-Security-Policy violations."""

    found: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"Chromium is not installed at {CHROMIUM}: `apt-get install -y chromium` "
            "(make test and .ci/run install it when they can)"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, Problems]]:
    """A fresh tab (its own storage) and what went wrong in it; the test checks ``Problems``."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    tab = context.new_page()
    problems = Problems()
    tab.on("pageerror", lambda error: problems.found.append(f"uncaught: {error}"))

    def console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            problems.found.append(f"CSP: {message.text}")

    tab.on("console", console)
    yield tab, problems
    context.close()
