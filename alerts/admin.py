"""Hooks (where and what to tell) and the delivery log, in admin."""

from __future__ import annotations

from functools import partial
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from . import names, services
from .models import AlertDelivery, AlertHook


class AlertHookForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=list(names.EVENTS.items()),
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="What to be told about. None ticked: everything.",
    )

    class Meta:
        model = AlertHook
        # An address typed without its scheme is https (Django 6's default, chosen now).
        field_classes = {"url": partial(forms.URLField, assume_scheme="https")}
        fields = ("name", "queue", "enabled", "url", "emails", "events", "waiting_threshold", "stall_seconds", "secret")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not cleaned.get("url") and not (cleaned.get("emails") or "").strip():
            raise forms.ValidationError("Give a webhook URL, e-mail addresses, or both: where should the alerts go?")
        for address in AlertHook(emails=cleaned.get("emails") or "").email_list:
            try:
                forms.EmailField().clean(address)
            except forms.ValidationError:
                self.add_error("emails", f"“{address}” is not an e-mail address.")
        return cleaned


@admin.register(AlertHook)
class AlertHookAdmin(admin.ModelAdmin):
    form = AlertHookForm
    list_display = ("name", "queue_shown", "enabled", "url", "emails", "last_delivery")
    list_filter = ("enabled",)
    search_fields = ("name", "url", "emails")
    actions = ("send_test",)
    fieldsets = (
        (None, {"fields": ("name", "queue", "enabled")}),
        ("Where to", {"fields": ("url", "emails", "secret")}),
        ("What about", {"fields": ("events", "waiting_threshold", "stall_seconds")}),
    )

    @admin.display(description="queue")
    def queue_shown(self, hook: AlertHook) -> str:
        return str(hook.queue) if hook.queue_id else "every queue"

    @admin.display(description="last delivery")
    def last_delivery(self, hook: AlertHook) -> str:
        last = hook.deliveries.order_by("-created_at").first()
        if last is None:
            return "none yet"
        when = timezone.localtime(last.created_at).strftime("%Y-%m-%d %H:%M:%S")
        return f"{last.event}: {last.get_status_display().lower()} ({when})"

    @admin.action(description="Send a test alert to the selected hooks", permissions=["change"])
    def send_test(self, request: HttpRequest, queryset: QuerySet[AlertHook]) -> None:
        for hook in queryset:
            for delivery in services.alert_test_send(hook):
                if delivery.status == AlertDelivery.Status.DELIVERED:
                    self.message_user(
                        request, f"{hook}: the test {delivery.get_channel_display().lower()} was delivered."
                    )
                else:
                    self.message_user(
                        request,
                        f"{hook}: the test {delivery.get_channel_display().lower()} was not delivered "
                        f"({delivery.last_error or 'not attempted'}); it is tried again shortly.",
                        level=messages.WARNING,
                    )


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "event",
        "hook",
        "queue",
        "channel",
        "status",
        "attempts",
        "last_status_code",
        "last_error_short",
    )
    list_filter = ("status", "channel", "event", "hook")
    date_hierarchy = "created_at"
    actions = ("retry_now",)
    readonly_fields = (
        "id",
        "hook",
        "queue",
        "event",
        "channel",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "last_error",
        "created_at",
        "delivered_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="last error")
    def last_error_short(self, delivery: AlertDelivery) -> str:
        return delivery.last_error[:80]

    @admin.action(description="Try the selected deliveries again now", permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[AlertDelivery]) -> None:
        again = queryset.exclude(status=AlertDelivery.Status.DELIVERED).update(
            status=AlertDelivery.Status.PENDING, attempts=0, next_attempt_at=timezone.now()
        )
        self.message_user(request, f"{again} deliveries will be tried again within seconds.")
