"""Management keys (README "API"): automation calls the management API with `Authorization: Api-Key <key>`
and is let do what the key's role's group may, no staff login needed."""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

from django.contrib.auth.models import Group
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework_api_key.permissions import KeyParser

from ..models import ManagementKey
from .errors import ApiError

ROLE_GROUPS = {ManagementKey.Role.OPERATOR: "Queue operators", ManagementKey.Role.VIEWER: "Queue viewers"}


class ManagementKeyUser:
    """request.user for a management key: staff, with its role's group's permissions, audited by name."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = True
    is_superuser = False

    def __init__(self, key: ManagementKey) -> None:
        self.key = key
        self.pk = self.id = f"key-{key.prefix}"
        self.audit_label = f"management key “{key.name}” ({key.prefix})"

    def __str__(self) -> str:
        return self.audit_label

    def get_username(self) -> str:
        return self.audit_label

    @cached_property
    def permissions(self) -> set[str]:
        group = Group.objects.filter(name=ROLE_GROUPS[ManagementKey.Role(self.key.role)]).first()
        if group is None:
            return set()
        return {
            f"{app}.{codename}"
            for app, codename in group.permissions.values_list("content_type__app_label", "codename")
        }

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return perm in self.permissions


class ManagementKeyAuthentication(BaseAuthentication):
    """`Authorization: Api-Key <key>` with a live management key; other Authorization schemes are left to
    the other authentications (a staff JWT, a session)."""

    key_parser = KeyParser()

    def authenticate(self, request: Request) -> tuple[ManagementKeyUser, ManagementKey] | None:
        key = self.key_parser.get(request)
        if not key:
            return None
        try:
            management_key = cast(ManagementKey, ManagementKey.objects.get_from_key(key))
        except ManagementKey.DoesNotExist:
            management_key = None
        if management_key is None or management_key.has_expired:
            raise ApiError(
                "invalid_api_key", "The management key is not valid.", headers={"WWW-Authenticate": "Api-Key"}
            )
        return ManagementKeyUser(management_key), management_key

    def authenticate_header(self, request: Request) -> str:
        return "Api-Key"
