"""The websocket server as runstack starts it, in a test's own event loop, and raw clients for it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator

from waitingroom_site import runstack

from .stack import free_port


def client_frame(text: str) -> bytes:
    """A masked text frame, as a browser sends it."""
    payload, mask = text.encode(), os.urandom(4)
    head = bytes([0x81])
    head += (
        bytes([0x80 | len(payload)]) if len(payload) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def stalled_client(port: int, slug: str, ticket: str) -> socket.socket:
    """Opens the socket, says hello and never reads again (a tiny receive buffer fills at once)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET /ws/queues/{slug}/ HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    answer = await asyncio.to_thread(sock.recv, 4096)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    sock.sendall(client_frame(json.dumps({"type": "hello", "ticket": ticket})))
    return sock


@contextlib.asynccontextmanager
async def websocket_server(ws: str = runstack.WS_PROTOCOL) -> AsyncIterator[int]:
    """The websocket server as runstack starts it (uvicorn, the sans-I/O protocol in its lean form unless `ws`
    names another), in this test's loop, on a free port; yields the port."""
    import uvicorn

    from waitingroom_site.asgi import application

    port = free_port()
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=port,
        ws=ws,
        ws_per_message_deflate=False,
        ws_max_size=4096,
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            assert not serving.done(), serving
            await asyncio.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
