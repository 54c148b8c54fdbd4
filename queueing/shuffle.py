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
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable


def seed_new() -> str:
    return secrets.token_hex(32)


def commitment_of(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def shuffle_order(seed: str, tickets: Iterable[tuple[int, int]]) -> list[int]:
    """Sequence numbers in their shuffled order; `tickets` are (sequence number, priority level)."""
    ordered = sorted(tickets, key=lambda t: (-t[1], hashlib.sha256(f"{seed}:{t[0]}".encode()).hexdigest()))
    return [seq for seq, _ in ordered]


def verify(record: dict[str, object]) -> list[str]:
    """Problems with a published shuffle record (empty when it checks out)."""
    problems = []
    seed, commitment = str(record.get("seed", "")), str(record.get("commitment", ""))
    if not record.get("revealed") or not seed:
        return ["The seed has not been revealed yet (the start has not come)."]
    if commitment_of(seed) != commitment:
        problems.append("The revealed seed does not hash to the published commitment.")
    tickets = [(int(seq), int(level)) for seq, level in record.get("tickets", [])]  # type: ignore[attr-defined]
    if shuffle_order(seed, tickets) != [int(s) for s in record.get("order", [])]:  # type: ignore[attr-defined]
        problems.append("The published order is not the one the seed gives.")
    return problems
