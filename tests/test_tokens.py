"""Tickets and access tokens: claims, JWKS, key rotation with overlap."""

from __future__ import annotations

import time
from datetime import timedelta

import jwt
import pytest
from django.utils import timezone

from queueing import signing_keys, tokens
from queueing.models import SigningKey

from .factories import decode_ticket

TID = "0000000007.AbCdEfGhIjKlMnOp"


def test_a_ticket_round_trips_its_claims(db):
    raw = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=2, epoch=3)
    claims = decode_ticket(raw, slug="sale")
    assert claims == tokens.TicketClaims("sale", TID, 7, "AbCdEfGhIjKlMnOp", 2, 3, None, claims.issued_at)
    assert abs(claims.issued_at - time.time()) < 60
    header = jwt.get_unverified_header(raw)
    assert header["alg"] == "HS256"
    payload = jwt.decode(raw, options={"verify_signature": False})
    assert payload["aud"] == "sale" and payload["token_type"] == "wr_ticket"


def test_tickets_carry_the_claims_simplejwts_token_gives_them(db, settings):
    """Tickets are signed without simplejwt's Token object (its cost, per join): the same claims, in order."""
    settings.WR_TICKET_LIFETIME = timedelta(hours=3)
    token = tokens.TicketToken(slug="sale")
    token["tid"], token["seq"], token["pri"], token["ep"], token["pl"] = TID, 7, 2, 3, 1.5
    theirs = jwt.decode(str(token), options={"verify_signature": False})
    raw = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=2, epoch=3, placement=1.5)
    ours = jwt.decode(raw, options={"verify_signature": False})
    assert list(ours) == list(theirs) and ours["exp"] - ours["iat"] == 3 * 3600
    assert {k: v for k, v in ours.items() if k not in ("jti", "exp", "iat")} == {
        k: v for k, v in theirs.items() if k not in ("jti", "exp", "iat")
    }
    assert abs(ours["iat"] - theirs["iat"]) <= 1 and len(ours["jti"]) == 32 and ours["jti"] != theirs["jti"]
    number = tokens.visitor_ticket_decode(tokens.position_issue(slug="sale", number=42, epoch=2), slug="sale")
    assert number == tokens.PositionClaims("sale", 42, 2, number.issued_at)


def test_a_ticket_whose_seq_disagrees_with_its_id_is_invalid(db):
    raw = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=8, priority=0, epoch=1)
    with pytest.raises(tokens.InvalidTicket):
        decode_ticket(raw, slug="sale")


def test_tickets_have_their_own_key_not_the_staff_one(db, settings):
    raw = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=0, epoch=1)
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(raw, settings.SECRET_KEY, algorithms=["HS256"], audience="sale")


def test_the_access_token_is_eddsa_with_a_published_kid(db):
    raw = tokens.access_token_issue(
        slug="sale", ticket_id=TID, fence=4, expires_ms=(int(timezone.now().timestamp()) + 60) * 1000
    )
    header = jwt.get_unverified_header(raw)
    assert header["alg"] == "EdDSA"
    published = {k["kid"]: k for k in signing_keys.jwks()["keys"]}
    assert header["kid"] in published
    key = jwt.PyJWK(published[header["kid"]])
    payload = jwt.decode(raw, key.key, algorithms=["EdDSA"], audience="sale")
    assert (payload["sub"], payload["fence"]) == (TID, 4)


def test_jwks_endpoint_publishes_public_keys_only(api, db):
    signing_keys.jwks()
    response = api.get("/.well-known/jwks.json")
    assert response.status_code == 200
    assert "max-age=300" in response["Cache-Control"]
    (key,) = response.json()["keys"]
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519" and key["alg"] == "EdDSA" and key["use"] == "sig"
    assert "d" not in key


def test_rotation_publishes_the_new_key_first_and_keeps_the_old_one_during_the_overlap(db, make_queue):
    make_queue(session_ttl=600)
    old_token = tokens.access_token_issue(
        slug="sale", ticket_id=TID, fence=1, expires_ms=(int(timezone.now().timestamp()) + 60) * 1000
    )
    old_kid = jwt.get_unverified_header(old_token)["kid"]
    new = signing_keys.signing_key_rotate(lead=timedelta(minutes=10))
    kids = {k["kid"] for k in signing_keys.jwks()["keys"]}
    assert kids == {old_kid, new.kid}
    # Until the new key's time comes, the old one still signs; tokens it signed keep verifying.
    assert (
        jwt.get_unverified_header(
            tokens.access_token_issue(
                slug="sale", ticket_id=TID, fence=1, expires_ms=(int(timezone.now().timestamp()) + 60) * 1000
            )
        )["kid"]
        == old_kid
    )
    old = SigningKey.objects.get(kid=old_kid)
    assert old.retires_at == new.signs_from + timedelta(seconds=600 + 60)

    # Later: the new key signs, and the old key's tokens still verify until it retires.
    SigningKey.objects.filter(kid=old_kid).update(signs_from=timezone.now() - timedelta(minutes=20))
    SigningKey.objects.filter(pk=new.pk).update(signs_from=timezone.now() - timedelta(seconds=1))
    signing_keys.signing_keys_reset_cache()
    fresh = tokens.access_token_issue(
        slug="sale", ticket_id=TID, fence=2, expires_ms=(int(timezone.now().timestamp()) + 60) * 1000
    )
    assert jwt.get_unverified_header(fresh)["kid"] == new.kid
    assert tokens.access_token_decode(old_token, slug="sale").fence == 1

    # After retirement the old key is gone from the JWKS and its tokens no longer verify.
    SigningKey.objects.filter(kid=old_kid).update(retires_at=timezone.now() - timedelta(seconds=1))
    signing_keys.signing_keys_reset_cache()
    assert {k["kid"] for k in signing_keys.jwks()["keys"]} == {new.kid}
    with pytest.raises(tokens.InvalidAccessToken):
        tokens.access_token_decode(old_token, slug="sale")


def test_keys_retired_for_a_day_are_pruned(db):
    signing_keys.jwks()
    SigningKey.objects.update(retires_at=timezone.now() - timedelta(days=2))
    assert signing_keys.signing_keys_prune() == 1


def test_an_access_token_with_an_unknown_kid_is_invalid(db):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signing_keys.jwks()
    foreign = jwt.encode(
        {"iss": "waitingroom", "aud": "sale", "sub": TID, "fence": 1, "exp": int(timezone.now().timestamp()) + 60},
        Ed25519PrivateKey.generate(),
        algorithm="EdDSA",
        headers={"kid": "someone-else"},
    )
    with pytest.raises(tokens.InvalidAccessToken):
        tokens.access_token_decode(foreign, slug="sale")


@pytest.mark.parametrize("raw", ["\ud800", "\udcff.e30.x", "e30.\ud800.x"])
def test_an_access_token_that_cannot_be_encoded_is_invalid_not_an_error(db, raw):
    # The API's serializers refuse such text first; require_queue_access and other callers meet it here.
    with pytest.raises(tokens.InvalidAccessToken):
        tokens.access_token_decode(raw, slug="q")


def test_visitor_keys_are_stable_keyed_and_short(settings):
    key = tokens.visitor_key("cookie:abc")
    assert key == tokens.visitor_key("cookie:abc") != tokens.visitor_key("cookie:abd")
    assert len(key) == 16
    settings.SECRET_KEY = "another-secret-" * 4
    assert tokens.visitor_key("cookie:abc") != key


def test_threads_that_find_the_keys_stale_together_load_them_once(transactional_db, monkeypatch):
    """The key cache re-checks under its lock: the threads that waited for it use what the first loaded."""
    import dataclasses
    import threading

    ring = signing_keys._keys.get()
    signing_keys._keys._ring = dataclasses.replace(ring, loaded_at=ring.loaded_at - 10_000)  # stale for everyone
    loads = []
    real_load = signing_keys._load_key_ring

    def slow_load():
        loads.append(threading.get_ident())
        time.sleep(0.2)  # long enough for every other thread to queue on the lock
        return real_load()

    monkeypatch.setattr(signing_keys, "_load_key_ring", slow_load)
    start = threading.Barrier(8)

    def read():
        start.wait()
        signing_keys.key_ring()

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(loads) == 1


def test_a_checked_ticket_is_kept_until_it_expires_or_the_keys_change(db, settings, monkeypatch):
    """A visitor polls with the same ticket every few seconds: its check is kept (the signature is checked
    once), but never for another queue, past the ticket's expiry, or under other keys."""
    settings.WR_TICKET_SIGNING_KEY = "k" * 64
    checks: list[str] = []
    decode = tokens.TicketBackend.decode

    def counted(self: tokens.TicketBackend, token: str, verify: bool = True) -> dict[str, object]:
        checks.append(token)
        return decode(self, token, verify)

    monkeypatch.setattr(tokens.TicketBackend, "decode", counted)
    raw = tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=2, epoch=3)
    first = tokens.visitor_ticket_decode(raw, slug="sale")
    assert tokens.visitor_ticket_decode(raw, slug="sale") == first and len(checks) == 1
    with pytest.raises(tokens.InvalidTicket):
        tokens.visitor_ticket_decode(raw, slug="another-sale")  # another queue's: checked, and refused
    assert len(checks) == 2
    expires = jwt.decode(raw, options={"verify_signature": False})["exp"]
    monkeypatch.setattr(time, "time", lambda: expires + 1.0)
    with pytest.raises(tokens.InvalidTicket) as expired:
        tokens.visitor_ticket_decode(raw, slug="sale")
    assert expired.value.expired and len(checks) == 3
    monkeypatch.undo()
    settings.WR_TICKET_SIGNING_KEY = "r" * 64  # rotated, without the old key as a fallback
    with pytest.raises(tokens.InvalidTicket):
        tokens.visitor_ticket_decode(raw, slug="sale")


def test_the_kept_checks_are_bounded_and_the_least_recently_used_let_go(db, settings, monkeypatch):
    from collections import OrderedDict

    monkeypatch.setattr(tokens, "CHECKED_MAX", 3)
    monkeypatch.setattr(tokens, "_checked", OrderedDict())
    raws = [tokens.ticket_issue(slug="sale", ticket_id=TID, seq=7, priority=0, epoch=e) for e in range(5)]
    for raw in raws[:3]:
        tokens.visitor_ticket_decode(raw, slug="sale")
    tokens.visitor_ticket_decode(raws[0], slug="sale")  # polled again: kept ahead of the others
    for raw in raws[3:]:
        tokens.visitor_ticket_decode(raw, slug="sale")
    assert [key[0] for key in tokens._checked] == [raws[0], raws[3], raws[4]]
