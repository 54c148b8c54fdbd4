"""The websocket clients of bench/push_bench.py, in a process of their own (several run side by side), so
that their CPU is theirs and not counted as the server's or the admitting process's.

    .venv/bin/python bench/push_clients.py --tickets FILE --out FILE [--origin URL] [--compression none]

FILE holds [{"ticket", "ticket_id", "ws_url"}, ...]. It opens a socket per ticket (saying hello with the
ticket), prints `OPEN <open> <failures>` and then reads every socket until told to stop. On its stdin it
takes `STATS` (prints one JSON line of message counts so far) and `STOP` (closes everything, writes what
it heard to --out and prints `DONE`). What it heard: when each `admitted` arrived (by ticket; the push and
the socket's own status read apart), when each `queue_move` reached its last socket here (by sequence)
and at how many, and how many other messages came by type. Every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


class Clients:
    """N websocket clients, each reading forever and noting when its messages arrive."""

    def __init__(self, origin: str, compression: str | None) -> None:
        self.origin = origin
        self.compression = compression
        self.sockets: list[Any] = []
        self.readers: list[asyncio.Task[None]] = []
        self.pushed_at: dict[str, list[float]] = {}  # `admitted` events pushed by queue_admit
        self.polled_at: dict[str, list[float]] = {}  # `admitted` sent by the socket's own status read
        self.move_last: dict[int, float] = {}
        self.move_count: Counter[int] = Counter()
        self.other: Counter[str] = Counter()
        self.closed_early = 0
        self.connect_failures = 0

    async def open_all(self, tickets: list[dict[str, Any]], concurrency: int) -> None:
        from websockets.asyncio.client import connect

        gate = asyncio.Semaphore(concurrency)

        async def open_one(ticket: dict[str, Any]) -> None:
            async with gate:
                for attempt in range(3):
                    try:
                        ws = await connect(
                            ticket["ws_url"],
                            origin=self.origin,  # type: ignore[arg-type]
                            compression=self.compression,
                            proxy=None,
                            open_timeout=60,
                            ping_interval=None,  # the server pings; the client answers
                            close_timeout=5,
                            max_queue=None,
                        )
                        # The ticket goes in the first message, not the URL (the server answers "ready").
                        await ws.send(json.dumps({"type": "hello", "ticket": ticket["ticket"]}))
                        break
                    except Exception:  # refused, reset, timed out: try again
                        if attempt == 2:
                            self.connect_failures += 1
                            return
                        await asyncio.sleep(0.5)
            self.sockets.append(ws)
            self.readers.append(asyncio.ensure_future(self._read(ws)))

        await asyncio.gather(*(open_one(t) for t in tickets))

    async def _read(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in ws:
                now = time.time()
                if '"admitted"' in message:
                    event = json.loads(message)
                    if event.get("type") == "admitted":
                        arrivals = self.pushed_at if event.get("via") == "push" else self.polled_at
                        arrivals.setdefault(event["ticket_id"], []).append(now)
                        continue
                if '"queue_move"' in message:
                    seq = int(json.loads(message)["seq"])
                    self.move_count[seq] += 1
                    if now > self.move_last.get(seq, 0.0):
                        self.move_last[seq] = now
                    continue
                kind = message.split('"type": "', 1)[-1].split('"', 1)[0] if '"type": "' in message else "?"
                self.other[kind] += 1
        except ConnectionClosed:
            self.closed_early += 1

    async def close_all(self) -> None:
        gate = asyncio.Semaphore(200)

        async def close(ws: Any) -> None:
            async with gate:
                with contextlib.suppress(Exception):  # closing is best effort; the stack stops next
                    await asyncio.wait_for(ws.close(), 10)

        closing = self.closed_early
        await asyncio.gather(*(close(ws) for ws in self.sockets))
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        self.closed_early = closing  # the ones we closed do not count

    def heard(self) -> dict[str, Any]:
        return {
            "pushed_at": self.pushed_at,
            "polled_at": self.polled_at,
            "move_last": self.move_last,
            "move_count": self.move_count,
            "other": self.other,
            "closed_by_server": self.closed_early,
            "connect_failures": self.connect_failures,
            "open": len(self.sockets),
        }


async def main(args: argparse.Namespace) -> None:
    tickets = json.loads(Path(args.tickets).read_text())
    clients = Clients(args.origin, None if args.compression == "none" else "deflate")
    await clients.open_all(tickets, args.concurrency)
    # The clients' own thousands of long-lived objects out of the collector's way, so that a full
    # collection in this process does not pass for push latency.
    gc.collect()
    gc.freeze()
    print(f"OPEN {len(clients.sockets)} {clients.connect_failures}", flush=True)
    while True:
        line = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if line == "STATS":
            print(json.dumps({"other": clients.other, "closed_by_server": clients.closed_early}), flush=True)
        elif line in ("STOP", ""):  # "": the bench went away
            break
    await clients.close_all()
    Path(args.out).write_text(json.dumps(clients.heard()))
    print("DONE", flush=True)


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
    parser.add_argument("--origin", default="http://127.0.0.1")
    parser.add_argument("--compression", choices=["deflate", "none"], default="none")
    parser.add_argument("--concurrency", type=int, default=100)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main(parser.parse_args()))
