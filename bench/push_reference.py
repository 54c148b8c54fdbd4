"""The framework-free reference for bench/push_bench.py's public-event figure: a websocket server that does
nothing but accept sockets and write one frame, built once, to every one of them when told to, with no
checks, no yields and no Redis, on the same event loop (uvloop) the product's websocket server runs on.
What it measures is this machine's floor for one process: the loop over the sockets and the kernel's
loopback `send()` (on 127.0.0.1 the sender's call also does the receiver's TCP work).

    .venv/bin/python bench/push_reference.py --port PORT

It prints `LISTENING`; then, for each line `MOVE <seq>` on its stdin, it writes a `queue_move` event with
that sequence number to every socket and prints `SENT <seconds the writes took>`; for `PAUSE` it prints
`PAUSE <ms>`, the worst pause of its event loop since the last `PAUSE` (watched as the product's is, by a
task that wakes every 10 ms). A client's close frame is answered with one and the connection closed, as
the product does, so that a crowd closing at once costs this server what the kernel and the loop make it
cost and nothing more: the floor for bench/push_bench.py's `--mass-close`. The clients are
bench/push_clients.py's, which time the event's arrival at the last socket as they do for the product.
Every connection is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys
import time
from typing import Any

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 4.2.2


class Socket(asyncio.Protocol):
    def __init__(self, sockets: set[Any]) -> None:
        self.sockets = sockets
        self.buffer = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.transport in self.sockets:
            if data[:1] == b"\x88":  # a close (RFC 6455 5.5.1): answered, then the connection closed
                self.transport.write(CLOSE)
                self.transport.close()
            return  # the client's other frames (its hello): not read
        self.buffer += data
        head, found, _ = self.buffer.partition(b"\r\n\r\n")
        if not found:
            return
        key = next(
            (
                line.split(b":", 1)[1].strip()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:")
            ),
            b"",
        )
        accept = base64.b64encode(hashlib.sha1(key + GUID, usedforsecurity=False).digest())  # RFC 6455 asks SHA-1
        self.transport.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self.buffer = b""
        self.sockets.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.sockets.discard(self.transport)


CLOSE = bytes((0x88, 2)) + (1000).to_bytes(2, "big")  # unmasked, normal closure
WATCH_TICK_S = 0.01  # as queueing/loopwatch.py's TICK_SECONDS


async def watch(worst: list[float]) -> None:
    """How late each 10-ms sleep wakes: the loop's pauses (worst[0], the worst since it was last read)."""
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(WATCH_TICK_S)
        worst[0] = max(worst[0], (loop.time() - before - WATCH_TICK_S) * 1000)


def frame(seq: int) -> bytes:
    # About the size of the product's queue_move: the move of an admission round and the queue's figures.
    text = json.dumps({"type": "queue_move", "seq": seq, "ops": [["-", 0, 20]], "waiting": 17980, "eta_s": 450})
    payload = text.encode()
    return bytes((0x81, len(payload))) + payload  # a final text frame, unmasked, under 126 bytes


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    sockets: set[Any] = set()
    server = await loop.create_server(lambda: Socket(sockets), "127.0.0.1", args.port, backlog=4096)
    worst = [0.0]
    watching = asyncio.ensure_future(watch(worst))
    print("LISTENING", flush=True)
    try:
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).split()
            if line and line[0] == "PAUSE":
                print(f"PAUSE {worst[0]:.1f}", flush=True)
                worst[0] = 0.0
                continue
            if not line or line[0] != "MOVE":
                break
            data = frame(int(line[1]))
            started = time.perf_counter()
            for transport in list(sockets):
                transport.write(data)
            print(f"SENT {time.perf_counter() - started:.6f}", flush=True)
    finally:
        watching.cancel()
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(main(parser.parse_args()))
