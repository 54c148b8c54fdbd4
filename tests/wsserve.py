"""The websocket server as runstack starts it, in a test's own event loop, and raw clients for it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

from waitingroom_site import runstack

from .stack import free_port


def client_frame(text: str | bytes, opcode: int = 0x1) -> bytes:
    """A masked frame (text unless `opcode` says otherwise), as a browser sends it."""
    payload, mask = (text.encode() if isinstance(text, str) else text), os.urandom(4)
    head = bytes([0x80 | opcode])
    head += (
        bytes([0x80 | len(payload)]) if len(payload) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def server_frame(sock: socket.socket) -> tuple[int, bytes]:
    """(opcode, payload) of the next frame the server sends (unmasked, RFC 6455 5.2); (-1, b"") at its end."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    try:
        first, length = exactly(2)
        if length & 0x7F == 126:
            length = struct.unpack("!H", exactly(2))[0]
        elif length & 0x7F == 127:
            length = struct.unpack("!Q", exactly(8))[0]
        return first & 0x0F, exactly(length & 0x7F if length < 126 else length)
    except (EOFError, ConnectionError):
        return -1, b""


async def stalled_client(port: int, slug: str, ticket: str, *, reading: bool = False) -> socket.socket:
    """Opens the socket and says hello; then it never reads again (a tiny receive buffer fills at once),
    unless `reading`: then the caller reads it (server_frame)."""
    sock = socket.socket()
    if not reading:
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
async def websocket_server(ws: str = runstack.WS_PROTOCOL, **options: Any) -> AsyncIterator[int]:
    """The websocket server as runstack starts it (uvicorn, the sans-I/O protocol in its lean form unless `ws`
    names another), in this test's loop, on a free port, with uvicorn's further `options`; yields the port."""
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
        **options,
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
