"""Headless Chromium (Debian's package, driven by Playwright; never a downloaded browser)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

CHROMIUM = os.environ.get("WR_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"
PHONE = {"width": 390, "height": 844}


# Per package, not per session: Playwright's synchronous API runs an event loop on the main thread while
# it is open, and asyncio tests that run after the browser tests (pytest-django orders tests by database
# use) could not start their own.
@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def contexts(browser: Browser) -> Iterator[Callable[..., BrowserContext]]:
    """New browser contexts (separate visitors: their own cookies), closed after the test."""
    opened: list[BrowserContext] = []

    def new(**options: object) -> BrowserContext:
        context = browser.new_context(**{"viewport": PHONE, **options})  # type: ignore[arg-type]
        context.set_default_timeout(15_000)
        opened.append(context)
        return context

    yield new
    for context in opened:
        context.close()


@pytest.fixture
def visitor(contexts: Callable[..., BrowserContext]) -> Callable[..., Page]:
    """A page in a context of its own: one visitor."""

    def new(**options: object) -> Page:
        return contexts(**options).new_page()

    return new


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    """Save a screenshot as a test artifact (tests/artifacts/screenshots/, looked at by a person)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def save(page: Page, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


def wait_until(page: Page, expression: str, timeout: float = 15_000) -> None:
    """Page.wait_for_function without its in-page polling, which the pages' CSP (no eval) forbids:
    the expression is evaluated from outside, every 100 ms, until it is true."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expression}")
        page.wait_for_timeout(100)


AXE = Axe()


def accessible(page: Page) -> None:
    """axe-core finds nothing on the page as it stands (WCAG 2 A and AA rules, and best practices)."""
    page.wait_for_load_state("load")
    found = AXE.run(page).response["violations"]
    assert not found, [(v["id"], v["impact"], v["help"], [n["target"] for n in v["nodes"]][:5]) for v in found]
