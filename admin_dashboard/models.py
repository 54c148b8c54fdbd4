"""What the dashboard keeps over time: a stats snapshot per queue every few seconds, and per admitted
ticket the wait it was told at join against the wait it had (the wait-estimate truth)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from queueing.models import Queue


class QueueSnapshot(models.Model):
    """A queue's figures at one moment (the `stats snapshot` beat task, every 10 s by default)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="snapshots")
    taken_at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=10)
    waiting = models.PositiveIntegerField(default=0)
    admitted = models.PositiveIntegerField(default=0, help_text="Admitted, not yet at the site.")
    active = models.PositiveIntegerField(default=0)
    capacity = models.PositiveIntegerField(default=0)
    capacity_in_use = models.PositiveIntegerField(default=0)
    viewers = models.PositiveIntegerField(default=0)
    # Totals since the queue began (so a period's figures are differences, whatever was missed).
    total_joined = models.PositiveBigIntegerField(default=0)
    total_admitted = models.PositiveBigIntegerField(default=0)
    total_completed = models.PositiveBigIntegerField(default=0)
    total_expired = models.PositiveBigIntegerField(default=0, help_text="Claim or session expired, or revoked.")
    total_abandoned = models.PositiveBigIntegerField(default=0, help_text="Left the line or gone too long.")
    # The period since the previous snapshot.
    period_seconds = models.FloatField(default=0)
    admissions = models.PositiveIntegerField(default=0, help_text="Admissions in the period.")
    outflow_configured = models.FloatField(default=0, help_text="Admissions a minute the policy allows.")
    outflow_observed = models.FloatField(default=0, help_text="Admissions a minute in the period.")
    average_wait_seconds = models.FloatField(null=True, blank=True)
    average_service_seconds = models.FloatField(null=True, blank=True)
    # The adaptive outflow, and the protected site's health it follows (over the adjustment interval).
    outflow_effective = models.FloatField(
        null=True, blank=True, help_text="Admissions a minute admission followed (adapted, or the configured)."
    )
    health_requests = models.PositiveIntegerField(default=0, help_text="Responses the site reported.")
    health_error_rate = models.FloatField(null=True, blank=True, help_text="Share of them that were 5xx.")
    health_p95_ms = models.FloatField(null=True, blank=True, help_text="Their 95th percentile response time.")

    class Meta:
        ordering = ("-taken_at",)
        indexes = [models.Index(fields=["queue", "taken_at"])]
        get_latest_by = "taken_at"

    def __str__(self) -> str:
        return f"{self.queue.slug} at {self.taken_at:%Y-%m-%d %H:%M:%S}"

    @property
    def capacity_use(self) -> float | None:
        return round(self.capacity_in_use / self.capacity, 4) if self.capacity else None


class WaitSample(models.Model):
    """One admitted ticket: the wait estimated when it joined and the wait it had."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="wait_samples")
    ticket_id = models.CharField(max_length=64)
    joined_at = models.DateTimeField()
    admitted_at = models.DateTimeField()
    estimated_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Empty when no estimate could be given (paused, no rate yet)."
    )
    actual_seconds = models.FloatField()
    stopped = models.BooleanField(
        default=False,
        help_text="Admission stopped (a pause, a close) while it waited: a wait no estimate could foresee, "
        "left out of the estimate's error.",
    )

    class Meta:
        ordering = ("-admitted_at",)
        indexes = [models.Index(fields=["queue", "admitted_at"])]
        constraints = [models.UniqueConstraint(fields=["queue", "ticket_id"], name="wait_sample_once")]

    def __str__(self) -> str:
        return f"{self.ticket_id}: told {self.estimated_seconds} s, waited {self.actual_seconds:.0f} s"
