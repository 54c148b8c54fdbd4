"""Turn notices' live state (tracked mode; services/notices.py): the noticed tickets of a queue, the ones among
them that left the line, and one run's reading of both (notice.lua, notices.lua).

A queue's `noticed` ZSET holds its noticed waiting tickets (score 0 until their nearness is told, then 1);
`notice_due` (a LIST) those that left the line since, admitted or finished, put there by the transition that
moved them (_transitions.lua). Every call takes the queue's script keys and then these two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .connection import client, run
from .keys import queue_keys
from .replies import Reply, texts


def _keys(slug: str) -> list[str]:
    keys = queue_keys(slug)
    return [*keys.script_keys(), keys.noticed, keys.notice_due]


def notice_keep(slug: str, *, ticket_id: str, until_ms: int, now_ms: int, told: bool = False) -> str:
    """Keep a waiting ticket noticed, seen until `until_ms` (notice.lua): 'ok', 'gone' when it is not waiting,
    'no_config' when the queue's policy is not in Redis."""
    return str(run("notice", _keys(slug), (ticket_id, until_ms // 1000, now_ms, int(told))))


@dataclass(frozen=True)
class NoticesReply(Reply):
    """notices.lua: {state, mode, seeded 0|1, due ids, near ids}."""

    state: str
    mode: str
    seeded: bool
    due: list[str]
    near: list[str]

    CONVERT = {"seeded": bool, "due": texts, "near": texts}


def notices_read(slug: str, *, now_ms: int, places: int, seconds: int, most_due: int) -> NoticesReply | None:
    """One run's reading (notices.lua); None when the queue's policy is not in Redis."""
    raw = run("notices", _keys(slug), (now_ms, places, seconds, most_due))
    return None if raw[0] == "no_config" else NoticesReply.parse(raw)


def notice_told(slug: str, ticket_id: str) -> None:
    """Mark a noticed ticket's nearness told (only while it is still noticed)."""
    client().zadd(queue_keys(slug).noticed, {ticket_id: 1}, xx=True)


def notices_forget(slug: str, *, noticed: Sequence[str] = (), due: Sequence[str] = ()) -> None:
    """Forget tickets the run is done with: out of `noticed`, and once each out of `notice_due`."""
    keys = queue_keys(slug)
    with client().pipeline(transaction=False) as pipe:
        if noticed:
            pipe.zrem(keys.noticed, *noticed)
        for tid in due:
            pipe.lrem(keys.notice_due, 1, tid)
        pipe.execute()


def notices_seeded(slug: str) -> None:
    """Say the queue's live state holds every notice the database keeps (after the run kept them again)."""
    client().hset(queue_keys(slug).st, "notices_seeded", 1)


def notices_clear(slug: str) -> None:
    """A queue's notices are over (its sale ended, it went stateless): its noticed set and due list go."""
    keys = queue_keys(slug)
    client().delete(keys.noticed, keys.notice_due)
