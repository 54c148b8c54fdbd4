"""Bad input gets a 4xx in the API's error shape, never a 500; nothing is lost or duplicated."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from queueing import store

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


def test_when_redis_is_unreachable_the_api_says_503_not_500(api, queue, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = post(api, url(queue.slug, "join"), "{}")
    body = error(response, 503, "service_unavailable")
    assert response["Retry-After"] == str(body["retry_after_seconds"])


def test_a_status_poll_while_redis_is_unreachable_is_503_in_the_error_shape(api, queue, settings):
    ticket = post(api, url(queue.slug, "join"), "{}").json()["ticket"]
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    response = api.get(url(queue.slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}")
    body = error(response, 503, "service_unavailable")
    assert response["Retry-After"] == str(body["retry_after_seconds"])
