"""The proof-of-work gate (per queue, off by default): before joining, a client gets a signed,
single-use, short-lived challenge and must find a nonce such that SHA-256("<challenge>:<nonce>") starts
with the queue's number of zero bits. Each bit doubles the expected work (2^bits hashes on average).

The challenge is signed (Django's TimestampSigner, compared in constant time), names its queue, the
difficulty it was issued at and a random id; the join script spends the id once (a Redis marker that
lives as long as the challenge could), so a solution buys one ticket. The difficulty in force is the
queue's when the join runs: raised during a flood, older, easier solutions are refused and the client
is handed a new challenge.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.core import signing

CHALLENGE_TTL_SECONDS = 120
NONCE_MAX_LENGTH = 64
_SIGNER = signing.TimestampSigner(salt="waitingroom.pow")


class InvalidProof(ValueError):
    pass


@dataclass(frozen=True)
class Solved:
    bits: int  # the difficulty the challenge was issued at (and the solution meets)
    challenge_id: str


def challenge_issue(slug: str, difficulty: int) -> dict[str, Any]:
    challenge = _SIGNER.sign(f"{slug}.{difficulty}.{secrets.token_hex(12)}")
    return {
        "challenge": challenge,
        "difficulty": difficulty,
        "algorithm": "sha256",
        "expires_in": CHALLENGE_TTL_SECONDS,
    }


def leading_zero_bits(digest: bytes) -> int:
    """Zero bits at the start of the digest, counted over every byte (no early exit)."""
    count, seen_one = 0, 0
    for byte in digest:
        for shift in range(7, -1, -1):
            bit = (byte >> shift) & 1
            seen_one |= bit
            count += 1 - seen_one
    return count


def solution_check(slug: str, challenge: str, nonce: str) -> Solved:
    """The solved difficulty and challenge id, or InvalidProof saying why not."""
    if not isinstance(challenge, str) or not isinstance(nonce, str) or not nonce or len(nonce) > NONCE_MAX_LENGTH:
        raise InvalidProof("Send pow_challenge and a pow_nonce of 1 to 64 characters.")
    try:
        payload = _SIGNER.unsign(challenge, max_age=CHALLENGE_TTL_SECONDS)
    except signing.SignatureExpired as exc:
        raise InvalidProof("The challenge has expired; ask for a new one.") from exc
    except signing.BadSignature as exc:
        raise InvalidProof("The challenge is not one this server issued.") from exc
    except UnicodeError as exc:  # a lone surrogate: no challenge of ours contains one
        raise InvalidProof("The challenge is not one this server issued.") from exc
    queue, _, rest = payload.partition(".")
    bits, _, challenge_id = rest.partition(".")
    if queue != slug:
        raise InvalidProof("The challenge was issued for another queue.")
    try:
        digest = hashlib.sha256(f"{challenge}:{nonce}".encode()).digest()
    except UnicodeError as exc:
        raise InvalidProof("The nonce does not solve the challenge.") from exc
    if leading_zero_bits(digest) < int(bits):
        raise InvalidProof("The nonce does not solve the challenge.")
    return Solved(int(bits), challenge_id)


def solve(challenge: str, difficulty: int) -> str:
    """A nonce solving the challenge (for tests, benchmarks and API clients written in Python): the plain loop
    a bot would write, its test on the digest's first bytes (counting bits one by one, as the check does,
    took 35 times as long: the hoarder's cost was overstated from it, issue 50)."""
    whole, rest = divmod(difficulty, 8)
    zeros, limit = bytes(whole), 1 << (8 - rest)
    prefix = f"{challenge}:".encode()
    for counter in range(1 << 40):
        nonce = format(counter, "x")
        digest = hashlib.sha256(prefix + nonce.encode()).digest()
        if digest[:whole] == zeros and (rest == 0 or digest[whole] < limit):
            return nonce
    raise AssertionError("unreachable")
