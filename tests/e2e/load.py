"""The load the end-to-end fault tests put on the product: visitors polling their tickets over HTTP (one web
server or several), a protected site verifying and completing their sessions, and a watch on the slots in
use; what they saw is kept in a Record, checked against the product's promises by the tests."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

SESSION_SECONDS = 1.0  # how long the protected site keeps a visitor before completing


@dataclass
class Record:
    """What the visitors and the site saw."""

    answers: dict[str, int] = field(default_factory=dict)  # "200", "503", "connection", …
    violations: list[str] = field(default_factory=list)  # anything outside the promises
    lost: set[str] = field(default_factory=set)
    slow: float = 0.0  # the longest answer, seconds
    admitted_at: dict[str, float] = field(default_factory=dict)  # ticket -> when first seen admitted
    most_used: int = 0
    bounced: dict[str, str] = field(default_factory=dict)  # ticket -> why the site's verify said no
    errors_at: list[float] = field(default_factory=list)  # when a 503 or a cut connection was seen
    completed: list[tuple[float, str]] = field(default_factory=list)  # (when answered 204, access token)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, when: float) -> None:
        with self.lock:
            self.answers[kind] = self.answers.get(kind, 0) + 1
            if kind != "2xx":
                self.errors_at.append(when)


def slots_in_use(client: redis.Redis, prefix: str, slug: str) -> int:
    """The slots a queue has in use at one moment: its live claims and sessions, past their end not counted
    (both keys in the queue's slot: one transaction, on a single Redis or a cluster)."""
    pipe = client.pipeline(transaction=True)
    for name in ("claims", "sessions"):
        pipe.zcount(f"{prefix}:{{{slug}}}:{name}", int(time.time() * 1000), "+inf")
    return int(sum(pipe.execute()))


class Load:
    """Visitors polling their tickets and a protected site verifying and completing sessions, each request
    to one of `bases` (web servers of one product) at random; `connect` gives a client of the live state,
    for the watch on the slots in use."""

    def __init__(
        self, bases: str | Sequence[str], slug: str, api_key: str, connect: Callable[[], redis.Redis], prefix: str
    ) -> None:
        self.bases = [bases] if isinstance(bases, str) else list(bases)
        self.slug, self.api_key, self.connect, self.prefix = slug, api_key, connect, prefix
        self.tickets: dict[str, str] = {}  # ticket id -> ticket token
        self.joined_at: dict[str, float] = {}  # ticket id -> when its join was answered
        self.join_sent_at: dict[str, float] = {}  # ticket id -> when its join was sent (by _join)
        self.finished: set[str] = set()
        self.record = Record()
        self.stopping = threading.Event()
        self.joining = threading.Event()  # set: no more joins
        self.threads: list[threading.Thread] = []
        self.sessions: list[tuple[float, str, float]] = []  # (complete at, access token, the session's end)

    def join_all(self, count: int) -> list[dict[str, Any]]:
        """`count` visitors join, each through the web servers in turn; their join answers."""

        def one(index: int) -> dict[str, Any]:
            with httpx.Client(base_url=self.bases[index % len(self.bases)], timeout=30) as client:
                answer = client.post(
                    f"/api/v1/queues/{self.slug}/join", json={}, headers={"X-Visitor-Id": str(uuid.uuid4())}
                )
                assert answer.status_code == 201, answer.text
                body: dict[str, Any] = answer.json()
                self.tickets[body["ticket_id"]] = body["ticket"]
                self.joined_at[body["ticket_id"]] = time.time()
                return body

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, range(count)))

    def _join(self, per_second: float) -> None:
        """Visitors keep joining, through any web server (a 503 is counted, as every answer is)."""
        with self._clients() as clients:
            while not self.stopping.wait(1 / per_second) and not self.joining.is_set():
                sent = time.time()
                answer = self._call(
                    random.choice(clients),
                    "POST",
                    f"/api/v1/queues/{self.slug}/join",
                    json={},
                    headers={"X-Visitor-Id": str(uuid.uuid4())},
                    ok=(201,),
                )
                if answer is not None:
                    body = answer.json()
                    self.tickets[body["ticket_id"]] = body["ticket"]
                    self.joined_at[body["ticket_id"]] = time.time()
                    self.join_sent_at[body["ticket_id"]] = sent

    def _call(
        self, client: httpx.Client, method: str, path: str, ok: Sequence[int] = (200, 204), **kwargs: Any
    ) -> httpx.Response | None:
        started = time.monotonic()
        try:
            answer = client.request(method, path, **kwargs)
        except httpx.TransportError:
            self.record.count("connection", time.time())
            return None
        took = time.monotonic() - started
        with self.record.lock:
            self.record.slow = max(self.record.slow, took)
        kind = "2xx" if answer.status_code in ok else str(answer.status_code)
        self.record.count(kind, time.time())
        if answer.status_code == 503:
            error = (
                answer.json().get("error", {})
                if answer.headers.get("content-type", "").startswith("application/json")
                else {}
            )
            if error.get("code") != "service_unavailable" or "Retry-After" not in answer.headers:
                self.record.violations.append(f"503 not in the error shape: {answer.text[:200]}")
            time.sleep(0.5)  # as a client that honours Retry-After would, if more eagerly
            return None
        if answer.status_code not in ok:
            self.record.violations.append(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
            return None
        return answer

    @contextlib.contextmanager
    def _clients(self) -> Iterator[list[httpx.Client]]:
        """A client of each web server, closed afterwards."""
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(httpx.Client(base_url=base, timeout=30)) for base in self.bases]

    def _polling(self) -> Iterator[tuple[str, str]]:
        """The tickets still in play, each once a round, in a new order every round: every visitor polls
        now and then, as a waiting page does (drawn at random, some would go unpolled past their claim)."""
        while not self.stopping.is_set():
            round_ = [(t, token) for t, token in list(self.tickets.items()) if t not in self.finished]
            if not round_:
                time.sleep(0.1)
            random.shuffle(round_)
            yield from round_

    def _poll(self) -> None:
        with self._clients() as clients:
            for ticket_id, ticket in self._polling():
                if self.stopping.is_set():
                    return
                if ticket_id in self.finished:
                    continue
                client = random.choice(clients)
                answer = self._call(
                    client, "GET", f"/api/v1/queues/{self.slug}/status", headers={"Authorization": f"Bearer {ticket}"}
                )
                if answer is None:
                    continue
                body = answer.json()
                if body["status"] == "expired" and not body.get("reason"):
                    with self.record.lock:
                        self.record.lost.add(ticket_id)
                elif body["status"] == "expired":
                    self.record.violations.append(f"{ticket_id} expired: {body.get('reason')}")
                    self.finished.add(ticket_id)
                elif body["status"] == "admitted" and ticket_id not in self.record.admitted_at:
                    with self.record.lock:
                        self.record.admitted_at[ticket_id] = time.time()
                    self.finished.add(ticket_id)
                    verdict = self._site(client, "verify", body["access_token"])
                    if verdict is not None and not verdict.json()["valid"]:
                        # The site sends the visitor back to the waiting page, which polls again.
                        with self.record.lock:
                            self.record.bounced[ticket_id] = verdict.json().get("reason", "")
                            del self.record.admitted_at[ticket_id]
                        self.finished.discard(ticket_id)
                        continue
                    # Completed SESSION_SECONDS later, but before the session's own end: a visitor polled
                    # late in its claim (one poller goes round every ticket) is verified near that end.
                    ends_at = verdict.json()["expires_at"] if verdict is not None else time.time()
                    due = time.monotonic() + max(0.0, min(SESSION_SECONDS, ends_at - time.time() - 1))
                    with self.record.lock:
                        self.sessions.append((due, body["access_token"], ends_at))

    def _site(self, client: httpx.Client, action: str, token: str) -> httpx.Response | None:
        return self._call(
            client,
            "POST",
            f"/api/v1/queues/{self.slug}/sessions/{action}",
            json={"access_token": token},
            headers={"Authorization": f"Api-Key {self.api_key}"},
        )

    def _complete(self) -> None:
        with self._clients() as clients:
            while not self.stopping.is_set():
                client = random.choice(clients)
                now = time.monotonic()
                with self.record.lock:
                    due = [s for s in self.sessions if s[0] <= now]
                    self.sessions = [s for s in self.sessions if s[0] > now]
                for _, token, ends_at in due:
                    # A completion that reaches the product after the session's end (expires_at, floored to
                    # the second) is answered 409 expired, as documented: the site was late, not the product.
                    late = time.time() >= ends_at
                    done = self._call(
                        client,
                        "POST",
                        f"/api/v1/queues/{self.slug}/sessions/complete",
                        ok=(200, 204, 409) if late else (200, 204),
                        json={"access_token": token},
                        headers={"Authorization": f"Api-Key {self.api_key}"},
                    )
                    if done is not None and done.status_code == 409 and done.json()["error"]["reason"] != "expired":
                        self.record.violations.append(f"a late completion: 409 {done.text[:200]}")
                    elif done is not None and done.status_code == 204:
                        with self.record.lock:
                            self.record.completed.append((time.time(), token))
                time.sleep(0.1)

    def _watch(self) -> None:
        client = self.connect()
        while not self.stopping.is_set():
            try:
                used = slots_in_use(client, self.prefix, self.slug)
                with self.record.lock:
                    self.record.most_used = max(self.record.most_used, used)
            except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
                pass
            time.sleep(0.05)
        client.close()

    def start(self, *, pollers: int = 3, joins_per_second: float = 0) -> None:
        targets: list[Callable[[], None]] = [*[self._poll] * pollers, self._complete, self._watch]
        if joins_per_second:
            targets.append(lambda: self._join(joins_per_second))
        self.threads = [threading.Thread(target=target, daemon=True) for target in targets]
        for thread in self.threads:
            thread.start()

    def stop_joining(self) -> None:
        self.joining.set()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=40)

    def still_live(self, tokens: list[str]) -> list[str]:
        """Of these access tokens, those whose sessions the product holds as live (the site's verify says
        valid): a completion that answered 204 and was undone."""
        live = []
        with httpx.Client(base_url=self.bases[0], timeout=10, trust_env=False) as client:
            for token in tokens:
                answer = self._site(client, "verify", token)
                if answer is not None and answer.status_code == 200 and answer.json()["valid"]:
                    live.append(token)
        return live

    def admissions_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first admission seen after it."""
        later = [at for at in self.record.admitted_at.values() if at > moment]
        return min(later) - moment if later else None
