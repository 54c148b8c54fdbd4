"""Join caps per client address, and the proof-of-work gate: real Redis, real HTTP handling."""

from __future__ import annotations

import hashlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.test import Client

from queueing import pow, services, store
from queueing.models import Queue


def join(client: Client, slug: str, body: dict[str, Any] | None = None, *, address: str = "198.51.100.1"):
    return client.post(
        f"/api/v1/queues/{slug}/join",
        data=body or {},
        content_type="application/json",
        HTTP_X_VISITOR_ID=str(uuid.uuid4()),
        REMOTE_ADDR=address,
    )


def live_tickets(slug: str) -> int:
    snap = store.snapshot(slug)
    return snap.waiting + snap.admitted + snap.active


# --- Join caps ----------------------------------------------------------------------------------------


def test_join_caps_are_off_by_default(make_queue):
    queue = make_queue(state="paused")
    assert queue.max_tickets_per_address == 0
    assert [join(Client(), queue.slug).status_code for _ in range(5)] == [201] * 5


def test_an_address_holding_its_cap_of_live_tickets_is_refused_with_its_own_code(make_queue):
    queue = make_queue(state="paused", max_tickets_per_address=2)
    client = Client()
    first = join(client, queue.slug)
    assert join(client, queue.slug).status_code == 201
    refused = join(client, queue.slug)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "ticket_cap_reached" and refused["Retry-After"] == "60"
    assert join(client, queue.slug, address="198.51.100.2").status_code == 201  # another address
    # A visitor asking again for its own ticket is not a new ticket: never capped.
    again = client.post(
        f"/api/v1/queues/{queue.slug}/join",
        data={},
        content_type="application/json",
        HTTP_X_VISITOR_ID=first.request["HTTP_X_VISITOR_ID"],
        REMOTE_ADDR="198.51.100.1",
    )
    assert again.status_code == 200 and again.json()["ticket_id"] == first.json()["ticket_id"]
    # A ticket that ends frees its place under the cap.
    left = client.post(f"/api/v1/queues/{queue.slug}/leave", HTTP_AUTHORIZATION=f"Bearer {first.json()['ticket']}")
    assert left.status_code == 204
    assert join(client, queue.slug).status_code == 201
    assert live_tickets(queue.slug) == 3


def test_ipv6_addresses_count_by_their_64_network(make_queue, settings):
    """Seen: a single IPv6 /64 counted as unlimited addresses (one subscriber holds the whole /64)."""
    queue = make_queue(state="paused", max_tickets_per_address=2)
    same_network = ["2001:db8:1:2::1", "2001:db8:1:2:aaaa::9", "2001:db8:1:2:ffff:ffff:ffff:ffff"]
    codes = [join(Client(), queue.slug, address=address).status_code for address in same_network]
    assert codes == [201, 201, 429]
    assert join(Client(), queue.slug, address="2001:db8:1:3::1").status_code == 201  # another /64
    settings.WR_IPV6_PREFIX = 128  # an operator who counts single addresses
    assert join(Client(), queue.slug, address="2001:db8:1:2::77").status_code == 201


def test_a_scheduled_sale_gets_a_per_address_cap_and_proof_of_work_unless_told_otherwise(make_queue):
    starts = {"starts_at": "2099-01-01T00:00:00Z", "target_url": "https://shop.example/"}
    guarded, _ = services.queue_configure(slug=f"s{uuid.uuid4().hex[:8]}", changes=dict(starts), actor_label="t")
    assert (guarded.max_tickets_per_address, guarded.pow_difficulty) == (20, 16)
    assert join(Client(), guarded.slug).status_code == 428  # the proof of work comes first
    chosen, _ = services.queue_configure(
        slug=f"s{uuid.uuid4().hex[:8]}", changes={**starts, "pow_difficulty": 0}, actor_label="t"
    )
    assert (chosen.max_tickets_per_address, chosen.pow_difficulty) == (20, 0)
    plain = make_queue()
    assert (plain.max_tickets_per_address, plain.pow_difficulty) == (0, 0)  # no scheduled start: none
    services.queue_update(guarded, changes={"pow_difficulty": 0})
    later, _ = services.queue_configure(slug=guarded.slug, changes={"capacity": 5}, actor_label="t")
    assert later.pow_difficulty == 0  # the operator's choice stays


def test_twenty_parallel_joins_from_one_address_get_exactly_the_cap(make_queue):
    queue = make_queue(state="paused", max_tickets_per_address=3)
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda _: join(Client(), queue.slug, address="203.0.113.5").status_code, range(20)))
    assert sorted(codes) == [201] * 3 + [429] * 17
    assert live_tickets(queue.slug) == 3


def test_the_cap_counts_the_tickets_joined_while_it_is_on_as_documented(make_queue, admin_client):
    """Addresses are indexed only while a cap is set (README, "Join caps": an index for every queue all
    the time would cost about 180 bytes per waiting ticket). Tickets joined before are not counted."""
    queue = make_queue(state="paused")
    client = Client()
    assert [join(client, queue.slug).status_code for _ in range(3)] == [201] * 3  # cap off
    services.queue_configure(slug=queue.slug, changes={"max_tickets_per_address": 2})
    assert [join(client, queue.slug).status_code for _ in range(3)] == [201, 201, 429]
    assert live_tickets(queue.slug) == 5
    help_text = admin_client.get(f"/admin/queueing/queue/{queue.pk}/change/").content.decode()
    assert "counts tickets joined while it is on" in help_text  # said where the cap is set


# --- Proof of work ------------------------------------------------------------------------------------


@pytest.fixture
def gated(make_queue) -> Queue:
    return make_queue(state="paused", pow_difficulty=8)


def challenge(client: Client, slug: str) -> dict[str, Any]:
    answer = client.post(f"/api/v1/queues/{slug}/challenge")
    assert answer.status_code == 201, answer.content
    return dict(answer.json())


def test_a_join_without_proof_gets_428_with_a_challenge_and_a_solution_gets_in_once(gated):
    client = Client()
    refused = join(client, gated.slug)
    assert refused.status_code == 428
    error = refused.json()["error"]
    assert error["code"] == "proof_of_work_required" and error["difficulty"] == 8 and error["algorithm"] == "sha256"
    nonce = pow.solve(error["challenge"], error["difficulty"])
    digest = hashlib.sha256(f"{error['challenge']}:{nonce}".encode()).digest()
    assert pow.leading_zero_bits(digest) >= 8
    body = {"pow_challenge": error["challenge"], "pow_nonce": nonce}
    assert join(client, gated.slug, body).status_code == 201
    reused = join(client, gated.slug, body)  # another visitor with the same solution
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "proof_of_work_reused"
    assert live_tickets(gated.slug) == 1


def test_parallel_joins_with_one_solution_get_one_ticket(gated):
    data = challenge(Client(), gated.slug)
    body = {"pow_challenge": data["challenge"], "pow_nonce": pow.solve(data["challenge"], data["difficulty"])}
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda _: join(Client(), gated.slug, body).status_code, range(20)))
    assert sorted(codes) == [201] + [409] * 19


def wrong_nonce(challenge: str) -> str:
    """A nonce that does not solve the challenge (any fixed one would, once in 256 challenges: CI saw it)."""
    return next(
        n
        for n in (format(i, "x") for i in range(10_000))
        if pow.leading_zero_bits(hashlib.sha256(f"{challenge}:{n}".encode()).digest()) < 8
    )


def test_wrong_expired_and_foreign_solutions_are_refused(gated, make_queue, monkeypatch):
    client = Client()
    data = challenge(client, gated.slug)
    good = pow.solve(data["challenge"], 8)
    wrong = wrong_nonce(data["challenge"])
    for body in (
        {"pow_challenge": data["challenge"], "pow_nonce": wrong},
        {"pow_challenge": data["challenge"] + "x", "pow_nonce": good},  # tampered signature
        {"pow_challenge": data["challenge"], "pow_nonce": ""},
    ):
        answer = join(client, gated.slug, body)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_proof_of_work", body
    other = make_queue(state="paused", pow_difficulty=8)
    foreign = join(client, other.slug, {"pow_challenge": data["challenge"], "pow_nonce": good})
    assert foreign.status_code == 400 and "another queue" in foreign.json()["error"]["message"]
    later = time.time() + pow.CHALLENGE_TTL_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)  # what TimestampSigner reads
    expired = join(client, gated.slug, {"pow_challenge": data["challenge"], "pow_nonce": good})
    assert expired.status_code == 400 and "expired" in expired.json()["error"]["message"]
    assert live_tickets(gated.slug) == 0


def test_raising_the_difficulty_live_refuses_easier_solutions(gated):
    client = Client()
    data = challenge(client, gated.slug)
    nonce = pow.solve(data["challenge"], 8)
    services.queue_configure(slug=gated.slug, changes={"pow_difficulty": 12}, actor_label="flood")
    answer = join(client, gated.slug, {"pow_challenge": data["challenge"], "pow_nonce": nonce})
    assert answer.status_code == 428 and answer.json()["error"]["difficulty"] == 12


def test_with_the_gate_off_the_challenge_says_difficulty_zero_and_joins_need_nothing(make_queue):
    queue = make_queue(state="paused")
    assert challenge(Client(), queue.slug)["difficulty"] == 0
    assert join(Client(), queue.slug).status_code == 201
    assert Client().post("/api/v1/queues/no-such-queue/challenge").status_code == 404


def test_leading_zero_bits_counts_bits_not_bytes():
    assert pow.leading_zero_bits(bytes([0, 0, 0b00010000]) + bytes(29)) == 19
    assert pow.leading_zero_bits(bytes([0xFF]) + bytes(31)) == 0
    assert pow.leading_zero_bits(bytes(32)) == 256


def test_staff_raise_the_difficulty_live_through_the_api(gated, staff_api):
    answer = staff_api.patch(f"/api/v1/queues/{gated.slug}", {"pow_difficulty": 20}, format="json")
    assert answer.status_code == 200 and answer.json()["pow_difficulty"] == 20
    assert challenge(Client(), gated.slug)["difficulty"] == 20  # in force at once: no tick needed
    too_hard = staff_api.patch(f"/api/v1/queues/{gated.slug}", {"pow_difficulty": 33}, format="json")
    assert too_hard.status_code == 400


def test_a_challenge_or_nonce_that_cannot_be_encoded_is_an_invalid_proof_not_an_error(gated):
    # The API refuses such text before; any other caller of the check gets a clear refusal too.
    real = pow.challenge_issue(gated.slug, 1)["challenge"]
    for challenge, nonce in (("\ud800:x", "1"), (real, "\ud800"), (real[:-1] + "\udcff", "1")):
        with pytest.raises(pow.InvalidProof):
            pow.solution_check(gated.slug, challenge, nonce)


def test_a_priority_code_that_cannot_be_stored_is_unknown_before_any_sql(make_queue, django_assert_num_queries):
    queue = make_queue()
    for code in ("\ud800abcd", "ab\x00cd"):
        with django_assert_num_queries(0), pytest.raises(services.InvalidPriorityCode):
            services.priority_code_reserve(slug=queue.slug, code=code)


def test_a_stray_proof_is_ignored_by_a_queue_without_a_gate_and_an_unknown_queue_is_404(gated, make_queue):
    """Issue 12: proof-of-work fields sent where no gate is on were refused as invalid proofs."""
    client = Client()
    data = challenge(client, gated.slug)
    stray = {"pow_challenge": data["challenge"], "pow_nonce": wrong_nonce(data["challenge"])}
    open_queue = make_queue(state="paused")  # pow_difficulty 0
    assert join(client, open_queue.slug, stray).status_code == 201
    assert live_tickets(open_queue.slug) == 1
    missing = join(Client(), "no-such-queue", stray)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "queue_not_found"
    assert join(Client(), gated.slug, stray).status_code == 400  # where the gate is on, still refused


def test_an_address_holding_tickets_is_asked_a_bit_more_for_each_doubling_of_them(make_queue):
    """Issue 50, item 8: at a flat 16 bits a hoarder's script paid about 26 ms a ticket. With the per-address
    cap on (its index knows what an address holds), the gate asks an address one bit more at its 2nd live
    ticket, two at its 4th, three at its 8th; another address pays the queue's difficulty."""
    queue = make_queue(state="paused", pow_difficulty=6, max_tickets_per_address=20)
    client = Client()
    asked = []
    for _ in range(8):
        base = challenge(client, queue.slug)  # the endpoint knows no address: the queue's difficulty
        body = {"pow_challenge": base["challenge"], "pow_nonce": pow.solve(base["challenge"], base["difficulty"])}
        answer = join(client, queue.slug, body)
        if answer.status_code == 428:  # the challenge in the refusal is at what this address is asked
            error = answer.json()["error"]
            nonce = pow.solve(error["challenge"], error["difficulty"])
            body = {"pow_challenge": error["challenge"], "pow_nonce": nonce}
            answer = join(client, queue.slug, body)
            asked.append(error["difficulty"])
        else:
            asked.append(base["difficulty"])
        assert answer.status_code == 201, answer.content
    assert asked == [6, 7, 7, 8, 8, 8, 8, 9]  # holding 0, 1, 2, 3, ... 7 live tickets
    other = challenge(client, queue.slug)
    body = {"pow_challenge": other["challenge"], "pow_nonce": pow.solve(other["challenge"], 6)}
    assert join(client, queue.slug, body, address="198.51.100.2").status_code == 201
