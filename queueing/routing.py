from typing import Any

from django.urls import path

from . import consumers, converters  # noqa: F401  (converters registers the "queue" path converter)

# Channels routes ASGI apps with Django's path(); django-stubs types path() for views only.
websocket_urlpatterns: list[Any] = [
    path("ws/queues/<queue:slug>/", consumers.QueueConsumer.as_asgi()),  # type: ignore[arg-type]
]
