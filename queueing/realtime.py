"""Live push (SPEC 7): the channel-group names, the events, and the one helper that sends them.

Services call this after their Redis transition; nothing else sends to a group.

The layer is channels-redis's RedisPubSubChannelLayer. Sending to a group is one Redis PUBLISH, which
each websocket server with members in the group receives once and hands to its local sockets, so a
queue watched by 5,000 sockets costs one publish and one delivery per server. RedisChannelLayer (the
core layer) would instead push one message per member channel into Redis lists, 5,000 writes per
event. Pub/sub delivers at most once, which suits push here: push is a hint, and polling (with the
event sequence numbers that reveal a missed event) remains the source of truth.

Sync code (Django views, Celery tasks) publishes with an ordinary Redis client on the layer's server, in the layer's own
wire format, rather than through `async_to_sync(layer.group_send)`: in a Celery worker that starts an
event loop, opens a connection and closes both on every send, the pattern behind channels-redis issue
#332 ("Event loop is closed"). One pipelined round trip sends all of a transition's events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from channels_redis.serializers import registry
from django.conf import settings
from django.http import HttpRequest

from . import conf, store

Event = dict[str, Any]
Message = tuple[str, Event]  # (group, event)


def socket_url(request: HttpRequest, path: str) -> str:
    """Where a browser opens a websocket: WR_WS_BASE_URL (the websocket server, when it has an address
    of its own), else the host the page came from."""
    base = conf.hot().WR_WS_BASE_URL
    if not base:
        base = f"{'wss' if request.is_secure() else 'ws'}://{request.get_host()}"
    return f"{base.rstrip('/')}{path}"


def queue_group(slug: str) -> str:
    """Every socket watching the queue: queue_move and snapshot events."""
    return f"queue.{slug}"


def ticket_group(slug: str, visitor_key: str) -> str:
    """The sockets of one visitor's ticket: admitted, position and expired events (private)."""
    return f"{TICKET}{slug}.{visitor_key}"


TICKET = "ticket."


def heard_through(group: str) -> str:
    """The layer's group (its pub/sub channel) a group's events are published on: a queue's own, and for
    every ticket of a queue one channel, the queue's private events (`private.<slug>`), from which a
    websocket server's router hands each event to its ticket's sockets (wsserver.Router).

    A channel per ticket cost a SUBSCRIBE when each socket said hello and an UNSUBSCRIBE when it closed:
    5,000 sockets closing at once held a server's event loop for 0.44 s, most of it those UNSUBSCRIBEs
    queueing on the connection's lock (bench/RESULTS.md). A server now hears every private event of a
    queue it serves, and drops those for tickets it holds no socket of: one dictionary lookup each."""
    if group.startswith(TICKET):
        return f"private.{group[len(TICKET) :].rpartition('.')[0]}"
    return group


def _layer_prefix() -> str:
    return str(settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"])


@lru_cache(maxsize=1)
def _serializer() -> Any:
    return registry.get_serializer("msgpack")


def encoded(messages: Iterable[Message]) -> list[tuple[str, bytes]]:
    """Each event as the (channel, payload) to PUBLISH: RedisPubSubChannelLayer's group channel name (of
    the group the event is heard through: heard_through) and message envelope, the event's text encoded
    here, once (a server forwards it to each socket as it is), its group, by which a websocket server's
    router finds the sockets it is for (wsserver.Router), and for a ticket's news the status it tells, so
    that the server's roll call does not read it again."""
    prefix, serializer = _layer_prefix(), _serializer()
    published = []
    for group, event in messages:
        envelope: dict[str, Any] = {"type": "queue.event", "group": group, "text": json.dumps(event)}
        known = _tells(event)
        if known:
            envelope["known"] = known
        published.append((f"{prefix}__group__{heard_through(group)}", serializer.serialize(envelope)))
    return published


def _tells(event: Event) -> int:
    """The ticket status a private event tells its visitor (0: none)."""
    if event["type"] == "admitted":
        return store.TicketStatus.ADMITTED
    if event["type"] == "expired":
        return store.TicketStatus.REVOKED if event.get("reason") == "revoked" else store.TicketStatus.EXPIRED
    return 0


def send(messages: Iterable[Message]) -> int:
    """Publish events to groups (one pipelined round trip); returns how many were sent."""
    published = encoded(messages)
    if published:
        store.publish(published)
    return len(published)


async def asend(messages: Iterable[Message]) -> int:
    """`send` from the event loop (the web server's hot path)."""
    published = encoded(messages)
    if published:
        await store.apublish(published)
    return len(published)


# --- Events ----------------------------------------------------------------------------------------


def queue_move(slug: str, moves: store.Moves, queue_length: int | None = None) -> list[Message]:
    """Places moved: each op is [op, rank, count] ('-' left at rank, '+' placed at rank), in order."""
    if not moves.seq:
        return []
    event: Event = {"type": "queue_move", "seq": moves.seq, "ops": [list(op) for op in moves.ops]}
    if queue_length is not None:
        event["queue_length"] = queue_length
    return [(queue_group(slug), event)]


def admitted(slug: str, ticket_id: str, *, access_token: str, redirect_url: str, expires_at: int) -> Message:
    parsed = store.parse_ticket_id(ticket_id)
    assert parsed is not None
    event = {
        "type": "admitted",
        "ticket_id": ticket_id,
        "access_token": access_token,
        "redirect_url": redirect_url,
        "expires_at": expires_at,
    }
    return ticket_group(slug, parsed[1]), event


def expired(slug: str, ticket_ids: Iterable[str], reason: str) -> list[Message]:
    messages = []
    for ticket_id in ticket_ids:
        parsed = store.parse_ticket_id(ticket_id)
        if parsed is not None:
            event = {"type": "expired", "ticket_id": ticket_id, "reason": reason}
            messages.append((ticket_group(slug, parsed[1]), event))
    return messages


def snapshot(slug: str, stats: dict[str, Any]) -> Message:
    """The periodic picture of a queue every watcher gets (seed 004's SNAPSHOT)."""
    event = {
        "type": "snapshot",
        "seq": stats["event_seq"],
        "epoch": stats["epoch"],
        "state": stats["state"],
        "queue_length": stats["waiting"],
        "head_position": stats["head_position"],  # the ticket number now at the head of the line
        "admitted_per_minute": stats["outflow_per_minute_observed"],
        "average_service_seconds": stats["average_service_seconds"],
        "viewers": stats["viewers"],
    }
    return queue_group(slug), event


def queue_state(slug: str, state: str) -> Message:
    """The queue's state changed (an operator paused, resumed, closed or opened it, or its schedule did):
    every watcher hears it at once, not at the next snapshot."""
    return queue_group(slug), {"type": "state", "state": state}


def queue_schedule(slug: str, times: dict[str, float | None]) -> Message:
    """The queue's schedule changed (an operator moved its pre-queue's opening, its start or its end): every
    watcher hears the new times at once (epoch seconds, or null for none), and the page asks for its truth."""
    return queue_group(slug), {"type": "schedule", **times}


def window_moved(slug: str, window: dict[str, Any]) -> Message:
    """A stateless queue's window moved: every watcher can tell its own state from it (SPEC 4)."""
    return queue_group(slug), {"type": "window", "seq": window["event_seq"], **window}
