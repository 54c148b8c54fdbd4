"""Cheap refusals stay cheap (issue 13, items 3 and 11): no page load reads a whole shuffle record, the
revealed record is cacheable and limited, `/window` misses cost no SQL, priority codes cannot be guessed,
stateless tokens die with their mode, and an unknown signing key fetches the JWKS once per interval."""

from __future__ import annotations

import json
import math
import string
import time
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing import caching, modes, selectors, services, tokens
from queueing.models import PriorityCode, PriorityLevel, Queue, QueueShuffle

from .test_caching import DEAD_CACHE

THREE_A_MINUTE = {"algorithm": "sliding_log", "window_seconds": 60, "max_requests": 3}  # no window boundary to cross


def an_address() -> str:
    """A client address of the test's own: the limiters count per address across the run."""
    raw = uuid.uuid4().int
    return f"10.{raw % 250}.{(raw >> 8) % 250}.{(raw >> 16) % 250 + 1}"


def shuffle_sql(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "queueing_queueshuffle" in q["sql"]]


def reads_the_lists(sql: str) -> bool:
    return '"tickets"' in sql or '"order"' in sql


@pytest.fixture
def big_sale(make_queue, clock):
    """A sale whose pre-queue shuffle was revealed with 50,000 tickets in it."""
    starts = datetime.fromtimestamp(clock.now + 60, tz=UTC)
    queue = make_queue(state="open", prequeue_opens_at=starts - timedelta(hours=1), starts_at=starts)
    tickets = [[seq, 0] for seq in range(1, 50_001)]
    QueueShuffle.objects.filter(queue=queue).update(
        tickets=tickets, order=[seq for seq, _ in reversed(tickets)], revealed_at=timezone.now()
    )
    caching.forget(caching.shuffle_key(queue.slug))
    return queue


# --- 3. No page load reads a whole shuffle record ------------------------------------------------------------


def test_a_page_load_reads_the_commitment_and_seed_but_never_the_shuffles_lists(big_sale):
    with CaptureQueriesContext(connection) as queries:
        page = Client().get(f"/q/{big_sale.slug}/")
    assert page.status_code == 200
    record = QueueShuffle.objects.get(queue=big_sale)
    assert record.seed in page.content.decode()  # the page still shows what it showed
    sql = shuffle_sql(queries)
    assert sql and not any(reads_the_lists(q) for q in sql), sql
    cached = caching.cached(caching.shuffle_key(big_sale.slug))
    assert cached["revealed"] and "tickets" not in cached and "order" not in cached  # nor from the cache
    with CaptureQueriesContext(connection) as again:
        assert Client().get(f"/q/{big_sale.slug}/").status_code == 200
    assert not shuffle_sql(again)


def test_the_revealed_record_is_cacheable_for_long_and_a_conditional_get_is_a_304_without_the_lists(big_sale, api):
    url = f"/api/v1/queues/{big_sale.slug}/shuffle"
    full = api.get(url)
    assert full.status_code == 200 and len(full.json()["order"]) == 50_000
    assert full["Cache-Control"] == "public, max-age=3600" and full["ETag"].startswith('"')
    caching.forget(caching.shuffle_key(big_sale.slug))
    with CaptureQueriesContext(connection) as queries:
        again = api.get(url, HTTP_IF_NONE_MATCH=full["ETag"])
    assert again.status_code == 304 and not again.content and again["ETag"] == full["ETag"]
    assert again["Cache-Control"] == "public, max-age=3600"
    assert not any(reads_the_lists(q) for q in shuffle_sql(queries))
    assert api.get(url, HTTP_IF_NONE_MATCH=f'"other", W/{full["ETag"]}').status_code == 304
    assert api.get(url, HTTP_IF_NONE_MATCH='"other"').status_code == 200


def test_before_the_reveal_the_record_is_cached_briefly_and_its_etag_changes_at_the_reveal(make_queue, clock, api):
    starts = datetime.fromtimestamp(clock.now + 60, tz=UTC)
    queue = make_queue(state="open", prequeue_opens_at=starts - timedelta(hours=1), starts_at=starts)
    url = f"/api/v1/queues/{queue.slug}/shuffle"
    before = api.get(url)
    assert before["Cache-Control"] == "public, max-age=5" and "seed" not in before.json()
    services.queue_prequeue_shuffle(queue, now=clock.now + 61)
    after = api.get(url, HTTP_IF_NONE_MATCH=before["ETag"])
    assert after.status_code == 200 and after.json()["revealed"] and after["ETag"] != before["ETag"]
    assert after.json()["tickets"] == [] and after.json()["order"] == []


def test_the_shuffle_record_is_rate_limited_per_address(big_sale, api, settings):
    settings.WR_RATE_LIMITS = {"shuffle": THREE_A_MINUTE}
    url, address = f"/api/v1/queues/{big_sale.slug}/shuffle", an_address()
    assert [api.get(url, REMOTE_ADDR=address).status_code for _ in range(3)] == [200] * 3
    refused = api.get(url, REMOTE_ADDR=address)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1
    assert api.get(url, REMOTE_ADDR=an_address()).status_code == 200  # another address


def test_the_new_scopes_are_limited_by_default_in_code_until_settings_say_otherwise(db, settings):
    settings.WR_RATE_LIMITS = {}  # no entry: the default in code
    now = math.floor(time.time() / 3600) * 3600 + 30  # early in every window: none of their edges is crossed
    for scope in ("shuffle", "window_miss", "priority_code"):
        address, limit = an_address(), selectors.DEFAULT_LIMITS[scope]["max_requests"]
        assert all(selectors.limit_hit(scope, address, now=now).allowed for _ in range(limit))
        assert not selectors.limit_hit(scope, address, now=now).allowed
    settings.WR_RATE_LIMITS = {"shuffle": None}  # switched off on purpose
    address = an_address()
    assert all(selectors.limit_hit("shuffle", address, now=now).allowed for _ in range(100))


# --- 11a. /window on a tracked or unknown queue --------------------------------------------------------------


def test_repeated_window_misses_cost_no_sql_even_with_the_shared_cache_down(make_queue, api, settings):
    tracked = make_queue()
    settings.CACHES = DEAD_CACHE  # the shared negative cache cannot help
    for slug in (tracked.slug, "no-such-window-queue"):
        assert api.get(f"/api/v1/queues/{slug}/window").status_code == 404
        with CaptureQueriesContext(connection) as queries:
            for _ in range(5):
                assert api.get(f"/api/v1/queues/{slug}/window").status_code == 404
        assert len(queries) == 0, [q["sql"] for q in queries.captured_queries]


def test_a_queue_switched_to_stateless_has_its_window_at_once_in_this_process(make_queue, api):
    queue = make_queue()
    assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 404
    services.queue_configure(
        slug=queue.slug, changes={"mode": "stateless", "window_size": 3, "window_interval": 10}, actor_label="tests"
    )
    assert api.get(f"/api/v1/queues/{queue.slug}/window").status_code == 200


def test_window_misses_that_would_ask_the_database_are_limited_per_address(make_queue, api, settings):
    settings.WR_RATE_LIMITS = {"window_miss": THREE_A_MINUTE}
    address, live = an_address(), make_queue(mode="stateless", window_size=3, window_interval=10)
    slugs = [f"made-up-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    answers = [api.get(f"/api/v1/queues/{slug}/window", REMOTE_ADDR=address) for slug in slugs]
    assert [a.status_code for a in answers] == [404, 404, 404, 429]
    assert answers[-1].json()["error"]["code"] == "rate_limited"
    assert api.get(f"/api/v1/queues/{slugs[0]}/window", REMOTE_ADDR=address).status_code == 404  # remembered
    assert api.get(f"/api/v1/queues/{live.slug}/window", REMOTE_ADDR=address).status_code == 200  # live: free
    assert api.get(f"/api/v1/queues/{slugs[3]}/window", REMOTE_ADDR=an_address()).status_code == 404


# --- 11b, c. Priority codes ----------------------------------------------------------------------------------


def test_a_priority_code_is_generated_with_at_least_80_random_bits_unless_the_operator_types_one(make_queue):
    queue = make_queue()
    codes = [PriorityCode(queue=queue, level=2).code for _ in range(50)]
    alphabet = set(string.ascii_letters + string.digits + "-_")
    assert all(set(code) <= alphabet and len(code) * math.log2(len(alphabet)) >= 80 for code in codes)
    assert len(set(codes)) == len(codes)
    generated = PriorityCode(queue=queue, level=2)
    generated.full_clean()
    generated.save()
    PriorityCode(queue=queue, code="Spring-VIP-2026", level=2).full_clean()  # a chosen code is still allowed
    # ... if it is strong (issue 50, item 9: a 4-character code could be typed in admin)
    for weak in ("VIP1", "VIP-2026", "aaaaaaaaaaaaaaa", "abcabcabcabcabc", "111122221111"):
        with pytest.raises(ValidationError) as refused:
            PriorityCode(queue=queue, code=weak, level=2).full_clean()
        assert "code" in refused.value.message_dict, weak
    kept = PriorityCode.objects.create(queue=queue, code="OLD1", level=2)  # one from before the rule
    kept.max_uses = 5
    kept.full_clean()  # may still be edited, while its code stays


@pytest.fixture
def vip_queue(make_queue):
    queue = make_queue(state="paused")
    PriorityLevel.objects.get_or_create(queue=queue, level=2, defaults={"name": "VIP"})
    return queue


def join_with(api: Any, slug: str, address: str, **body: Any) -> Any:
    return api.post(
        f"/api/v1/queues/{slug}/join",
        json.dumps(body),
        content_type="application/json",
        REMOTE_ADDR=address,
        HTTP_X_VISITOR_ID=str(uuid.uuid4()),
    )


def test_guessing_priority_codes_is_refused_after_a_few_tries_while_plain_joins_go_on(vip_queue, api, settings):
    settings.WR_RATE_LIMITS = {"priority_code": THREE_A_MINUTE}
    good = PriorityCode.objects.create(queue=vip_queue, level=2).code
    address, slug = an_address(), vip_queue.slug
    for guess in ("GUESS-1", "GUESS-2", "GUESS-3"):
        assert join_with(api, slug, address, priority_code=guess).json()["error"]["code"] == "invalid_priority_code"
    with CaptureQueriesContext(connection) as queries:
        refused = join_with(api, slug, address, priority_code=good)  # even a right code: no oracle
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert not [q for q in queries.captured_queries if "queueing_prioritycode" in q["sql"]]
    assert join_with(api, slug, address).status_code == 201  # a join without a code is not counted here
    assert join_with(api, slug, an_address(), priority_code=good).status_code == 201
    assert PriorityCode.objects.get(code=good).uses == 1


def test_wrong_codes_from_many_addresses_lock_the_queue_s_codes_a_while(vip_queue, make_queue, api, settings):
    """Issue 50, item 9. Seen: code guesses were limited per address only, so guesses spread over many
    addresses went on without end. Wrong codes count per queue too; past the limit every code tried for the
    queue is refused (429, no SQL), a right one too, until the limiter lets one through again."""
    settings.WR_RATE_LIMITS = {"priority_code_failed": THREE_A_MINUTE}
    good = PriorityCode.objects.create(queue=vip_queue, level=2).code
    slug = vip_queue.slug
    for guess in ("GUESS-1", "GUESS-2", "GUESS-3", "GUESS-4"):  # each from an address of its own
        assert join_with(api, slug, an_address(), priority_code=guess).json()["error"]["code"] == (
            "invalid_priority_code"
        )
    with CaptureQueriesContext(connection) as queries:
        refused = join_with(api, slug, an_address(), priority_code=good)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert int(refused["Retry-After"]) > 0
    assert not [q for q in queries.captured_queries if "queueing_prioritycode" in q["sql"]]
    assert join_with(api, slug, an_address()).status_code == 201  # joins without a code go on
    assert PriorityCode.objects.get(code=good).uses == 0
    elsewhere = make_queue(state="paused")  # another queue's codes are its own
    PriorityLevel.objects.get_or_create(queue=elsewhere, level=2, defaults={"name": "VIP"})
    code = PriorityCode.objects.create(queue=elsewhere, level=2).code
    assert join_with(api, elsewhere.slug, an_address(), priority_code=code).status_code == 201


# --- 11d. Stateless tokens after a switch to tracked mode ----------------------------------------------------


def admitted_in_a_stateless_queue(make_queue, clock) -> tuple[Queue, str, str, tokens.PositionClaims]:
    """A stateless queue, and a ticket of it (with its claims) the window let through: its access token."""
    queue = make_queue(mode="stateless", window_size=3, window_interval=10, active_windows=2)
    window = services.queue_join_stateless(slug=queue.slug, now=clock.now)
    claims = tokens.PositionClaims(queue.slug, window.next_number, window.epoch, int(clock.now))
    ticket = tokens.position_issue(slug=queue.slug, number=claims.number, epoch=claims.epoch)
    services.queue_window_tick(queue=Queue.objects.get(pk=queue.pk), now=clock.now + 11)
    access = modes.status(claims=claims, now=clock.now + 11).access_token
    assert access
    return queue, ticket, access, claims


def test_a_stateless_ticket_is_refused_once_the_queue_is_tracked(make_queue, clock, api):
    queue, ticket, _, claims = admitted_in_a_stateless_queue(make_queue, clock)
    services.queue_configure(slug=queue.slug, changes={"mode": "tracked"}, actor_label="tests")
    with pytest.raises(selectors.TicketGone):
        modes.status(claims=claims)
    polled = api.get(f"/api/v1/queues/{queue.slug}/status", HTTP_AUTHORIZATION=f"Bearer {ticket}").json()
    assert polled["status"] == "expired" and "access_token" not in polled


def test_a_stateless_access_token_is_refused_once_the_queue_is_tracked(make_queue, clock, api, api_key_for):
    queue, _, access, _ = admitted_in_a_stateless_queue(make_queue, clock)
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {api_key_for(queue)}"}
    verify_url = f"/api/v1/queues/{queue.slug}/sessions/verify"
    assert api.post(verify_url, {"access_token": access}, format="json", **auth).json()["valid"]
    services.queue_configure(slug=queue.slug, changes={"mode": "tracked"}, actor_label="tests")
    verdict = api.post(verify_url, {"access_token": access}, format="json", **auth).json()
    assert verdict["valid"] is False


# --- 11e. The JWKS: one client per process, one fetch per interval for an unknown key ------------------------


def test_an_unknown_kid_fetches_the_jwks_at_most_once_per_interval(db, settings, monkeypatch):
    import base64
    import io

    from queueing import verifiers

    settings.WR_API_URL = "https://waitingroom.example"
    document = json.dumps({"keys": []})
    fetches: list[str] = []

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        fetches.append(url)
        return io.BytesIO(document.encode())

    now = [1000.0]
    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    monkeypatch.setattr("queueing.verifiers.time", SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    verifiers.published_keys._refetched.clear()

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'EdDSA', 'kid': 'unknown-kid', 'typ': 'JWT'})}.{part({'sub': 'x'})}.c2ln"
    verify = verifiers.VERIFIERS["offline"]
    assert verify("q", token).reason == "invalid"
    assert len(fetches) <= 2  # the cached document (or the first fetch), then one fetch for the new kid
    after_first = len(fetches)
    for _ in range(50):
        assert verify("q", token).reason == "invalid"
    assert len(fetches) == after_first  # a flood of unknown kids fetches nothing more
    now[0] += verifiers.JWKS_REFETCH_SECONDS + 1
    verify("q", token)
    assert len(fetches) == after_first + 1  # once the interval has passed: one more
    assert verifiers.VERIFIERS["offline"] is verify and isinstance(verifiers.published_keys, verifiers._PublishedKeys)
