"""Bad input gets a 4xx in the API's error shape, never a 500; nothing is lost or duplicated."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from queueing import store

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)

JSON = "application/json"


def url(slug: str, op: str) -> str:
    return f"/api/v1/queues/{slug}/{op}"


@pytest.fixture(params=["anonymous", "signed-in"])
def api(request, db, django_user_model):
    """Both join paths: anonymous visitors take the fast path, signed-in ones the full stack and DRF."""
    client = APIClient()
    if request.param == "signed-in":
        client.force_login(django_user_model.objects.create_user("visitor", password="pw"))
    return client


@pytest.fixture
def queue(make_queue):
    return make_queue(state="paused")


def error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def post(api, path, raw: str, **extra):
    return api.generic("POST", path, raw, content_type=JSON, HTTP_X_VISITOR_ID=str(uuid.uuid4()), **extra)


@pytest.mark.parametrize("raw", ["{", '{"display_name": }', "[1, 2", "nul", '{"a": 1}}'])
def test_malformed_json_is_400(api, queue, raw):
    error(post(api, url(queue.slug, "join"), raw), 400, "malformed_json")
    assert store.snapshot(queue.slug).waiting == 0


def test_unknown_fields_are_400_and_named(api, queue):
    body = error(
        post(api, url(queue.slug, "join"), '{"display_name": "x", "priority": 3, "vip": true}'), 400, "unknown_fields"
    )
    assert body["fields"] == ["priority", "vip"]
    assert store.snapshot(queue.slug).waiting == 0


@pytest.mark.parametrize(
    "raw",
    ['{"display_name": 123}', '{"priority_code": ["a"]}', '{"display_name": null}', '"just a string"', "[]", "42"],
)
def test_wrong_types_are_400(api, queue, raw):
    error(post(api, url(queue.slug, "join"), raw), 400, "invalid_request")
    assert store.snapshot(queue.slug).waiting == 0


def test_too_long_a_display_name_is_400(api, queue):
    error(post(api, url(queue.slug, "join"), '{"display_name": "%s"}' % ("x" * 41)), 400, "invalid_request")


# JSON lets a client send a lone surrogate ("\\ud800") or a NUL ("\\u0000"): valid JSON, but text that cannot be
# encoded (for hashing, signing or SQL) or stored (PostgreSQL refuses NUL). Refused like any bad field.
UNENCODABLE = ["\\ud800", "a\\u0000b", "\\udcff:\\ud83d"]


@pytest.mark.parametrize("field", ["priority_code", "display_name", "pow_challenge", "pow_nonce"])
@pytest.mark.parametrize("escaped", UNENCODABLE)
def test_a_lone_surrogate_or_a_nul_in_any_join_field_is_400_not_500(api, make_queue, field, escaped):
    queue = make_queue(state="paused", pow_difficulty=1)
    body = error(post(api, url(queue.slug, "join"), f'{{"{field}": "{escaped}"}}'), 400, "invalid_request")
    assert list(body["fields"]) == [field]
    assert store.snapshot(queue.slug).waiting == 0


def test_a_real_challenge_with_an_unencodable_nonce_is_400_not_500(api, make_queue):
    queue = make_queue(state="paused", pow_difficulty=1)
    challenge = api.post(url(queue.slug, "challenge")).json()["challenge"]
    raw = f'{{"pow_challenge": "{challenge}", "pow_nonce": "\\ud800"}}'
    error(post(api, url(queue.slug, "join"), raw), 400, "invalid_request")
    assert store.snapshot(queue.slug).waiting == 0


def test_a_non_json_body_is_415(api, queue):
    response = api.generic(
        "POST", url(queue.slug, "join"), "display_name=x", content_type="application/x-www-form-urlencoded"
    )
    error(response, 415, "unsupported_media_type")


def test_an_empty_body_is_a_plain_join(api, queue):
    assert api.post(url(queue.slug, "join"), HTTP_X_VISITOR_ID=str(uuid.uuid4())).status_code == 201


def test_an_unknown_queue_is_404_queue_not_found(api, db):
    error(post(api, url("nope", "join"), "{}"), 404, "queue_not_found")


def test_an_unknown_api_path_is_404_in_the_error_shape(api, db):
    error(api.get("/api/v1/nothing/here"), 404, "not_found")
    error(api.get("/api/v1/queues/UPPER/status"), 404, "not_found")


def test_a_wrong_method_is_405(api, queue):
    error(api.get(url(queue.slug, "join")), 405, "method_not_allowed")
    error(api.delete(url(queue.slug, "status")), 405, "method_not_allowed")


def test_a_closed_queue_refuses_joins_with_409(api, make_queue):
    queue = make_queue(state="closed")
    error(post(api, url(queue.slug, "join"), "{}"), 409, "queue_closed")


def test_a_full_queue_refuses_with_503_and_retry_after(api, make_queue):
    queue = make_queue(state="paused", max_waiting=1)
    assert post(APIClient(), url(queue.slug, "join"), "{}").status_code == 201  # someone else fills it
    response = post(api, url(queue.slug, "join"), "{}")
    body = error(response, 503, "queue_full")
    assert int(response["Retry-After"]) == body["retry_after_seconds"] >= 5


def test_an_unusable_priority_code_is_400_and_spends_nothing(api, queue):
    from queueing.models import PriorityCode

    code = PriorityCode.objects.create(queue=queue, code="VIP-ONE", level=2, max_uses=1)
    assert post(api, url(queue.slug, "join"), '{"priority_code": "VIP-ONE"}').status_code == 201
    error(post(api, url(queue.slug, "join"), '{"priority_code": "VIP-ONE"}'), 400, "invalid_priority_code")
    error(post(api, url(queue.slug, "join"), '{"priority_code": "NOPE"}'), 400, "invalid_priority_code")
    code.refresh_from_db()
    assert code.uses == 1
    assert store.snapshot(queue.slug).waiting == 1


def test_when_redis_is_unreachable_the_api_says_503_not_500(api, queue, redis_away):
    redis_away()
    response = post(api, url(queue.slug, "join"), "{}")
    body = error(response, 503, "service_unavailable")
    assert response["Retry-After"] == str(body["retry_after_seconds"])


def test_a_status_poll_while_redis_is_unreachable_is_503_in_the_error_shape(api, queue, redis_away):
    ticket = post(api, url(queue.slug, "join"), "{}").json()["ticket"]
    redis_away()
    response = api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}")
    body = error(response, 503, "service_unavailable")
    assert response["Retry-After"] == str(body["retry_after_seconds"])


NESTED = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON parser can recurse


def test_a_body_nested_too_deeply_is_400_not_500_on_every_json_endpoint(api, queue, django_user_model):
    """Issue 12: a RecursionError in the JSON parser was a 500 on joins, the protected-site API and auth."""
    from queueing import services
    from queueing.models import Queue

    error(api.post(url(queue.slug, "join"), NESTED, content_type=JSON), 400, "malformed_json")
    key = services.api_key_create(Queue.objects.get(slug=queue.slug), name="site")[1]
    site = APIClient()
    site.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    for op in ("sessions/verify", "sessions/complete", "health"):
        error(site.post(url(queue.slug, op), NESTED, content_type=JSON), 400, "malformed_json")
    error(APIClient().post("/api/v1/auth/token", NESTED, content_type=JSON), 400, "malformed_json")


def test_a_body_over_the_upload_limit_is_413_in_the_error_shape(api, queue, settings):
    """Issue 12: Django refused it with an HTML 400 page."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = "{" + " " * 2000 + "}"
    error(api.post(url(queue.slug, "join"), body, content_type=JSON), 413, "request_too_large")
    error(APIClient().post("/api/v1/auth/token", body, content_type=JSON), 413, "request_too_large")


def test_a_bad_refresh_token_says_why_without_python_reprs(db):
    """Issue 12: the refresh error's message was the repr of simplejwt's error dict."""
    answer = APIClient().post("/api/v1/auth/token/refresh", {"refresh": "garbage"}, format="json")
    refused = error(answer, 401, "invalid_credentials")
    assert "ErrorDetail" not in refused["message"] and "{" not in refused["message"]
