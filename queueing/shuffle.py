"""The pre-queue shuffle's order, as a pure function anyone can recompute (SPEC 3.3).

Given the revealed seed and the pre-queue's tickets as (sequence number, priority level):

1. higher priority levels go first (as they would have been placed ahead had they joined in line);
2. within a level, tickets are ordered by SHA-256 of "<seed>:<sequence number>" (hex, ascending).

The seed is 64 hex characters; its SHA-256 (hex) is the commitment published before the pre-queue
opened. Verification needs nothing but Python's hashlib:

    import hashlib, json
    record = json.load(open("shuffle.json"))       # GET /api/v1/queues/<slug>/shuffle
    assert hashlib.sha256(record["seed"].encode()).hexdigest() == record["commitment"]
    order = [seq for seq, level in sorted(record["tickets"], key=lambda t: (-t[1],
             hashlib.sha256(f"{record['seed']}:{t[0]}".encode()).hexdigest()))]
    assert order == record["order"]

(`manage.py verify_shuffle SLUG [--file shuffle.json]` does exactly this.)

A stateless queue (SPEC 4) keeps no list of its tickets: its pre-queue is the range of numbers
`first..last` issued before the start, and the shuffle is a permutation of that range computed per number,
so that any ticket's place follows from the seed and its own number alone: `place(seed, first, last, n)`
below (a four-round Feistel network keyed by SHA-256 of "<seed>:<round>:<half>", on the smallest
even-width binary domain that holds the range, walking cycles until the result falls inside the range).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import QueueShuffle


def seed_new() -> str:
    return secrets.token_hex(32)


def commitment_of(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def shuffle_order(seed: str, tickets: Iterable[tuple[int, int]]) -> list[int]:
    """Sequence numbers in their shuffled order; `tickets` are (sequence number, priority level)."""
    ordered = sorted(tickets, key=lambda t: (-t[1], hashlib.sha256(f"{seed}:{t[0]}".encode()).hexdigest()))
    return [seq for seq, _ in ordered]


def shuffled_places(order: list[int]) -> dict[int, float]:
    """The line score each pre-queue ticket gets from the shuffle: the k-th in the order gets the k-th
    smallest of their own sequence numbers, so the pre-queue keeps the span of scores it had (the line is
    kept in buckets by score: lua/_lib.lua)."""
    return {seq: float(score) for seq, score in zip(order, sorted(order), strict=True)}


def verify(record: dict[str, object]) -> list[str]:
    """Problems with a published shuffle record (empty when it checks out)."""
    problems = []
    seed, commitment = str(record.get("seed", "")), str(record.get("commitment", ""))
    if not record.get("revealed") or not seed:
        return ["The seed has not been revealed yet (the start has not come)."]
    if commitment_of(seed) != commitment:
        problems.append("The revealed seed does not hash to the published commitment.")
    if record.get("method") == STATELESS_METHOD:
        first, last = (int(n) for n in (record.get("numbers") or [1, 0]))  # type: ignore[attr-defined]
        places = record.get("places", {})  # optional: a few published {number: place} to check
        for number, claimed in dict(places).items():  # type: ignore[call-overload]
            if not first <= int(number) <= last or place(seed, first, last, int(number)) != int(claimed):
                problems.append(f"Ticket {number} is not at place {claimed} as published.")
        return problems
    tickets = [(int(seq), int(level)) for seq, level in record.get("tickets", [])]  # type: ignore[attr-defined]
    if shuffle_order(seed, tickets) != [int(s) for s in record.get("order", [])]:  # type: ignore[attr-defined]
        problems.append("The published order is not the one the seed gives.")
    return problems


FEISTEL_ROUNDS = 4
STATELESS_METHOD = "feistel-sha256"


def _feistel(seed: str, half_bits: int, x: int) -> int:
    mask = (1 << half_bits) - 1
    left, right = x >> half_bits, x & mask
    for round_ in range(FEISTEL_ROUNDS):
        digest = hashlib.sha256(f"{seed}:{round_}:{right}".encode()).digest()
        left, right = right, left ^ (int.from_bytes(digest[:8], "big") & mask)
    return (left << half_bits) | right


def place(seed: str, first: int, last: int, number: int) -> int:
    """The place (first..last) the stateless pre-queue shuffle gives ticket `number` (first..last)."""
    count = last - first + 1
    half_bits = max(1, ((count - 1).bit_length() + 1) // 2)
    x = number - first
    while True:  # a permutation of 0..2^(2h)-1; walking its cycle from x reaches 0..count-1 (< 4 steps on average)
        x = _feistel(seed, half_bits, x)
        if x < count:
            return first + x


def stateless_order(seed: str, first: int, last: int) -> list[int]:
    """Every number of the range, in the shuffled order (for verification; O(count))."""
    order = [0] * (last - first + 1)
    for number in range(first, last + 1):
        order[place(seed, first, last, number) - first] = number
    return order


def public_record(record: QueueShuffle) -> dict[str, Any]:
    """What anyone may see of a shuffle: the commitment always; the seed and the lists once revealed."""
    body: dict[str, Any] = {
        "starts_at": record.starts_at.isoformat(),
        "commitment": record.commitment,
        "committed_at": record.committed_at.isoformat(),
        "revealed": record.revealed_at is not None,
    }
    if record.revealed_at is not None and record.numbers is not None:
        body.update(
            seed=record.seed,
            revealed_at=record.revealed_at.isoformat(),
            method=STATELESS_METHOD,
            numbers=record.numbers,
        )
    elif record.revealed_at is not None:
        body.update(
            seed=record.seed, revealed_at=record.revealed_at.isoformat(), tickets=record.tickets, order=record.order
        )
    return body
