from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import QueueSnapshot, WaitSample


@admin.register(QueueSnapshot)
class QueueSnapshotAdmin(admin.ModelAdmin):
    list_display = ("queue", "taken_at", "state", "waiting", "admitted", "active", "capacity", "outflow_observed")
    list_filter = ("queue", "state")
    date_hierarchy = "taken_at"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WaitSample)
class WaitSampleAdmin(admin.ModelAdmin):
    list_display = ("queue", "ticket_id", "admitted_at", "estimated_seconds", "actual_seconds")
    list_filter = ("queue",)
    search_fields = ("ticket_id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
