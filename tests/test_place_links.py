"""A turn notice's link back to a place in line (issue 50, item 1). Seen when the product was tried: `GET
/q/<slug>/?resume=<token>` from another site answered 303 with `Set-Cookie: wr_visitor=...`, so the victim's
page held the sender's ticket and the victim's own tickets were out of reach; the link worked 24 h in any
number of browsers and was kept in clear in `TurnNotice.link`. Now opening a link changes nothing; its page's
button (a POST, CSRF-checked) takes the place, once; a browser with an identity of its own is told what
taking it replaces; the token is scoped to one ticket of one queue and epoch and kept only as its hash."""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

import pytest
from django.test import Client

from queueing import services, store
from queueing.models import PlaceLink, TurnNotice

from .factories import join
from .stack import product_env, race
from .test_notices import leave_address, link_in, page_visitor, path_of, take_place


@pytest.fixture(autouse=True)
def _email_on(settings):
    settings.WR_NOTIFY_BY_EMAIL = True
    settings.WR_NOTIFY_NEAR_PLACES = 3
    settings.WR_NOTIFY_NEAR_SECONDS = 0


@pytest.fixture
def noticed(make_queue, mailbox, clock):
    """A visitor who left an address on the page, third in line and e-mailed so: (queue, their browser, the
    link in the e-mail)."""
    queue = make_queue(state="paused", capacity=1, burst=1, claim_ttl=120)
    for i in range(2):
        join(queue.slug, f"ahead{i}", now=clock())
    asker = page_visitor(queue.slug)
    leave_address(asker, queue.slug, "ada@example.com")
    assert services.turn_notices_send(now=clock()) == 1
    return queue, asker, link_in(mailbox.messages[-1][1])


def visitor_cookie(response) -> str | None:
    cookie = response.cookies.get("wr_visitor")
    return cookie.value if cookie is not None and cookie.value else None


def test_opening_a_link_from_another_site_sets_no_identity(noticed):
    _queue, _asker, link = noticed
    victim = Client(enforce_csrf_checks=True)
    opened = victim.get(path_of(link), HTTP_SEC_FETCH_SITE="cross-site", HTTP_REFERER="https://evil.example/mail")
    assert opened.status_code == 200  # was: 303 with Set-Cookie: wr_visitor=<the sender's identity>
    assert visitor_cookie(opened) is None and "wr_visitor" not in victim.cookies
    page = opened.content.decode()
    assert "This link takes you back to your place in line: number 3." in page
    assert 'id="wr-resume-form"' in page and opened["Cache-Control"] == "no-store"
    assert PlaceLink.objects.get().used_at is None  # opening it spends nothing


def test_the_link_s_page_speaks_the_visitor_s_language(noticed):
    _queue, _asker, link = noticed
    opened = Client().get(path_of(link), HTTP_ACCEPT_LANGUAGE="de").content.decode()
    assert "Dieser Link bringt Sie zurück an Ihren Platz in der Schlange: Nummer 3." in opened
    assert "Meinen Platz in diesem Browser übernehmen" in opened


def test_the_button_takes_the_place_once_and_only_with_the_page_s_csrf_token(noticed):
    queue, _asker, link = noticed
    token = link.split("resume=")[1]
    forged = Client(enforce_csrf_checks=True)
    refused = forged.post(f"/q/{queue.slug}/", {"action": "resume", "token": token})
    assert refused.status_code == 403 and visitor_cookie(refused) is None  # a POST from another site's page

    phone = Client(enforce_csrf_checks=True)
    landed = take_place(phone, link)
    assert re.search(r'<span id="wr-position">3</span>', landed.content.decode())
    assert PlaceLink.objects.get().used_at is not None

    third = Client(enforce_csrf_checks=True)
    again = third.get(path_of(link))
    assert again.status_code == 410 and "This link has been used already" in again.content.decode()
    assert visitor_cookie(again) is None and 'id="wr-resume-form"' not in again.content.decode()
    form_page = third.get(f"/q/{queue.slug}/").content.decode()  # (a page with the form's CSRF token)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form_page)
    assert csrf
    spent = third.post(f"/q/{queue.slug}/", {"csrfmiddlewaretoken": csrf.group(1), "action": "resume", "token": token})
    assert spent.status_code == 410 and visitor_cookie(spent) is None  # a used link: the button takes nothing


def test_a_browser_with_an_identity_of_its_own_keeps_it_unless_its_visitor_takes_the_place(noticed, make_queue, clock):
    _queue, _asker, link = noticed
    elsewhere = make_queue(state="paused", slug=f"other{uuid.uuid4().hex[:6]}")
    victim = page_visitor(elsewhere.slug)  # waiting in another line
    mine = victim.cookies["wr_visitor"].value
    opened = victim.get(path_of(link))
    assert 'id="wr-resume-replaces"' in opened.content.decode() and 'id="wr-resume-keep"' in opened.content.decode()
    assert victim.cookies["wr_visitor"].value == mine  # opened, not taken: still itself
    own_page = victim.get(f"/q/{elsewhere.slug}/")
    assert re.search(r'<span id="wr-position">1</span>', own_page.content.decode())


def test_the_asker_s_own_browser_opens_its_page_and_keeps_the_link(noticed):
    queue, asker, link = noticed
    opened = asker.get(path_of(link))
    assert opened.status_code == 303 and opened["Location"] == f"/q/{queue.slug}/"
    assert PlaceLink.objects.get().used_at is None


def test_a_link_is_for_its_own_queue_and_live_ticket_only(noticed, make_queue, clock):
    queue, _asker, link = noticed
    token = link.split("resume=")[1]
    other = make_queue(state="paused", slug=f"other{uuid.uuid4().hex[:6]}")
    assert Client().get(f"/q/{other.slug}/?resume={token}").status_code == 410  # another queue's page
    assert Client().get(f"/q/{queue.slug}/?resume=not-a-token").status_code == 410
    ticket_id = PlaceLink.objects.get().ticket_id
    store.revoke(queue.slug, ticket_id=ticket_id, now_ms=int(clock() * 1000))  # the ticket ended
    ended = Client().get(path_of(link))
    assert ended.status_code == 410 and 'id="wr-resume-form"' not in ended.content.decode()


def test_the_database_keeps_neither_the_token_nor_the_identity_in_clear(noticed):
    _queue, asker, link = noticed
    cookie_id = asker.cookies["wr_visitor"].value.split(":")[0]  # the signed cookie's value
    token = link.split("resume=")[1]
    (found,) = PlaceLink.objects.values()
    assert found["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert not any(token in str(value) or cookie_id in str(value) for value in found.values())
    notice = TurnNotice.objects.get()
    assert "?" not in notice.link and cookie_id not in notice.sealed and notice.sealed


def test_a_notice_asked_through_the_api_links_to_the_plain_page(make_queue, api, mailbox, clock):
    queue = make_queue(state="paused", capacity=1)
    joined = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    api.post(
        f"/api/v1/queues/{queue.slug}/notify",
        {"email": "ada@example.com"},
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {joined['ticket']}",
    )
    assert services.turn_notices_send(now=clock()) == 1
    assert link_in(mailbox.messages[-1][1]) == f"http://testserver/q/{queue.slug}/"
    assert not PlaceLink.objects.exists()


# Each racing process: wait for the common start, then press the same link's button (the service it runs).
RACER = """
import json, os, time, django
django.setup()
from queueing import services
token = open(os.environ["TOKEN_FILE"]).read()
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
print(json.dumps(services.place_link_take(slug="placed", token=token)))
"""

SETUP = """
import os, django
django.setup()
from queueing import services, tokens
from queueing.models import TurnNotice
from queueing.services.notices import _place_url
from queueing.visitors import identity_seal
changes = {"name": "Placed", "target_url": "https://shop.example/", "state": "paused"}
queue, _ = services.queue_configure(slug="placed", changes=changes)
ticket = services.queue_join(slug="placed", visitor_key=tokens.visitor_key("cookie:racer-cookie-id")).ticket
notice = TurnNotice.objects.create(queue=queue, ticket_id=ticket.ticket_id, epoch=queue.epoch, email="a@example.com",
    link="http://x/q/placed/", sealed=identity_seal("racer-cookie-id"))
open(os.environ["TOKEN_FILE"], "w").write(_place_url(notice).split("resume=")[1])
"""


def test_browsers_racing_in_separate_processes_take_the_place_once(database_url, tmp_path: Path):
    env = {
        **product_env(tmp_path, f"wrp{uuid.uuid4().hex[:6]}"),
        "DATABASE_URL": database_url,
        "TOKEN_FILE": os.fspath(tmp_path / "token"),
    }
    taken = race(env, SETUP, RACER)
    assert [t for t in taken if t is not None] == ["racer-cookie-id"] and taken.count(None) == 3
