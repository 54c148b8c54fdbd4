"""Servers a test starts to receive what the product sends: an HTTP receiver for webhooks, an SMTP server for
e-mail."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


class Receiver:
    """A real HTTP server on a free port that keeps what it is sent and answers as told."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int] = []  # answered in order; 200 once they run out
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    code = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b"not now" if code >= 400 else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/waiting-room"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.seen]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """What a real SMTP server (aiosmtpd) was sent: (recipients, parsed message) in order."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content, policy=policy.default)))
        return "250 Message accepted for delivery"


@contextmanager
def smtp_server() -> Iterator[tuple[Mailbox, int]]:
    """A real SMTP server on a free port of 127.0.0.1, stopped after: (its mailbox, its port)."""
    box = Mailbox()
    with socket.socket() as probe:  # aiosmtpd needs a port it can name (it connects to itself once started)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()
