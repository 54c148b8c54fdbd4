"""The waiting page without a browser: the server's side of each state (what a no-JavaScript visitor
gets), per-queue templates, and the wording of waits."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.template import engines
from django.template.loader import render_to_string
from django.utils import timezone

from queueing import selectors, services
from queueing.templatetags.waiting import countdown_text, epoch_clock, epoch_iso, wait_text


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
    assert response["Location"].startswith(f"/q/{full.slug}/?state=full&retry=")
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


def test_a_finished_visit_is_called_complete_not_expired_and_offers_to_join_again_while_the_line_takes_people(
    client, make_queue
):
    """Issue 47, item 13: a visitor who went in, finished (the site completed the session) and came back
    read "Your place has expired". The status says `completed`; the page says so, thanks them and offers to
    join again, unless the line is closed."""
    from queueing import tokens

    queue = make_queue(capacity=5, burst=5, target_url="/demo/protected/")
    page(client, queue.slug)
    client.post(f"/q/{queue.slug}/", {"action": "join"})
    admitted = re.search(rb"wr_access=([\w.-]+)", page(client, queue.slug).content)
    assert admitted
    claims = tokens.access_token_decode(admitted.group(1).decode(), slug=queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims) == "completed"
    response = page(client, queue.slug)
    text = response.content.decode()
    assert data_state(response) == "expired"  # the card of a finished ticket, worded for its reason
    assert "Your place has expired" not in text
    assert '<h2 id="wr-expired-title">Your visit is complete</h2>' in text
    assert '<p id="wr-expired-why">Thank you!</p>' in text
    assert re.search(r'<form method="post" id="wr-rejoin-form">', text)
    german = client.get(f"/q/{queue.slug}/", HTTP_ACCEPT_LANGUAGE="de")
    assert "Ihr Besuch ist abgeschlossen" in german.content.decode()

    services.queue_configure(slug=queue.slug, changes={"state": "closed"}, actor_label="tests")
    text = page(client, queue.slug).content.decode()
    assert "Your visit is complete" in text and re.search(r'id="wr-rejoin-form"[^>]* hidden', text)


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


def test_an_unknown_queue_is_404(client, db, settings):
    assert client.get("/q/no-such-queue/").status_code == 404
    settings.DEBUG = False  # as in production: the styled page (issue 20), not Django's technical one
    answer = client.get("/q/no-such-queue/")
    assert answer.status_code == 404 and "There is no page here" in answer.content.decode()
    assert "queueing/base.css" in answer.content.decode() and "favicon.svg" in answer.content.decode()


def test_a_closed_line_says_what_its_operator_wrote_with_the_link_they_gave(client, make_queue):
    """Issue 20: "closed" and a queue's end gave one fixed sentence; the operator's message and link, per
    queue, mirrored with the policy (no database read on the page), audited like any setting."""
    plain = make_queue(state="closed")
    text = page(client, plain.slug).content.decode()
    assert "It is not taking anyone new right now." in text and 'id="wr-closed-link"' not in text
    sold_out = make_queue(state="open")
    services.queue_update(
        sold_out,
        changes={
            "state": "closed",
            "closed_message": "Sold out: thank you for waiting. <b>not bold</b>",
            "closed_link_url": "https://shop.example/more",
            "closed_link_text": "See what is still available",
        },
    )
    text = page(client, sold_out.slug).content.decode()
    assert "Sold out: thank you for waiting. &lt;b&gt;not bold&lt;/b&gt;" in text
    assert (
        '<a class="button" id="wr-closed-link" href="https://shop.example/more">See what is still available</a>' in text
    )
    with pytest.raises(ValidationError):
        services.queue_update(sold_out, changes={"closed_link_url": "javascript:alert(1)"})


def test_only_a_visitor_in_line_is_told_they_are_in_a_fair_line_and_who_is_around_them_waits_for_script(
    client, make_queue
):
    """Issue 20: the join page said "you are in a fair line" before joining, and the page without
    JavaScript showed an empty "Around you" heading."""
    queue = make_queue(state="paused")
    text = page(client, queue.slug).content.decode()
    assert re.search(r'data-show="waiting paused prequeue offline">[^<]*you are in a fair line', text)
    assert not re.search(r'data-show="[^"]*\bjoin\b[^"]*">[^<]*you are in a fair line', text)
    assert '<div class="wr-line-wrap" id="wr-line-wrap" data-show="waiting paused" hidden>' in text
    assert client.get("/static/queueing/favicon.svg").status_code == 200


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
    ("range_", "text"),
    [
        (None, ""),
        ([20, 80], ""),  # under a minute and a half: no range
        ([250, 500], "(4\u20139 minutes)"),
        ([300, 360], "(5\u20136 minutes)"),
        ([300, 300], "(5\u20136 minutes)"),  # never a range of one figure
        ([1500, 2400], "(25\u201340 minutes)"),
        ([3600, 9000], ""),  # past two hours: the estimate alone
    ],
)
def test_the_estimate_s_range_is_worded_in_minutes_people_read(range_, text):
    from types import SimpleNamespace

    from queueing.templatetags.waiting import wait_range_text

    assert wait_range_text(SimpleNamespace(estimated_wait_range=range_)) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, ""), (65, "1:05"), (3725, "1:02:05"), (90_061, "1 day 01:01:01"), (200_000, "2 days 07:33:20")],
)
def test_countdowns_are_worded_plainly(seconds, text):
    assert countdown_text(seconds) == text


# --- Without JavaScript, a refused join retries by itself --------------------------------------------


def refresh_of(response) -> tuple[int, str]:
    """The page's own refresh (for browsers without JavaScript): after how long, and to where."""
    match = re.search(
        rb'<noscript><meta http-equiv="refresh" content="(\d+)(?:;url=([^"]*))?"></noscript>', response.content
    )
    assert match, "the page does not refresh itself"
    return int(match.group(1)), (match.group(2) or b"").decode().replace("&amp;", "&")


def test_a_full_line_without_javascript_retries_the_join_by_itself_once_there_is_room(client, make_queue):
    queue = make_queue(state="paused", max_waiting=1)
    other = services.queue_join(slug=queue.slug, visitor_key="someone-else-000").ticket
    page(client, queue.slug)
    refused = client.post(f"/q/{queue.slug}/", {"action": "join"})
    response = client.get(refused["Location"])
    assert data_state(response) == "full"
    seconds, url = refresh_of(response)
    assert 5 <= seconds <= 300 and url.startswith(f"/q/{queue.slug}/?rejoin=")
    assert f"Trying again in {seconds} s." in response.content.decode()
    assert client.get(url)["Location"].startswith(f"/q/{queue.slug}/?state=full&retry=")  # still full: again

    services.session_revoke(slug=queue.slug, ticket_id=other.ticket_id)  # room in line now
    retried = client.get(url)
    assert (retried.status_code, retried["Location"]) == (303, f"/q/{queue.slug}/")
    response = page(client, queue.slug)
    assert data_state(response) == "paused" and b'id="wr-position">1<' in response.content


def test_a_line_that_has_not_opened_joins_a_visitor_without_javascript_when_it_opens(client, make_queue):
    now = timezone.now()
    queue = make_queue(prequeue_opens_at=now + timedelta(hours=1), starts_at=now + timedelta(hours=2))
    response = page(client, queue.slug)
    assert data_state(response) == "notyet"
    seconds, url = refresh_of(response)
    assert seconds == 30 and url.startswith(f"/q/{queue.slug}/?rejoin=")
    assert client.get(url)["Location"].startswith(f"/q/{queue.slug}/?state=notyet&retry=")  # not yet: again

    services.queue_configure(slug=queue.slug, changes={"prequeue_opens_at": now - timedelta(minutes=1)})
    assert client.get(url)["Location"] == f"/q/{queue.slug}/"
    assert data_state(page(client, queue.slug)) == "prequeue"  # joined: holds a ticket, counts down


def test_too_many_attempts_without_javascript_are_retried_when_the_limiter_says(client, make_queue, settings):
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "sliding_log", "window_seconds": 60, "max_requests": 1}}
    queue = make_queue(state="paused")
    services.queue_join(slug=queue.slug, visitor_key="someone-else-000")
    from django.test import Client

    Client().post(f"/q/{queue.slug}/", {"action": "join"})  # the address's one join this minute
    page(client, queue.slug)
    refused = client.post(f"/q/{queue.slug}/", {"action": "join"})
    response = client.get(refused["Location"])
    assert data_state(response) == "limited"
    seconds, url = refresh_of(response)
    assert 2 <= seconds <= 60 and f'id="wr-limited-in">{seconds}<' in response.content.decode()
    settings.WR_RATE_LIMITS = {}  # the window has passed
    assert client.get(url)["Location"] == f"/q/{queue.slug}/"
    assert b'id="wr-position">3<' in page(client, queue.slug).content


def test_a_retry_is_only_for_the_visitor_and_queue_it_was_made_for(client, make_queue):
    from django.test import Client

    queue = make_queue(state="paused", max_waiting=1)
    services.queue_join(slug=queue.slug, visitor_key="someone-else-000")
    page(client, queue.slug)
    _, url = refresh_of(client.get(client.post(f"/q/{queue.slug}/", {"action": "join"})["Location"]))
    services.queue_configure(slug=queue.slug, changes={"max_waiting": 0})
    stranger = Client()
    page(stranger, queue.slug)
    assert stranger.get(url)["Location"] == f"/q/{queue.slug}/"  # shown the join button, not joined
    other = make_queue(state="paused")
    assert client.get(url.replace(f"/q/{queue.slug}/", f"/q/{other.slug}/"))["Location"] == f"/q/{other.slug}/"
    assert client.get(f"/q/{queue.slug}/?rejoin=forged")["Location"] == f"/q/{queue.slug}/"
    from queueing import store

    assert store.snapshot(queue.slug).waiting == 1 and store.snapshot(other.slug).waiting == 0


def test_a_visitor_with_a_ticket_sees_its_place_whatever_state_the_address_asks_for(client, make_queue):
    queue = make_queue(state="paused")
    page(client, queue.slug)
    client.post(f"/q/{queue.slug}/", {"action": "join"})
    assert data_state(page(client, queue.slug, state="full")) == "paused"


def test_while_redis_is_unreachable_pages_answer_a_503_that_retries_not_a_500(make_queue, settings, django_user_model):
    """Issue 12: the waiting page (and every page reading live state) was a 500 while Redis was down."""
    from django.test import Client

    queue = make_queue(state="open")
    staff = django_user_model.objects.create_superuser("ops", password="pw")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    visitor, operator = Client(raise_request_exception=False), Client(raise_request_exception=False)
    operator.force_login(staff)
    for browser, path in (
        (visitor, f"/q/{queue.slug}/"),
        (operator, f"/dashboard/{queue.slug}/"),
        (operator, "/admin/queueing/queue/"),
    ):
        page = browser.get(path)
        assert (page.status_code, page["Retry-After"]) == (503, "5"), path
        assert "Back in a moment" in page.content.decode() and 'http-equiv="refresh"' in page.content.decode()


def test_a_time_on_a_page_without_javascript_is_a_clock_time_never_a_raw_number(client, make_queue):
    """Issue 20: the demo protected page said "Your session ends at 1795470647" without JavaScript."""
    queue = make_queue(slug="demo", capacity=5, burst=5, target_url="/demo/protected/")
    body = client.post(f"/api/v1/queues/{queue.slug}/join", {}, "application/json").json()
    assert body["status"] == "admitted", body
    client.get(f"/demo/protected/?wr_access={body['access_token']}")  # the redirect that keeps it in a cookie
    text = client.get("/demo/protected/").content.decode()
    ends = re.search(r'<time id="session-end" datetime="([^"]+)" data-expires-at="(\d+)">([^<]+)</time>', text)
    assert ends, text[:2000]
    assert ends.group(1).endswith("+00:00") and re.fullmatch(r"\d\d:\d\d:\d\d UTC", ends.group(3))
    assert ends.group(2) not in ends.group(3)


def test_unix_times_are_worded_as_iso_and_as_a_named_clock_time():
    assert epoch_iso(1795470647) == "2026-11-23T21:50:47+00:00" and epoch_iso("") == ""
    assert epoch_clock(1795470647) == "21:50:47 UTC" and epoch_clock(None) == ""


def test_an_opening_time_without_javascript_is_a_date_and_a_clock_time_in_the_server_s_zone(client, make_queue):
    """Issue 20: the opening time said "21:43 UTC" beside the browser's "9:43:44 PM"; without JavaScript it is
    the server's zone, named; the page's script rewrites it into the visitor's (data-local)."""
    later = timezone.now() + timedelta(days=400)
    queue = make_queue(prequeue_opens_at=later, starts_at=later + timedelta(hours=1))
    text = page(client, queue.slug).content.decode()
    shown = re.search(r'<time id="wr-opens-at" datetime="([^"]+)" data-local="date-time">([^<]+)</time>', text)
    assert shown, text[:3000]
    assert shown.group(2) == f"{later:%-d %B %Y, %H:%M} UTC"


def test_clock_times_without_javascript_are_in_the_queues_time_zone(client, make_queue):
    """Issue 20: "without JavaScript, the queue's time zone". A queue for a sale in Berlin says its times in
    Berlin's zone (named), whatever zone the server runs in; the browser's script still says the visitor's."""
    queue = make_queue(
        prequeue_opens_at=datetime(2098, 12, 31, 12, 0, tzinfo=UTC),
        starts_at=datetime(2098, 12, 31, 13, 0, tzinfo=UTC),
        time_zone="Europe/Berlin",
    )
    text = page(client, queue.slug).content.decode()
    shown = re.search(r'<time id="wr-opens-at" datetime="([^"]+)" data-local="date-time">([^<]+)</time>', text)
    assert shown and shown.group(2) == "31 December 2098, 13:00 CET"
    assert shown.group(1).startswith("2098-12-31T13:00:00+01:00")  # the same moment, for the script
    with pytest.raises(ValidationError):
        services.queue_configure(slug=queue.slug, changes={"time_zone": "Mars/Olympus_Mons"}, actor_label="tests")


def test_a_wait_that_rests_on_a_slot_held_by_someone_who_left_says_so_with_its_latest_end(rf, settings):
    """Issue 47, item 12: the visitor behind a slot held far past the queue's holds reads why, and by when it
    frees at the latest (a clock time in the page's zone), not only "less than a minute" or a long figure."""
    settings.TIME_ZONE = "UTC"
    view = selectors.TicketView(
        ticket_id="0000000009.AbCdEfGhIjKlMnOp",
        status="waiting",
        position=1,
        ahead=0,
        queue_length=1,
        estimated_wait_seconds=780,
        poll_after_seconds=2.0,
        access_token=None,
        redirect_url=None,
        expires_at=None,
        reason="",
        epoch=1,
        seq=9,
        priority=0,
        queue_state="open",
        opens_in_seconds=None,
        event_seq=0,
        estimated_wait_range=[0, 780],
        held_slot_ends_at=4_102_444_800,  # 2100-01-01 00:00:00 UTC
    )
    context = {"view": view, "state": "waiting", "queue": {"slug": "sale", "name": "Sale"}, "config": {}}
    text = render_to_string("queueing/waiting.html", context, request=rf.get("/q/sale/"))
    note = re.search(r'<p class="wr-gone-slot" id="wr-gone-slot">([^<]+)<time[^>]*>([^<]+)</time>', text)
    assert note and "someone there may have left without finishing" in note.group(1), text
    assert note.group(2) == "00:00:00 UTC"
    quiet = dataclasses.replace(view, held_slot_ends_at=None, estimated_wait_range=[500, 900])
    assert 'id="wr-gone-slot" hidden' in render_to_string("queueing/waiting.html", {**context, "view": quiet})
