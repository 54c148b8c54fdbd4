"""Adaptive outflow (issue 6, part 5): the protected site reports its response times and errors, and the
admission tick follows them within the operator's bounds: additive increase while healthy, multiplicative
decrease when the p95 or the error rate passes its threshold. Real Redis, a controlled clock."""

from __future__ import annotations

import json
import threading
import time
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.http import Http404, HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from admin_dashboard import services as dashboard_services
from queueing import health, middleware, selectors, services, store
from queueing.models import Queue, QueueChange

from .factories import join, status

ADAPTIVE = {
    "adaptive_outflow": True,
    "outflow_per_minute": 60.0,
    "outflow_min_per_minute": 20.0,
    "outflow_max_per_minute": 80.0,
    "adaptive_step_per_minute": 10.0,
    "adaptive_decrease_factor": 0.5,
    "adaptive_interval_seconds": 10,
    "adaptive_min_requests": 20,
    "health_latency_p95_ms": 1000,
    "health_error_rate": 0.05,
    # One slot, and nobody counted absent within a test: the line stays long for the whole test.
    "capacity": 1,
    "presence_timeout": 3600,
    "abandon_timeout": 7200,
}


@pytest.fixture(autouse=True)
def _every_response_counts(settings):
    """These tests are about how responses are reported: each one counts (test_health_sources.py tests
    the bound on one visitor's)."""
    settings.WR_HEALTH_SOURCE_SECONDS = 0


@pytest.fixture
def adaptive(make_queue, clock) -> Queue:
    queue = make_queue(**ADAPTIVE)
    for i in range(20):
        join(queue.slug, f"v{i}", now=clock.now)
    return queue


def report(slug: str, now: float, *, count: int = 30, ms: float = 50, errors: int = 0) -> None:
    services.site_health_report(slug=slug, requests=count, errors=errors, latencies_ms=[ms] * count, now=now)


def tick(slug: str, now: float, instance: str = "node-a") -> store.AdmitReply | None:
    return services.queue_tick(slug=slug, instance=instance, now=now)


def in_force(slug: str) -> float:
    snap = store.snapshot(slug)
    return selectors.outflow_in_force(snap.config, snap.stats)


def adapt(slug: str, now: float, instance: str = "node-a") -> services.OutflowStep | None:
    token = store.leader(slug, instance_id=instance, ttl_ms=3000)
    assert token is not None
    return services.queue_outflow_adapt(slug=slug, leader_token=token, now=now)


def adaptations(queue: Queue) -> list[QueueChange]:
    return list(QueueChange.objects.filter(queue=queue, action="outflow_adapted").order_by("id"))


# --- The site's health: histogram and p95 -----------------------------------------------------------------


def test_the_p95_of_added_reports_is_the_p95_of_all_their_responses():
    fast = health.histogram([20.0] * 90, requests=90)
    slow = health.histogram([2000.0] * 10, requests=10)
    combined = {i: fast.get(i, 0) + slow.get(i, 0) for i in {*fast, *slow}}
    # 100 responses, 10 of them slow: the 95th is slow, though each report's average would hide it.
    p95 = health.quantile_ms(combined)
    assert p95 is not None and 2000 / 1.19 <= p95 <= 2000 * 1.19
    p50 = health.quantile_ms(combined, 0.5)
    assert p50 is not None and 20 / 1.19 <= p50 <= 20 * 1.19
    assert health.quantile_ms({}) is None


def test_a_sample_of_response_times_stands_for_all_the_requests():
    buckets = health.histogram([10.0, 10.0, 3000.0], requests=300)
    assert sum(buckets.values()) == 300
    assert buckets[health.bucket_of(3000.0)] == 100 and buckets[health.bucket_of(10.0)] == 200


def test_reports_from_many_processes_add_up_in_redis(make_queue, clock):
    queue = make_queue()
    for _ in range(4):  # four web processes in the same second
        report(queue.slug, clock.now, count=25, ms=40, errors=1)
    report(queue.slug, clock.now - 30, count=1000, ms=9000)  # outside the 10 s window
    site = selectors.site_health_get(slug=queue.slug, now=clock.now)
    assert (site.window_seconds, site.requests, site.errors, site.latency_samples) == (10, 100, 4, 100)
    assert site.error_rate == pytest.approx(0.04)
    assert site.p95_ms is not None and 40 / 1.19 <= site.p95_ms <= 40 * 1.19


def test_health_reports_expire_so_nothing_grows(make_queue, clock):
    queue = make_queue()
    report(queue.slug, clock.now)
    key = store.health_slice_key(queue.slug, int(clock.now))
    assert 0 < store.client().ttl(key) <= health.KEEP_SECONDS


# --- The adaptation ---------------------------------------------------------------------------------------


def test_it_cuts_the_outflow_multiplicatively_under_injected_latency_and_never_below_the_minimum(adaptive, clock):
    slug, t0 = adaptive.slug, clock.now
    assert in_force(slug) == 60
    for seconds, expected in ((0, 30), (10, 20), (20, 20)):  # 60 x 0.5, then the minimum (not 15), then held
        report(slug, t0 + seconds, ms=1500)
        tick(slug, t0 + seconds)
        assert in_force(slug) == expected, seconds


def test_it_cuts_the_outflow_under_injected_errors(adaptive, clock):
    report(adaptive.slug, clock.now, count=100, ms=30, errors=10)  # fast, but 10% fail (threshold 5%)
    step = adapt(adaptive.slug, clock.now)
    assert step is not None and (step.verdict, step.reason, step.after) == ("decrease", "errors", 30)
    assert in_force(adaptive.slug) == 30


def test_it_recovers_additively_when_healthy_and_never_above_the_maximum(adaptive, clock):
    slug, t0 = adaptive.slug, clock.now
    report(slug, t0, ms=2500)
    tick(slug, t0)
    assert in_force(slug) == 30
    seen = []
    for interval in range(1, 8):
        now = t0 + 10 * interval
        report(slug, now, ms=80)  # healthy again
        tick(slug, now)
        seen.append(in_force(slug))
    assert seen == [40, 50, 60, 70, 80, 80, 80]


def test_it_leaves_the_outflow_alone_without_traffic(adaptive, clock):
    step = adapt(adaptive.slug, clock.now)
    assert step is not None and (step.verdict, step.reason) == ("hold", "no_traffic")
    assert in_force(adaptive.slug) == 60
    assert adaptations(adaptive) == []


def test_one_slow_response_of_two_does_not_cut_the_outflow(adaptive, clock):
    services.site_health_report(slug=adaptive.slug, requests=2, errors=0, latencies_ms=[20, 4000], now=clock.now)
    step = adapt(adaptive.slug, clock.now)
    assert step is not None and (step.verdict, step.reason) == ("hold", "too_few_requests")
    assert in_force(adaptive.slug) == 60


def test_a_healthy_site_does_not_raise_the_outflow_while_nobody_waits(make_queue, clock):
    queue = make_queue(**ADAPTIVE)  # nobody in line
    report(queue.slug, clock.now)
    step = adapt(queue.slug, clock.now)
    assert step is not None and (step.outcome, step.after) == ("not_limiting", 60)


def test_a_paused_queue_holds_its_outflow(adaptive, clock):
    services.queue_pause(adaptive, actor_label="tests")
    report(adaptive.slug, clock.now, ms=5000)
    step = adapt(adaptive.slug, clock.now)
    assert step is not None and (step.outcome, step.after) == ("not_admitting", 60)


def test_it_adjusts_at_most_once_per_interval_even_with_two_tick_runners(adaptive, clock):
    slug, t0 = adaptive.slug, clock.now
    report(slug, t0, ms=3000)
    tick(slug, t0, "node-a")
    assert tick(slug, t0, "node-b") is None  # not the leader: no tick, no adjustment
    assert in_force(slug) == 30
    # node-a's lease lapses and node-b takes over within the interval: the Redis side still says "not due".
    store.client().delete(store.queue_keys(slug).leader)
    report(slug, t0 + 5, ms=3000)
    assert tick(slug, t0 + 5, "node-b") is not None
    assert in_force(slug) == 30
    token = store.leader(slug, instance_id="node-b", ttl_ms=3000)
    assert token is not None
    assert (
        store.outflow_adapt(slug, now_ms=int((t0 + 5) * 1000), leader_token=token, verdict="decrease")[0] == "not_due"
    )
    assert store.outflow_adapt(slug, now_ms=int((t0 + 20) * 1000), leader_token="node-a:1", verdict="decrease")[0] == (
        "not_leader"
    )
    tick(slug, t0 + 10, "node-b")
    assert in_force(slug) == 20
    assert len(adaptations(adaptive)) == 2


def test_racing_calls_of_one_node_adjust_once(adaptive, clock):
    # Every process of the leading worker node holds its lease: they may tick the same queue together.
    token = store.leader(adaptive.slug, instance_id="node-a", ttl_ms=3000)
    assert token is not None
    start, outcomes = threading.Barrier(8), []

    def race() -> None:
        start.wait()
        outcomes.append(
            store.outflow_adapt(adaptive.slug, now_ms=int(clock.now * 1000), leader_token=token, verdict="decrease")[0]
        )

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == ["adapted"] + ["not_due"] * 7
    assert in_force(adaptive.slug) == 30


def test_every_change_of_the_outflow_is_audited_with_the_figures_that_caused_it(adaptive, clock):
    slug, t0 = adaptive.slug, clock.now
    report(slug, t0, count=40, ms=1500, errors=4)
    tick(slug, t0)
    tick(slug, t0 + 10)  # no traffic: no change, no entry
    report(slug, t0 + 20, count=30, ms=50)
    tick(slug, t0 + 20)
    down, up = adaptations(adaptive)
    assert (down.actor, down.actor_label, up.actor_label) == (None, "adaptive outflow", "adaptive outflow")
    assert down.before == {"outflow_per_minute_effective": 60.0}
    assert down.after["outflow_per_minute_effective"] == 30.0 and down.after["reason"] == "latency_and_errors"
    assert (down.after["requests"], down.after["errors"], down.after["error_rate"]) == (40, 4, 0.1)
    assert down.after["p95_latency_ms"] > 1000 and down.after["window_seconds"] == 10
    assert (up.before, up.after["outflow_per_minute_effective"], up.after["reason"]) == (
        {"outflow_per_minute_effective": 30.0},
        40.0,
        "healthy",
    )


@pytest.mark.usefixtures("nobody_walks_at_first")
def test_admission_follows_the_outflow_in_force_and_so_do_the_wait_estimates(make_queue, clock):
    queue = make_queue(
        **{**ADAPTIVE, "capacity": 1000, "burst": 1, "outflow_min_per_minute": 15, "adaptive_decrease_factor": 0.25}
    )
    slug, t0 = queue.slug, clock.now
    tickets = [join(slug, f"v{i}", now=t0) for i in range(100)]  # the first takes the bucket's one token
    waiting = tickets[40]
    # 39 ahead, then this one, at 1 a second (the bucket empty), and the next tick's half second
    assert status(slug, waiting, now=t0).est_wait_s == 41
    report(slug, t0, ms=4000)
    reply = tick(slug, t0)
    assert reply is not None and reply.figures is not None and reply.figures.outflow_per_minute == 15
    assert status(slug, waiting, now=t0).est_wait_s == 40 * 4 + 1  # at 15 a minute
    admitted = sum(len(r.admitted) for r in (tick(slug, t0 + s) for s in range(1, 61)) if r is not None)
    assert 14 <= admitted <= 16  # 15 a minute, not the configured 60


def test_turning_adaptation_off_or_retuning_the_outflow_starts_again_from_the_configured_outflow(adaptive, clock):
    report(adaptive.slug, clock.now, ms=3000)
    tick(adaptive.slug, clock.now)
    assert in_force(adaptive.slug) == 30
    services.queue_update(adaptive, changes={"outflow_per_minute": 70}, actor_label="operator")
    assert in_force(adaptive.slug) == 70
    reset = QueueChange.objects.get(queue=adaptive, action="outflow_reset")
    assert (reset.actor_label, reset.before, reset.after["outflow_per_minute_effective"]) == (
        "operator",
        {"outflow_per_minute_effective": 30.0},
        70,
    )
    # The new rate gets a full interval before it is judged.
    report(adaptive.slug, clock.now + 1, ms=3000)
    assert adapt(adaptive.slug, clock.now + 1) is None
    report(adaptive.slug, clock.now + 11, ms=3000)
    step = adapt(adaptive.slug, clock.now + 11)
    assert step is not None and step.after == 35
    services.queue_update(adaptive, changes={"adaptive_outflow": False}, actor_label="operator")
    assert in_force(adaptive.slug) == 70
    assert store.outflow_adapt(adaptive.slug, now_ms=0, leader_token="x", verdict="decrease")[0] == "not_leader"
    assert adapt(adaptive.slug, clock.now + 30) is None  # off: nothing adapts


def test_if_redis_loses_the_adapted_outflow_admission_falls_back_to_the_configured_one(adaptive, clock):
    report(adaptive.slug, clock.now, ms=3000)
    tick(adaptive.slug, clock.now)
    assert in_force(adaptive.slug) == 30
    store.client().delete(store.queue_keys(adaptive.slug).st)
    reply = services.queue_admit(slug=adaptive.slug, now=clock.now + 1)
    assert reply.figures is not None and reply.figures.outflow_per_minute == 60


def test_admission_goes_on_when_an_adaptation_step_fails(make_queue, clock, monkeypatch):
    queue = make_queue(**{**ADAPTIVE, "capacity": 100, "burst": 5})
    for i in range(20):
        join(queue.slug, f"v{i}", now=clock.now)

    def broken(*_: Any, **__: Any) -> None:
        raise ConnectionError("the audit log's database went away")

    monkeypatch.setattr(services.admission, "queue_change_record", broken)  # where the tick uses it
    report(queue.slug, clock.now, ms=3000)
    reply = tick(queue.slug, clock.now + 5)
    assert in_force(queue.slug) == 30  # the step itself happened; only its audit entry failed
    assert reply is not None and len(reply.admitted) > 0


# --- Configuration ----------------------------------------------------------------------------------------


def test_adaptive_outflow_needs_bounds_around_the_outflow(make_queue):
    queue = make_queue()
    with pytest.raises(ValidationError) as missing:
        services.queue_update(queue, changes={"adaptive_outflow": True})
    assert set(missing.value.message_dict) == {"outflow_min_per_minute", "outflow_max_per_minute"}
    bounds = {"adaptive_outflow": True, "outflow_min_per_minute": 100.0, "outflow_max_per_minute": 50.0}
    with pytest.raises(ValidationError) as crossed:
        services.queue_update(queue, changes=bounds)
    assert "outflow_min_per_minute" in crossed.value.message_dict
    outside = {**bounds, "outflow_min_per_minute": 10.0, "outflow_max_per_minute": 50.0}  # the outflow is 600
    with pytest.raises(ValidationError) as out:
        services.queue_update(queue, changes=outside)
    assert "outflow_per_minute" in out.value.message_dict
    for field, value in (("adaptive_decrease_factor", 1.0), ("adaptive_decrease_factor", 0), ("health_error_rate", 0)):
        with pytest.raises(ValidationError):
            services.queue_update(queue, changes={field: value})
    queue.refresh_from_db()
    assert not queue.adaptive_outflow


def test_staff_turn_adaptation_on_through_the_api_and_bad_values_are_400(staff_api, make_queue):
    queue = make_queue(outflow_per_minute=60)
    url = f"/api/v1/queues/{queue.slug}"
    bad = staff_api.patch(url, {"adaptive_outflow": True}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
    assert "outflow_min_per_minute" in bad.json()["error"]["fields"]
    assert staff_api.patch(url, {"adaptive_outflow": "yes"}, format="json").status_code == 400
    changes = {"adaptive_outflow": True, "outflow_min_per_minute": 30, "outflow_max_per_minute": 120}
    good = staff_api.patch(url, changes, format="json")
    assert good.status_code == 200 and good.json()["adaptive_outflow"] is True
    assert good.json()["outflow_max_per_minute"] == 120
    assert store.config_read(queue.slug)["adaptive_outflow"] == "1"


def test_configure_queue_sets_the_adaptive_outflow(db):
    out = StringIO()
    call_command(
        "configure_queue",
        "sale",
        *("--target-url", "https://shop.example/", "--outflow-per-minute", "60"),
        *("--adaptive-outflow", "on", "--outflow-min-per-minute", "10", "--outflow-max-per-minute", "200"),
        *("--health-latency-p95-ms", "800", "--adaptive-interval-seconds", "15"),
        stdout=out,
    )
    printed = json.loads(out.getvalue())
    assert (printed["adaptive_outflow"], printed["health_latency_p95_ms"], printed["adaptive_interval_seconds"]) == (
        True,
        800,
        15,
    )
    assert store.config_read("sale")["outflow_max_per_minute"] == "200.0"


# --- require_queue_access reports the site's health ---------------------------------------------------------


@pytest.fixture
def demo(make_queue):
    return make_queue(slug="demo", capacity=5, burst=5, target_url="/demo/protected/")


def admitted_token(slug: str = "demo") -> str:
    body = APIClient().post(f"/api/v1/queues/{slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    assert body["status"] == "admitted", body
    return str(body["access_token"])


def with_access(path: str, token: str) -> HttpRequest:
    request = RequestFactory().get(path)
    request.COOKIES[middleware.access_cookie_name("demo")] = token
    request.COOKIES["wr_browser"] = "one-browser-for-these-tests"  # the session is bound to it
    return request


@middleware.require_queue_access("demo")
def slow_view(request: HttpRequest) -> HttpResponse:
    time.sleep(0.15)
    return HttpResponse("slow")


@middleware.require_queue_access("demo")
def failing_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("down", status=503)


@middleware.require_queue_access("demo")
def broken_view(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("bug")


@middleware.require_queue_access("demo")
def missing_view(request: HttpRequest) -> HttpResponse:
    raise Http404("no such product")


def test_the_demo_protected_page_reports_each_response_in_local_mode(client, demo):
    client.get(f"/demo/protected/?wr_access={admitted_token()}")  # the redirect that stores the cookie
    assert selectors.site_health_get(slug="demo").requests == 0  # a redirect is not the site's response
    for _ in range(3):
        assert client.get("/demo/protected/").status_code == 200
    site = selectors.site_health_get(slug="demo")
    assert (site.requests, site.errors, site.latency_samples) == (3, 0, 3)
    Client().get("/demo/protected/")  # sent to the waiting page: not counted
    assert selectors.site_health_get(slug="demo").requests == 3


def test_the_decorator_reports_latency_and_server_errors(demo):
    token = admitted_token()
    assert slow_view(with_access("/slow", token)).status_code == 200
    assert failing_view(with_access("/down", token)).status_code == 503
    with pytest.raises(RuntimeError):
        broken_view(with_access("/broken", token))
    with pytest.raises(Http404):  # Django answers 404: the visitor's mistake, not the site failing
        missing_view(with_access("/missing", token))
    site = selectors.site_health_get(slug="demo")
    assert (site.requests, site.errors) == (4, 2)
    assert site.p95_ms is not None and site.p95_ms >= 150 / 1.19


def test_one_visitor_s_server_errors_count_once_per_interval_as_its_successes_do(demo, settings):
    """Issue 50, item 6. Seen: one admitted visitor's server errors always counted (successes were counted
    once per WR_HEALTH_SOURCE_SECONDS), so 20 errors an interval from one visitor cut the outflow down to
    its minimum."""
    settings.WR_HEALTH_SOURCE_SECONDS = 5
    token, other = admitted_token(), admitted_token()
    for _ in range(20):
        assert failing_view(with_access("/down", token)).status_code == 503
    site = selectors.site_health_get(slug="demo")
    assert (site.requests, site.errors) == (1, 1)  # was (20, 20)
    assert failing_view(with_access("/down", other)).status_code == 503  # another visitor's error counts
    assert slow_view(with_access("/slow", token)).status_code == 200  # and this one's success after its errors
    site = selectors.site_health_get(slug="demo")
    assert (site.requests, site.errors) == (3, 2)


def test_the_middleware_reports_the_paths_it_protects(demo, settings):
    settings.WR_PROTECTED_PATHS = {"/shop/": "demo"}
    token = admitted_token()
    protect = middleware.QueueAccessMiddleware(lambda request: HttpResponse("oops", status=500))
    assert protect(with_access("/shop/cart", token)).status_code == 500
    assert protect(RequestFactory().get("/elsewhere")).status_code == 500  # not protected, not counted
    site = selectors.site_health_get(slug="demo")
    assert (site.requests, site.errors) == (1, 1)


def test_a_failing_report_never_breaks_the_protected_page(client, demo, monkeypatch):
    client.get(f"/demo/protected/?wr_access={admitted_token()}")

    def broken(**_: Any) -> None:
        raise ConnectionError("Redis went away")

    monkeypatch.setattr(services, "site_health_report", broken)
    assert client.get("/demo/protected/").status_code == 200


def test_reports_are_off_when_told_or_when_there_is_nowhere_to_send_them(client, demo, settings):
    settings.WR_HEALTH_REPORT = "off"
    client.get(f"/demo/protected/?wr_access={admitted_token()}")
    client.get("/demo/protected/")
    assert selectors.site_health_get(slug="demo").requests == 0
    settings.WR_HEALTH_REPORT, settings.WR_VERIFY_MODE, settings.WR_API_URL = "auto", "offline", ""
    assert middleware.health_report_mode() == "off"


def test_a_batch_keeps_every_request_and_a_uniform_sample_of_their_times(settings):
    settings.WR_HEALTH_FLUSH_SECONDS, settings.WR_HEALTH_FLUSH_REQUESTS = 3600, 10**9
    reporter = middleware.HealthReporter()
    for i in range(5000):
        reporter.add("demo", float(i), error=i % 100 == 0)
    batch = reporter._batches["demo"]
    assert (batch.requests, batch.errors, len(batch.latencies_ms)) == (5000, 50, reporter.SAMPLE_CAP)
    assert sum(ms >= 2000 for ms in batch.latencies_ms) > 0.4 * reporter.SAMPLE_CAP  # not just the first 2000


@pytest.fixture
def remote_demo(live_server, settings, make_queue, monkeypatch):
    """A protected site in remote mode, with its own (fresh) reporter that flushes only when told."""
    queue = make_queue(slug="demo", capacity=5, burst=5, target_url="/demo/protected/")
    settings.WR_VERIFY_MODE, settings.WR_API_URL = "remote", live_server.url
    settings.WR_API_KEY = services.api_key_create(queue, name="site")[1]
    settings.WR_HEALTH_FLUSH_SECONDS, settings.WR_HEALTH_FLUSH_REQUESTS = 3600, 10**9
    monkeypatch.setattr(middleware, "health_reporter", middleware.HealthReporter())
    caches["default"].delete_pattern("wr:verdict:*")  # type: ignore[attr-defined]
    return queue


@pytest.mark.django_db(transaction=True)
def test_remote_mode_batches_the_reports_and_posts_them_to_the_health_endpoint(client, remote_demo):
    client.get(f"/demo/protected/?wr_access={admitted_token()}")
    for _ in range(3):
        assert client.get("/demo/protected/").status_code == 200
    assert selectors.site_health_get(slug="demo").requests == 0  # batched in the process, not sent yet
    assert middleware.health_reporter.flush() == 1  # one POST for the three responses
    assert selectors.site_health_get(slug="demo").requests == 3
    assert middleware.health_reporter.flush() == 0  # nothing left to send


@pytest.mark.django_db(transaction=True)
def test_remote_mode_sends_a_batch_by_itself_once_enough_requests_wait(client, remote_demo, settings):
    settings.WR_HEALTH_FLUSH_REQUESTS = 2
    client.get(f"/demo/protected/?wr_access={admitted_token()}")
    client.get("/demo/protected/")
    client.get("/demo/protected/")
    deadline = time.monotonic() + 10
    while selectors.site_health_get(slug="demo").requests < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert selectors.site_health_get(slug="demo").requests == 2


@pytest.mark.django_db(transaction=True)
def test_a_report_the_waiting_room_refuses_is_dropped_without_harm(client, remote_demo, settings):
    client.get(f"/demo/protected/?wr_access={admitted_token()}")
    client.get("/demo/protected/")
    settings.WR_API_KEY = "wrong.key"
    assert middleware.health_reporter.flush() == 0
    assert selectors.site_health_get(slug="demo").requests == 0
    assert middleware.health_reporter.flush() == 0  # dropped, not retried with stale figures


# --- The health endpoint ------------------------------------------------------------------------------------


def health_url(slug: str) -> str:
    return f"/api/v1/queues/{slug}/health"


def test_the_health_endpoint_counts_a_report_and_answers_the_window(make_queue, api_key_for):
    queue = make_queue(**ADAPTIVE)
    site = APIClient()
    site.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key_for(queue)}")
    body = {"requests": 200, "errors": 3, "latency_ms": [120.5, 80, 95.2, 1800]}
    answer = site.post(health_url(queue.slug), body, format="json")
    assert answer.status_code == 200, answer.content
    figures = answer.json()
    assert (figures["window_seconds"], figures["requests"], figures["errors"]) == (10, 200, 3)
    assert figures["error_rate"] == 0.015 and figures["p95_latency_ms"] > 1000  # one in four samples is slow
    count_only = site.post(health_url(queue.slug), {"requests": 10, "errors": 0}, format="json")
    assert count_only.status_code == 200 and count_only.json()["requests"] == 210


def test_the_health_endpoint_needs_the_queues_api_key(make_queue, api_key_for):
    queue, other = make_queue(), make_queue()
    body = {"requests": 1, "errors": 0}
    cases = [(None, 401, "authentication_required"), ("nope.nope", 401, "invalid_api_key")]
    cases.append((api_key_for(other), 403, "permission_denied"))
    for key, status_code, code in cases:
        client = APIClient()
        if key:
            client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
        answer = client.post(health_url(queue.slug), body, format="json")
        assert (answer.status_code, answer.json()["error"]["code"]) == (status_code, code), key
    assert selectors.site_health_get(slug=queue.slug).requests == 0


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"requests": 1, "errors": 0, "latency": [1]}, "unknown_fields", None),
        ({"requests": -1, "errors": 0}, "invalid_request", "requests"),
        ({"requests": 1, "errors": -1}, "invalid_request", "errors"),
        ({"requests": 2, "errors": 3}, "invalid_request", "errors"),
        ({"requests": 1, "errors": 0, "latency_ms": [5, 6]}, "invalid_request", "latency_ms"),
        ({"requests": 1, "errors": 0, "latency_ms": [-5]}, "invalid_request", "latency_ms"),
        ({"requests": 1, "errors": 0, "latency_ms": ["5"]}, "invalid_request", "latency_ms"),
        ({"requests": 1, "errors": 0, "latency_ms": 5}, "invalid_request", "latency_ms"),
        ({"requests": 10**9, "errors": 0, "latency_ms": [1] * 10_001}, "invalid_request", "latency_ms"),
        ({"requests": "5", "errors": 0}, "invalid_request", "requests"),
        ({"requests": True, "errors": 0}, "invalid_request", "requests"),
        ({"errors": 0}, "invalid_request", "requests"),
        ([1, 2], "invalid_request", None),
    ],
)
def test_the_health_endpoint_refuses_bad_reports_in_the_api_error_shape(make_queue, api_key_for, body, code, field):
    queue = make_queue()
    site = APIClient()
    site.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key_for(queue)}")
    answer = site.post(health_url(queue.slug), body, format="json")
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == code and error["message"]
    if field:
        assert field in error["fields"]
    assert selectors.site_health_get(slug=queue.slug).requests == 0


def test_the_health_endpoint_refuses_malformed_json(make_queue, api_key_for):
    queue = make_queue()
    answer = APIClient().post(
        health_url(queue.slug),
        data='{"requests": NaN, "errors": 0}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Api-Key {api_key_for(queue)}",
    )
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "malformed_json")


# --- Shown on the dashboard and in the stats ----------------------------------------------------------------


def test_the_stats_api_shows_the_outflow_in_force_and_the_sites_health(staff_api, adaptive, clock):
    report(adaptive.slug, clock.now, count=50, ms=2000, errors=5)
    tick(adaptive.slug, clock.now)
    body = staff_api.get(f"/api/v1/queues/{adaptive.slug}/stats").json()
    assert (body["adaptive_outflow"], body["outflow_per_minute_configured"], body["outflow_per_minute_effective"]) == (
        True,
        60.0,
        30.0,
    )
    site = body["site_health"]
    assert (site["window_seconds"], site["requests"], site["errors"], site["error_rate"]) == (10, 50, 5, 0.1)
    assert 2000 / 1.19 <= site["p95_latency_ms"] <= 2000 * 1.19


def test_the_dashboard_shows_the_outflow_in_force_and_the_sites_health(admin_client, adaptive):
    now = time.time()  # the pages read the real clock
    report(adaptive.slug, now, count=50, ms=2000, errors=5)
    tick(adaptive.slug, now)
    live = admin_client.get(f"/dashboard/{adaptive.slug}/data.json").json()["live"]
    assert (live["outflow_per_minute_effective"], live["health_requests"], live["health_error_percent"]) == (30, 50, 10)
    assert 2000 / 1.19 <= live["health_p95_ms"] <= 2000 * 1.19
    page = admin_client.get(f"/dashboard/{adaptive.slug}/").content.decode()
    assert 'data-field="outflow_per_minute_effective" id="q-outflow-effective">30.0<' in page
    assert f'data-field="health_p95_ms">{live["health_p95_ms"]}<' in page
    assert 'data-field="health_error_percent">10.0<' in page
    assert "unhealthy above 1000 ms or 5 % errors" in page
    assert "<td>outflow adapted</td>" in page and "adaptive outflow" in page  # the audit log, in words
    index = admin_client.get("/dashboard/").content.decode()
    assert '<span data-field="outflow_per_minute_effective">30.0</span> (adaptive)' in index

    snapshot = dashboard_services.queue_snapshot_take(adaptive, now=now)
    assert (snapshot.outflow_effective, snapshot.health_requests, snapshot.health_error_rate) == (30, 50, 0.1)
    assert snapshot.health_p95_ms is not None and snapshot.health_p95_ms > 1000
    series = admin_client.get(f"/dashboard/{adaptive.slug}/data.json").json()["series"]
    assert series[-1]["outflow_effective"] == 30 and series[-1]["health_p95_ms"] == snapshot.health_p95_ms


@pytest.fixture
def admin_client(db: Any) -> Client:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-root-123"))
    return client
