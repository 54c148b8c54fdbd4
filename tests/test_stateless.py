"""Stateless mode (issue 6, part 3; SPEC 4, seed 000): numbered tickets and a sliding window, with nothing
stored per visitor. Real Redis, a controlled clock."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueing import modes, selectors, services, shuffle, store, tokens
from queueing.models import Queue, QueueChange, QueueShuffle

from .test_recovery import private_redis  # noqa: F401  (a redis-server of the test's own)

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


@pytest.fixture
def window_queue(make_queue):
    return make_queue(mode="stateless", window_size=3, window_interval=10, active_windows=2)


def joined(slug: str, now: float) -> tokens.PositionClaims:
    window = services.queue_join_stateless(slug=slug, now=now)
    return tokens.PositionClaims(slug, window.next_number, window.epoch, int(now))


def state(claims: tokens.PositionClaims, now: float) -> str:
    return modes.status(claims=claims, now=now).status


def step(queue: Queue, now: float) -> store.WindowStep:
    return services.queue_window_tick(queue=Queue.objects.get(pk=queue.pk), now=now)


def test_a_tickets_state_follows_from_its_number_at_the_window_edges(window_queue, clock):
    t0, slug = clock.now, window_queue.slug
    tickets = [joined(slug, t0) for _ in range(10)]
    assert [t.number for t in tickets] == list(range(1, 11))
    assert {state(t, t0) for t in tickets} == {"waiting"}
    assert not step(window_queue, t0 + 5).stepped  # the first step comes an interval after the start
    assert step(window_queue, t0 + 10).active == 3
    assert [state(t, t0 + 10) for t in tickets[:4]] == ["admitted", "admitted", "admitted", "waiting"]
    assert modes.status(claims=tickets[3], now=t0 + 10).position == 1
    assert not step(window_queue, t0 + 15).stepped  # not before the interval has passed
    assert step(window_queue, t0 + 20).active == 6
    # Two active windows: 1-3 (the older window) and 4-6; 7 waits.
    assert [state(t, t0 + 20) for t in tickets[:7]] == ["admitted"] * 6 + ["waiting"]
    assert step(window_queue, t0 + 30).active == 9
    # The window passed 1-3 (place <= 9 - 2 * 3): expired; 4 (= 9 - 6 + 1) is the oldest still active.
    views = [modes.status(claims=t, now=t0 + 30) for t in tickets]
    assert [v.status for v in views] == ["expired"] * 3 + ["admitted"] * 6 + ["waiting"]
    assert views[0].reason == selectors.EXPIRED_WINDOW
    assert views[9].position == 1 and views[9].queue_length == 1


def test_the_window_skips_its_steps_while_it_already_passes_the_next_number(window_queue, clock):
    t0, slug = clock.now, window_queue.slug
    first = [joined(slug, t0) for _ in range(2)]
    assert step(window_queue, t0 + 10).active == 3  # two waiting: one step covers them, and one place more
    assert not step(window_queue, t0 + 20).stepped  # a slow line: the window is ahead of every number
    assert not step(window_queue, t0 + 30).stepped
    third = joined(slug, t0 + 31)
    assert third.number == 3 and state(third, t0 + 31) == "admitted"  # inside the window: through at once
    fourth = joined(slug, t0 + 32)
    assert state(fourth, t0 + 32) == "waiting"
    # The window now does not pass the next number (4): the overdue step happens at the next tick.
    assert step(window_queue, t0 + 33).active == 6
    assert state(fourth, t0 + 33) == "admitted"
    assert all(state(t, t0 + 33) == "admitted" for t in first)  # their window is still one of the last two


def test_a_ticket_that_joined_just_before_a_step_stays_active_for_the_next_one_too(window_queue, clock):
    t0, slug = clock.now, window_queue.slug
    tickets = [joined(slug, t0) for _ in range(12)]
    step(window_queue, t0 + 10)
    late = joined(slug, t0 + 19.9)  # number 13, just before the second step
    step(window_queue, t0 + 20)
    assert state(tickets[2], t0 + 25) == "admitted"  # spill-over: the previous window is still active
    step(window_queue, t0 + 30)
    assert state(tickets[2], t0 + 30) == "expired"
    assert state(late, t0 + 30) == "waiting" and modes.status(claims=late, now=t0 + 30).position == 4


def test_only_the_leader_moves_the_window(window_queue, clock):
    t0, slug = clock.now, window_queue.slug
    for _ in range(30):
        joined(slug, t0)
    queue = Queue.objects.get(pk=window_queue.pk)
    first = services.queue_window_tick_lead(queue=queue, instance="node-a", now=t0 + 10)
    second = services.queue_window_tick_lead(queue=queue, instance="node-b", now=t0 + 10)
    assert first is not None and first.stepped and second is None
    assert store.window_tick(slug, now_ms=int((t0 + 20) * 1000), leader_token="node-b:99").outcome == "not_leader"
    # However often ticks run (every half second from +10 to +30), the window moves once per interval.
    steps = 0
    for i in range(41):
        tick = services.queue_window_tick_lead(queue=queue, instance="node-a", now=t0 + 10 + i * 0.5)
        steps += int(tick is not None and tick.stepped)
    assert steps == 2 and store.window_read(slug).active == 9  # at +20 and +30


def test_a_paused_or_full_site_holds_the_window(window_queue, clock, make_queue):
    t0, slug = clock.now, window_queue.slug
    for _ in range(10):
        joined(slug, t0)
    services.queue_pause(Queue.objects.get(pk=window_queue.pk), actor_label="tests")
    assert not step(window_queue, t0 + 10).stepped
    assert modes.status(claims=tokens.PositionClaims(slug, 5, 1), now=t0 + 10).estimated_wait_seconds is None
    services.queue_configure(
        slug=slug, changes={"state": "open", "capacity_source": "reported", "capacity": 5}, actor_label="t"
    )
    services.capacity_report(slug=slug, in_use=5, now=t0 + 11)
    assert not step(window_queue, t0 + 12).stepped  # the site reports itself full
    services.capacity_report(slug=slug, in_use=4, now=t0 + 13)
    assert step(window_queue, t0 + 13).stepped


def test_redis_does_not_grow_with_100000_joins(window_queue, clock):
    slug = window_queue.slug
    client = store.client()
    keys_before = sorted(client.scan_iter(match=f"{store.key_pattern()[:-1]}{{{slug}}}*"))
    bytes_before = int(client.memory_usage(store.queue_keys(slug).win, samples=0) or 0)
    join = store.library().function("window/join")
    now = int(clock.now * 1000)
    for _ in range(100):
        pipe = client.pipeline(transaction=False)
        for _ in range(1000):
            pipe.fcall(join, 2, store.queue_keys(slug).win, store.queue_keys(slug).tagged("unused"), now, 0, 0, "next")
        pipe.execute()
    assert store.window_read(slug).issued == 100_000
    assert sorted(client.scan_iter(match=f"{store.key_pattern()[:-1]}{{{slug}}}*")) == keys_before
    # The window's hash holds counters only: longer numbers take a few bytes (an allocator size class at
    # most), nothing per visitor. (Tracked mode holds ~240 bytes per waiting ticket: 24 MB here.)
    assert int(client.memory_usage(store.queue_keys(slug).win, samples=0) or 0) - bytes_before <= 128


def test_an_access_token_is_issued_only_when_an_active_ticket_asks_and_verifies_without_state(
    window_queue, clock, api_key_for, api
):
    t0, slug = clock.now, window_queue.slug
    waiting, _ = joined(slug, t0), [joined(slug, t0) for _ in range(5)]
    assert modes.status(claims=waiting, now=t0).access_token is None
    step(window_queue, t0 + 10)
    view = modes.status(claims=waiting, now=t0 + 10)
    assert (
        view.status == "admitted" and view.access_token and str(view.redirect_url).startswith(window_queue.target_url)
    )
    claims = tokens.access_token_decode(view.access_token, slug=slug)
    assert claims.stateless and claims.ticket_id == waiting.ticket_id
    assert view.expires_at == int(t0 + 10) + window_queue.session_ttl
    key = api_key_for(window_queue)
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {key}"}
    verify = api.post(
        f"/api/v1/queues/{slug}/sessions/verify", {"access_token": view.access_token}, format="json", **auth
    )
    assert verify.json() == {"valid": True, "ticket_id": waiting.ticket_id, "expires_at": view.expires_at}
    done = api.post(
        f"/api/v1/queues/{slug}/sessions/complete", {"access_token": view.access_token}, format="json", **auth
    )
    assert done.status_code == 204
    revoke = api.post(f"/api/v1/queues/{slug}/sessions/revoke", {"ticket_id": waiting.ticket_id}, format="json", **auth)
    assert revoke.status_code == 409 and revoke.json()["error"]["code"] == "not_in_stateless_mode"


def test_a_stateless_access_token_is_bound_to_the_first_browser_that_presents_it(window_queue, clock, api_key_for, api):
    t0, slug = clock.now, window_queue.slug
    waiting, _ = joined(slug, t0), [joined(slug, t0) for _ in range(5)]
    step(window_queue, t0 + 10)
    token = modes.status(claims=waiting, now=t0 + 10).access_token
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {api_key_for(window_queue)}"}

    def verify(**body: object) -> dict:
        answer = api.post(
            f"/api/v1/queues/{slug}/sessions/verify", {"access_token": token, **body}, format="json", **auth
        )
        assert answer.status_code == 200, answer.content
        return dict(answer.json())

    assert verify(browser="a" * 40)["valid"]
    assert verify(browser="a" * 40)["valid"]
    assert verify(browser="b" * 40) == {"valid": False, "reason": "bound_elsewhere"}
    assert verify() == {"valid": False, "reason": "bound_elsewhere"}  # bound: no secret, no entry (issue 50)
    assert verify(server=True)["valid"]  # the site's own check: the token only
    assert verify(browser="b" * 40, rebind=True)["valid"]
    assert verify(browser="a" * 40) == {"valid": False, "reason": "bound_elsewhere"}


def test_joins_and_polls_over_the_api_with_dedupe_by_the_signed_cookie_only(window_queue, api):
    slug = window_queue.slug
    first = api.post(f"/api/v1/queues/{slug}/join", {}, format="json")
    assert first.status_code == 201
    body = first.json()
    assert body["mode"] == "stateless" and body["number"] == 1 and body["place"] == 1 and body["status"] == "waiting"
    assert body["window"]["active_to"] == 0 and body["ws_url"].endswith(f"/ws/queues/{slug}/")
    assert first.cookies[f"wr_pos_{slug}"].value == body["ticket"]
    again = api.post(f"/api/v1/queues/{slug}/join", {}, format="json")  # the cookie comes back
    assert again.status_code == 200 and again.json()["ticket"] == body["ticket"]
    api.cookies.clear()
    other = api.post(f"/api/v1/queues/{slug}/join", {}, format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    assert other.status_code == 201 and other.json()["number"] == 2  # no cookie: a new number
    api.cookies[f"wr_pos_{slug}"] = "forged." + body["ticket"]
    assert api.post(f"/api/v1/queues/{slug}/join", {}, format="json").json()["number"] == 3

    with CaptureQueriesContext(connection) as queries:
        poll = api.get(f"/api/v1/queues/{slug}/status", HTTP_AUTHORIZATION=f"Bearer {body['ticket']}")
    assert poll.status_code == 200 and poll.json()["position"] == 1 and len(queries) == 0
    assert int(poll["Retry-After"]) >= 1
    tampered = body["ticket"][:-3] + ("AAA" if not body["ticket"].endswith("AAA") else "BBB")
    assert api.get(f"/api/v1/queues/{slug}/status", HTTP_AUTHORIZATION=f"Bearer {tampered}").status_code == 401
    priority = api.post(f"/api/v1/queues/{slug}/join", {"priority_code": "VIP-1234"}, format="json")
    assert priority.json()["error"]["code"] == "invalid_priority_code"
    assert api.get(f"/api/v1/queues/{slug}/neighbours", HTTP_AUTHORIZATION=f"Bearer {body['ticket']}").json() == {
        "neighbours": []
    }


def test_the_window_endpoint_is_public_and_cacheable_for_about_one_interval(window_queue, api, make_queue, clock):
    slug = window_queue.slug
    for _ in range(4):
        joined(slug, clock.now)
    with CaptureQueriesContext(connection) as queries:
        answer = api.get(f"/api/v1/queues/{slug}/window")
    assert answer.status_code == 200 and len(queries) == 0
    body = answer.json()
    assert (body["active_from"], body["active_to"], body["issued"], body["queue_length"]) == (1, 0, 4, 4)
    assert (body["window_size"], body["window_interval"], body["active_windows"]) == (3, 10, 2)
    max_age = int(answer["Cache-Control"].split("max-age=")[1])
    assert answer["Cache-Control"].startswith("public") and 1 <= max_age <= 10
    tracked = make_queue()
    assert api.get(f"/api/v1/queues/{tracked.slug}/window").json()["error"]["code"] == "not_found"
    assert api.get("/api/v1/queues/no-such-queue/window").status_code == 404


def test_stats_and_the_dashboard_snapshot_work_in_stateless_mode(window_queue, clock):
    from admin_dashboard import services as dashboard

    t0, slug = clock.now, window_queue.slug
    for _ in range(7):
        joined(slug, t0)
    step(window_queue, t0 + 10)
    stats = selectors.queue_stats_get(slug=slug, now=t0 + 10)
    assert (stats["mode"], stats["waiting"], stats["active"], stats["totals"]["joined"]) == ("stateless", 4, 3, 7)
    assert stats["totals"]["admitted"] == 3 and stats["outflow_per_minute_configured"] == 18.0
    assert stats["outflow_per_minute_observed"] > 0
    snapshot = dashboard.queue_snapshot_take(Queue.objects.get(pk=window_queue.pk), now=t0 + 10)
    assert (snapshot.waiting, snapshot.active, snapshot.total_admitted) == (4, 3, 3)


def test_a_scheduled_stateless_sale_shuffles_its_pre_queue_verifiably(make_queue, clock, api):
    from io import StringIO

    from django.core.management import call_command

    t0 = clock.now
    queue = make_queue(
        mode="stateless",
        window_size=2,
        window_interval=5,
        prequeue_opens_at=at(t0 + 10),
        starts_at=at(t0 + 20),
    )
    with pytest.raises(services.QueueNotOpen):
        services.queue_join_stateless(slug=queue.slug, now=t0)
    prequeue = [joined(queue.slug, t0 + 11) for _ in range(8)]
    assert modes.status(claims=prequeue[0], now=t0 + 12).opens_in_seconds == 8
    services.queues_tick(now=t0 + 15)  # before the start: nothing moves
    assert store.window_read(queue.slug).active == 0
    services.queues_tick(now=t0 + 21)  # the start: the shuffle is revealed, and the window moves
    record = QueueShuffle.objects.get(queue=queue)
    assert record.numbers == [1, 8] and record.revealed_at is not None
    order = shuffle.stateless_order(record.seed, 1, 8)
    assert sorted(order) == list(range(1, 9)) and order != list(range(1, 9))
    through = {t.number for t in prequeue if state(t, t0 + 21) == "admitted"}
    assert through == set(order[:2])  # the first window lets in the first two of the shuffled order
    later = joined(queue.slug, t0 + 22)
    assert modes.status(claims=later, now=t0 + 22).position == 7  # behind the pre-queue
    public = api.get(f"/api/v1/queues/{queue.slug}/shuffle").json()
    assert public["method"] == shuffle.STATELESS_METHOD and public["numbers"] == [1, 8]
    out = StringIO()
    call_command("verify_shuffle", queue.slug, stdout=out)
    assert out.getvalue().startswith("OK:")


def test_losing_redis_keeps_every_stateless_ticket_and_never_reissues_a_number(make_queue, private_redis, clock):  # noqa: F811
    t0 = clock.now
    queue = make_queue(mode="stateless", window_size=2, window_interval=5)
    old = [joined(queue.slug, t0) for _ in range(6)]
    # (The window began when the queue was made, a moment after t0: its first step is due a moment after t0 + 5.)
    services.queues_tick(now=t0 + 6)  # 1-2 through; the tick notes where the window and the numbers are
    assert [state(t, t0 + 6) for t in old] == ["admitted"] * 2 + ["waiting"] * 4
    private_redis.flushall()
    services.queues_tick(now=t0 + 7)  # the next epoch begins where the window was, not a step further
    queue.refresh_from_db()
    assert queue.epoch == 2 and QueueChange.objects.filter(queue=queue, action="epoch").exists()
    new = joined(queue.slug, t0 + 7)
    assert new.number > queue.seq_reserved - settings.WR_SEQ_BLOCK >= max(t.number for t in old)
    assert [state(t, t0 + 7) for t in old] == ["admitted"] * 2 + ["waiting"] * 4
    assert modes.status(claims=old[2], now=t0 + 7).position == 1
    assert modes.status(claims=new, now=t0 + 7).position == 5  # right behind the old ones


def test_switching_a_queue_to_stateless_sends_its_visitors_to_join_again(make_queue, clock, api):
    from .factories import join

    queue = make_queue(state="paused")
    tracked = join(queue.slug, "before", now=clock.now)
    services.queue_configure(slug=queue.slug, changes={"mode": "stateless"}, actor_label="tests")
    queue.refresh_from_db()
    assert queue.epoch == 2 and store.snapshot(queue.slug).waiting == 0
    claims = tokens.TicketClaims(queue.slug, tracked.ticket_id, tracked.seq, tracked.ticket_id[11:], 0, 1)
    with pytest.raises(selectors.TicketGone):
        modes.status(claims=claims, now=clock.now)
    body = api.post(f"/api/v1/queues/{queue.slug}/join", {}, format="json").json()
    assert body["mode"] == "stateless" and body["number"] > tracked.seq and body["place"] == 1
    services.queue_configure(slug=queue.slug, changes={"mode": "tracked"}, actor_label="tests")
    assert join(queue.slug, "after", now=clock.now).seq > body["number"]
    assert not QueueChange.objects.filter(queue=queue, action="epoch").exists()  # a switch is no loss


def test_the_waiting_page_works_without_javascript_in_stateless_mode(window_queue, clock):
    from django.test import Client

    slug, browser = window_queue.slug, Client()
    page = browser.get(f"/q/{slug}/")
    assert 'data-state="join"' in page.content.decode()
    assert '"mode": "stateless"' in page.content.decode() and f"/api/v1/queues/{slug}/window" in page.content.decode()
    joined_page = browser.post(f"/q/{slug}/", {"action": "join"})
    assert joined_page.status_code == 303 and f"wr_pos_{slug}" in joined_page.cookies
    browser.post(f"/q/{slug}/", {"action": "join"})  # again: the cookie's ticket is kept, no new number
    assert store.window_read(slug).issued == 1
    waiting = browser.get(f"/q/{slug}/").content.decode()
    assert 'data-state="waiting"' in waiting and 'id="wr-number">1<' in waiting
    assert 'http-equiv="refresh"' in waiting
    step(window_queue, time.time() + window_queue.window_interval)
    through = browser.get(f"/q/{slug}/").content.decode()
    assert 'data-state="admitted"' in through and "wr_access=" in through


def test_the_dashboard_shows_a_stateless_queue(window_queue, staff_user, clock):
    from django.test import Client

    for _ in range(5):
        joined(window_queue.slug, clock.now)
    step(window_queue, clock.now + 10)
    staff = Client()
    staff.force_login(staff_user)
    assert staff.get("/dashboard/").status_code == 200
    page = staff.get(f"/dashboard/{window_queue.slug}/")
    assert page.status_code == 200 and "stateless" in page.content.decode().lower()
    live = staff.get(f"/dashboard/{window_queue.slug}/data.json").json()
    assert live["live"]["waiting"] == 2 and live["live"]["window"]["active_to"] == 3


def test_a_join_finds_its_way_when_the_queue_changed_mode_a_moment_ago(make_queue, api):
    """Each process remembers a queue's mode for a moment; a join that meets the other mode joins that way."""
    queue = make_queue(state="open")

    def join_once():
        answer = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))
        assert answer.status_code == 201, answer.content
        return answer.json()

    assert "mode" not in join_once()  # a join tries the tracked way while this process does not know the mode
    assert selectors.queue_mode_get(queue.slug) == "tracked"  # now it knows
    services.queue_configure(slug=queue.slug, changes={"mode": "stateless"}, actor_label="tests")
    assert selectors.queue_mode_get(queue.slug) == "tracked"  # this process has not noticed yet
    assert join_once()["mode"] == "stateless"
    services.queue_configure(slug=queue.slug, changes={"mode": "tracked"}, actor_label="tests")
    assert selectors.queue_mode_get(queue.slug) == "stateless"
    assert "mode" not in join_once()


def issued(slug: str, now: float) -> tokens.PositionClaims:
    """A join's ticket as the visitor holds it (signed, with the queue's row), read back."""
    ticket = modes.Stateless.joined(slug, services.queue_join_stateless(slug=slug, now=now)).ticket
    claims = tokens.visitor_ticket_decode(ticket, slug=slug)
    assert isinstance(claims, tokens.PositionClaims)
    return claims


def test_tickets_of_a_sale_before_a_change_of_mode_are_void_after_it(window_queue, clock, api_key_for, api):
    """Issue 50, item 2. Seen: a queue switched stateless -> tracked -> stateless read its old tickets' epoch
    gap as 0, so their numbers became places 1-3 of the new sale; one already admitted was admitted again."""
    t0, slug = clock.now, window_queue.slug
    old = [issued(slug, t0) for _ in range(4)]
    step(window_queue, t0 + 10)
    token = modes.status(claims=old[0], now=t0 + 10).access_token
    assert token and [state(t, t0 + 10) for t in old] == ["admitted"] * 3 + ["waiting"]
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {api_key_for(window_queue)}"}

    def verified() -> dict:
        answer = api.post(f"/api/v1/queues/{slug}/sessions/verify", {"access_token": token}, format="json", **auth)
        assert answer.status_code == 200, answer.content
        return dict(answer.json())

    assert verified()["valid"]
    for mode in ("tracked", "stateless"):
        services.queue_configure(slug=slug, changes={"mode": mode}, actor_label="tests")
    views = [modes.status(claims=t, now=t0 + 11) for t in old]
    assert {(v.status, v.reason) for v in views} == {("expired", selectors.EXPIRED_EPOCH)}
    assert views[0].access_token is None
    assert verified() == {"valid": False, "reason": "invalid"}  # its sale is over
    new = [issued(slug, t0 + 11) for _ in range(4)]
    assert [modes.status(claims=t, now=t0 + 11).position for t in new] == [1, 2, 3, 4]
    window_queue.refresh_from_db()
    step(window_queue, t0 + 30)
    assert [state(t, t0 + 30) for t in new] == ["admitted"] * 3 + ["waiting"]  # one step: three, all new
    assert {state(t, t0 + 30) for t in old} == {"expired"}


def test_a_queue_deleted_and_made_again_under_its_slug_voids_the_old_tickets(make_queue, clock, api_key_for, api):
    t0 = clock.now
    first = make_queue(mode="stateless", window_size=3, window_interval=10)
    slug = first.slug
    old = [issued(slug, t0) for _ in range(2)]
    step(first, t0 + 12)  # (its window began when it was made, a moment after t0)
    token = modes.status(claims=old[0], now=t0 + 12).access_token
    assert token
    services.queue_delete(first, actor_label="tests")
    again = make_queue(slug=slug, mode="stateless", window_size=3, window_interval=10)
    assert again.epoch == first.epoch  # the same epoch, the same numbers: only the queue's row tells them apart
    views = [modes.status(claims=t, now=t0 + 13) for t in old]
    assert {(v.status, v.reason) for v in views} == {("expired", selectors.EXPIRED_EPOCH)}
    new = issued(slug, t0 + 13)
    assert modes.status(claims=new, now=t0 + 13).position == 1
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {api_key_for(again)}"}
    answer = api.post(f"/api/v1/queues/{slug}/sessions/verify", {"access_token": token}, format="json", **auth)
    assert answer.json() == {"valid": False, "reason": "invalid"}
