"""The waiting page in the visitor's language (issue 20, item 1) in headless Chromium: the browser's
language decides (Playwright's locale sets Accept-Language and the browser's own), the page's script
speaks it too, the switcher changes it, and Arabic turns the layout right to left."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from playwright.sync_api import expect

from .conftest import PHONE, accessible

pytestmark = pytest.mark.browser


def join_from_elsewhere(stack: Any, slug: str) -> None:
    with stack.client() as client:
        client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})


def test_a_german_browser_gets_the_page_and_its_live_words_in_german(stack, visitor):
    slug = stack.new_queue(capacity=1, state="paused")
    join_from_elsewhere(stack, slug)
    page = visitor(locale="de-DE")
    page.goto(f"{stack.url}/q/{slug}/")
    expect(page.locator("html")).to_have_attribute("lang", "de")
    expect(page.locator("#wr")).to_have_attribute("data-state", "paused")
    expect(page.locator("#wr-position")).to_have_text("2")
    expect(page.locator("#wr-ahead-label")).to_have_text("Person")  # one ahead: the script's plural, in German
    expect(page.get_by_text("Ihr Platz in der Schlange")).to_be_visible()
    expect(page.locator("#wr-updated")).to_have_text(re.compile(r"^Aktualisiert um \d\d?:\d\d:\d\d\.$"))
    expect(page.locator("#wr-live")).to_contain_text("Schlange")
    accessible(page)


def test_a_french_browser_gets_french_and_the_switcher_turns_it_to_spanish(stack, visitor):
    slug = stack.new_queue(capacity=1, state="paused")
    page = visitor(locale="fr-FR")
    page.goto(f"{stack.url}/q/{slug}/")
    expect(page.locator("html")).to_have_attribute("lang", "fr")
    expect(page.get_by_text("Votre place dans la file")).to_be_visible()
    expect(page.locator("#wr-updated")).to_have_text(re.compile(r"^Mis à jour à "))
    accessible(page)
    page.get_by_role("button", name="Español").click()
    expect(page.locator("html")).to_have_attribute("lang", "es")
    expect(page.get_by_text("Su puesto en la fila")).to_be_visible()
    expect(page.locator("#wr-updated")).to_have_text(re.compile(r"^Actualizado a las "))
    expect(page.locator("#wr-position")).to_have_text("1")  # the same ticket: switching keeps the place


def test_arabic_lays_the_page_out_right_to_left_on_a_phone(stack, visitor):
    slug = stack.new_queue(capacity=1, state="paused")
    page = visitor(locale="ar", viewport=PHONE)
    page.goto(f"{stack.url}/q/{slug}/")
    expect(page.locator("html")).to_have_attribute("dir", "rtl")
    expect(page.locator("#wr")).to_have_attribute("data-state", "paused")
    assert page.evaluate("() => getComputedStyle(document.getElementById('wr')).direction") == "rtl"
    title = page.locator("#wr-title").bounding_box()
    assert title is not None and title["x"] + title["width"] > PHONE["width"] * 0.5  # starts from the right
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")  # no sideways scroll
    accessible(page)
