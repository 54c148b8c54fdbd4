"""The OpenAPI schema documents every operation, and the docs page works offline (no CDN)."""

from __future__ import annotations

from io import StringIO

import yaml
from django.core.management import call_command

OPERATIONS = {
    ("/api/v1/queues/{slug}/join", "post"): "queue_join",
    ("/api/v1/queues/{slug}/status", "get"): "ticket_status",
    ("/api/v1/queues/{slug}/leave", "post"): "ticket_leave",
    ("/api/v1/queues/{slug}/sessions/verify", "post"): "session_verify",
    ("/api/v1/queues/{slug}/sessions/complete", "post"): "session_complete",
    ("/api/v1/queues/{slug}/sessions/revoke", "post"): "session_revoke",
    ("/api/v1/queues/{slug}/capacity", "put"): "capacity_report",
    ("/api/v1/queues/{slug}/health", "post"): "site_health_report",
    ("/api/v1/queues/{slug}/stats", "get"): "queue_stats",
    ("/api/v1/queues/{slug}/pause", "post"): "queue_pause",
    ("/api/v1/queues/{slug}/resume", "post"): "queue_resume",
    ("/api/v1/queues/{slug}", "patch"): "queue_update",
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
