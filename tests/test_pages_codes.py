"""Codes on the waiting page without JavaScript (issue 20, item 2): the box shows where the queue has codes,
a code entered moves the visitor's own ticket, and the page says plainly what came of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from queueing import services, store
from queueing.models import PriorityCode

from .test_pages import data_state, page


def said(response) -> str:
    match = re.search(r'<p class="wr-notice" id="wr-code-said"( hidden)?>([^<]*)</p>', response.content.decode())
    assert match, "no code message on the page"
    return "" if match.group(1) else match.group(2).replace("&#x27;", "'")


def position(response) -> int:
    match = re.search(r'<span id="wr-position">(\d+)</span>', response.content.decode())
    assert match
    return int(match.group(1))


@pytest.fixture
def line(make_queue, clock):
    """A paused queue with 29 in line and a level-2 code; synced as the beat's tick syncs it."""
    queue = make_queue(state="paused")
    for i in range(29):
        services.queue_join(slug=queue.slug, visitor_key=f"{i:032x}", now=clock())
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2, max_uses=5)
    services.queues_tick(now=clock())
    return queue


def enter(client, slug: str, code: str, **params):
    return client.post(f"/q/{slug}/", {"action": "code", "code": code, **params}, follow=True)


def join_page(client, slug: str) -> None:
    page(client, slug)
    client.post(f"/q/{slug}/", {"action": "join"})


def test_the_code_box_shows_only_where_the_queue_has_codes(client, make_queue, line):
    plain = make_queue(state="paused")
    join_page(client, plain.slug)
    assert b'id="wr-code-form"' not in page(client, plain.slug).content
    join_page(client, line.slug)
    assert b'id="wr-code-form"' in page(client, line.slug).content


def test_a_code_moves_the_visitor_and_the_page_says_from_where_to_where(client, line):
    join_page(client, line.slug)
    assert position(page(client, line.slug)) == 30
    response = enter(client, line.slug, " Gold-2026 ")  # pasted with spaces
    assert response.redirect_chain[-1][0].endswith("?code=moved&before=30")
    assert data_state(response) == "paused" and position(response) == 16
    assert said(response) == "Your code worked: you moved up from place 30 to place 16."
    again = enter(client, line.slug, "Gold-2026")
    assert said(again).startswith("You already have the place this code gives") and position(again) == 16
    assert PriorityCode.objects.get(code="Gold-2026").uses == 1


def test_a_wrong_code_is_said_plainly_and_moves_nothing(client, line):
    join_page(client, line.slug)
    response = enter(client, line.slug, "gold-2026")
    assert said(response).startswith("That code did not work: it is unknown, used up or expired.")
    assert position(response) == 30
    assert said(enter(client, line.slug, "   ")) == "Type your code first."
    assert said(page(client, line.slug)) == ""  # said once, not on every later page


def test_a_code_with_the_join_places_the_joiner_ahead(client, line):
    page(client, line.slug)
    response = client.post(f"/q/{line.slug}/", {"action": "join", "code": "Gold-2026"}, follow=True)
    assert said(response) == "Your code worked: you joined the line with priority."
    assert position(response) == 15  # ahead of the last half of the 29 already waiting


def test_a_wrong_code_with_the_join_joins_nobody_and_offers_the_join_again(client, line):
    page(client, line.slug)
    response = client.post(f"/q/{line.slug}/", {"action": "join", "code": "NOPE"}, follow=True)
    assert data_state(response) == "join"
    assert said(response).startswith("That code did not work")
    assert store.snapshot(line.slug).waiting == 29


def test_an_admitted_visitor_is_told_codes_only_move_those_in_line(client, make_queue):
    queue = make_queue(capacity=5)
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2)
    services.queue_config_sync(queue)
    join_page(client, queue.slug)
    response = enter(client, queue.slug, "Gold-2026")
    assert data_state(response) == "admitted"
    assert said(response) == "Codes only move people waiting in line, and you are no longer waiting."
    assert PriorityCode.objects.get(code="Gold-2026").uses == 0


def test_the_page_says_it_in_the_visitors_language(client, line):
    client.cookies["django_language"] = "de"
    join_page(client, line.slug)
    response = enter(client, line.slug, "Gold-2026")
    assert said(response) == "Ihr Code hat funktioniert: Sie sind von Platz 30 auf Platz 16 vorgerückt."
    assert "Haben Sie einen Einladungs- oder Prioritätscode?" in response.content.decode()


DRAWN_AHEAD = "when the line opens and places are drawn, you will be placed ahead of everyone with a lower priority."


def test_a_code_in_the_pre_queue_says_what_it_does_at_the_draw_and_again_that_it_is_applied(client, make_queue):
    """Issue 47, item 11: in a pre-queue the page said "moved up from place 36 to place null", and the same
    code again "unknown, used up or expired"."""
    queue = make_queue(starts_at=timezone.now() + timedelta(hours=1))
    for i in range(5):
        services.queue_join(slug=queue.slug, visitor_key=f"{i:032x}")
    PriorityCode.objects.create(queue=queue, code="Gold-2026", level=2, max_uses=1)
    services.queue_config_sync(queue)
    join_page(client, queue.slug)
    response = enter(client, queue.slug, "Gold-2026")
    assert data_state(response) == "prequeue"
    assert said(response) == "Your code worked: " + DRAWN_AHEAD
    again = enter(client, queue.slug, "Gold-2026")
    assert said(again) == "This code's priority is already applied to your ticket: " + DRAWN_AHEAD
    assert PriorityCode.objects.get(code="Gold-2026").uses == 1
    client.cookies["django_language"] = "de"
    assert said(enter(client, queue.slug, "Gold-2026")).startswith(
        "Der Vorrang dieses Codes gilt für Ihr Ticket bereits"
    )
