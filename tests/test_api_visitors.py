"""The visitor API: join, status (heartbeat), leave; identities; ticket attacks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from datetime import timedelta

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing import signing_keys, store, tokens
from queueing.visitors import random_visitor_id

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def url(slug: str, op: str) -> str:
    return f"/api/v1/queues/{slug}/{op}"


def visitor_headers() -> dict[str, str]:
    return {"HTTP_X_VISITOR_ID": str(uuid.uuid4())}


def join(api, slug: str, **extra):
    return api.post(url(slug, "join"), format="json", **{**visitor_headers(), **extra})


def poll(api, slug: str, ticket: str):
    return api.get(url(slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}")


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@pytest.fixture
def queue(make_queue):
    return make_queue(state="paused", capacity=2)


def test_join_returns_201_with_a_ticket_and_the_full_body(api, queue):
    response = join(api, queue.slug)
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {
        "ticket",
        "ticket_id",
        "status",
        "position",
        "queue_length",
        "estimated_wait_seconds",
        "estimated_wait_range",
        "poll_after_seconds",
        "ws_url",
        "queue_state",
        "event_seq",
        "epoch",
    }
    assert (body["status"], body["position"], body["queue_length"]) == ("waiting", 1, 1)
    assert body["queue_state"] == "paused"
    assert body["estimated_wait_seconds"] is None  # paused: nobody can say
    assert body["ws_url"].startswith("ws://testserver/ws/queues/") and "ticket" not in body["ws_url"]
    assert int(response["Retry-After"]) >= 1


def test_join_is_idempotent_per_visitor_201_then_200(api, queue):
    headers = visitor_headers()
    first = api.post(url(queue.slug, "join"), format="json", **headers)
    second = api.post(url(queue.slug, "join"), format="json", **headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["ticket_id"] == second.json()["ticket_id"]


def test_a_browser_without_an_identity_gets_a_signed_visitor_cookie_that_keeps_its_ticket(api, queue):
    first = api.post(url(queue.slug, "join"), format="json")
    assert first.status_code == 201
    assert "wr_visitor" in first.cookies
    second = api.post(url(queue.slug, "join"), format="json")  # the client sends the cookie back
    assert second.status_code == 200
    assert second.json()["ticket_id"] == first.json()["ticket_id"]


def test_a_tampered_visitor_cookie_is_ignored_not_trusted(api, queue):
    api.cookies["wr_visitor"] = "forged-value:signature"
    response = api.post(url(queue.slug, "join"), format="json")
    assert response.status_code == 201
    assert response.cookies["wr_visitor"].value != "forged-value:signature"


def test_a_signed_in_user_joins_as_themselves(api, queue, staff_user):
    api.force_login(staff_user)
    first = api.post(url(queue.slug, "join"), format="json", **visitor_headers())
    second = api.post(url(queue.slug, "join"), format="json", **visitor_headers())
    assert first.json()["ticket_id"] == second.json()["ticket_id"]


@pytest.mark.parametrize(
    "value",
    [
        "short",
        "0123456789abcdef",  # 64 bits
        "00000000-0000-4000-8000-000000000000",
        "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
        "12345678-1234-1234-8234-123456789abc",  # not version 4
        "0123456789abcdef0123456789abcdef",  # periodic and sequential
        "abababababababababababababababab",
        "has spaces and symbols !!!!!!!!!!!",
        "x" * 200,
    ],
)
def test_a_short_or_patterned_visitor_id_is_refused(api, queue, value):
    response = api.post(url(queue.slug, "join"), format="json", HTTP_X_VISITOR_ID=value)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_visitor_id"


@pytest.mark.parametrize("make_id", [lambda: str(uuid.uuid4()), lambda: uuid.uuid4().hex, lambda: random_visitor_id()])
def test_random_visitor_ids_are_accepted(api, queue, make_id):
    for _ in range(50):
        assert api.post(url(queue.slug, "join"), format="json", HTTP_X_VISITOR_ID=make_id()).status_code == 201


def test_status_reports_position_and_ahead_and_asks_to_come_back(api, queue):
    for _ in range(3):
        join(api, queue.slug)
    ticket = join(api, queue.slug).json()["ticket"]
    response = poll(api, queue.slug, ticket)
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["position"], body["ahead"], body["queue_length"]) == ("waiting", 4, 3, 4)
    assert body["poll_after_seconds"] > 0
    assert response["Retry-After"] == str(int(-(-body["poll_after_seconds"] // 1)))


def test_status_costs_no_sql_and_no_session(api, make_queue):
    queue = make_queue(capacity=1, burst=1)
    join(api, queue.slug)  # admitted: a status answer then signs an access token too
    ticket = join(api, queue.slug).json()["ticket"]
    signing_keys.jwks()  # warm the key cache, as any running process has it
    with CaptureQueriesContext(connection) as queries:
        response = poll(api, queue.slug, ticket)
    assert response.status_code == 200
    assert len(queries) == 0
    assert "Set-Cookie" not in response.headers
    assert not hasattr(response.wsgi_request, "session")  # the fast path skipped the session machinery


def test_an_admitted_visitor_gets_the_access_token_and_redirect(api, make_queue):
    queue = make_queue(capacity=5, burst=5, target_url="https://shop.example/buy?x=1")
    body = join(api, queue.slug).json()
    assert body["status"] == "admitted"
    assert body["redirect_url"].startswith("https://shop.example/buy?x=1&wr_access=")
    claims = tokens.access_token_decode(body["access_token"], slug=queue.slug)
    assert claims.ticket_id == body["ticket_id"]
    assert body["expires_at"] == claims.expires_at
    status = poll(api, queue.slug, body["ticket"]).json()
    assert status["status"] == "admitted" and "Retry-After" not in poll(api, queue.slug, body["ticket"])


def test_leave_returns_204_and_the_ticket_expires(api, queue):
    ticket = join(api, queue.slug).json()["ticket"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ticket}"}
    assert api.post(url(queue.slug, "leave"), **auth).status_code == 204
    assert api.post(url(queue.slug, "leave"), **auth).status_code == 204
    assert poll(api, queue.slug, ticket).json()["status"] == "expired"


def test_a_ticket_redis_no_longer_knows_reads_as_expired(api, queue):
    ticket = join(api, queue.slug).json()["ticket"]
    store.client().delete(store.queue_keys(queue.slug).tk, *store.record_hashes(queue.slug))
    assert poll(api, queue.slug, ticket).json()["status"] == "expired"


# --- Ticket attacks: all 401 invalid_ticket ---------------------------------------------------------------


def _assert_401(response):
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_ticket"


def test_a_missing_or_malformed_authorization_gets_401(api, queue):
    _assert_401(api.get(url(queue.slug, "status")))
    _assert_401(api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION="Bearer"))
    _assert_401(api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION="Basic abc"))
    _assert_401(poll(api, queue.slug, "garbage"))


def test_a_tampered_ticket_gets_401(api, queue):
    ticket = join(api, queue.slug).json()["ticket"]
    header, payload, signature = ticket.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["tid"] = "0000000001." + "A" * 16
    claims["seq"] = 1
    _assert_401(poll(api, queue.slug, f"{header}.{b64(claims)}.{signature}"))


def test_another_queues_ticket_gets_401(api, queue, make_queue):
    other = make_queue(state="paused")
    ticket = join(api, other.slug).json()["ticket"]
    _assert_401(poll(api, queue.slug, ticket))
    assert poll(api, other.slug, ticket).status_code == 200


def forge_hs256(claims: dict, secret: bytes) -> str:
    """A ticket as an attacker builds one: PyJWT's own compact encoding of the header and claims, signed
    HS256 with `secret` by hand (PyJWT itself refuses to use a public key as an HMAC secret)."""
    unsigned = jwt.encode(claims, "not-the-key-" + "x" * 20, algorithm="HS256").rsplit(".", 1)[0]
    mac = hmac.new(secret, unsigned.encode(), hashlib.sha256).digest()
    return f"{unsigned}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def genuine_claims(api, slug: str) -> tuple[str, dict]:
    ticket = join(api, slug).json()["ticket"]
    return ticket, jwt.decode(ticket, options={"verify_signature": False})


def test_an_alg_none_ticket_gets_401(api, queue):
    ticket, claims = genuine_claims(api, queue.slug)
    unsigned = jwt.encode(claims, "", algorithm="none")  # what PyJWT makes of alg=none: no signature
    header = json.loads(base64.urlsafe_b64decode(unsigned.split(".")[0] + "=="))
    assert header == {"alg": "none", "typ": "JWT"} and unsigned.endswith(".")
    _assert_401(poll(api, queue.slug, unsigned))
    # The issued header kept and the signature dropped: past the header check, refused by the signature.
    stripped = ticket.rsplit(".", 1)[0] + "."
    assert stripped.split(".")[0] == tokens.TICKET_HEADER
    _assert_401(poll(api, queue.slug, stripped))
    assert poll(api, queue.slug, ticket).status_code == 200  # the genuine one still passes


def test_a_ticket_signed_hs256_with_the_public_key_gets_401(api, queue):
    _, claims = genuine_claims(api, queue.slug)
    # The forging is sound: with the real ticket key the same recipe passes. Only the key differs below.
    real = forge_hs256(claims, tokens._ticket_signing_key().encode())
    assert poll(api, queue.slug, real).status_code == 200
    public = signing_keys._keys.get().signing_key.public_key()
    secrets = (
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw),
        signing_keys.jwks()["keys"][0]["x"].encode(),
        json.dumps(signing_keys.jwks()["keys"][0]).encode(),
    )
    for secret in secrets:
        forged = forge_hs256(claims, secret)
        assert forged.split(".")[0] == tokens.TICKET_HEADER  # past the header check: the signature refuses it
        _assert_401(poll(api, queue.slug, forged))


def test_an_expired_ticket_gets_401(api, queue):
    body = join(api, queue.slug).json()
    claims = jwt.decode(body["ticket"], options={"verify_signature": False})
    token = tokens.TicketToken(slug=queue.slug)
    token.payload.update({k: v for k, v in claims.items() if k not in ("exp", "iat")})
    token["exp"] = int(time.time()) - 10
    response = poll(api, queue.slug, str(token))
    _assert_401(response)
    assert "expired" in response.json()["error"]["message"]


def test_a_staff_jwt_is_not_a_ticket(api, queue, staff_user):
    from rest_framework_simplejwt.tokens import AccessToken

    _assert_401(poll(api, queue.slug, str(AccessToken.for_user(staff_user))))


def neighbours(api, slug: str, ticket: str):
    return api.get(url(slug, "neighbours"), HTTP_AUTHORIZATION=f"Bearer {ticket}")


def test_neighbours_are_the_three_ahead_and_three_behind_by_display_name_only(api, make_queue):
    queue = make_queue(state="paused")
    names = ["Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ida"]
    tickets = [join(api, queue.slug, data={"display_name": name}).json() for name in names]
    response = neighbours(api, queue.slug, tickets[4]["ticket"])  # Ed, 5th in line
    assert response.status_code == 200
    assert response.json() == {
        "neighbours": [
            {"position": p, "display_name": names[p - 1], "you": p == 5}
            for p in range(2, 9)  # Bo .. Hal
        ]
    }
    assert not any(t["ticket_id"] in response.content.decode() for t in tickets)  # nobody's ticket id
    head = neighbours(api, queue.slug, tickets[0]["ticket"]).json()["neighbours"]
    assert [(n["position"], n["you"]) for n in head] == [(1, True), (2, False), (3, False), (4, False)]


def test_before_a_scheduled_start_nobody_is_around_as_nobody_has_a_place(api, make_queue):
    """Issue 47, item 10: in a pre-queue status gives no place (the draw at the start makes the order), but
    the neighbours answered places 1, 2, 3 by arrival, which the draw then shuffled."""
    now = timezone.now()
    queue = make_queue(prequeue_opens_at=now - timedelta(minutes=5), starts_at=now + timedelta(hours=1))
    tickets = [join(api, queue.slug, data={"display_name": name}).json() for name in ("Ann", "Bo", "Cy")]
    assert tickets[1]["position"] is None and tickets[1]["place_drawn_at_start"] is True
    assert neighbours(api, queue.slug, tickets[1]["ticket"]).json() == {"neighbours": []}


def test_neighbours_of_a_ticket_no_longer_in_line_are_none_and_a_bad_ticket_gets_401(api, make_queue):
    queue = make_queue(capacity=1, burst=1)
    admitted = join(api, queue.slug).json()
    assert admitted["status"] == "admitted"
    assert neighbours(api, queue.slug, admitted["ticket"]).json() == {"neighbours": []}
    _assert_401(neighbours(api, queue.slug, admitted["ticket"][:-2] + "xx"))
    _assert_401(api.get(url(queue.slug, "neighbours")))


def test_a_hostile_page_cannot_join_for_a_visitor_or_replace_their_identity(make_queue):
    """Seen: an empty cross-site form POST to join returned 201 and a fresh wr_visitor cookie that overwrote
    the victim's (who then rejoined at the back on reload); the same for wr_pos_<slug>."""
    from django.test import Client

    queue = make_queue(state="paused")
    url = f"/api/v1/queues/{queue.slug}/join"
    browser = Client()
    for header, value in (("Sec-Fetch-Site", "cross-site"), ("Origin", "https://evil.example"), ("Origin", "null")):
        refused = browser.post(url, data="", content_type="application/x-www-form-urlencoded", headers={header: value})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_site_refused"
        assert not refused.cookies
    program = browser.post(
        url,
        data={},
        content_type="application/json",
        HTTP_ORIGIN="https://partner.example",
        HTTP_X_VISITOR_ID=str(uuid.uuid4()),
    )
    assert program.status_code == 201 and not program.cookies  # an API client: served, no cookie set
    own_page = browser.post(url, data={}, content_type="application/json", HTTP_ORIGIN="http://testserver")
    assert own_page.status_code == 201 and "wr_visitor" in own_page.cookies
