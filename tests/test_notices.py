"""Turn notices (issue 20, item 3, "Notify me"): a waiting visitor's e-mail address, told through a real SMTP
server when the turn is near and when it comes, in the visitor's language, with a link back to the place
that works in another browser; the address deleted after; nothing lost when the SMTP server is away; the
notice keeps the visitor present; racing runs in separate processes send each e-mail once."""

from __future__ import annotations

import re
import uuid
from typing import Any

import msgpack
import pytest
from django.test import Client

from queueing import modes, services, store
from queueing.models import TurnNotice
from queueing.store import connection

from .factories import decode_ticket, join, status
from .stack import product_env, race
from .windows import clear_of_a_window_edge


@pytest.fixture(autouse=True)
def _email_on(settings):
    settings.WR_NOTIFY_BY_EMAIL = True
    settings.WR_NOTIFY_NEAR_PLACES = 3
    settings.WR_NOTIFY_NEAR_SECONDS = 0  # by places alone here: the estimate is tested elsewhere


def page_visitor(slug: str, **headers) -> Client:
    """A browser without JavaScript that has joined the line on the waiting page."""
    client = Client(**headers)
    client.get(f"/q/{slug}/")
    client.post(f"/q/{slug}/", {"action": "join"})
    return client


def leave_address(client: Client, slug: str, email: str):
    return client.post(f"/q/{slug}/", {"action": "notify", "email": email}, follow=True)


def said(response) -> str:
    match = re.search(r'<p class="wr-notice" id="wr-email-said"( hidden)?>([^<]*)</p>', response.content.decode())
    assert match
    return "" if match.group(1) else match.group(2)


def link_in(message) -> str:
    match = re.search(r"(http://testserver/q/[^\s]+)", message.get_content())
    assert match, message.get_content()
    return match.group(1)


def path_of(link: str) -> str:
    return link.replace("http://testserver", "")


def take_place(client: Client, link: str):
    """Open a place link, then press its page's button (a POST with the page's CSRF token), following on."""
    page = client.get(path_of(link))
    assert page.status_code == 200, page.content.decode()[:2000]
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    token = re.search(r'name="token" value="([^"]+)"', page.content.decode())
    assert csrf and token
    form = {"csrfmiddlewaretoken": csrf.group(1), "action": "resume", "token": token.group(1)}
    return client.post(path_of(link).split("?")[0], form, follow=True)


@pytest.fixture
def line(make_queue, clock):
    queue = make_queue(state="paused", capacity=1, burst=1, claim_ttl=120, time_zone="Asia/Tokyo")
    ahead = [join(queue.slug, f"a{i}", now=clock()) for i in range(5)]
    return queue, ahead


def test_near_then_turn_by_e_mail_with_a_link_that_takes_another_browser_to_the_place(line, mailbox, clock):
    queue, ahead = line
    client = page_visitor(queue.slug)
    response = leave_address(client, queue.slug, "ada@example.com")
    assert said(response) == (
        "We will e-mail you when your turn is near, and again when it comes. You may leave this page."
    )
    assert services.turn_notices_send(now=clock()) == 0 and mailbox.messages == []  # sixth: not near yet
    for ticket in ahead[:3]:
        store.revoke(queue.slug, ticket_id=ticket.ticket_id, now_ms=int(clock() * 1000))
    assert services.turn_notices_send(now=clock()) == 1
    assert services.turn_notices_send(now=clock()) == 0  # told once
    ((to, near),) = mailbox.messages
    assert to == ["ada@example.com"] and near["Subject"] == f"{queue.name}: your turn is near"
    assert "You are number 3 in line" in near.get_content()
    link = link_in(near)

    other_browser = Client(enforce_csrf_checks=True)
    landed = take_place(other_browser, link)
    assert landed.redirect_chain[-1][0] == f"/q/{queue.slug}/"  # the link's token is gone from the address
    assert re.search(r'<span id="wr-position">3</span>', landed.content.decode())

    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock.advance(1))
    for ticket in ahead[3:]:
        services.session_revoke(slug=queue.slug, ticket_id=ticket.ticket_id)
        services.queue_admit(slug=queue.slug, now=clock.advance(1))
    assert services.turn_notices_send(now=clock()) == 1
    turn = mailbox.messages[1][1]
    assert turn["Subject"] == f"{queue.name}: it's your turn"
    assert "Go through now" in turn.get_content() and link_in(turn) != link  # a link of its own: each works once
    assert re.search(r"Your turn is held until \d\d:\d\d:\d\d JST;", turn.get_content())  # the queue's zone
    assert TurnNotice.objects.count() == 0  # the address is gone once the turn is told
    assert services.turn_notices_send(now=clock()) == 0
    offered = Client().get(path_of(link_in(turn)))
    assert "your turn has come" in offered.content.decode()
    went = take_place(Client(enforce_csrf_checks=True), link_in(turn))
    assert 'data-state="admitted"' in went.content.decode()  # the link takes them through, in any browser


def test_the_e_mail_speaks_the_visitors_language(line, mailbox, clock):
    queue, ahead = line
    client = page_visitor(queue.slug, HTTP_ACCEPT_LANGUAGE="de")
    assert said(leave_address(client, queue.slug, "ada@example.com")).startswith("Wir schreiben Ihnen")
    for ticket in ahead[:3]:
        store.revoke(queue.slug, ticket_id=ticket.ticket_id, now_ms=int(clock() * 1000))
    services.turn_notices_send(now=clock())
    ((_, near),) = mailbox.messages
    assert near["Subject"] == f"{queue.name}: Sie sind bald an der Reihe"
    assert "Sie sind Nummer 3 in der Schlange" in near.get_content()


def test_a_ticket_that_ends_without_a_turn_leaves_no_address_behind(line, mailbox, clock):
    queue, _ = line
    client = page_visitor(queue.slug)
    leave_address(client, queue.slug, "ada@example.com")
    assert TurnNotice.objects.count() == 1
    ticket_id = TurnNotice.objects.get().ticket_id
    store.revoke(queue.slug, ticket_id=ticket_id, now_ms=int(clock() * 1000))
    assert services.turn_notices_send(now=clock()) == 0
    assert TurnNotice.objects.count() == 0 and mailbox.messages == []


def test_a_sale_that_ends_leaves_no_address_behind(line, mailbox, clock):
    queue, _ = line
    leave_address(page_visitor(queue.slug), queue.slug, "ada@example.com")
    assert services.turn_notices_send(now=clock()) == 0 and TurnNotice.objects.count() == 1
    services.queue_configure(slug=queue.slug, changes={"state": "closed"}, actor_label="tests")
    assert services.turn_notices_send(now=clock()) == 0
    assert TurnNotice.objects.count() == 0 and mailbox.messages == []


def test_bad_addresses_and_visitors_not_in_line_are_told_so(line, make_queue, mailbox, clock):
    queue, _ = line
    client = page_visitor(queue.slug)
    for bad in ("not an address", "a@b", "x" * 250 + "@example.com", ""):
        assert said(leave_address(client, queue.slug, bad)).startswith("That does not look like an e-mail address")
    admitted = make_queue(capacity=5)
    inside = page_visitor(admitted.slug)
    assert said(leave_address(inside, admitted.slug, "ada@example.com")).startswith("Only people waiting in line")
    assert TurnNotice.objects.count() == 0


def test_a_page_without_e_mail_set_up_never_says_it_will_write(line, settings):
    """The page's form uses the domain's outcomes: with e-mail off it keeps nothing and promises nothing (it
    said "We will e-mail you" when it read the API's not_found as anything but a refusal)."""
    queue, _ = line
    client = page_visitor(queue.slug)
    settings.WR_NOTIFY_BY_EMAIL = False
    response = leave_address(client, queue.slug, "ada@example.com")
    assert "notify=" not in response.redirect_chain[-1][0] and "We will e-mail you" not in response.content.decode()
    assert TurnNotice.objects.count() == 0


def test_the_api_keeps_an_address_for_a_ticket_and_refuses_in_the_error_shape(line, api, clock, settings):
    queue, _ = line
    joined = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {joined['ticket']}"}
    url = f"/api/v1/queues/{queue.slug}/notify"
    response = api.post(url, {"email": "ada@example.com"}, format="json", **bearer)
    assert response.status_code == 201 and response.json() == {
        "email": "ada@example.com",
        "near_places": 3,
        "near_seconds": 0,
    }
    assert TurnNotice.objects.get().link == f"http://testserver/q/{queue.slug}/"  # no page cookie: the plain page
    bad = api.post(url, {"email": "nope"}, format="json", **bearer)
    assert bad.status_code == 400 and bad.json()["error"]["fields"] == {"email": ["Enter a valid email address."]}
    assert api.post(url, {"email": "a@example.com", "x": 1}, format="json", **bearer).json()["error"]["code"] == (
        "unknown_fields"
    )
    assert api.post(url, {"email": "a@example.com"}, format="json").status_code == 401
    settings.WR_NOTIFY_BY_EMAIL = False
    off = api.post(url, {"email": "ada@example.com"}, format="json", **bearer)
    assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"


def test_the_api_tells_a_visitor_let_through_already_in_words_about_e_mail_in_their_language(api, make_queue):
    admitted = make_queue(capacity=5)
    joined = api.post(f"/api/v1/queues/{admitted.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {joined.json()['ticket']}"}
    url = f"/api/v1/queues/{admitted.slug}/notify"
    english = api.post(url, {"email": "ada@example.com"}, format="json", **bearer)
    assert english.status_code == 409 and english.json()["error"] == {
        "code": "not_in_line",
        "message": "Only people waiting in line can be e-mailed, and you are no longer waiting.",
    }
    german = api.post(url, {"email": "ada@example.com"}, format="json", HTTP_ACCEPT_LANGUAGE="de", **bearer)
    assert german.json()["error"]["message"] == (
        "Nur wer in der Schlange wartet, kann eine E-Mail bekommen, und Sie warten nicht mehr."
    )
    assert TurnNotice.objects.count() == 0


def test_leaving_addresses_is_limited_per_address(line, api, settings):
    queue, _ = line
    settings.WR_RATE_LIMITS = {
        "notify": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 2}
    }
    clear_of_a_window_edge(600)
    joined = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {joined['ticket']}"}
    codes = [
        api.post(
            f"/api/v1/queues/{queue.slug}/notify", {"email": f"v{i}@example.com"}, format="json", **bearer
        ).status_code
        for i in range(3)
    ]
    assert codes == [201, 201, 429]
    assert TurnNotice.objects.get().email == "v1@example.com"  # one address per ticket: the last kept


def test_an_empty_address_on_the_page_is_said_to_be_bad_without_spending_the_limit(line, settings):
    queue, _ = line
    settings.WR_RATE_LIMITS = {
        "notify": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 2}
    }
    client = page_visitor(queue.slug, REMOTE_ADDR="198.51.100.7")
    for _ in range(3):
        assert said(leave_address(client, queue.slug, "  ")).startswith("That does not look like an e-mail address")
    assert said(leave_address(client, queue.slug, "ada@example.com")).startswith("We will e-mail you")


def test_an_e_mail_the_smtp_server_refused_is_sent_on_a_later_run(line, mailbox, clock, settings):
    queue, ahead = line
    client = page_visitor(queue.slug)
    leave_address(client, queue.slug, "ada@example.com")
    for ticket in ahead[:3]:
        store.revoke(queue.slug, ticket_id=ticket.ticket_id, now_ms=int(clock() * 1000))
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = 1  # nothing listens there
    assert services.turn_notices_send(now=clock()) == 0
    assert TurnNotice.objects.get().near_sent_at is None  # given back
    settings.EMAIL_PORT = port
    assert services.turn_notices_send(now=clock()) == 1 and len(mailbox.messages) == 1


def test_a_visitor_who_left_an_address_keeps_the_place_while_away(make_queue, mailbox, clock):
    queue = make_queue(state="paused", capacity=1, presence_timeout=10, abandon_timeout=30)
    away = join(queue.slug, "away", now=clock())
    silent = join(queue.slug, "silent", now=clock())
    services.turn_notice_request(
        claims=decode_ticket(_token(queue.slug, away), slug=queue.slug),
        email="ada@example.com",
        language="en",
        link="http://testserver/q/x/",
    )
    for _ in range(12):  # a minute without a single poll of their own
        services.turn_notices_send(now=clock.advance(5))
    services.queue_cleanup(slug=queue.slug, now=clock())
    assert status(queue.slug, silent, now=clock()).reason == "abandoned"
    assert status(queue.slug, away, now=clock()).status == store.TicketStatus.WAITING


def _token(slug: str, ticket) -> str:
    from .factories import ticket_token

    return ticket_token(slug, ticket)


# Each racing process: wait for the common start, then one run of the notices.
RACER = """
import json, os, time, django
django.setup()
from queueing import services
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
print(json.dumps(services.turn_notices_send()))
"""

SETUP = """
import django
django.setup()
from queueing import services, tokens
changes = {"name": "Racing", "target_url": "https://shop.example/", "state": "paused"}
queue, _ = services.queue_configure(slug="racing", changes=changes)
for i in range(3):
    ticket = services.queue_join(slug="racing", visitor_key=tokens.visitor_key(f"cookie:racer-{i}")).ticket
    claims = tokens.held_claims("racing", ticket_id=ticket.ticket_id, priority=0, epoch=queue.epoch)
    services.turn_notice_request(claims=claims, email=f"v{i}@example.com", language="en", link="http://x/q/racing/")
"""


def test_runs_racing_in_separate_processes_send_each_e_mail_once(database_url, mailbox, tmp_path, settings):
    env = {
        **product_env(tmp_path, f"wrn{uuid.uuid4().hex[:6]}"),
        "DATABASE_URL": database_url,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(settings.EMAIL_PORT),
        "WR_NOTIFY_NEAR_PLACES": "3",
    }
    assert sum(race(env, SETUP, RACER)) == 3
    assert sorted(to[0] for to, _ in mailbox.messages) == ["v0@example.com", "v1@example.com", "v2@example.com"]


def test_a_queue_keeps_at_most_its_cap_of_notices_and_one_ipv6_48_its_own_limit(make_queue, api, clock, settings):
    """Issue 50, item 3: notices were limited per /64 only, so one /48 made as many as it has /64s (65,536),
    and every run of the task reads every notice. A queue keeps at most WR_NOTIFY_MAX_PER_QUEUE (asking again
    for the same ticket replaces its address), and an IPv6 client's /48 has a limit of its own."""
    from queueing import ratelimit

    settings.WR_NOTIFY_MAX_PER_QUEUE = 2
    queue = make_queue(state="paused")

    def ask(i: int, address: str = "", email: str = "") -> Any:
        ticket = join(queue.slug, f"n{i}", now=clock())
        claims = decode_ticket(_token(queue.slug, ticket), slug=queue.slug)
        return services.turn_notice_request(
            claims=claims, email=email or f"v{i}@example.com", language="en", link="http://x/", address=address
        )

    ask(0), ask(1)
    with pytest.raises(services.NoticesFull):
        ask(2)
    ask(0, email="again@example.com")  # the same ticket: replaced, not refused
    assert TurnNotice.objects.count() == 2 and TurnNotice.objects.filter(email="again@example.com").exists()

    page = page_visitor(queue.slug)
    assert said(leave_address(page, queue.slug, "ada@example.com")) == (
        "No more e-mail addresses can be kept for this line. Keep this page open: it takes you through at your turn."
    )
    settings.WR_NOTIFY_MAX_PER_QUEUE = 1000
    settings.WR_RATE_LIMITS = {"notify_wide": {"algorithm": "sliding_log", "window_seconds": 60, "max_requests": 3}}
    for i in range(3):  # three /64s of one /48
        ask(10 + i, address=f"2001:db8:7:{i}::/64")
    with pytest.raises(ratelimit.Limited):
        ask(20, address="2001:db8:7:99::/64")
    ask(21, address="2001:db8:8:1::/64")  # another /48
    ask(22, address="198.51.100.7")  # IPv4: its own address's limit only


def test_the_api_refuses_an_address_past_the_queue_s_cap_in_the_error_shape(make_queue, api, settings):
    settings.WR_NOTIFY_MAX_PER_QUEUE = 1
    queue = make_queue(state="paused")
    url = f"/api/v1/queues/{queue.slug}/notify"
    answers = []
    for i in range(2):
        joined = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
        bearer = {"HTTP_AUTHORIZATION": f"Bearer {joined.json()['ticket']}"}
        answers.append(api.post(url, {"email": f"v{i}@example.com"}, format="json", **bearer))
    assert answers[0].status_code == 201
    assert answers[1].status_code == 409 and answers[1].json()["error"]["code"] == "notices_full"


def _notice(slug: str, ticket, clock, email: str = "") -> TurnNotice:
    return services.turn_notice_request(
        claims=decode_ticket(_token(slug, ticket), slug=slug),
        email=email or f"{ticket.ticket_id[-8:]}@example.com",
        language="en",
        link="http://testserver/q/x/",
    )


def test_a_run_s_work_does_not_grow_with_the_notices_kept(redis_of_its_own, make_queue, mailbox, clock):
    """Issue 50, item 3: every run read every noticed ticket (a status read each, 0.22-0.27 ms, on the worker
    slots the admission tick needs), so ~37,000 notices filled them. Now one script a queue gives the tickets
    that left the line and those near the head, and only those are read: a run with 220 notices far back runs
    the Redis commands and SQL queries of a run with 20."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from .test_engine_sessions import commands_of

    queue = make_queue(state="paused", capacity=1)
    ahead = [join(queue.slug, f"a{i}", now=clock()) for i in range(5)]
    behind = [join(queue.slug, f"b{i}", now=clock()) for i in range(220)]
    for ticket in behind[:20]:
        _notice(queue.slug, ticket, clock)
    services.turn_notices_send(now=clock.advance(5))  # the first run keeps the database's notices again, once

    def one_run() -> tuple[dict[str, int], int]:
        client = store.client()
        client.config_resetstat()
        with CaptureQueriesContext(connection) as queries:
            assert services.turn_notices_send(now=clock.advance(5)) == 0
        return commands_of(client), len(queries)

    few = one_run()
    for ticket in behind[20:]:
        _notice(queue.slug, ticket, clock)
    many = one_run()
    assert many == few and few[0]["fcall"] == 1, (few, many)  # one script for the queue, and no status read
    assert mailbox.messages == []
    for ticket in ahead:  # the first noticed ticket comes near: read, told, and nobody else is
        store.revoke(queue.slug, ticket_id=ticket.ticket_id, now_ms=int(clock() * 1000))
    assert services.turn_notices_send(now=clock.advance(5)) == 3  # places 1 to 3 (WR_NOTIFY_NEAR_PLACES)
    assert sorted(to[0] for to, _ in mailbox.messages) == sorted(f"{t.ticket_id[-8:]}@example.com" for t in behind[:3])


@pytest.mark.parametrize("noticed_every", [2, 9], ids=["many-noticed:the-head-walked", "few-noticed:each-one-s-place"])
def test_near_by_its_wait_is_the_wait_the_visitor_is_told(make_queue, mailbox, clock, settings, noticed_every):
    """Near by seconds: the script reaches as far down the line as the tick's table of waits is within
    WR_NOTIFY_NEAR_SECONDS (lua/notices.lua), and the e-mail goes to exactly those whose own poll is told such
    a wait; walking the head when many are noticed, reading each one's place when few are."""
    settings.WR_NOTIFY_NEAR_SECONDS = 95
    queue = make_queue(state="open", capacity=1, outflow_per_minute=6)
    slug = queue.slug
    line = [join(slug, f"w{i}", now=clock()) for i in range(30)]
    noticed = line[1::noticed_every]
    for ticket in noticed:
        _notice(slug, ticket, clock)
    services.turn_notices_send(now=clock())  # kept once (before any table: by places alone, places 1 to 3)
    first = {to[0] for to, _ in mailbox.messages}
    keys = store.queue_keys(slug)
    table = [str(int(clock() * 1000))] + [f"{place} {10 * place}" for place in (0, 1, 2, 4, 8, 16, 32, 64)]
    store.client().hset(keys.st, "wt", " ".join(table))  # a wait of ten seconds a place
    told: dict[str, tuple[int, int | None]] = {}
    for ticket in noticed:
        view = modes.status(decode_ticket(_token(slug, ticket), slug=slug), now=clock())
        assert view.position is not None
        told[f"{ticket.ticket_id[-8:]}@example.com"] = (view.position, view.estimated_wait_seconds)
    assert services.turn_notices_send(now=clock()) >= 1
    near = {email for email, (position, wait) in told.items() if position <= 3 or (wait is not None and wait <= 95)}
    assert {to[0] for to, _ in mailbox.messages} == near, told
    assert first < near and any(position > 3 for email, (position, _) in told.items() if email in near - first)
    assert all(wait is not None and wait > 95 for email, (_, wait) in told.items() if email not in near)


def test_notices_are_kept_again_after_the_queue_s_live_state_lost_them(make_queue, mailbox, clock):
    """The noticed set is the live state's: lost with it (or never made, by a version before it), the run
    keeps every notice of the database again once, so the ticket is still present while away and told."""
    queue = make_queue(state="paused", capacity=1, presence_timeout=10, abandon_timeout=30)
    ahead = [join(queue.slug, f"a{i}", now=clock()) for i in range(3)]
    away = join(queue.slug, "away", now=clock())
    _notice(queue.slug, away, clock, email="ada@example.com")
    keys = store.queue_keys(queue.slug)
    store.client().delete(keys.noticed)
    store.client().hdel(keys.st, "notices_seeded")
    tk, field = keys.record(away.ticket_id.split(".", 1)[1])
    raw = connection.raw_client()
    record = msgpack.unpackb(raw.hget(tk, field))
    record[4] = int(clock())  # seen now: no promise of presence (as a record of before the notice's was)
    raw.hset(tk, field, msgpack.packb(record))
    services.turn_notices_send(now=clock.advance(5))
    assert store.client().zscore(keys.noticed, away.ticket_id) == 0
    for _ in range(12):  # a minute without a poll: still present
        services.turn_notices_send(now=clock.advance(5))
    services.queue_cleanup(slug=queue.slug, now=clock())  # those ahead, silent, are abandoned; not this one
    assert all(status(queue.slug, ticket, now=clock()).reason == "abandoned" for ticket in ahead)
    assert services.turn_notices_send(now=clock()) == 1
    ((to, near),) = mailbox.messages
    assert to == ["ada@example.com"] and "You are number 1 in line" in near.get_content()
