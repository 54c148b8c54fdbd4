"""Django's cache on Redis: what it holds, when it is dropped, what two processes share, and what happens
when it cannot be reached (the product answers; nobody gets in who should not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.cache import cache, caches
from django.test import Client

from admin_dashboard import selectors as dashboard_selectors
from admin_dashboard import services as dashboard_services
from queueing import selectors, services, store
from queueing.middleware import VERIFIERS

ROOT = Path(__file__).resolve().parent.parent
DEAD_CACHE = {
    "default": {
        **settings.CACHES["default"],
        "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there
        "OPTIONS": {**settings.CACHES["default"]["OPTIONS"], "SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
    }
}


def cache_keys(pattern: str) -> list[str]:
    return caches["default"].keys(pattern)  # type: ignore[attr-defined]


def test_the_cache_is_redis_under_the_runs_own_prefix(db):
    config = settings.CACHES["default"]
    assert config["BACKEND"] == "django_redis.cache.RedisCache"
    assert config["OPTIONS"]["PARSER_CLASS"].endswith("HiredisParser")
    cache.set("probe", {"x": 1}, 30)
    raw = list(store.client().scan_iter(match=f"{settings.WR_REDIS_PREFIX}:cache:*probe"))
    assert len(raw) == 1 and 0 < store.client().ttl(raw[0]) <= 30
    assert cache.get("probe") == {"x": 1}


# --- Staff sessions (cached_db) ----------------------------------------------------------------------------


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True)


def test_a_staff_session_survives_a_flushed_cache(staff):
    browser = Client()
    browser.force_login(staff)
    assert cache_keys("django.contrib.sessions.cached_db*")
    caches["default"].delete_pattern("django.contrib.sessions.cached_db*")  # type: ignore[attr-defined]
    assert browser.get("/dashboard/").status_code == 200


def test_a_staff_session_is_read_from_the_cache(staff):
    browser = Client()
    browser.force_login(staff)
    Session.objects.all().delete()  # only the cache's copy is left
    assert browser.get("/dashboard/").status_code == 200


def test_the_caches_copy_of_a_session_is_kept_only_a_while(staff):
    browser = Client()
    browser.force_login(staff)
    (key,) = list(store.client().scan_iter(match=f"{settings.WR_REDIS_PREFIX}:cache:*cached_db*"))
    assert 0 < store.client().ttl(key) <= settings.SESSION_CACHE_SECONDS < settings.SESSION_COOKIE_AGE


# --- Cached reads and their invalidation -------------------------------------------------------------------


def test_the_shuffle_record_is_read_from_the_cache_until_the_shuffle_is_revealed(
    make_queue, clock, django_assert_num_queries
):
    starts = datetime.fromtimestamp(clock.now + 60, tz=UTC)
    queue = make_queue(state="open", prequeue_opens_at=starts - timedelta(hours=1), starts_at=starts)
    first = selectors.queue_shuffle_get(slug=queue.slug)
    assert first is not None and not first["revealed"]
    with django_assert_num_queries(0):
        assert selectors.queue_shuffle_get(slug=queue.slug) == first
    services.queue_prequeue_shuffle(queue, now=clock.now + 61)
    revealed = selectors.queue_shuffle_get(slug=queue.slug)
    assert revealed is not None and revealed["revealed"] and revealed["seed"]


def test_a_tracked_queues_missing_window_is_remembered_until_the_queue_changes(
    make_queue, api, django_assert_num_queries
):
    queue = make_queue(state="open")
    assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 404
    with django_assert_num_queries(0):
        assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 404
        assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 404
    services.queue_configure(slug=queue.slug, changes={"mode": "stateless"}, actor_label="tests")
    assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 200


def test_an_unknown_queues_window_costs_one_query_in_a_while(db, api, django_assert_num_queries):
    assert api.get("/api/v1/queues/nobody/window").status_code == 404
    with django_assert_num_queries(0):
        for _ in range(5):
            assert api.get("/api/v1/queues/nobody/window").status_code == 404


def test_the_dashboard_series_is_cached_until_the_next_snapshot(make_queue, clock, django_assert_num_queries):
    queue = make_queue(state="open")
    dashboard_services.queue_snapshot_take(queue, now=clock.now)
    start = datetime.fromtimestamp(clock.now - 60, tz=UTC)
    first = dashboard_selectors.queue_series(queue, start=start)
    assert len(first) == 1
    with django_assert_num_queries(0):
        assert dashboard_selectors.queue_series(queue, start=start) == first
    dashboard_services.queue_snapshot_take(queue, now=clock.now + 10)
    assert len(dashboard_selectors.queue_series(queue, start=start)) == 2


# --- The protected site's middleware, across processes -----------------------------------------------------

SHARED_VERDICT_SECONDS = 6  # long enough for a second process to start on a busy machine

VERIFY_SCRIPT = """
import json, sys
import django
django.setup()
from django.conf import settings
settings.WR_API_URL, settings.WR_API_KEY = sys.argv[1], sys.argv[2]
from queueing.middleware import VERIFIERS
verdict = VERIFIERS["remote"](sys.argv[3], sys.argv[4])
print(json.dumps([verdict.valid, verdict.reason]))
"""


def verify_in_another_process(url: str, key: str, slug: str, token: str) -> list:
    """A protected site's process (remote mode) of its own, sharing this run's cache."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "WR_TEST_RUN_ID": settings.WR_REDIS_PREFIX.removeprefix("wrt"),
        "WR_VERIFY_CACHE_SECONDS": str(SHARED_VERDICT_SECONDS),
    }
    done = subprocess.run(
        [sys.executable, "-c", VERIFY_SCRIPT, url, key, slug, token],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def admitted_token(api, slug: str) -> str:
    body = api.post(f"/api/v1/queues/{slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    assert body["status"] == "admitted", body
    return body["access_token"]


@pytest.mark.django_db(transaction=True)
def test_a_verdict_one_site_process_got_is_used_by_another_and_a_revoke_reaches_both_in_time(
    live_server, make_queue, api
):
    queue = make_queue(capacity=5, burst=5, target_url="/demo/protected/")
    key = services.api_key_create(queue, name="site")[1]
    token = admitted_token(api, queue.slug)
    assert verify_in_another_process(live_server.url, key, queue.slug, token) == [True, ""]
    ticket_id = json.loads(__import__("base64").urlsafe_b64decode(token.split(".")[1] + "=="))["sub"]
    services.session_revoke(slug=queue.slug, ticket_id=ticket_id)
    revoked_at = time.monotonic()
    # A second process asks at once: the first one's verdict, from the shared cache, within its bound.
    assert verify_in_another_process(live_server.url, key, queue.slug, token) == [True, ""]
    assert time.monotonic() - revoked_at < SHARED_VERDICT_SECONDS
    time.sleep(max(0.0, SHARED_VERDICT_SECONDS + 0.3 - (time.monotonic() - revoked_at)))
    assert verify_in_another_process(live_server.url, key, queue.slug, token) == [False, "revoked"]
    assert verify_in_another_process(live_server.url, key, queue.slug, token) == [False, "revoked"]


@pytest.mark.django_db(transaction=True)
def test_a_verdict_is_never_kept_past_its_tokens_expiry(live_server, make_queue, api, settings):
    queue = make_queue(capacity=5, burst=5, session_ttl=30, claim_ttl=30, target_url="/demo/protected/")
    settings.WR_API_URL, settings.WR_API_KEY = live_server.url, services.api_key_create(queue, name="site")[1]
    settings.WR_VERIFY_CACHE_SECONDS = 3600
    token = admitted_token(api, queue.slug)
    assert VERIFIERS["remote"](queue.slug, token).valid
    (verdict_key,) = list(store.client().scan_iter(match=f"{settings.WR_REDIS_PREFIX}:cache:*wr:verdict:*"))
    assert 0 < store.client().ttl(verdict_key) <= 30


# --- The cache down -----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_with_the_cache_down_a_revoked_token_is_refused_at_once(live_server, make_queue, api, settings):
    queue = make_queue(capacity=5, burst=5, target_url="/demo/protected/")
    settings.WR_API_URL, settings.WR_API_KEY = live_server.url, services.api_key_create(queue, name="site")[1]
    token = admitted_token(api, queue.slug)
    settings.CACHES = DEAD_CACHE
    assert VERIFIERS["remote"](queue.slug, token).valid
    ticket_id = json.loads(__import__("base64").urlsafe_b64decode(token.split(".")[1] + "=="))["sub"]
    services.session_revoke(slug=queue.slug, ticket_id=ticket_id)
    assert VERIFIERS["remote"](queue.slug, token).reason == "revoked"


def test_with_the_cache_down_the_product_answers(make_queue, staff, api, settings, clock):
    starts = datetime.fromtimestamp(clock.now + 60, tz=UTC)
    tracked = make_queue(state="open", prequeue_opens_at=starts - timedelta(hours=1), starts_at=starts)
    browser = Client()
    browser.force_login(staff)
    settings.CACHES = DEAD_CACHE
    assert cache.get("anything") is None  # a miss, not an error
    assert browser.get("/dashboard/").status_code == 200  # the session comes from the database
    assert browser.get(f"/dashboard/{tracked.slug}/").status_code == 200
    assert api.get(f"/api/v1/queues/{tracked.slug}/window").status_code == 404
    assert selectors.queue_shuffle_get(slug=tracked.slug) is not None
    page = Client().get(f"/q/{tracked.slug}/")
    assert page.status_code == 200
    joined = api.post(f"/api/v1/queues/{tracked.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert joined.status_code == 201


def test_a_sign_out_the_cache_cannot_record_leaves_the_session_and_says_try_again(staff, settings):
    browser = Client()
    browser.force_login(staff)
    settings.CACHES = DEAD_CACHE
    answer = browser.post("/admin/logout/")
    assert (answer.status_code, answer["Retry-After"]) == (503, "5")
    assert Session.objects.count() == 1  # not ended in the database while its cached copy lives on


def test_a_sign_out_ends_the_session_in_the_cache_and_the_database(staff):
    browser = Client()
    browser.force_login(staff)
    assert browser.post("/admin/logout/").status_code == 200
    assert Session.objects.count() == 0
    assert not cache_keys("django.contrib.sessions.cached_db*")
    assert browser.get("/dashboard/").status_code == 302  # to the login page


# --- Offline mode: the JWKS in the site's cache -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_offline_mode_keeps_the_jwks_in_the_sites_cache_and_fetches_it_again_for_a_new_key(
    live_server, make_queue, api, settings
):
    from datetime import timedelta as lead

    from queueing import signing_keys, verifiers

    queue = make_queue(capacity=5, burst=5, target_url="/demo/protected/")
    settings.WR_API_URL = live_server.url
    verifiers.published_keys._refetched.clear()  # no refetch made earlier in this process holds the next back
    first = admitted_token(api, queue.slug)
    assert VERIFIERS["offline"](queue.slug, first).valid
    assert cache_keys("wr:jwks:*")  # shared with the site's other processes
    signing_keys.signing_key_rotate(lead=lead(0))  # a key the cached JWKS does not have yet
    second = admitted_token(api, queue.slug)
    assert VERIFIERS["offline"](queue.slug, second).valid  # an unknown kid fetched the JWKS again
    forged = second[:-4] + "AAAA"
    assert VERIFIERS["offline"](queue.slug, forged).reason == "invalid"


def test_offline_mode_without_the_waiting_room_answers_unavailable_not_invalid(db, settings):
    settings.WR_API_URL = "http://127.0.0.1:1"
    header = {"alg": "EdDSA", "kid": "nobody-knows", "typ": "JWT"}
    import base64

    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    token = f"{part(header)}.{part({'sub': 'x'})}.c2ln"
    assert VERIFIERS["offline"]("q", token).reason == "unavailable"
