"""`ws /ws/dashboard/` (SPEC 7): staff only. Sends every queue's live figures every few seconds and
forwards the dashboard group's events (a new snapshot, a change made by someone)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from . import selectors
from .services import DASHBOARD_GROUP

CLOSE_NOT_STAFF = 4403


class DashboardConsumer(AsyncWebsocketConsumer):
    live: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user: Any = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=CLOSE_NOT_STAFF)  # before accept: the handshake is refused
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        self.live = asyncio.ensure_future(self._live())

    async def disconnect(self, code: int) -> None:
        if self.live is None:
            return
        self.live.cancel()
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def queue_event(self, message: dict[str, Any]) -> None:
        await self.send(text_data=message["text"])
        if '"changed"' in message["text"]:
            await self._send_live()  # someone changed a queue: show the effect now

    async def _send_live(self) -> None:
        with contextlib.suppress(redis.RedisError):  # the next round will do
            cards = await database_sync_to_async(selectors.dashboard_cards)()
            await self.send(text_data=json.dumps({"type": "live", "queues": cards}))

    async def _live(self) -> None:
        while True:
            await self._send_live()
            await asyncio.sleep(settings.WR_DASHBOARD_LIVE_SECONDS)
