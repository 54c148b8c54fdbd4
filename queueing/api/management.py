"""The management API's priority levels and API keys (issue 19): what admin does with them, for automation,
by staff or a management key, audited alike. Queues, their schedules and codes are in views.py."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services
from ..models import PriorityLevel, Queue, QueueAPIKey
from . import serializers as s
from .errors import ApiError
from .permissions import needs
from .schema import JSON_BODY, error_responses
from .views import STAFF_AUTH, _StaffView, _validated

STAFF_ERRORS = (401, 403, 406, 429, 503)


def _levels(queue: Queue) -> list[dict[str, Any]]:
    return [
        {
            "level": level.level,
            "name": level.name,
            "placement_fraction": level.placement_fraction,
            "group": level.group.name if level.group else None,
        }
        for level in PriorityLevel.objects.filter(queue=queue).select_related("group").order_by("level")
    ]


class LevelsView(_StaffView):
    def get_permissions(self) -> list[Any]:
        return (
            [needs("queueing.view_prioritylevel")()]
            if self.request.method == "GET"
            else [needs("queueing.change_prioritylevel")()]
        )

    @extend_schema(
        operation_id="priority_levels_get",
        summary="A queue's four priority levels",
        responses={200: s.LevelSerializer(many=True), **error_responses(*STAFF_ERRORS)},
        auth=STAFF_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        return Response(_levels(self.queue(slug)))

    @extend_schema(
        operation_id="priority_levels_update",
        summary="Change some of a queue's priority levels (validated as in admin, all or none; audited)",
        request=s.LevelsPatchSerializer,
        examples=[
            OpenApiExample(
                "VIPs placed ahead of three quarters of the line",
                value={"levels": [{"level": 2, "name": "VIP", "placement_fraction": 0.75}]},
                request_only=True,
            )
        ],
        responses={200: s.LevelSerializer(many=True), **error_responses(*JSON_BODY, *STAFF_ERRORS)},
        auth=STAFF_AUTH,
    )
    def patch(self, request: Request, slug: str) -> Response:
        queue = self.queue(slug)
        data = _validated(s.LevelsPatchSerializer, request.data)
        try:
            services.queue_priority_levels_update(
                queue, levels=[dict(level) for level in data["levels"]], actor=request.user
            )
        except ValidationError as exc:
            raise ApiError("invalid_request", "The levels are not valid.", fields=exc.message_dict) from exc
        return Response(_levels(queue))


def _key(api_key: QueueAPIKey) -> dict[str, Any]:
    return {
        "prefix": api_key.prefix,
        "name": api_key.name,
        "created": api_key.created,
        "expiry_date": api_key.expiry_date,
        "revoked": api_key.revoked,
    }


class KeysView(_StaffView):
    def get_permissions(self) -> list[Any]:
        return (
            [needs("queueing.view_queueapikey")()]
            if self.request.method == "GET"
            else [needs("queueing.add_queueapikey")()]
        )

    @extend_schema(
        operation_id="api_key_list",
        summary="A queue's API keys (their prefixes and names; the keys themselves are never shown again)",
        responses={200: s.ApiKeySerializer(many=True), **error_responses(*STAFF_ERRORS)},
        auth=STAFF_AUTH,
    )
    def get(self, request: Request, slug: str) -> Response:
        keys = QueueAPIKey.objects.filter(queue=self.queue(slug)).order_by("created")
        return Response(s.ApiKeySerializer([_key(key) for key in keys], many=True).data)

    @extend_schema(
        operation_id="api_key_create",
        summary="A new API key for the queue's protected site, shown this once (audited without it)",
        request=s.ApiKeyCreateSerializer,
        examples=[OpenApiExample("The shop's checkout", value={"name": "shop checkout"}, request_only=True)],
        responses={201: s.ApiKeyCreatedSerializer, **error_responses(*JSON_BODY, *STAFF_ERRORS)},
        auth=STAFF_AUTH,
    )
    def post(self, request: Request, slug: str) -> Response:
        queue = self.queue(slug)
        data = _validated(s.ApiKeyCreateSerializer, request.data)
        api_key, key = services.api_key_create(queue, name=data["name"], actor=request.user)
        if data.get("expiry_date"):
            api_key.expiry_date = data["expiry_date"]
            api_key.save(update_fields=["expiry_date"])
        return Response(s.ApiKeyCreatedSerializer({**_key(api_key), "key": key}).data, status=201)


class KeyView(_StaffView):
    permission_classes = [needs("queueing.change_queueapikey")]

    @extend_schema(
        operation_id="api_key_revoke",
        summary="Revoke one of a queue's API keys: its site is refused at once (audited)",
        responses={204: None, **error_responses(401, 403, 404, 406, 429, 503)},
        auth=STAFF_AUTH,
    )
    def delete(self, request: Request, slug: str, prefix: str) -> Response:
        queue = self.queue(slug)
        try:
            services.api_key_revoke(queue, prefix=prefix, actor=request.user)
        except QueueAPIKey.DoesNotExist:
            raise ApiError("not_found", f"The queue {slug} has no API key {prefix}.") from None
        return Response(status=204)
