"""Limiter plumbing: the five rate-limiting scripts (lua/limits/), one key per limited subject.

The algorithms and their arguments are the domain's (`queueing/ratelimit.py`); here they are run, alone
(`limit_hit`) or in the same round trip as other work (`LimitCall`, see tracked.status_plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .connection import Plan, ScriptCall, client, run
from .keys import limit_key, queue_keys
from .replies import Reply

__all__ = ["LimitCall", "LimitReply", "limit_hit", "limit_key", "limit_plan"]


class LimitCall(NamedTuple):
    """One limiter script to run: its algorithm (lua/limits/<algorithm>.lua), key and arguments."""

    algorithm: str
    key: str
    args: tuple[str | int | float, ...]

    @property
    def script(self) -> str:
        return f"limits/{self.algorithm}"

    @property
    def call(self) -> ScriptCall:
        return self.script, [self.key], self.args


@dataclass(frozen=True)
class LimitReply(Reply):
    """Every limiter script's reply: {allowed 0|1, retry after (ms), remaining (or the weighted count),
    wait (ms; the leaking bucket's turn in its queue)}."""

    allowed: bool
    retry_ms: int
    remaining: float
    wait_ms: int


def limit_hit(algorithm: str, key: str, *args: str | int | float) -> LimitReply:
    """Run one limiter script: (allowed, retry after ms, remaining or weighted count, wait ms)."""
    call = LimitCall(algorithm, key, args)
    return LimitReply.parse(run(call.script, [key], args))


def limit_plan(call: LimitCall) -> Plan[LimitReply]:
    """One limiter script as a round trip's plan (a limiter that must count before other work)."""
    return Plan((call.call,), lambda replies: LimitReply.parse(replies[0]))


# --- A queue's priority codes locked after too many wrong ones (services.priority_code_reserve) ---------------


def codes_lock(slug: str, *, seconds: float) -> None:
    """Refuse every code tried for `slug` for `seconds` (too many wrong ones were tried there)."""
    client().set(queue_keys(slug).tagged("codes_locked"), "1", px=max(1, int(seconds * 1000)))


def codes_locked(slug: str) -> float:
    """Seconds the queue's codes stay locked (0: not locked)."""
    left = int(client().pttl(queue_keys(slug).tagged("codes_locked")))
    return left / 1000 if left > 0 else 0.0
