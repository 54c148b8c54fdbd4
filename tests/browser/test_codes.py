"""Codes on the waiting page (issue 20, item 2) in headless Chromium against the running stack: a visitor
enters a code while waiting and is told plainly whether it worked, moves up on the spot, and the visitors it
passed see their places change without a reload; in the visitor's language; axe-core clean."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from .conftest import accessible

pytestmark = pytest.mark.browser


def join_from_elsewhere(stack: Any, slug: str, count: int) -> None:
    with stack.client() as client:
        for _ in range(count):
            response = client.post(f"/api/v1/queues/{slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())})
            assert response.status_code == 201, response.text


def code_for(stack: Any, slug: str, code: str, level: int, max_uses: int | None = None) -> None:
    """A priority code, made as admin makes one; the beat's next tick tells the page the queue has codes."""
    stack.manage(
        "shell",
        "--no-imports",
        "-c",
        f"from queueing.models import PriorityCode, Queue; "
        f"PriorityCode.objects.create(queue=Queue.objects.get(slug='{slug}'), code='{code}', level={level}, "
        f"max_uses={max_uses})",
    )
    deadline = time.monotonic() + 15
    while stack.redis.hget(f"{stack.prefix}:{{{slug}}}:cfg", "codes") != "1":
        assert time.monotonic() < deadline, "the tick did not mirror the queue's codes"
        time.sleep(0.2)


def waiting_at(page: Page, position: int) -> None:
    expect(page.locator("#wr")).to_have_attribute("data-state", "paused")
    expect(page.locator("#wr-position")).to_have_text(str(position))


def test_a_code_entered_while_waiting_moves_the_visitor_up_and_the_others_see_it_live(stack, visitor, screenshot):
    slug = stack.new_queue(capacity=1, state="paused")
    code_for(stack, slug, "Gold-2026", 2)
    join_from_elsewhere(stack, slug, 4)
    passed = visitor()  # fifth in line: the code holder will pass them
    passed.goto(f"{stack.url}/q/{slug}/")
    waiting_at(passed, 5)
    join_from_elsewhere(stack, slug, 1)
    holder = visitor(locale="de-DE")
    holder.goto(f"{stack.url}/q/{slug}/")
    waiting_at(holder, 7)
    expect(holder.get_by_label("Haben Sie einen Einladungs- oder Prioritätscode?")).to_be_visible()
    first_ticket = holder.evaluate("() => window.waitingRoom.ticket")

    holder.get_by_label("Haben Sie einen Einladungs- oder Prioritätscode?").fill("gold-2026")  # case counts
    holder.get_by_role("button", name="Code verwenden").click()
    expect(holder.locator("#wr-code-said")).to_contain_text("Dieser Code hat nicht funktioniert")
    waiting_at(holder, 7)
    accessible(holder)

    holder.get_by_label("Haben Sie einen Einladungs- oder Prioritätscode?").fill("Gold-2026")
    holder.get_by_role("button", name="Code verwenden").click()
    expect(holder.locator("#wr-code-said")).to_have_text(
        "Ihr Code hat funktioniert: Sie sind von Platz 7 auf Platz 4 vorgerückt."
    )
    waiting_at(holder, 4)  # ahead of the last half of the seven in line
    expect(holder.get_by_label("Haben Sie einen Einladungs- oder Prioritätscode?")).to_have_value("")
    assert holder.evaluate("() => window.waitingRoom.ticket") != first_ticket  # signed again with its level
    waiting_at(passed, 6)  # passed by one, told by the socket, no reload
    screenshot(holder, "code-worked-de")
    accessible(holder)

    holder.get_by_label("Haben Sie einen Einladungs- oder Prioritätscode?").fill("Gold-2026")
    holder.get_by_role("button", name="Code verwenden").click()
    expect(holder.locator("#wr-code-said")).to_contain_text("Sie haben den Platz, den dieser Code gibt, bereits")
    holder.reload()
    waiting_at(holder, 4)  # the place is the ticket's, not the page's


def test_a_code_in_the_pre_queue_says_what_it_does_at_the_draw_and_again_that_it_is_applied(stack, visitor):
    """Issue 47, item 11: in a pre-queue the page said "you moved up from place 36 to place null", and the
    same code again "unknown, used up or expired"."""
    starts = datetime.now(UTC) + timedelta(hours=1)
    slug = stack.new_queue(starts_at=starts.strftime("%Y-%m-%dT%H:%M:%SZ"))
    code_for(stack, slug, "Gold-2026", 2, max_uses=1)
    join_from_elsewhere(stack, slug, 3)
    page = visitor(locale="fr-FR")
    page.goto(f"{stack.url}/q/{slug}/")
    expect(page.locator("#wr")).to_have_attribute("data-state", "prequeue")
    box = page.get_by_label("Vous avez un code d'invitation ou de priorité ?")
    drawn = "à l\u2019ouverture de la file, quand les places seront tirées au sort, vous passerez devant tous ceux"
    box.fill("Gold-2026")
    page.get_by_role("button", name="Utiliser le code").click()
    expect(page.locator("#wr-code-said")).to_have_text(
        f"Votre code a fonctionné : {drawn} qui ont une priorité plus basse."
    )
    expect(page.locator("#wr")).to_have_attribute("data-state", "prequeue")
    box.fill("Gold-2026")
    page.get_by_role("button", name="Utiliser le code").click()
    expect(page.locator("#wr-code-said")).to_have_text(
        f"La priorité de ce code est déjà appliquée à votre ticket : {drawn} qui ont une priorité plus basse."
    )
    accessible(page)


def test_a_queue_without_codes_shows_no_code_box(stack, visitor):
    slug = stack.new_queue(capacity=1, state="paused")
    join_from_elsewhere(stack, slug, 1)
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    waiting_at(page, 2)
    expect(page.locator("#wr-code-form")).to_have_count(0)


def test_an_e_mail_left_on_the_page_tells_the_turn_and_its_link_takes_another_browser_through(stack, visitor):
    """Issue 20, item 3: the visitor leaves an address and closes the page; the worker and beat e-mail them
    (a real SMTP server) when the turn is near and when it comes; the link opens a page in another browser (a
    phone's mail app) whose button takes the place there (issue 50), and the phone is sent through."""
    slug = stack.new_queue(capacity=100, outflow_per_minute=60, burst=1, state="paused")
    join_from_elsewhere(stack, slug, 12)
    page = visitor()
    page.goto(f"{stack.url}/q/{slug}/")
    waiting_at(page, 13)
    page.get_by_label(re.compile("E-mail me when my turn is near")).fill("ada@example.com")
    page.get_by_role("button", name="E-mail me").click()
    expect(page.locator("#wr-email-said")).to_have_text(
        "We will e-mail you when your turn is near, and again when it comes. You may leave this page."
    )
    accessible(page)
    page.close()  # gone: the notice keeps the place while away

    assert stack.mailbox is not None
    stack.configure(slug, state="open")  # one a second: the twelve ahead, then this visitor
    deadline = time.monotonic() + 60
    mine: list[Any] = []
    while len(mine) < 2:
        assert time.monotonic() < deadline, [m["Subject"] for _, m in stack.mailbox.messages]
        time.sleep(0.5)
        mine = [m for to, m in stack.mailbox.messages if to == ["ada@example.com"] and slug in m["X-WaitingRoom-Queue"]]
    near, turn = mine
    assert near["Subject"].endswith(": your turn is near") and turn["Subject"].endswith(": it's your turn")
    found = re.search(r"(http://\S+/q/\S+)", turn.get_content())
    assert found and "resume=" in found.group(1)
    phone = visitor()
    phone.route(f"**/demo/{slug}/**", lambda route: route.fulfill(status=204))  # let in: a 204 keeps the page
    phone.goto(found.group(1))  # opening the link changes nothing (issue 50): its page's button takes the place
    expect(phone.locator("#wr-resume-said")).to_have_text(
        "This link takes you back to your place in line: your turn has come."
    )
    accessible(phone)
    phone.get_by_role("button", name="Take my place in this browser").click()
    expect(phone.locator("#wr")).to_have_attribute("data-state", "admitted")
    assert "resume=" not in phone.url
