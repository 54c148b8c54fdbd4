"""The hot paths: status polls answered in front of Django (WSGI) give the same answers as the API view,
with the same security checks and headers; joins without a session skip the session machinery."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from django.core.wsgi import get_wsgi_application
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from waitingroom_site.fastpath import HotPathWSGI
from waitingroom_site.wsgi import application


def call(path: str, *, method: str = "GET", headers: dict[str, str] | None = None, app: Any = None, **environ: Any):
    env = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": io.StringIO(),
        "HTTP_HOST": "testserver",
        **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()},
        **environ,
    }
    captured: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        captured["status"], captured["headers"] = status, dict(response_headers)

    body = b"".join((app or application)(env, start_response))
    return int(captured["status"].split()[0]), captured["headers"], body


@pytest.fixture
def ticket(make_queue, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    queue = make_queue(state="paused")
    client = APIClient()
    for _ in range(2):
        client.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    body = client.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    return queue.slug, body["ticket"]


def test_gunicorn_serves_the_hot_path_wrapper():
    assert isinstance(application, HotPathWSGI)


def test_a_status_poll_is_answered_in_front_of_django_like_the_api_view(ticket):
    slug, raw = ticket
    with CaptureQueriesContext(connection) as queries:
        status, headers, body = call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"})
    assert status == 200 and len(queries) == 0
    import json

    fast = json.loads(body)
    view = APIClient().get(f"/api/v1/queues/{slug}/status", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert {k: v for k, v in fast.items() if k != "poll_after_seconds"} == {
        k: v for k, v in view.json().items() if k != "poll_after_seconds"
    }
    assert (fast["position"], fast["ahead"]) == (3, 2)
    assert headers["Content-Type"] == "application/json" and int(headers["Retry-After"]) >= 1
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"
    assert "Set-Cookie" not in headers


def test_a_bad_ticket_gets_the_same_401_in_front_of_django(ticket):
    slug, _ = ticket
    status, _, body = call(f"/api/v1/queues/{slug}/status", headers={"Authorization": "Bearer forged"})
    assert status == 401 and b'"invalid_ticket"' in body


def test_a_host_not_allowed_goes_to_django_which_refuses_it(ticket):
    slug, raw = ticket
    status, _, _ = call(
        f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}", "Host": "evil.example"}
    )
    assert status == 400


def test_an_insecure_poll_is_redirected_by_django_when_https_is_required(ticket, settings):
    slug, raw = ticket
    settings.SECURE_SSL_REDIRECT = True
    fresh = HotPathWSGI(get_wsgi_application())  # Django reads the setting when its handler is built
    status, headers, _ = call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"}, app=fresh)
    assert status == 301 and headers["Location"].startswith("https://")


def test_a_secure_poll_gets_hsts_as_django_would_send_it(ticket, settings):
    slug, raw = ticket
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    wrapper = HotPathWSGI(application.django_app)  # headers are captured when the wrapper starts
    env_headers = {"Authorization": f"Bearer {raw}", "X-Forwarded-Proto": "https"}
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        captured.update(headers)

    env = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": f"/api/v1/queues/{slug}/status",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
        "HTTP_HOST": "testserver",
        **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in env_headers.items()},
    }
    b"".join(wrapper(env, start_response))
    assert captured["Strict-Transport-Security"].startswith("max-age=3600")


def test_other_requests_go_to_django(db, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    status, _, body = call("/healthz")
    assert (status, body) == (200, b"ok")
    status, _, _ = call("/api/v1/queues/x/status", method="POST")
    assert status == 405


def test_a_join_without_a_session_skips_the_session_machinery(make_queue):
    queue = make_queue(state="paused")
    response = APIClient().post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert response.status_code == 201
    assert not hasattr(response.wsgi_request, "session")
    assert "csrftoken" not in response.cookies
