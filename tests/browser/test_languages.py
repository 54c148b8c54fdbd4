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


def said_in(language: str, text: str) -> str:
    """`text` as the catalogs say it in `language` (tests/test_languages.py checks they are complete)."""
    from django.utils import translation

    with translation.override(language):
        return translation.gettext(text)


@pytest.mark.parametrize("language", ["de", "fr"])
@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_every_state_in_german_and_french_with_and_without_javascript(stack, visitor, language, javascript):
    """Issue 20: per language, per state: the page's own words in the visitor's language in every state a
    visitor meets (waiting, paused, pre-queue, not yet open, admitted, expired, closed, full), with the
    script and without it, and axe-core clean in each."""
    url = f"{stack.url}/q/{{}}/"
    options = {"locale": language, "java_script_enabled": javascript}

    def open_page(slug: str, state: str, words: str, join: bool = True) -> Any:
        page = visitor(**options)
        page.route(re.compile(r"/demo/[^/]+/protected/"), lambda route: route.fulfill(status=204))
        page.goto(url.format(slug))
        if not javascript and join and state != "closed":
            page.locator("#wr-join-form button").click()  # without the script, the visitor joins with the form
        expect(page.locator("html")).to_have_attribute("lang", language)
        expect(page.locator("#wr")).to_have_attribute("data-state", state)
        expect(page.get_by_text(said_in(language, words), exact=False).first).to_be_visible()
        if javascript:  # axe-core runs as a script in the page: with the script on (the same markup)
            accessible(page)
        return page

    waiting = stack.new_queue(capacity=100, outflow_per_minute=1, burst=1)
    for _ in range(3):
        join_from_elsewhere(stack, waiting)
    open_page(waiting, "waiting", "Your place in line")
    paused = stack.new_queue(state="paused")
    open_page(
        paused,
        "paused",
        "The line is paused for a moment. You keep your place; nobody is let through until it resumes.",
    )
    prequeue = stack.new_queue(starts_at="2099-01-01T00:00:00Z")
    open_page(prequeue, "prequeue", "The line opens in")
    notyet = stack.new_queue(prequeue_opens_at="2098-12-31T12:00:00Z", starts_at="2099-01-01T00:00:00Z")
    open_page(notyet, "notyet", "This line has not opened yet", join=javascript)
    admitted = stack.new_queue(capacity=5, burst=5)
    open_page(admitted, "admitted", "It's your turn")
    closed = stack.new_queue(state="closed")
    open_page(closed, "closed", "This line is closed")
    full = stack.new_queue(state="paused", max_waiting=1)
    join_from_elsewhere(stack, full)
    open_page(full, "full", "The line is full")
    expired = stack.new_queue(state="paused")
    key = stack.manage("create_api_key", expired).strip()
    page = open_page(expired, "paused", "Your place in line")
    line = stack.manage("shell", "-c", f"from queueing import store; print(*store.line_members('{expired}'))")
    with stack.client() as client:
        client.post(
            f"/api/v1/queues/{expired}/sessions/revoke",
            json={"ticket_id": line.split()[-1]},
            headers={"Authorization": f"Api-Key {key}"},
        )
    if not javascript:
        page.reload()  # what its own refresh does
    expect(page.locator("#wr")).to_have_attribute("data-state", "expired")
    expect(page.get_by_text(said_in(language, "Your place was withdrawn."))).to_be_visible()
    if javascript:
        accessible(page)
