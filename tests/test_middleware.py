"""require_queue_access and the demo protected page: only admitted visitors get in."""

from __future__ import annotations

import uuid

import pytest
from django.core.cache import caches
from django.http import HttpResponse
from django.test import Client, RequestFactory

from queueing import services, store
from queueing.middleware import QueueAccessMiddleware, access_cookie_name


@pytest.fixture
def demo(make_queue):
    return make_queue(slug="demo", capacity=1, burst=5, target_url="/demo/protected/")


def admitted(api, slug="demo"):
    body = api.post(f"/api/v1/queues/{slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    assert body["status"] == "admitted", body
    return body


def enter(client, body):
    """Follow the redirect the waiting room gives an admitted visitor."""
    first = client.get(body["redirect_url"])
    assert first.status_code == 302 and first["Location"] == "/demo/protected/"
    assert first.cookies[access_cookie_name("demo")]["httponly"]
    return client.get("/demo/protected/")


def test_without_an_access_token_the_visitor_is_sent_to_the_waiting_page(client, demo):
    response = client.get("/demo/protected/")
    assert (response.status_code, response["Location"]) == (302, "/q/demo/")


def test_an_admitted_visitor_gets_in_and_the_token_leaves_the_url(client, api, demo):
    body = admitted(api)
    page = enter(client, body)
    assert page.status_code == 200
    assert b"You're in" in page.content
    assert f'data-expires-at="{body["expires_at"]}"'.encode() in page.content
    assert (
        api.get("/api/v1/queues/demo/status", HTTP_AUTHORIZATION=f"Bearer {body['ticket']}").json()["status"]
        == "active"
    )
    assert client.get("/demo/protected/").status_code == 200  # the cookie carries it from now on


def test_a_forged_token_is_sent_back_to_the_waiting_page_with_the_reason(client, demo):
    response = client.get("/demo/protected/?wr_access=forged.token.here")
    assert response["Location"] == "/q/demo/?reason=invalid"


def test_finish_completes_the_session_and_the_next_visitor_is_admitted_at_once(client, api, demo):
    first = admitted(api)
    second = api.post("/api/v1/queues/demo/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    assert second["status"] == "waiting"
    enter(client, first)
    done = client.post("/demo/protected/finish")
    assert done.status_code == 200 and b"you're done" in done.content
    assert done.cookies[access_cookie_name("demo")].value == ""
    assert (
        api.get("/api/v1/queues/demo/status", HTTP_AUTHORIZATION=f"Bearer {second['ticket']}").json()["status"]
        == "admitted"
    )
    assert client.get("/demo/protected/")["Location"].startswith("/q/demo/")


def test_the_clean_url_redirect_never_leaves_the_site(api, demo, settings):
    settings.WR_PROTECTED_PATHS = {"/": "demo"}
    middleware = QueueAccessMiddleware(lambda request: HttpResponse("page"))
    body = admitted(api)
    for path in ("//evil.example/x", "///evil.example/x", "/%2F%2Fevil.example/x"):
        response = middleware(RequestFactory().get(path, {"wr_access": body["access_token"]}))
        location = response["Location"]
        assert location.startswith("/") and not location.startswith("//"), location


def test_a_bad_token_in_a_link_does_not_log_the_visitor_out(client, api, demo):
    enter(client, admitted(api))
    response = client.get("/demo/protected/?wr_access=crafted.bad.token")
    assert response.status_code == 200
    assert access_cookie_name("demo") not in response.cookies


def test_a_revoked_visitor_is_thrown_out_on_the_next_request(client, api, demo):
    body = admitted(api)
    enter(client, body)
    services.session_revoke(slug="demo", ticket_id=body["ticket_id"])
    response = client.get("/demo/protected/")
    assert response["Location"] == "/q/demo/?reason=revoked"


def test_offline_mode_checks_the_signature_only(client, api, demo, settings):
    settings.WR_VERIFY_MODE = "offline"
    body = admitted(api)
    assert enter(client, body).status_code == 200
    assert store.snapshot("demo").active == 0  # offline cannot start the session: the site would call verify


@pytest.mark.django_db(transaction=True)
def test_remote_mode_calls_the_verify_endpoint_with_the_api_key(client, live_server, settings, make_queue):
    from rest_framework.test import APIClient

    make_queue(slug="demo", capacity=1, burst=5, target_url="/demo/protected/")
    from queueing.models import Queue

    settings.WR_VERIFY_MODE = "remote"
    settings.WR_API_URL = live_server.url
    settings.WR_API_KEY = services.api_key_create(Queue.objects.get(slug="demo"), name="site")[1]
    body = admitted(APIClient())
    assert enter(client, body).status_code == 200
    assert store.snapshot("demo").active == 1
    refused = Client().get(body["redirect_url"])  # the same link in another browser, verified remotely
    assert refused["Location"] == "/q/demo/?reason=bound_elsewhere"

    # A wrong key (misconfiguration) or an unreachable waiting room: nobody gets in, nobody loses access.
    for url, key in ((live_server.url, "wrong.key"), ("http://127.0.0.1:1", settings.WR_API_KEY)):
        settings.WR_API_URL, settings.WR_API_KEY = url, key
        caches["default"].delete_pattern("wr:verdict:*")  # type: ignore[attr-defined]
        response = client.get("/demo/protected/")
        assert (response.status_code, response["Retry-After"]) == (503, "5")
        assert access_cookie_name("demo") not in response.cookies


@pytest.mark.django_db(transaction=True)
def test_offline_mode_fetches_the_jwks_from_the_waiting_room(client, live_server, settings, make_queue):
    from rest_framework.test import APIClient

    make_queue(slug="demo", capacity=1, burst=5, target_url="/demo/protected/")
    settings.WR_VERIFY_MODE = "offline"
    settings.WR_API_URL = live_server.url
    body = admitted(APIClient())
    assert enter(client, body).status_code == 200
    forged = body["access_token"][:-4] + "AAAA"
    assert Client().get(f"/demo/protected/?wr_access={forged}")["Location"].endswith("reason=invalid")


def test_the_middleware_protects_configured_path_prefixes(api, demo, settings):
    settings.WR_PROTECTED_PATHS = {"/shop/": "demo"}
    middleware = QueueAccessMiddleware(lambda request: HttpResponse("shop"))
    factory = RequestFactory()
    assert middleware(factory.get("/shop/cart"))["Location"] == "/q/demo/"
    assert middleware(factory.get("/elsewhere")).getvalue() == b"shop"
    body = admitted(api)
    request = factory.get("/shop/cart")
    request.COOKIES[access_cookie_name("demo")] = body["access_token"]
    response = middleware(request)
    assert response.getvalue() == b"shop"
    assert request.queue_access.ticket_id == body["ticket_id"]  # type: ignore[attr-defined]


def test_an_admissions_link_lets_in_one_browser_and_refuses_the_next_with_the_reason(api, demo):
    """Seen: one `?wr_access=` link opened in three browsers (three cookie jars) let all three in."""
    body = admitted(api)
    first, second, third = Client(), Client(), Client()
    assert enter(first, body).status_code == 200
    assert first.cookies["wr_browser"]["httponly"]
    for other in (second, third):
        refused = other.get(body["redirect_url"])
        assert refused["Location"] == "/q/demo/?reason=bound_elsewhere"
        page = other.get(refused["Location"])
        assert b"already used in another browser" in page.content
    assert first.get("/demo/protected/").status_code == 200  # the first one keeps its session


def test_a_copied_access_cookie_without_the_browsers_secret_is_refused(api, demo):
    body = admitted(api)
    first = Client()
    assert enter(first, body).status_code == 200
    thief = Client()
    thief.cookies[access_cookie_name("demo")] = first.cookies[access_cookie_name("demo")].value
    response = thief.get("/demo/protected/")
    assert response["Location"] == "/q/demo/?reason=bound_elsewhere"
