"""What happened and what a queue says per language: the change log, finished tickets, draws, turn notices
and translated texts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import dateformat, timezone

from .queue import Queue


class QueueChange(models.Model):
    """The audit log: who changed what on a queue, with the values before and after. It outlives its queue
    (the entry keeps the slug) and cannot be edited or deleted from admin."""

    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    queue_slug = models.CharField(max_length=64, default="", help_text="The queue's slug when the entry was made.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=150, help_text="Who, when there is no user (a command).")
    action = models.CharField(max_length=40)
    before = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    after = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.queue_slug} {self.action} by {self.actor_label}"

    def summary(self) -> str:
        """What changed, as people read it: "capacity 3 → 5, state open → paused" (a creation: what it was
        created with; an entry without values: its action; a change inside a group of values, such as a
        priority level's: "level 2 placement fraction 0.5 → 0.6")."""
        if self.action == "create":
            return "created: " + ", ".join(f"{_words(k)} {_shown(v)}" for k, v in sorted(self.after.items()))
        group = {"priority_levels": "level ", "texts": "text "}.get(self.action, "")
        parts: list[str] = []
        for key in dict.fromkeys([*self.before, *self.after]):
            before, after = self.before.get(key), self.after.get(key)
            if isinstance(before, dict) and isinstance(after, dict):
                parts += [
                    f"{group}{_words(key)} {_words(inner)} {_shown(before.get(inner))} → {_shown(after.get(inner))}"
                    for inner in dict.fromkeys([*before, *after])
                    if before.get(inner) != after.get(inner)
                ]
            elif key in self.before:
                parts.append(f"{group}{_words(key)} {_shown(before)} → {_shown(after)}")
            else:
                parts.append(f"{group}{_words(key)} {_shown(after)}")
        return ", ".join(parts) or self.action_words

    @property
    def action_words(self) -> str:
        return _words(self.action)


def _words(name: str) -> str:
    return name.replace("_", " ")


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{_words(k)} {_shown(v)}" for k, v in value.items())
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:  # a time (ISO 8601, as the log's JSON keeps it): shown as the dashboard shows every time
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return dateformat.format(timezone.localtime(moment) if timezone.is_aware(moment) else moment, "Y-m-d H:i:s T")
    return str(value)


class FinishedTicket(models.Model):
    """A ticket that finished (left, expired, completed, revoked), noted from Redis by the cleanup task
    every few seconds, so that if Redis loses the queue's state the ticket is not given back a place or a
    session (SPEC 3.6). Kept a day; only the sequence number (unique per queue across epochs) is needed."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="finished_tickets")
    seq = models.BigIntegerField()
    noted_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "seq"], name="one_note_per_finished_ticket")]

    def __str__(self) -> str:
        return f"{self.queue.slug} #{self.seq}"


class QueueShuffle(models.Model):
    """The auditable pre-queue shuffle of one scheduled start (SPEC 3.3).

    When the schedule is set the queue commits to a random seed by publishing its SHA-256
    (`commitment`); at the start the seed is revealed with the pre-queue's tickets (sequence number and
    priority level) and the order they were put in, which anyone can recompute (queueing/shuffle.py,
    `manage.py verify_shuffle`; shuffle.public_record is what is published)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="shuffles")
    starts_at = models.DateTimeField(help_text="The start this shuffle is for.")
    seed = models.CharField(max_length=64, editable=False)
    commitment = models.CharField(max_length=64, editable=False, help_text="SHA-256 of the seed, published.")
    committed_at = models.DateTimeField(default=timezone.now)
    revealed_at = models.DateTimeField(null=True, blank=True)
    tickets = models.JSONField(default=list, help_text="[[sequence number, priority level], ...] in the pre-queue.")
    order = models.JSONField(default=list, help_text="Their sequence numbers in the order they were put in.")
    # A stateless queue's pre-queue is a range of numbers, shuffled number by number (shuffle.place).
    numbers = models.JSONField(null=True, blank=True, help_text="Stateless mode: [first, last] number shuffled.")

    class Meta:
        ordering = ("-starts_at",)
        constraints = [models.UniqueConstraint(fields=["queue", "starts_at"], name="one_shuffle_per_start")]

    def __str__(self) -> str:
        return f"{self.queue.slug} start {self.starts_at:%Y-%m-%d %H:%M:%S}"


class TurnNotice(models.Model):
    """A waiting visitor's e-mail address, to tell them when their turn is near and when it comes (issue 20,
    "Notify me"). Kept only while the ticket waits: deleted once the turn is told, the ticket ends without
    one, or the ticket's lifetime is over (services.turn_notices_send). One per ticket."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="turn_notices")
    ticket_id = models.CharField(max_length=100)
    epoch = models.PositiveIntegerField()
    email = models.EmailField()
    language = models.CharField(max_length=10, default="en")
    # The waiting page's address (the e-mail's link: a place link made at the send, or this page alone).
    link = models.URLField(max_length=1000)
    # The visitor cookie's id, sealed (visitors.identity_seal), when asked from the page with it: each e-mail
    # then carries a place link (PlaceLink) that can make another browser this visitor, once. Empty: none.
    sealed = models.TextField(blank=True, default="")
    near_sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("created_at",)
        constraints = [models.UniqueConstraint(fields=["queue", "ticket_id"], name="one_notice_per_ticket")]

    def __str__(self) -> str:
        return f"{self.queue.slug} {self.ticket_id[:10]}"


class PlaceLink(models.Model):
    """A turn notice's link back to one waiting ticket's place (issue 50): the e-mail carries a random token,
    kept here only as its SHA-256. Opening it changes nothing; its page's button (a POST, CSRF-checked) makes
    that browser the visitor who asked, once, while the ticket of that queue and epoch is live and the link
    not past its time. Made by the e-mail's send (services.turn_notices_send), which also forgets the old."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="place_links")
    ticket_id = models.CharField(max_length=100)
    epoch = models.PositiveIntegerField()
    token_hash = models.CharField(max_length=64, unique=True)
    sealed = models.TextField()  # the visitor cookie's id (visitors.identity_seal)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at",)

    def __str__(self) -> str:
        return f"{self.queue.slug} {self.ticket_id[:10]}"


class QueueText(models.Model):
    """A queue's own words in one language (issue 20): its name, intro and closed-page texts as visitors who
    read that language see them. A word left empty falls back to the queue's own."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="texts")
    language = models.CharField(max_length=10, choices=settings.LANGUAGES)
    name = models.CharField(max_length=120, blank=True)
    intro = models.TextField(max_length=500, blank=True)
    closed_message = models.TextField("closed message", max_length=500, blank=True)
    closed_link_text = models.CharField("closed page's link text", max_length=100, blank=True)

    class Meta:
        ordering = ("queue", "language")
        constraints = [models.UniqueConstraint(fields=("queue", "language"), name="one_text_per_language")]
        verbose_name = "text in another language"
        verbose_name_plural = "texts in other languages"

    def __str__(self) -> str:
        return f"{self.queue.slug} ({self.language})"
