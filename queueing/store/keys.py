"""The key builder: every key of a queue under its Redis Cluster hash tag, and ticket ids.

One function builds every key under `settings.WR_REDIS_PREFIX`, so tests can change the prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from .. import conf

SEQ_DIGITS = 10


@dataclass(frozen=True)
class QueueKeys:
    """Every key of one queue, all under the hash tag `{slug}` so multi-key scripts run on one shard."""

    cfg: str
    st: str
    line: str  # the line's buckets and indexes are `line:<b>`, `line:i`, `line:f` (lua/_lib.lua)
    tk: str
    claims: str
    sessions: str
    done: str
    leader: str
    away: str
    waits: str
    restore: str  # places of pre-queue tickets after the shuffle, kept for a while after lost state
    viewers: str  # not a script key: websocket servers report their viewer counts here
    health: str  # not a script key: the prefix of the protected site's health slices (store.health)
    win: str  # stateless mode: the window and its counters, with the policy it needs (lua/window/)
    noticed: str  # turn notices: the noticed waiting tickets (lua/notice.lua, store/notices.py)
    notice_due: str  # turn notices: noticed tickets that left the line since the last run

    def script_keys(self) -> list[str]:
        """The KEYS every transition script receives, in the order `_lib.lua` expects."""
        return [
            *(self.cfg, self.st, self.line, self.tk, self.claims, self.sessions, self.done, self.leader, self.away),
            *(self.waits, self.restore),
        ]

    def record(self, visitor_key: str) -> tuple[str, str]:
        """(hash, field) of a waiting visitor's record: one of 4,096 small hashes by the visitor key's first
        two characters (`record_slot` in lua/_lib.lua). Other records are in `tk` itself, by visitor key."""
        return f"{self.tk}:{visitor_key[:2]}", visitor_key

    @property
    def line_tree(self) -> str:
        """The line's count index (a Fenwick tree over its buckets; field 'n': everyone in line)."""
        return f"{self.line}:f"

    def line_bucket(self, bucket: int | str) -> str:
        """One bucket of the line: a ZSET of 64 places of score (lua/_line.lua, bucket_key)."""
        return f"{self.line}:{bucket}"

    @property
    def line_keys(self) -> str:
        """SCAN pattern of the line's buckets and their indexes (lua/_line.lua, line_add)."""
        return f"{self.line}:*"

    @property
    def record_hashes(self) -> str:
        """SCAN pattern of the small hashes of waiting visitors' records."""
        return f"{self.tk}:*"

    def tagged(self, name: str) -> str:
        """A further key of this queue under its hash tag (a join's address index, a spent challenge)."""
        return f"{self.cfg[: -len('cfg')]}{name}"


@lru_cache(maxsize=4096)
def _queue_keys(prefix: str, slug: str) -> QueueKeys:
    base = f"{prefix}:{{{slug}}}:"
    return QueueKeys(*(base + name for name in QueueKeys.__dataclass_fields__))


def queue_keys(slug: str) -> QueueKeys:
    return _queue_keys(conf.hot().WR_REDIS_PREFIX, slug)


def key_pattern() -> str:
    """A SCAN pattern matching every key this installation writes (tests clean up with it)."""
    return f"{settings.WR_REDIS_PREFIX}:*"


def queue_config_pattern() -> tuple[str, str]:
    """(SCAN pattern of every queue's policy key, the prefix before the slug in it)."""
    return f"{settings.WR_REDIS_PREFIX}:{{*}}:cfg", f"{settings.WR_REDIS_PREFIX}:{{"


def limit_key(scope: str, ident: str, *, queue: str = "") -> str:
    """The key of one limited subject (a client address, a ticket, an API key, a user) in one scope. A
    subject of one `queue` (a ticket) has its key under the queue's hash tag, so its limiter can run in
    the same script as the queue's own work (store.combined)."""
    if queue:
        return queue_keys(queue).tagged(f"rl:{scope}:{ident}")
    return f"{conf.hot().WR_REDIS_PREFIX}:rl:{scope}:{{{ident}}}"


def ticket_id(seq: int, visitor_key: str) -> str:
    return f"{seq:0{SEQ_DIGITS}d}.{visitor_key}"


def parse_ticket_id(value: str) -> tuple[int, str] | None:
    """(seq, visitor key) from a ticket id, or None if it is not one."""
    seq, dot, visitor_key = value.partition(".")
    if not dot or len(seq) != SEQ_DIGITS or not seq.isdigit() or not visitor_key:
        return None
    if _VISITOR_KEY.fullmatch(visitor_key) is None:
        return None
    return int(seq), visitor_key


_VISITOR_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
