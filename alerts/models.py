"""Alert hooks (where and what to tell), what each hook last saw of each queue, and every delivery."""

from __future__ import annotations

import secrets
import uuid

from django.core.validators import MinValueValidator, URLValidator
from django.db import models

from queueing.models import Queue

from . import names

RETRY_MAX_ATTEMPTS = 6


def new_secret() -> str:
    return secrets.token_urlsafe(32)


class AlertHook(models.Model):
    name = models.CharField(max_length=100, help_text="What this hook is for, e.g. “Ops pager” or “Sale team e-mail”.")
    queue = models.ForeignKey(
        Queue,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_hooks",
        help_text="Leave empty to be told about every queue.",
    )
    url = models.URLField(
        "webhook URL",
        max_length=500,
        blank=True,
        validators=[URLValidator(schemes=["http", "https"])],
        help_text="Each alert is POSTed here as JSON, signed with the secret below (see README “Alerts”). "
        "Any answer other than 2xx is tried again, waiting longer each time.",
    )
    emails = models.TextField(
        "e-mail addresses",
        blank=True,
        help_text="One or more addresses, separated by commas or new lines. Needs the server's e-mail "
        "settings (EMAIL_HOST and friends).",
    )
    events = models.JSONField(
        default=list,
        blank=True,
        help_text="What to be told about. None ticked: everything.",
    )
    waiting_threshold = models.PositiveIntegerField(
        "waiting threshold",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tell when this many people or more wait in line (and again when it falls back below 90% "
        "of it). Empty: never.",
    )
    stall_seconds = models.PositiveIntegerField(
        "stall after (seconds)",
        default=120,
        validators=[MinValueValidator(10)],
        help_text="Tell when an open queue has let nobody through for this long while people wait.",
    )
    secret = models.CharField(
        max_length=100,
        default=new_secret,
        help_text="Signs every webhook (X-WaitingRoom-Signature). Your receiver checks it with this secret.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(url="") | ~models.Q(emails=""), name="alerthook_has_a_destination"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def email_list(self) -> list[str]:
        return [part.strip() for part in self.emails.replace("\n", ",").split(",") if part.strip()]

    def wants(self, event: str) -> bool:
        return event == names.TEST or not self.events or event in self.events


class AlertWatch(models.Model):
    """What a hook last saw of a queue (its state and conditions), to tell only what changed."""

    hook = models.ForeignKey(AlertHook, on_delete=models.CASCADE, related_name="watches")
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+")
    seen = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=("hook", "queue"), name="alertwatch_one_per_hook_and_queue")]

    def __str__(self) -> str:
        return f"{self.hook} watching {self.queue_id}"


class AlertDelivery(models.Model):
    class Channel(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        EMAIL = "email", "E-mail"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed (gave up)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hook = models.ForeignKey(AlertHook, on_delete=models.CASCADE, related_name="deliveries")
    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    event = models.CharField(max_length=60)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        verbose_name_plural = "alert deliveries"

    def __str__(self) -> str:
        return f"{self.event} → {self.hook} ({self.get_channel_display()})"
