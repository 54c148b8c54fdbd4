"""The web server's application (web.py, fastpath.HotPathASGI): status polls and window reads answered on
the event loop give the same answers as the API view, with the same security checks and headers; the rest
goes to Django in threads, its body read first; joins without a session skip the session machinery."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from queueing import store
from waitingroom_site import fastpath
from waitingroom_site.fastpath import HotPathASGI
from waitingroom_site.web import application, django_application

from .test_engine_join import library_loaded, lose_the_library
from .windows import clear_of_a_configured_edge, clear_of_a_window_edge

# A fixed window a day long: its edge, where a window lets more through, falls at midnight UTC only (a minute's
# edge let a join through in CI).
DAY = 86400

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("live_state")]  # also on a Redis Cluster


async def call(
    path: str, *, method: str = "GET", headers: dict[str, str] | None = None, app: Any = None, scheme: str = "http"
) -> httpx.Response:
    transport = httpx.ASGITransport(app=app or application)
    async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://testserver") as client:
        return await client.request(method, path, headers=headers or {})


@pytest.fixture
def ticket(make_queue, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    queue = make_queue(state="paused")
    client = APIClient()
    for _ in range(2):
        client.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    body = client.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    return queue.slug, body["ticket"]


def test_the_web_server_runs_the_hot_path_application():
    assert isinstance(application, HotPathASGI)


@pytest.mark.asyncio
async def test_a_status_poll_is_answered_on_the_event_loop_like_the_api_view(ticket):
    slug, raw = ticket
    # No SQL: on the event loop, Django refuses any query (SynchronousOnlyOperation, a 500).
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200
    fast = response.json()
    view = await asyncio.to_thread(
        lambda: APIClient().get(f"/api/v1/queues/{slug}/status", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    )
    assert {k: v for k, v in fast.items() if k != "poll_after_seconds"} == {
        k: v for k, v in view.items() if k != "poll_after_seconds"
    }
    assert (fast["position"], fast["ahead"]) == (3, 2)
    headers = response.headers
    assert headers["content-type"] == "application/json" and int(headers["retry-after"]) >= 1
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    assert "set-cookie" not in headers


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "limit",
    [
        {"algorithm": "token_bucket", "capacity": 2, "refill_per_second": 0.001},
        {"algorithm": "fixed_window", "window_seconds": 600, "max_requests": 2},
    ],
)
async def test_the_poll_and_its_rate_limiter_are_one_script_under_the_queues_hash_tag(ticket, settings, limit):
    slug, raw = ticket
    settings.WR_RATE_LIMITS = {**settings.WR_RATE_LIMITS, "status": limit}
    clear_of_a_configured_edge(limit)
    codes = [
        (await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"})).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 429]
    keys = list(store.client().scan_iter(match=f"*rl:status:{limit['algorithm']}:*"))
    if limit["algorithm"] == "token_bucket":
        assert keys == []  # the bucket is in the ticket's record (status.lua): no key of its own
    else:
        assert keys and all(f"{{{slug}}}" in key for key in keys)  # one slot with the queue's keys (cluster-ready)


@pytest.mark.asyncio
async def test_a_bad_ticket_gets_the_same_401(ticket):
    slug, _ = ticket
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": "Bearer forged"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_ticket"


@pytest.mark.asyncio
async def test_an_error_on_the_event_loop_is_said_in_the_language_asked_for(ticket):
    """Issue 20: the hot path answers in front of LocaleMiddleware; its errors follow Accept-Language (and the
    language cookie) as Django's path does, its answers that are not errors carry no words to translate."""
    slug, good = ticket
    path = f"/api/v1/queues/{slug}/status"
    german = await call(path, headers={"Authorization": "Bearer forged", "Accept-Language": "de-DE,de;q=0.9"})
    assert german.json()["error"]["message"] == "Das Ticket ist für diese Schlange nicht gültig."
    french = await call(path, headers={"Authorization": "Bearer forged", "Cookie": "django_language=fr"})
    assert french.json()["error"]["message"] == "Le ticket n'est pas valable pour cette file."
    plain = await call(path, headers={"Authorization": "Bearer forged"})
    assert plain.json()["error"]["message"] == "The ticket is not valid for this queue."
    polled = await call(path, headers={"Authorization": f"Bearer {good}", "Accept-Language": "de"})
    assert polled.status_code == 200 and polled.json()["status"] == "waiting"


@pytest.mark.asyncio
async def test_a_host_not_allowed_goes_to_django_which_refuses_it(ticket):
    slug, raw = ticket
    response = await call(
        f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}", "Host": "evil.example"}
    )
    assert response.status_code == 400


@pytest.mark.asyncio
async def test_an_insecure_poll_is_redirected_by_django_when_https_is_required(ticket, settings):
    slug, raw = ticket
    settings.SECURE_SSL_REDIRECT = True
    fresh = HotPathASGI(await asyncio.to_thread(_fresh_django))  # Django reads the setting when its handler is built
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"}, app=fresh)
    assert response.status_code == 301 and response.headers["location"].startswith("https://")


def _fresh_django() -> Any:
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


@pytest.mark.asyncio
async def test_a_secure_poll_gets_hsts_as_django_would_send_it(ticket, settings):
    slug, raw = ticket
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    app = HotPathASGI(django_application)  # headers are captured when the application starts
    response = await call(
        f"/api/v1/queues/{slug}/status",
        headers={"Authorization": f"Bearer {raw}", "X-Forwarded-Proto": "https"},
        app=app,
    )
    assert response.status_code == 200
    assert response.headers["strict-transport-security"].startswith("max-age=3600")


@pytest.mark.asyncio
async def test_other_requests_go_to_django(settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    response = await call("/healthz")
    assert (response.status_code, response.text) == (200, "ok")
    assert (await call("/api/v1/queues/x/status", method="POST")).status_code == 405


@pytest.mark.asyncio
async def test_a_queue_whose_policy_redis_lost_is_answered_on_the_loop_its_sync_in_a_thread(ticket, counted):
    slug, raw = ticket
    app, django = counted
    store.client().delete(store.queue_keys(slug).cfg)  # lost: the database has it, the loop cannot read it
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"}, app=app)
    assert response.status_code == 200 and response.json()["status"] == "waiting"
    assert store.client().hget(store.queue_keys(slug).cfg, "live_epoch")  # synced again
    assert django.paths == []


@pytest.mark.asyncio
async def test_an_admitted_visitors_poll_carries_its_access_token_before_and_after_the_keys_are_loaded(
    make_queue, counted
):
    """Signing the access token needs the keys, which live in the database: the event loop never reads it
    (Django forbids it there, a 500), so the first poll before they are loaded loads them in a thread."""
    from queueing import services, signing_keys

    app, django = counted
    queue = await asyncio.to_thread(make_queue, state="open", capacity=5)
    raw = (await call_json("POST", f"/api/v1/queues/{queue.slug}/join"))["ticket"]
    await asyncio.to_thread(services.queue_admit, slug=queue.slug)
    signing_keys.signing_keys_reset_cache()
    for _ in range(2):  # not loaded (a thread loads them), then loaded (the event loop signs)
        path = f"/api/v1/queues/{queue.slug}/status"
        response = await call(path, headers={"Authorization": f"Bearer {raw}"}, app=app)
        assert response.status_code == 200 and response.json()["status"] == "admitted"
        assert response.json()["access_token"]
    assert django.paths == []


async def call_json(method: str, path: str) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=application)
    headers = {"X-Visitor-Id": str(uuid.uuid4()), "Content-Type": "application/json"}
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.request(method, path, headers=headers, content=b"{}")
    assert response.status_code < 300, response.text
    return dict(response.json())


@pytest.mark.asyncio
async def test_a_server_that_lost_its_scripts_gets_them_loaded_again(redis_of_its_own, ticket, settings):
    slug, raw = ticket
    settings.WR_RATE_LIMITS = {"status": {"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 1}}
    name = lose_the_library(redis_of_its_own)
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200 and response.json()["position"] == 3
    assert library_loaded(name, on=store.queue_keys(slug).cfg)  # on a cluster: the queue's master


@pytest.mark.asyncio
async def test_redis_out_of_reach_is_a_503_in_the_error_shape(ticket, redis_away):
    slug, raw = ticket
    redis_away()
    response = await call(f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable" and int(response.headers["retry-after"]) >= 1


@pytest.mark.asyncio
async def test_a_body_that_trickles_in_holds_no_thread():
    """With one thread for Django, a body that never finishes must not keep another request waiting."""
    app = HotPathASGI(django_application, threads=1)
    never = asyncio.Event()

    async def slow_receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.request", "body": b"", "more_body": False}

    async def discard(message: MutableMapping[str, Any]) -> None:
        pass

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/queues/x/join",
        "raw_path": b"/api/v1/queues/x/join",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (b"content-length", b"100")],
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "http_version": "1.1",
    }
    slow = [asyncio.create_task(app(scope, slow_receive, discard)) for _ in range(3)]
    try:
        response = await asyncio.wait_for(call("/healthz", app=app, headers={"Host": "127.0.0.1"}), 10)
        assert response.status_code == 200
    finally:
        for task in slow:
            task.cancel()


@pytest.mark.asyncio
async def test_a_body_too_large_is_refused_before_django(monkeypatch):
    monkeypatch.setattr(fastpath, "BODY_MAX_BYTES", 1000)
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.post("/api/v1/queues/x/join", content=b"x" * 5000)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_a_join_without_a_session_skips_the_session_machinery(make_queue):
    queue = make_queue(state="paused")
    response = APIClient().post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert response.status_code == 201
    assert not hasattr(response.wsgi_request, "session")
    assert "csrftoken" not in response.cookies


# --- Joins on the event loop ----------------------------------------------------------------------------


class DjangoCalls:
    """Django's handler, counting the requests it is given (the event loop answered the rest)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        self.paths.append(environ["PATH_INFO"])
        return django_application(environ, start_response)


@pytest.fixture
def counted() -> tuple[HotPathASGI, DjangoCalls]:
    django = DjangoCalls()
    return HotPathASGI(django, threads=4), django


async def join(
    app: Any, slug: str, *, body: bytes = b"{}", headers: dict[str, str] | None = None, cookies: Any = None
) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=("203.0.113.9", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver", cookies=cookies) as client:
        return await client.post(
            f"/api/v1/queues/{slug}/join",
            content=body,
            headers={"Content-Type": "application/json", **(headers or {})},
        )


@pytest.fixture
def paused(make_queue, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    return make_queue(state="paused").slug


@pytest.mark.asyncio
async def test_a_join_is_answered_on_the_event_loop_as_django_answers_it(paused, counted):
    from queueing import tokens

    app, django = counted
    first = await join(app, paused)
    assert first.status_code == 201 and django.paths == []
    body = first.json()
    assert (
        body["status"] == "waiting"
        and body["position"] == 1
        and body["ws_url"] == f"ws://testserver/ws/queues/{paused}/"
    )
    assert tokens.visitor_ticket_decode(body["ticket"], slug=paused).ticket_id == body["ticket_id"]
    assert int(first.headers["retry-after"]) >= 1 and first.headers["x-content-type-options"] == "nosniff"
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("wr_visitor=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    # The cookie is the visitor: joining again with it is the same ticket (200), and no new cookie.
    again = await join(app, paused, cookies=first.cookies)
    assert again.status_code == 200 and again.json()["ticket_id"] == body["ticket_id"]
    assert "set-cookie" not in again.headers
    # Django's path (the test client) gives the same visitor the same ticket, and the same fields.
    visitor = {"X-Visitor-Id": str(uuid.uuid4())}
    fast = (await join(app, paused, headers=visitor)).json()
    slow = await asyncio.to_thread(
        lambda: APIClient().post(
            f"/api/v1/queues/{paused}/join", format="json", HTTP_X_VISITOR_ID=visitor["X-Visitor-Id"]
        )
    )
    assert slow.status_code == 200 and slow.json()["ticket_id"] == fast["ticket_id"]
    assert set(slow.json()) == set(fast) and django.paths == []


@pytest.mark.asyncio
async def test_the_join_and_its_rate_limiter_are_one_script_and_a_refused_join_joins_nobody(paused, counted, settings):
    app, django = counted
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "fixed_window", "window_seconds": DAY, "max_requests": 2}}
    clear_of_a_window_edge(DAY)
    codes = [(await join(app, paused, headers={"X-Visitor-Id": str(uuid.uuid4())})).status_code for _ in range(3)]
    assert codes == [201, 201, 429] and django.paths == []
    assert store.line_count(paused) == 2  # the refused join took no place
    keys = list(store.client().scan_iter(match="*rl:join:fixed_window:*"))
    assert len(keys) == 1 and "{203.0.113.9}" in keys[0]  # per address, whichever queue it joins
    # Django's path counts in the same bucket.
    refused = await asyncio.to_thread(
        lambda: APIClient(REMOTE_ADDR="203.0.113.9").post(
            f"/api/v1/queues/{paused}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())
        )
    )
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{not json", {}, 400, "malformed_json"),
        (b'{"colour": "red"}', {}, 400, "unknown_fields"),
        (b'{"priority_code": "nope-nope-nope"}', {}, 400, "invalid_priority_code"),
        (b"{}", {"X-Visitor-Id": "1234"}, 400, "invalid_visitor_id"),
        (b"{}", {"Origin": "https://evil.example"}, 403, "cross_site_refused"),
        (b'{"pow_challenge": "forged", "pow_nonce": "1"}', {}, 201, ""),  # no gate: a bad proof is ignored
    ],
)
async def test_every_join_without_a_session_is_answered_on_the_loop_as_djangos_path_answers_it(
    paused, counted, body, headers, status, code
):
    """One flow for a join, run by either driver: the event loop answers every join without a session (a bad
    body, a priority code, a bad identity header, another site's page) with Django's path's answer."""
    app, django = counted
    response = await join(app, paused, body=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json().get("error", {}).get("code", "") == code
    assert django.paths == []
    slow = await asyncio.to_thread(
        lambda: APIClient(REMOTE_ADDR="203.0.113.9").post(
            f"/api/v1/queues/{paused}/join",
            data=body,
            content_type="application/json",
            **{f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()},
        )
    )
    assert slow.status_code == status and slow.json().get("error", {}).get("code", "") == code
    if status == 201:
        assert set(slow.json()) == set(response.json())


def join_count(address: str = "203.0.113.9") -> int:
    """How many joins the join limiter (a fixed window) has counted for `address`."""
    keys = list(store.client().scan_iter(match=f"*rl:join:fixed_window:*{address}*"))
    return sum(int(store.client().hget(key, "count") or 0) for key in keys)


@pytest.mark.asyncio
@pytest.mark.parametrize("driver", ["loop", "django"])
async def test_the_join_limiter_counts_every_kind_of_join_once_on_either_path(make_queue, counted, settings, driver):
    """The limiter in one place (answers.join_flow): counted once for a join that goes straight to its script,
    one whose proof does not check out, one with a priority code, one whose policy Redis lost, a stateless
    join that holds its number already; not at all for a join refused before any work in Redis."""
    from queueing import selectors

    settings.ALLOWED_HOSTS = ["testserver"]
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "fixed_window", "window_seconds": DAY, "max_requests": 100}}
    clear_of_a_window_edge(DAY)
    app, django = counted
    tracked = await asyncio.to_thread(make_queue, state="paused")
    stateless = await asyncio.to_thread(make_queue, state="open", mode="stateless")
    lost = await asyncio.to_thread(make_queue, state="paused")
    store.client().delete(store.queue_keys(lost.slug).cfg)
    selectors.queue_mode_forget(stateless.slug)

    async def joined(slug: str, body: bytes = b"{}", cookies: Any = None) -> int:
        if driver == "loop":
            return (await join(app, slug, body=body, cookies=cookies)).status_code
        client = APIClient(REMOTE_ADDR="203.0.113.9")
        for name, value in (cookies or {}).items():
            client.cookies[name] = value
        answer = await asyncio.to_thread(
            lambda: client.post(f"/api/v1/queues/{slug}/join", data=body, content_type="application/json")
        )
        return int(answer.status_code)

    cases: list[tuple[str, bytes, int, int]] = [
        (tracked.slug, b"{}", 201, 1),
        (tracked.slug, b'{"pow_challenge": "forged", "pow_nonce": "1"}', 201, 1),
        (tracked.slug, b'{"priority_code": "nope-nope-nope"}', 400, 1),
        (lost.slug, b"{}", 201, 1),
        (stateless.slug, b"{}", 201, 1),  # the mode unknown: the tracked script counted it and said so
        (tracked.slug, b'{"colour": "red"}', 400, 0),
        (tracked.slug, b"{not json", 400, 0),
    ]
    for slug, body, status, counted_once in cases:
        before = join_count()
        assert await joined(slug, body) == status, (slug, body)
        assert join_count() - before == counted_once, (slug, body)
    response = await join(app, stateless.slug)
    before = join_count()
    assert await joined(stateless.slug, cookies=dict(response.cookies)) == 200  # the number it holds, read first
    assert join_count() - before == 1 and django.paths == []


@pytest.mark.asyncio
async def test_a_join_with_a_session_takes_djangos_path(paused, counted):
    app, django = counted
    response = await join(app, paused, cookies={"sessionid": "whatever"})
    assert response.status_code == 201 and django.paths == [f"/api/v1/queues/{paused}/join"]


@pytest.mark.asyncio
async def test_refusals_on_the_event_loop_are_the_apis(make_queue, counted, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.ALLOWED_HOSTS = ["testserver"]
    app, django = counted
    closed = await asyncio.to_thread(make_queue, state="closed")
    response = await join(app, closed.slug)
    assert (response.status_code, response.json()["error"]["code"]) == (409, "queue_closed")
    starts = timezone.now() + timedelta(hours=2)
    early = await asyncio.to_thread(
        make_queue, state="open", prequeue_opens_at=starts - timedelta(hours=1), starts_at=starts
    )
    response = await join(app, early.slug)  # its opening time is in the database: read in a thread
    assert (response.status_code, response.json()["error"]["code"]) == (409, "queue_not_open")
    assert response.json()["error"]["opens_at"] and 3000 < int(response.headers["retry-after"]) <= 3600
    gated = await asyncio.to_thread(make_queue, state="paused", pow_difficulty=4)
    response = await join(app, gated.slug)
    assert (response.status_code, response.json()["error"]["code"]) == (428, "proof_of_work_required")
    from queueing import pow

    challenge = response.json()["error"]["challenge"]
    solved = json_body(pow_challenge=challenge, pow_nonce=pow.solve(challenge, 4))
    assert (await join(app, gated.slug, body=solved)).status_code == 201  # a proof that checks out: here
    assert django.paths == []


def json_body(**fields: str) -> bytes:
    import json

    return json.dumps(fields).encode()


@pytest.mark.asyncio
async def test_a_join_whose_policy_redis_lost_is_finished_in_a_thread_and_counted_once(paused, counted, settings):
    app, django = counted
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "fixed_window", "window_seconds": DAY, "max_requests": 2}}
    clear_of_a_window_edge(DAY)
    store.client().delete(store.queue_keys(paused).cfg)  # lost: the database has it, the loop cannot read it
    codes = [(await join(app, paused, headers={"X-Visitor-Id": str(uuid.uuid4())})).status_code for _ in range(3)]
    assert codes == [201, 201, 429] and django.paths == []
    assert store.client().hget(store.queue_keys(paused).cfg, "live_epoch")  # synced again


@pytest.mark.asyncio
async def test_a_stateless_queue_is_joined_on_the_event_loop_whether_or_not_its_mode_is_known(
    make_queue, counted, settings
):
    from queueing import selectors, tokens

    settings.ALLOWED_HOSTS = ["testserver"]
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "fixed_window", "window_seconds": DAY, "max_requests": 3}}
    clear_of_a_window_edge(DAY)
    app, django = counted
    queue = await asyncio.to_thread(make_queue, state="open", mode="stateless")
    selectors.queue_mode_forget(queue.slug)
    first = await join(app, queue.slug)  # the mode unknown here: the tracked script says so, a thread reads it
    assert first.status_code == 201 and django.paths == [] and f"wr_pos_{queue.slug}=" in first.headers["set-cookie"]
    second = await join(app, queue.slug)  # the mode known now: the stateless script, here
    assert second.status_code == 201 and django.paths == []
    numbers = [tokens.visitor_ticket_decode(r.json()["ticket"], slug=queue.slug) for r in (first, second)]
    assert numbers[1].number == numbers[0].number + 1  # type: ignore[union-attr]
    # A browser holding its number (the cookie) keeps it, here too.
    again = await join(app, queue.slug, cookies=first.cookies)
    assert again.status_code == 200 and again.json()["ticket"] == first.json()["ticket"]
    assert django.paths == []
    # The limiter counted each join once (three), in the stateless script too: the fourth joins nobody.
    issued = store.client().hget(store.queue_keys(queue.slug).win, "next")
    assert issued is not None
    refused = await join(app, queue.slug)
    assert refused.status_code == 429 and store.client().hget(store.queue_keys(queue.slug).win, "next") == issued


@pytest.mark.asyncio
async def test_parallel_joins_of_one_visitor_on_the_event_loop_hold_one_ticket(paused, counted):
    app, _ = counted
    visitor = {"X-Visitor-Id": str(uuid.uuid4())}
    answers = await asyncio.gather(*(join(app, paused, headers=visitor) for _ in range(20)))
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201]
    assert len({a.json()["ticket_id"] for a in answers}) == 1
    assert store.line_count(paused) == 1


@pytest.mark.asyncio
async def test_a_join_with_redis_out_of_reach_is_a_503_in_the_error_shape(paused, counted, redis_away):
    app, _ = counted
    redis_away()
    response = await join(app, paused, headers={"X-Visitor-Id": str(uuid.uuid4())})
    assert response.status_code == 503 and response.json()["error"]["code"] == "service_unavailable"


@pytest.mark.asyncio
async def test_the_join_limit_counts_an_address_across_queues_so_made_up_slugs_are_refused_cheaply(
    make_queue, counted, settings
):
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.WR_RATE_LIMITS = {"join": {"algorithm": "fixed_window", "window_seconds": DAY, "max_requests": 3}}
    clear_of_a_window_edge(DAY)
    app, django = counted
    first, second = [await asyncio.to_thread(make_queue, state="paused") for _ in range(2)]
    assert (await join(app, first.slug)).status_code == 201
    assert (await join(app, second.slug)).status_code == 201
    missing = await join(app, "no-such-queue")  # its policy is nowhere: the database says so, in a thread
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "queue_not_found")
    refused = await join(app, "another-made-up-one")  # the address's allowance is spent, whatever the slug
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert django.paths == []


@pytest.mark.asyncio
async def test_a_join_the_database_fails_on_the_loop_is_a_503_and_any_other_failure_a_500_in_the_error_shape(
    paused, counted, monkeypatch
):
    """Django's path has its handlers for a failed request; the loop answers as they do, in the error shape."""
    from django.db import OperationalError

    from queueing.services import joins

    app, django = counted

    def database_away(**kwargs: Any) -> int:
        raise OperationalError("the database went away")

    monkeypatch.setattr(joins, "priority_code_reserve", database_away)
    response = await join(app, paused, body=json_body(priority_code="GOLD-2"))
    assert (response.status_code, response.json()["error"]["code"]) == (503, "service_unavailable")
    assert int(response.headers["retry-after"]) >= 1

    def broken(**kwargs: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(joins, "priority_code_reserve", broken)
    response = await join(app, paused, body=json_body(priority_code="GOLD-2"))
    assert (response.status_code, response.json()["error"]["code"]) == (500, "server_error")
    assert django.paths == []


@pytest.mark.asyncio
async def test_a_join_cancelled_on_the_loop_gives_its_priority_code_back(paused, counted, monkeypatch):
    """A request's task cancelled while its join is in Redis (the server shutting down): the flow is told (the
    cancellation is thrown into it), gives back the code's use it took, and ends cancelled."""
    from queueing.models import PriorityCode, Queue
    from queueing.store import connection

    app, _ = counted
    queue = await asyncio.to_thread(Queue.objects.get, slug=paused)
    await asyncio.to_thread(PriorityCode.objects.create, queue=queue, code="GOLD-2", level=2, max_uses=1)
    aexecute = connection.aexecute

    async def cancelled_at_the_join(plan: Any) -> Any:
        if any(name == "join" for name, _, _ in plan.calls):
            raise asyncio.CancelledError
        return await aexecute(plan)

    monkeypatch.setattr(store, "aexecute", cancelled_at_the_join)
    with pytest.raises(asyncio.CancelledError):
        await join(app, paused, body=json_body(priority_code="GOLD-2"))
    code = await asyncio.to_thread(PriorityCode.objects.get, code="GOLD-2")
    assert code.uses == 0 and store.line_count(paused) == 0
