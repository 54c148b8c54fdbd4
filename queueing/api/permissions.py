"""Who may call what: protected sites by per-queue API key, staff by session or staff JWT."""

from __future__ import annotations

from typing import Any, cast

from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework_api_key.permissions import KeyParser

from ..models import QueueAPIKey
from .errors import ApiError


class HasQueueApiKey(BasePermission):
    """`Authorization: Api-Key <key>` with a live key of the queue in the URL.

    Missing key: 401 authentication_required; unknown, revoked or expired key: 401 invalid_api_key;
    a valid key of another queue: 403 permission_denied.
    """

    key_parser = KeyParser()

    def has_permission(self, request: Request, view: Any) -> bool:
        key = self.key_parser.get(request)
        if not key:
            raise ApiError(
                "authentication_required",
                "Send the queue's API key as 'Authorization: Api-Key <key>'.",
                headers={"WWW-Authenticate": "Api-Key"},
            )
        api_key: QueueAPIKey | None
        try:
            api_key = cast(QueueAPIKey, QueueAPIKey.objects.get_from_key(key))
        except QueueAPIKey.DoesNotExist:
            api_key = None
        if api_key is None or api_key.has_expired:
            raise ApiError("invalid_api_key", "The API key is not valid.", headers={"WWW-Authenticate": "Api-Key"})
        if api_key.queue.slug != view.kwargs.get("slug"):
            raise ApiError("permission_denied", "This API key belongs to another queue.")
        return True


class IsStaff(BasePermission):
    message = "Staff only."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_active and user.is_staff)


class CanChangeQueue(IsStaff):
    message = "Changing a queue needs the 'Can change queue' permission."

    def has_permission(self, request: Request, view: Any) -> bool:
        return super().has_permission(request, view) and request.user.has_perm("queueing.change_queue")


class HasModelPermission(IsStaff):
    """Staff holding one model permission (the Queue operators group holds them all: README "Roles")."""

    permission = ""

    def has_permission(self, request: Request, view: Any) -> bool:
        return super().has_permission(request, view) and request.user.has_perm(self.permission)

    @property
    def message(self) -> str:  # type: ignore[override]
        return f"This needs the '{self.permission}' permission (the Queue operators group has it)."


class CanViewQueue(HasModelPermission):
    """To look at a queue (its settings, its figures): view_queue, or change_queue, which includes it (as in
    Django's admin). Staff status alone is not enough (issue 50)."""

    permission = "queueing.view_queue"

    def has_permission(self, request: Request, view: Any) -> bool:
        return super().has_permission(request, view) or (
            IsStaff.has_permission(self, request, view) and request.user.has_perm("queueing.change_queue")
        )


class CanAddQueue(HasModelPermission):
    permission = "queueing.add_queue"


class CanDeleteQueue(HasModelPermission):
    permission = "queueing.delete_queue"


class CanAddCodes(HasModelPermission):
    permission = "queueing.add_prioritycode"


def needs(permission: str) -> type[HasModelPermission]:
    """A permission class for staff (or a management key) holding `permission`."""
    return type(f"Needs_{permission.replace('.', '_')}", (HasModelPermission,), {"permission": permission})
