"""The websocket clients of bench/push_bench.py, in a process of their own (several run side by side), so
that their CPU is theirs and not counted as the server's or the admitting process's.

    .venv/bin/python bench/push_clients.py --tickets FILE --out FILE [--concurrency 50]

FILE holds [{"ticket", "ticket_id", "ws_url"}, ...]. It opens a socket per ticket (saying hello with the
ticket), prints `OPEN <open> <failures>` and then reads every socket until told to stop. On its stdin it
takes `STATS` (prints one JSON line of message counts so far), `CLOSE k` (closes its last k sockets, the
back of the line, at once, and prints one JSON line when the server has closed them all) and `STOP`
(closes everything, writes what it heard to --out and prints `DONE`). What it heard: when each `admitted`
arrived (by ticket; the push and the socket's own status read apart), when each `queue_move` reached its
last socket here (by sequence) and at how many, the same for each `state` event (by its order), and how
many other messages came by type. Every connection goes to 127.0.0.1.

The clients are plain asyncio protocols speaking RFC 6455 themselves (the handshake, masked frames out,
pings answered), not a websockets library: at 18,000 sockets and two events a second each, a library's
per-message work took more CPU than the server it measured (bench/RESULTS.md). A message is looked at
only as far as its figures need: its type, and for `queue_move` its sequence number.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SEQ = b'"seq": '
STATE = b'{"type": "state"'


class Heard:
    """What every socket of this process heard."""

    def __init__(self) -> None:
        self.pushed_at: dict[str, list[float]] = {}  # `admitted` events pushed by queue_admit
        self.polled_at: dict[str, list[float]] = {}  # `admitted` sent by the socket's own status read
        self.move_last: dict[int, float] = {}
        self.move_count: Counter[int] = Counter()
        self.state_last: dict[int, float] = {}  # the k-th `state` event a socket heard: when the last heard it
        self.state_count: Counter[int] = Counter()
        self.other: Counter[str] = Counter()
        self.closed_by_server = 0

    def state(self, ordinal: int, now: float) -> None:
        self.state_count[ordinal] += 1
        if now > self.state_last.get(ordinal, 0.0):
            self.state_last[ordinal] = now

    def message(self, payload: bytes, now: float) -> None:
        if b'"queue_move"' in payload[:40]:
            at = payload.find(SEQ) + len(SEQ)
            end = at
            while payload[end : end + 1].isdigit():
                end += 1
            seq = int(payload[at:end])
            self.move_count[seq] += 1
            if now > self.move_last.get(seq, 0.0):
                self.move_last[seq] = now
            return
        if b'"admitted"' in payload[:40]:
            event = json.loads(payload)
            arrivals = self.pushed_at if event.get("via") == "push" else self.polled_at
            arrivals.setdefault(event["ticket_id"], []).append(now)
            return
        start = payload.find(b'"type": "') + 9
        self.other[payload[start : payload.find(b'"', start)].decode() if start >= 9 else "?"] += 1


def masked(opcode: int, payload: bytes) -> bytes:
    """A client's frame (RFC 6455 5.2: clients mask)."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    key = (mask * (n // 4 + 1))[:n]
    return head + mask + bytes(a ^ b for a, b in zip(payload, key, strict=True))


class Client(asyncio.Protocol):
    def __init__(
        self, heard: Heard, request: bytes, hello: bytes, ready: asyncio.Future[bool], ticket_id: str = ""
    ) -> None:
        self.heard, self.request, self.hello, self.ready = heard, request, hello, ready
        self.ticket_id = ticket_id
        self.buffer = bytearray()
        self.upgraded = False
        self.transport: Any = None
        self.closing = False
        self.states = 0  # `state` events heard
        self.lost: asyncio.Future[None] | None = None  # set when a close was asked: done when it is closed

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.buffer.startswith(b"HTTP/1.1 101"):
                self._fail()
                return
            del self.buffer[: end + 4]
            self.upgraded = True
            self.transport.write(self.hello)
            if not self.ready.done():
                self.ready.set_result(True)
        now = time.time()
        buffer = self.buffer
        while len(buffer) >= 2:
            opcode, length, at = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length == 126:
                if len(buffer) < 4:
                    return
                length, at = struct.unpack_from("!H", buffer, 2)[0], 4
            elif length == 127:
                if len(buffer) < 10:
                    return
                length, at = struct.unpack_from("!Q", buffer, 2)[0], 10
            if len(buffer) < at + length:
                return
            payload = bytes(buffer[at : at + length])
            del buffer[: at + length]
            if opcode == 0x1 and self.closing:
                pass  # its visitor left: what still comes before the server's close is heard by nobody
            elif opcode == 0x1:
                if payload.startswith(STATE):
                    self.states += 1
                    self.heard.state(self.states, now)
                else:
                    self.heard.message(payload, now)
            elif opcode == 0x9:  # ping: the server closes a socket that does not answer
                self.transport.write(masked(0xA, payload))
            elif opcode == 0x8:
                if not self.closing:
                    self.heard.closed_by_server += 1
                    self.closing = True
                    self.transport.write(masked(0x8, payload[:2]))
                self.transport.close()
                return

    def _fail(self) -> None:
        if not self.ready.done():
            self.ready.set_result(False)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_result(False)
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.closing = True
            self.transport.write(masked(0x8, struct.pack("!H", 1000)))

    def close_noting(self) -> asyncio.Future[None]:
        """Close it (as close()), with a future done when the server has closed the connection."""
        self.lost = asyncio.get_running_loop().create_future()
        if self.transport is None or self.transport.is_closing():
            self.lost.set_result(None)
        self.close()
        return self.lost


def _factory(heard: Heard, request: bytes, hello: bytes, ready: asyncio.Future[bool], ticket_id: str) -> Any:
    return lambda: Client(heard, request, hello, ready, ticket_id)


async def open_all(heard: Heard, tickets: list[dict[str, Any]], concurrency: int) -> tuple[list[Client], int]:
    """The tickets' sockets, in the tickets' order (the line's), those that failed left out."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    opened: dict[int, Client] = {}
    failures = 0

    async def open_one(index: int, ticket: dict[str, Any]) -> None:
        nonlocal failures
        url = urlsplit(ticket["ws_url"])
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nOrigin: http://{url.netloc}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        hello = masked(0x1, json.dumps({"type": "hello", "ticket": ticket["ticket"]}).encode())
        async with gate:
            for _attempt in range(3):
                ready: asyncio.Future[bool] = loop.create_future()
                try:
                    _, client = await loop.create_connection(
                        _factory(heard, request, hello, ready, ticket["ticket_id"]), url.hostname, url.port
                    )
                    if await asyncio.wait_for(ready, 60):
                        opened[index] = client
                        return
                except (OSError, TimeoutError):
                    pass
                await asyncio.sleep(0.5)
            failures += 1

    await asyncio.gather(*(open_one(i, t) for i, t in enumerate(tickets)))
    return [opened[i] for i in sorted(opened)], failures


async def main(args: argparse.Namespace) -> None:
    tickets = json.loads(Path(args.tickets).read_text())
    heard = Heard()
    clients, failures = await open_all(heard, tickets, args.concurrency)
    # The clients' own long-lived objects out of the collector's way, so that a full collection in this
    # process does not pass for push latency.
    gc.collect()
    gc.freeze()
    print(f"OPEN {len(clients)} {failures}", flush=True)
    while True:
        line = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if line == "STATS":
            print(json.dumps({"other": heard.other, "closed_by_server": heard.closed_by_server}), flush=True)
        elif line.startswith("CLOSE "):  # the last k sockets (the back of the line) at once
            clients, closed = await close_crowd(clients, int(line.split()[1]))
            print(json.dumps(closed), flush=True)
        elif line in ("STOP", ""):  # "": the bench went away
            break
    for client in clients:
        client.close()
    await asyncio.sleep(1)
    result = {
        "pushed_at": heard.pushed_at,
        "polled_at": heard.polled_at,
        "move_last": heard.move_last,
        "move_count": heard.move_count,
        "state_last": heard.state_last,
        "state_count": heard.state_count,
        "other": heard.other,
        "closed_by_server": heard.closed_by_server,
        "connect_failures": failures,
        "open": len(clients),
    }
    Path(args.out).write_text(json.dumps(result))
    print("DONE", flush=True)


async def close_crowd(clients: list[Client], k: int) -> tuple[list[Client], dict[str, Any]]:
    """Close the last k of the sockets in one go, as a proxy's restart or the end of a sale does; what stays,
    and the ticket ids closed, how long sending the closes took and how long until the server had closed
    every one."""
    crowd, stay = clients[len(clients) - k :] if k else [], clients[: len(clients) - k]
    started = time.monotonic()
    waits = [client.close_noting() for client in crowd]
    sent = time.monotonic() - started
    await asyncio.wait_for(asyncio.gather(*waits), 120)
    closed = {"closed": len(crowd), "sent_s": round(sent, 3), "all_closed_s": round(time.monotonic() - started, 3)}
    return stay, {**closed, "ticket_ids": [client.ticket_id for client in crowd]}


def _loop_factory() -> Any:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=50)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main(parser.parse_args()))
