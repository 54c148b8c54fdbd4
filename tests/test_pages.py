"""The waiting page without a browser: the server's side of each state (what a no-JavaScript visitor
gets), per-queue templates, and the wording of waits."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.template import engines
from django.utils import timezone

from queueing import services
from queueing.templatetags.waiting import countdown_text, wait_text


def page(client, slug, **params):
    return client.get(f"/q/{slug}/", params)


def data_state(response) -> str:
    match = re.search(r'id="wr" class="wr" data-state="([a-z]+)"', response.content.decode())
    assert match, response.content[:500]
    return match.group(1)


def test_a_first_visit_offers_to_join_and_sets_the_visitor_cookie(client, make_queue):
    queue = make_queue(state="paused")
    response = page(client, queue.slug)
    assert response.status_code == 200
    assert data_state(response) == "join"
    assert "wr_visitor" in response.cookies and "csrftoken" in response.cookies
    assert b'<meta http-equiv="refresh"' not in response.content


def test_joining_without_javascript_then_refreshing_shows_the_place(client, make_queue):
    queue = make_queue(state="paused")
    page(client, queue.slug)  # the cookie
    response = client.post(f"/q/{queue.slug}/", {"action": "join"})
    assert (response.status_code, response["Location"]) == (303, f"/q/{queue.slug}/")
    response = page(client, queue.slug)
    assert data_state(response) == "paused"
    assert b'id="wr-position">1<' in response.content
    assert re.search(rb'<noscript><meta http-equiv="refresh" content="\d+"></noscript>', response.content)
    again = client.post(f"/q/{queue.slug}/", {"action": "join"})  # joining twice keeps the ticket
    assert again.status_code == 303 and b'id="wr-position">1<' in page(client, queue.slug).content


def test_an_admitted_visitor_without_javascript_is_forwarded(client, make_queue):
    queue = make_queue(capacity=5, burst=5, target_url="/demo/protected/")
    page(client, queue.slug)
    client.post(f"/q/{queue.slug}/", {"action": "join"})
    response = page(client, queue.slug)
    assert data_state(response) == "admitted"
    assert re.search(rb'content="0;url=/demo/protected/\?wr_access=[\w.-]+"', response.content)


def test_a_closed_queue_and_a_full_one_say_so(client, make_queue):
    closed = make_queue(state="closed")
    assert data_state(page(client, closed.slug)) == "closed"
    full = make_queue(state="paused", max_waiting=1)
    services.queue_join(slug=full.slug, visitor_key="someone-else-000")
    page(client, full.slug)
    response = client.post(f"/q/{full.slug}/", {"action": "join"})
    assert response["Location"] == f"/q/{full.slug}/?state=full"
    assert data_state(client.get(response["Location"])) == "full"


def test_a_finished_ticket_offers_to_join_again(client, make_queue):
    queue = make_queue(state="paused")
    page(client, queue.slug)
    client.post(f"/q/{queue.slug}/", {"action": "join"})
    from queueing import store

    (ticket_id,) = store.line_members(queue.slug)
    services.session_revoke(slug=queue.slug, ticket_id=ticket_id)
    response = page(client, queue.slug)
    assert data_state(response) == "expired"
    assert b"Your place was withdrawn." in response.content


def test_a_scheduled_start_shows_the_pre_queue_countdown(client, make_queue):
    queue = make_queue(starts_at=timezone.now() + timedelta(hours=2))
    page(client, queue.slug)
    client.post(f"/q/{queue.slug}/", {"action": "join"})
    response = page(client, queue.slug)
    assert data_state(response) == "prequeue"
    assert re.search(rb'id="wr-opens-in">(1:59:\d\d|2:00:00)<', response.content)


def test_a_site_that_sent_the_visitor_back_is_explained(client, make_queue):
    queue = make_queue()
    assert b"Your session has ended." in page(client, queue.slug, reason="expired").content
    assert b"<script>" not in page(client, queue.slug, reason="<script>").content


def test_an_unknown_queue_is_404(client, db):
    assert client.get("/q/no-such-queue/").status_code == 404


def test_operators_can_override_the_template_per_queue(client, make_queue, tmp_path, settings):
    queue = make_queue(slug=f"branded-{uuid.uuid4().hex[:6]}", state="paused")
    folder = tmp_path / "queueing" / "queues" / queue.slug
    folder.mkdir(parents=True)
    (folder / "waiting.html").write_text(
        '{% extends "queueing/waiting.html" %}{% block brand %}<p class="brand">ACME tickets</p>{% endblock %}'
    )
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path, *settings.TEMPLATES[0]["DIRS"]]}]
    engines._engines = {}  # type: ignore[attr-defined]  # rebuilt with the new template directories
    try:
        response = page(client, queue.slug)
        assert b'<p class="brand">ACME tickets</p>' in response.content
        assert data_state(response) == "join"
    finally:
        engines._engines = {}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "working it out…"),
        ("", "working it out…"),
        (0, "less than a minute"),
        (59, "less than a minute"),
        (75, "about a minute"),
        (420, "about 7 minutes"),
        (1500, "about 25 minutes"),
        (3600, "about 1 hour"),
        (5700, "about 1 hour 35 minutes"),
        (200_000, "more than 2 days"),
    ],
)
def test_waits_are_worded_plainly(seconds, text):
    assert wait_text(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, ""), (65, "1:05"), (3725, "1:02:05"), (90_061, "1 day 01:01:01"), (200_000, "2 days 07:33:20")],
)
def test_countdowns_are_worded_plainly(seconds, text):
    assert countdown_text(seconds) == text
