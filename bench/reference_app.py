"""The framework-free reference for the status benchmark: a bare ASGI app doing only what a status poll
must do at minimum, a ticket check (PyJWT, HS256, audience) and one Redis GET. Served by uvicorn.

    WR_TICKET_SIGNING_KEY=... BENCH_REDIS_URL=... uvicorn bench.reference_app:app --workers 2
"""

from __future__ import annotations

import json
import os
from typing import Any

import jwt
import redis.asyncio as aioredis

KEY = os.environ["WR_TICKET_SIGNING_KEY"]
AUDIENCE = os.environ.get("BENCH_QUEUE", "bench")
REDIS_KEY = os.environ.get("BENCH_REFERENCE_KEY", "wrbench:reference")
_redis: aioredis.Redis | None = None


async def _send(send: Any, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _redis
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _redis = aioredis.Redis.from_url(os.environ["BENCH_REDIS_URL"], decode_responses=True)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization", b"").decode()
    try:
        claims = jwt.decode(auth.removeprefix("Bearer "), KEY, algorithms=["HS256"], audience=AUDIENCE)
    except jwt.PyJWTError:
        await _send(send, 401, {"error": {"code": "invalid_ticket", "message": "bad ticket"}})
        return
    assert _redis is not None
    value = await _redis.get(REDIS_KEY)
    await _send(send, 200, {"status": "waiting", "ticket_id": claims.get("tid"), "value": value})
