"""The OpenAPI schema documents every operation, and the docs page works offline (no CDN)."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client

from queueing import services

JSON = "application/json"

OPERATIONS = {
    ("/api/v1/queues/{slug}/join", "post"): "queue_join",
    ("/api/v1/queues/{slug}/status", "get"): "ticket_status",
    ("/api/v1/queues/{slug}/leave", "post"): "ticket_leave",
    ("/api/v1/queues/{slug}/code", "post"): "ticket_code",
    ("/api/v1/queues/{slug}/notify", "post"): "ticket_notify",
    ("/api/v1/queues/{slug}/sessions/verify", "post"): "session_verify",
    ("/api/v1/queues/{slug}/sessions/complete", "post"): "session_complete",
    ("/api/v1/queues/{slug}/sessions/revoke", "post"): "session_revoke",
    ("/api/v1/queues/{slug}/capacity", "put"): "capacity_report",
    ("/api/v1/queues/{slug}/health", "post"): "site_health_report",
    ("/api/v1/queues/{slug}/stats", "get"): "queue_stats",
    ("/api/v1/queues/{slug}/pause", "post"): "queue_pause",
    ("/api/v1/queues/{slug}/resume", "post"): "queue_resume",
    ("/api/v1/queues/{slug}", "patch"): "queue_update",
    ("/api/v1/queues/{slug}", "delete"): "queue_delete",
    ("/api/v1/queues", "get"): "queue_list",
    ("/api/v1/queues", "post"): "queue_create",
    ("/api/v1/queues/{slug}/codes", "post"): "priority_codes_generate",
    ("/api/v1/queues/{slug}/levels", "get"): "priority_levels_get",
    ("/api/v1/queues/{slug}/levels", "patch"): "priority_levels_update",
    ("/api/v1/queues/{slug}/keys", "get"): "api_key_list",
    ("/api/v1/queues/{slug}/keys", "post"): "api_key_create",
    ("/api/v1/queues/{slug}/keys/{prefix}", "delete"): "api_key_revoke",
    ("/api/v1/queues/{slug}/challenge", "post"): "pow_challenge",
    ("/api/v1/queues/{slug}/neighbours", "get"): "ticket_neighbours",
}


def test_the_schema_validates_without_warnings_and_names_every_operation(db):
    out = StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = yaml.safe_load(out.getvalue())
    assert schema["openapi"].startswith("3.")
    for (path, method), operation_id in OPERATIONS.items():
        assert schema["paths"][path][method]["operationId"] == operation_id
    join = schema["paths"]["/api/v1/queues/{slug}/join"]["post"]
    assert {"200", "201", "400", "404", "409", "429", "503"} <= set(join["responses"])
    schemes = schema["components"]["securitySchemes"]
    assert schemes["apiKey"]["name"] == "Authorization" and schemes["ticket"]["scheme"] == "bearer"


def test_the_schema_documents_the_proof_of_work_flow_for_api_clients(db):
    out = StringIO()
    call_command("spectacular", stdout=out)
    schema = yaml.safe_load(out.getvalue())
    challenge = schema["paths"]["/api/v1/queues/{slug}/challenge"]["post"]
    assert "201" in challenge["responses"] and "429" in challenge["responses"]
    answer = _resolve(schema, challenge["responses"]["201"]["content"]["application/json"]["schema"])
    assert {"challenge", "difficulty", "algorithm", "expires_in"} <= set(answer["properties"])
    for words in ("pow_challenge", "pow_nonce", "SHA-256", "zero bits", "428", "proof_of_work_reused"):
        assert words in challenge["description"], words
    join = schema["paths"]["/api/v1/queues/{slug}/join"]["post"]
    assert "proof_of_work_required" in join["responses"]["428"]["description"]
    body = _resolve(schema, join["requestBody"]["content"]["application/json"]["schema"])
    assert {"pow_challenge", "pow_nonce"} <= set(body["properties"])
    assert "pow_challenge" in join["description"] and "challenge" in join["description"]


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_the_schema_and_docs_are_served(client, db):
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "cdn" not in html.lower() and "/static/drf_spectacular_sidecar/" in html
    assert client.get("/api/redoc/").status_code == 200


# --- Every answer an operation really gives is documented (issue 12) ------------------------------------

ERROR_STATUSES = {
    "staff_token_obtain": {400, 401, 404, 406, 413, 415, 429, 503},
    "staff_token_refresh": {400, 401, 404, 406, 413, 415, 429, 503},
    "queue_join": {400, 403, 404, 406, 409, 413, 415, 428, 429, 503},
    "ticket_status": {401, 404, 429, 503},
    "ticket_neighbours": {401, 404, 406, 429, 503},
    "ticket_leave": {401, 404, 406, 503},
    "pow_challenge": {404, 406, 429, 503},
    "queue_window": {404, 429, 503},
    "prequeue_shuffle": {404, 406, 429},
    "session_verify": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "session_complete": {400, 401, 403, 404, 406, 409, 413, 415, 429, 503},
    "session_revoke": {400, 401, 403, 404, 406, 409, 413, 415, 429, 503},
    "capacity_report": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "site_health_report": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "queue_stats": {401, 403, 404, 406, 429, 503},
    "queue_pause": {401, 403, 404, 406, 429, 503},
    "queue_resume": {401, 403, 404, 406, 429, 503},
    "queue_get": {401, 403, 404, 406, 429, 503},
    "queue_update": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "queue_delete": {401, 403, 404, 406, 429, 503},
    "queue_list": {401, 403, 404, 406, 429, 503},
    "queue_create": {400, 401, 403, 404, 406, 409, 413, 415, 429, 503},
    "priority_codes_generate": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "priority_levels_get": {401, 403, 404, 406, 429, 503},
    "priority_levels_update": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "api_key_list": {401, 403, 404, 406, 429, 503},
    "api_key_create": {400, 401, 403, 404, 406, 413, 415, 429, 503},
    "api_key_revoke": {401, 403, 404, 406, 429, 503},
    "ticket_code": {400, 401, 404, 406, 409, 413, 415, 429, 503},
    "ticket_notify": {400, 401, 404, 406, 409, 413, 415, 429, 503},
}
# simplejwt's serializers ignore fields they do not know (settings.SIMPLE_JWT would have to name strict ones).
# A body each operation accepts, so that only what a test changes can be refused.
GOOD_BODIES: dict[str, dict[str, Any]] = {
    "staff_token_obtain": {"username": "staffer", "password": "pw-staff-123"},
    "session_verify": {"access_token": "x"},
    "session_complete": {"access_token": "x"},
    "session_revoke": {"ticket_id": "1.abc"},
    "capacity_report": {"in_use": 1},
    "site_health_report": {"requests": 1, "errors": 0},
    "queue_update": {"capacity": 5},
    "queue_create": {"slug": "made-by-a-test", "name": "Made by a test", "target_url": "/"},
    "priority_codes_generate": {"count": 1, "level": 2},
    "priority_levels_update": {"levels": [{"level": 1, "name": "Elevated"}]},
    "api_key_create": {"name": "a test's key"},
    "ticket_code": {"code": "NO-SUCH-CODE"},
    "ticket_notify": {"email": "ada@example.com"},
}
PRODUCTION_RATE_LIMITS = {
    scope: {"algorithm": "token_bucket", "capacity": 100, "refill_per_second": 1}
    for scope in ("join", "challenge", "status", "neighbours", "protected", "staff", "auth")
}


def _schema() -> dict:
    out = StringIO()
    call_command("spectacular", stdout=out)
    return yaml.safe_load(out.getvalue())


def _operations(schema: dict) -> list[tuple[str, str, dict]]:
    """Every operation; deleting the queue comes last (the others use the queue it deletes)."""
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    return sorted(operations, key=lambda operation: operation[2]["operationId"] == "queue_delete")


def _error_body(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return body["error"]


@pytest.fixture
def caller(make_queue, staff_user, api_key_for):
    """Sends an operation's request as the caller its security names (ticket, API key, staff JWT, nobody)."""
    queue = make_queue()
    management = ["view_queue", "add_queue", "delete_queue", "add_prioritycode", "view_prioritylevel"]  # the API's
    management += ["change_prioritylevel", "view_queueapikey", "add_queueapikey", "change_queueapikey"]
    staff_user.user_permissions.add(*Permission.objects.filter(codename__in=management))
    client = Client()
    visitor = str(uuid.uuid4())
    ticket = client.post(f"/api/v1/queues/{queue.slug}/join", "{}", JSON, HTTP_X_VISITOR_ID=visitor).json()["ticket"]
    staff = client.post("/api/v1/auth/token", GOOD_BODIES["staff_token_obtain"], JSON).json()
    credentials = {"ticket": f"Bearer {ticket}", "apiKey": f"Api-Key {api_key_for(queue)}"}
    credentials["staffJWT"] = f"Bearer {staff['access']}"

    def send(
        path: str, method: str, op: dict, *, slug: str = queue.slug, body: Any = None, raw: str = "", **extra: Any
    ):
        schemes = [name for requirement in op.get("security", []) for name in requirement]
        if schemes and schemes[0] in credentials:
            extra.setdefault("HTTP_AUTHORIZATION", credentials[schemes[0]])
        if op["operationId"] == "staff_token_refresh":
            body = {"refresh": staff["refresh"]} if body is None else body
        raw = raw or json.dumps(GOOD_BODIES.get(op["operationId"], {}) if body is None else body)
        extra.setdefault("content_type", JSON)
        extra.setdefault("HTTP_X_VISITOR_ID", visitor)
        return Client().generic(method.upper(), path.replace("{slug}", slug), raw, **extra)

    return send


def test_every_operation_documents_each_error_it_can_answer_in_the_error_shape(db):
    schema = _schema()
    documented = {op["operationId"]: op["responses"] for _, _, op in _operations(schema)}
    assert set(documented) == set(ERROR_STATUSES)
    for operation_id, statuses in ERROR_STATUSES.items():
        responses = documented[operation_id]
        assert {int(code) for code in responses if int(code) >= 400} == statuses, operation_id
        for code in statuses:
            assert responses[str(code)]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    detail = schema["components"]["schemas"]["ErrorDetail"]
    codes = schema["components"]["schemas"]["ErrorCodeEnum"]["enum"]
    assert detail["properties"]["code"]["$ref"].endswith("/ErrorCodeEnum") and "request_too_large" in codes


def test_a_malformed_slug_is_the_documented_404_on_every_operation(caller):
    for path, method, op in _operations(_schema()):
        if "{slug}" in path:
            response = caller(path, method, op, slug="Bad%20Slug!")
            assert response.status_code == 404 and _error_body(response)["code"] == "not_found", op["operationId"]
            assert "404" in op["responses"]


def test_without_redis_every_operation_that_needs_it_is_the_documented_503(caller, settings):
    settings.WR_RATE_LIMITS = PRODUCTION_RATE_LIMITS  # the limiters live in Redis too
    operations = _operations(_schema())
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    for path, method, op in operations:
        response = caller(path, method, op)
        if op["operationId"] == "prequeue_shuffle":  # the database's, through a cache that may be away
            assert response.status_code == 404 and "503" not in op["responses"]
            continue
        assert response.status_code == 503, (op["operationId"], response.content)
        assert _error_body(response)["code"] == "service_unavailable" and response["Retry-After"]
        assert "503" in op["responses"]


def test_every_json_body_that_is_malformed_too_large_or_not_json_is_a_documented_4xx(caller, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    refusals = [
        ("{", JSON, 400, "malformed_json"),
        ("{" + " " * 2000 + "}", JSON, 413, "request_too_large"),
        ("a=b", "text/plain", 415, "unsupported_media_type"),
    ]
    bodies = [(path, method, op) for path, method, op in _operations(_schema()) if "requestBody" in op]
    assert len(bodies) == 15
    for path, method, op in bodies:
        for raw, content_type, status, code in refusals:
            response = caller(path, method, op, raw=raw, content_type=content_type)
            assert response.status_code == status and _error_body(response)["code"] == code, (op["operationId"], code)
            assert str(status) in op["responses"]


def test_every_request_body_that_refuses_unknown_fields_says_so(caller):
    schema = _schema()
    for path, method, op in _operations(schema):
        if "requestBody" not in op:
            continue
        body = _resolve(schema, op["requestBody"]["content"]["application/json"]["schema"])
        good = GOOD_BODIES.get(
            op["operationId"], {"refresh": "x"} if op["operationId"] == "staff_token_refresh" else {}
        )
        response = caller(path, method, op, body={**good, "surprise": 1})
        assert body["additionalProperties"] is False, op["operationId"]
        assert response.status_code == 400, op["operationId"]
        assert _error_body(response) == {
            "code": "unknown_fields",
            "message": "Unknown field(s): surprise.",
            "fields": ["surprise"],
        }


def test_a_json_answer_is_the_only_one_and_anything_else_is_the_documented_406(caller):
    for path, method, op in _operations(_schema()):
        response = caller(path, method, op, HTTP_ACCEPT="text/html")
        if op["operationId"] == "queue_join":  # 406 for a signed-in visitor (DRF); anonymous joins skip DRF
            assert "406" in op["responses"] and response.status_code in (200, 201)
        elif "406" in op["responses"]:
            assert response.status_code == 406 and _error_body(response)["code"] == "not_acceptable", op["operationId"]
        else:  # answered in front of DRF's content negotiation: JSON whatever the client accepts
            assert response.status_code != 406 and response["Content-Type"] == JSON, op["operationId"]


def test_the_staff_token_endpoints_answer_their_documented_400_401_and_429(db, staff_user, settings):
    settings.WR_RATE_LIMITS = {"auth": {"algorithm": "sliding_log", "window_seconds": 300, "max_requests": 3}}
    documented = {op["operationId"]: op["responses"] for _, _, op in _operations(_schema())}
    for path, operation_id, wrong in [
        ("/api/v1/auth/token", "staff_token_obtain", {"username": "staffer", "password": "wrong"}),
        ("/api/v1/auth/token/refresh", "staff_token_refresh", {"refresh": "garbage"}),
    ]:
        client = Client(REMOTE_ADDR=f"203.0.113.{len(path)}")
        answers = [client.post(path, body, JSON) for body in ({}, wrong, wrong, wrong)]
        codes = [_error_body(answer)["code"] for answer in answers]
        assert codes == ["invalid_request", "invalid_credentials", "invalid_credentials", "rate_limited"], codes
        assert [answer.status_code for answer in answers] == [400, 401, 401, 429]
        assert {"400", "401", "429"} <= set(documented[operation_id])


def test_every_example_body_in_the_docs_works_as_given(caller, db):
    """Issue 19: "Try it out" on join failed as shipped (the generated body carried `pow_challenge: "string"`:
    400). Every example body the docs offer is accepted as it stands, except those with a <placeholder> the
    caller must fill in (a token, a challenge); the join's first example, what "Try it out" fills in, is {}."""
    schema = _schema()
    from queueing.models import PriorityCode, Queue

    queue = Queue.objects.get()  # the caller's
    PriorityCode.objects.create(queue=queue, code="SPRING-VIP-7Q2X", level=2)
    services.queue_pause(queue)  # who joins now waits: the code's example moves a waiting visitor up
    waiting = Client().post(f"/api/v1/queues/{queue.slug}/join", "{}", JSON, HTTP_X_VISITOR_ID=str(uuid.uuid4()))
    tried = 0
    for path, method, op in _operations(schema):
        content = op.get("requestBody", {}).get("content", {}).get(JSON, {})
        examples = content.get("examples", {})
        if path.endswith("/join"):
            assert next(iter(examples.values()))["value"] == {}
        for name, example in examples.items():
            if "<" in json.dumps(example["value"]):
                assert example["value"], name  # a placeholder says what goes there
                continue
            waits = path.endswith(("/code", "/notify"))  # what only a visitor in line may do
            extra = {"HTTP_AUTHORIZATION": f"Bearer {waiting.json()['ticket']}"} if waits else {}
            response = caller(path, method, op, body=example["value"], **extra)
            assert response.status_code < 300, (op["operationId"], name, response.content)
            tried += 1
    assert tried >= 8  # join (3), capacity, health, queue update (2), a code, an address
