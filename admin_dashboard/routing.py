from typing import Any

from channels.auth import AuthMiddlewareStack
from django.urls import path

from . import consumers

# Staff sockets need the logged-in user: these routes carry the session machinery themselves.
websocket_urlpatterns: list[Any] = [
    path("ws/dashboard/", AuthMiddlewareStack(consumers.DashboardConsumer.as_asgi())),  # type: ignore[arg-type]
]
