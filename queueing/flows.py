"""A visitor's use-case written once, run by either driver (sans-IO).

A join, a status poll or a window read is a generator (a `Flow`) that does no input or output itself: it
yields what it needs done (an `Effect`) and is sent back the result, or has the error thrown into it at
that point. Two drivers run the same flow:

* `drive`, from synchronous code (Django's views, the fast path's middleware, Celery tasks): each effect
  done in place;
* `adrive`, from the web server's event loop (fastpath.HotPathASGI, the websocket server): a round trip
  to Redis awaited on the loop, and what may read the database (`Blocking`: a queue's policy synced from
  its row, signing keys loaded, a pre-queue's opening time) run in a thread of its own, so the loop never
  waits on the database and the request never has to start over on the other path.

Effects:

* `Execute(plan)`: one round trip to Redis (store.Plan: script calls and how to read their replies);
* `Publish(messages)`: the events a transition must publish before its answer is given (realtime);
* `Blocking(call)`: synchronous code that may read the database.

Inside a flow, `yield from execute(plan)` (and `publish`, `blocking`) gives the result typed; a flow that
calls another one does so with `yield from`. A failure of the effect (a Redis error, a refusal the plan's
reading raised, the request's task cancelled on the event loop) is raised inside the flow where it yielded,
so it handles it as it would a call's: a flow that took something (a priority code's use) gives it back in
an `except BaseException` that may still yield, then raises again. A driver never closes a flow early.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from channels.db import database_sync_to_async

from . import realtime, store

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Execute(Generic[T]):
    """One round trip to Redis: the plan's calls, read by the plan."""

    plan: store.Plan[T]

    def run(self) -> T:
        return store.execute(self.plan)

    async def arun(self) -> T:
        return await store.aexecute(self.plan)


@dataclass(frozen=True, slots=True)
class Publish:
    """Events to publish (one pipelined round trip; nothing when there are none)."""

    messages: Sequence[realtime.Message]

    def run(self) -> int:
        return realtime.send(self.messages)

    async def arun(self) -> int:
        return await realtime.asend(self.messages)


@dataclass(frozen=True, slots=True)
class Blocking(Generic[T]):
    """Synchronous code that may read the database: in place, or from the event loop in a thread of its
    own (its database connection closed as after a request)."""

    call: Callable[[], T]

    def run(self) -> T:
        return self.call()

    async def arun(self) -> T:
        result: T = await database_sync_to_async(self.call, thread_sensitive=False)()
        return result


Effect = Execute[Any] | Publish | Blocking[Any]
Flow = Generator[Effect, Any, T]


def execute(plan: store.Plan[T]) -> Flow[T]:
    """`yield from execute(plan)`: the plan's reading of its round trip."""
    result: T = yield Execute(plan)
    return result


def publish(messages: Sequence[realtime.Message]) -> Flow[None]:
    if messages:
        yield Publish(messages)


def blocking(call: Callable[[], T]) -> Flow[T]:
    result: T = yield Blocking(call)
    return result


def done(call: Callable[[], T]) -> Flow[T]:
    """A synchronous call as a flow (for synchronous callers of a flow that takes one: `drive` only)."""
    return call()
    yield  # a generator that yields nothing


def drive(flow: Flow[T]) -> T:
    """Run a flow from synchronous code."""
    try:
        effect = next(flow)
        while True:
            try:
                result = effect.run()
            except BaseException as exc:  # raised in the flow, where it yielded
                effect = flow.throw(exc)
            else:
                effect = flow.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


def synchronous(flow: Callable[P, Flow[T]]) -> Callable[P, T]:
    """A flow function as a plain function for synchronous callers (its flow driven in place)."""

    @functools.wraps(flow)
    def driven(*args: P.args, **kwargs: P.kwargs) -> T:
        return drive(flow(*args, **kwargs))

    return driven


async def adrive(flow: Flow[T]) -> T:
    """Run a flow from the event loop."""
    try:
        effect = next(flow)
        while True:
            try:
                result = await effect.arun()
            except BaseException as exc:  # a cancellation too: the flow gives back what it took, then ends
                effect = flow.throw(exc)
            else:
                effect = flow.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
