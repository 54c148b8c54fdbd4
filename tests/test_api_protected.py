"""The protected site's API: API-key auth, verify, complete, revoke, reported capacity."""

from __future__ import annotations

import uuid

import jwt
import pytest
from rest_framework.test import APIClient

from queueing import signing_keys

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def url(slug: str, op: str) -> str:
    return f"/api/v1/queues/{slug}/{op}"


@pytest.fixture
def queue(make_queue):
    return make_queue(capacity=1, burst=5)


@pytest.fixture
def site(api, queue, api_key_for):
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key_for(queue)}")
    return api


def join(client, slug):
    return client.post(url(slug, "join"), format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()


def poll(slug, ticket):
    # A visitor's own client: the site's client always sends its API key.
    return APIClient().get(url(slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}").json()


def test_verify_starts_the_session_and_answers_valid(site, queue):
    visitor = join(site, queue.slug)
    response = site.post(url(queue.slug, "sessions/verify"), {"access_token": visitor["access_token"]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"valid": True, "ticket_id": visitor["ticket_id"], "expires_at": visitor["expires_at"]}
    assert poll(queue.slug, visitor["ticket"])["status"] == "active"


def test_once_bound_a_verify_without_the_browser_s_secret_is_refused_unless_it_is_the_site_s_own(site, queue):
    """Issue 50, item 4. Seen: any verify without `browser` skipped the binding, and the queue's own recipe for
    non-Django sites (its curl call) sent none, so a shared admission link still let a second browser in."""
    token = join(site, queue.slug)["access_token"]

    def verify(**more):
        answer = site.post(url(queue.slug, "sessions/verify"), {"access_token": token, **more}, format="json")
        assert answer.status_code == 200, answer.content
        return answer.json()

    assert verify(browser="first-browser-secret")["valid"]
    assert verify() == {"valid": False, "reason": "bound_elsewhere"}  # the link, in a browser the site did not ask
    assert verify(server=True)["valid"]  # the site's own back-office check: the token alone
    assert verify(browser="first-browser-secret")["valid"]
    odd = site.post(url(queue.slug, "sessions/verify"), {"access_token": token, "server": "yes"}, format="json")
    assert odd.json()["error"]["code"] == "invalid_request"


def test_the_recipes_and_the_schema_send_the_browser_s_secret(admin_client, queue):
    page = admin_client.get(f"/admin/queueing/queue/{queue.pk}/change/").content.decode()
    verify_call = page[page.index("curl") : page.index("sessions/verify")]
    assert '"browser": ' in verify_call  # the non-Django recipe binds, as the middleware does
    schema = admin_client.get("/api/schema/?format=json").json()
    examples = schema["paths"]["/api/v1/queues/{slug}/sessions/verify"]["post"]["requestBody"]["content"][
        "application/json"
    ]["examples"]
    assert all("browser" in e["value"] or e["value"].get("server") for e in examples.values())


def test_verify_answers_invalid_with_a_reason(site, queue):
    response = site.post(url(queue.slug, "sessions/verify"), {"access_token": "x.y.z"}, format="json")
    assert response.json() == {"valid": False, "reason": "invalid"}


def test_an_access_token_signed_hs256_with_the_public_key_is_invalid(site, queue):
    visitor = join(site, queue.slug)
    claims = jwt.decode(visitor["access_token"], options={"verify_signature": False})
    forged = jwt.encode(claims, signing_keys.jwks()["keys"][0]["x"], algorithm="HS256")
    response = site.post(url(queue.slug, "sessions/verify"), {"access_token": forged}, format="json")
    assert response.json()["reason"] == "invalid"


def test_complete_frees_the_slot_for_the_next_visitor_at_once(site, queue):
    first = join(site, queue.slug)
    second = join(site, queue.slug)
    assert (first["status"], second["status"]) == ("admitted", "waiting")
    response = site.post(url(queue.slug, "sessions/complete"), {"access_token": first["access_token"]}, format="json")
    assert response.status_code == 204
    assert poll(queue.slug, second["ticket"])["status"] == "admitted"
    again = site.post(url(queue.slug, "sessions/complete"), {"access_token": first["access_token"]}, format="json")
    assert again.status_code == 204


def test_completing_a_revoked_session_is_a_conflict_with_the_reason(site, queue):
    visitor = join(site, queue.slug)
    assert (
        site.post(url(queue.slug, "sessions/revoke"), {"ticket_id": visitor["ticket_id"]}, format="json").status_code
        == 204
    )
    response = site.post(url(queue.slug, "sessions/complete"), {"access_token": visitor["access_token"]}, format="json")
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "session_not_active",
        "message": "The session is not live (revoked).",
        "reason": "revoked",
    }


def test_completing_with_a_forged_token_is_a_bad_request(site, queue):
    response = site.post(url(queue.slug, "sessions/complete"), {"access_token": "a.b.c"}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_access_token")


@pytest.mark.parametrize("op", ["sessions/verify", "sessions/complete", "sessions/revoke"])
@pytest.mark.parametrize("escaped", ["\\ud800", "x.\\udcff.y", "\\u0000"])
def test_an_unencodable_token_or_ticket_id_is_400_not_500(site, queue, op, escaped):
    field = "ticket_id" if op.endswith("revoke") else "access_token"
    raw = f'{{"{field}": "{escaped}"}}'
    response = site.generic("POST", url(queue.slug, op), raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_request"


def test_revoking_an_unknown_ticket_is_404(site, queue):
    response = site.post(
        url(queue.slug, "sessions/revoke"), {"ticket_id": "0000000042.AAAAAAAAAAAAAAAA"}, format="json"
    )
    assert (response.status_code, response.json()["error"]["code"]) == (404, "ticket_not_found")


def test_capacity_report_is_absolute_and_returns_the_figures(site, make_queue, api_key_for, api):
    queue = make_queue(capacity=10, capacity_source="reported")
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key_for(queue)}")
    response = api.put(url(queue.slug, "capacity"), {"in_use": 4}, format="json")
    assert response.status_code == 200
    assert response.json() == {"capacity": 10, "in_use": 4, "capacity_source": "reported"}
    assert api.put(url(queue.slug, "capacity"), {"in_use": 4}, format="json").json()["in_use"] == 4


@pytest.mark.parametrize("body", [{"in_use": -1}, {"in_use": "4"}, {"in_use": 4.5}, {"in_use": True}, {}])
def test_capacity_report_refuses_bad_figures(site, queue, body):
    response = site.put(url(queue.slug, "capacity"), body, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_request")


@pytest.mark.parametrize("op", ["sessions/verify", "sessions/complete", "sessions/revoke"])
def test_a_missing_api_key_is_401(api, queue, op):
    response = api.post(url(queue.slug, op), {"access_token": "x", "ticket_id": "y"}, format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_required"
    assert response["WWW-Authenticate"] == "Api-Key"


@pytest.mark.parametrize("key", ["nonsense", "abcdefgh.wrongsecretwrongsecretwrongsec", ""])
def test_a_wrong_api_key_is_401(api, queue, key, api_key_for):
    real = api_key_for(queue)
    if key == "":
        key = real.split(".")[0] + ".tampered"
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    response = api.put(url(queue.slug, "capacity"), {"in_use": 1}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_revoked_api_key_is_401(api, queue):
    from queueing import services

    api_key, key = services.api_key_create(queue, name="old")
    api_key.revoked = True
    api_key.save()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    assert api.put(url(queue.slug, "capacity"), {"in_use": 1}, format="json").status_code == 401


def test_another_queues_api_key_is_403(api, queue, make_queue, api_key_for):
    other = make_queue()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key_for(other)}")
    response = api.put(url(queue.slug, "capacity"), {"in_use": 1}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (403, "permission_denied")


def test_api_keys_are_stored_hashed(queue, api_key_for):
    from queueing.models import QueueAPIKey

    key = api_key_for(queue)
    stored = QueueAPIKey.objects.get(queue=queue)
    assert key.split(".")[1] not in stored.hashed_key
    assert stored.hashed_key.startswith("sha512$$")
