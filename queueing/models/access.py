"""Who gets in ahead or at all: priority levels and codes, API keys, and the keys that sign tokens."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey

from .queue import DEFAULT_FRACTIONS, Queue


class PriorityLevel(models.Model):
    """How far ahead a joiner of this level is placed (seed 003).

    `placement_fraction` is the share of the current line the joiner is placed ahead of, counted from the
    back: 0 = back of the queue, 0.1 = ahead of the last 10%, 1 = the front. Level 3 (premium) is also
    admitted at once when a slot is free.
    """

    class Level(models.IntegerChoices):
        NORMAL = 0, "Normal"
        ELEVATED = 1, "Elevated"
        VIP = 2, "VIP"
        PREMIUM = 3, "Premium"

    DEFAULT_FRACTIONS = DEFAULT_FRACTIONS

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="priority_levels")
    level = models.PositiveSmallIntegerField(choices=Level.choices)
    name = models.CharField(max_length=50)
    placement_fraction = models.FloatField(
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of the line (from the back) a joiner is placed ahead of: 0 back, 1 front.",
    )
    group = models.ForeignKey(
        Group,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Signed-in members of this group join at this level.",
    )

    class Meta:
        ordering = ("queue", "level")
        constraints = [models.UniqueConstraint(fields=("queue", "level"), name="unique_priority_level_per_queue")]

    def __str__(self) -> str:
        return f"{self.queue.slug}: {self.level} {self.name}"

    def clean(self) -> None:
        if self.level == self.Level.NORMAL and self.placement_fraction not in (0, 0.0, None):
            raise ValidationError({"placement_fraction": "Normal joiners always go to the back (0)."})


PRIORITY_CODE_BYTES = 12  # 96 bits: a code cannot be guessed (joins that try codes are rate-limited too)


def priority_code_new() -> str:
    """A fresh priority code: 16 URL-safe characters, 96 random bits (an operator may type their own)."""
    return secrets.token_urlsafe(PRIORITY_CODE_BYTES)


PRIORITY_CODE_MIN_LENGTH = 12


def priority_code_strength_check(code: str) -> None:
    """A code an operator types (issue 50: 4-character codes could be typed in admin): at least
    PRIORITY_CODE_MIN_LENGTH characters, of at least 5 different ones, and not a shorter part repeated
    ("abcabcabcabc"). ValidationError saying so."""
    if len(code) < PRIORITY_CODE_MIN_LENGTH:
        raise ValidationError(
            f"At least {PRIORITY_CODE_MIN_LENGTH} characters: a short code will be guessed (the generated ones "
            "have 16, 96 random bits)."
        )
    if len(set(code)) < 5 or code in (code + code)[1:-1]:
        raise ValidationError("Too easy to guess: a few characters, or a part repeated. Leave the generated one.")


class PriorityCode(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="priority_codes")
    code = models.CharField(
        max_length=64,
        default=priority_code_new,
        help_text='What visitors send with their join (priority_code in the API). Case counts ("vip" is '
        'not "VIP"). Leave the generated one (96 random bits) unless you need a memorable code: a short or '
        "guessable code will be guessed. To make many at once, use the queue list's \"Generate priority "
        'codes" action.',
        validators=[RegexValidator(r"^[A-Za-z0-9_-]{4,64}$", "4-64 letters, digits, '-' or '_'.")],
    )
    level = models.PositiveSmallIntegerField(choices=[c for c in PriorityLevel.Level.choices if c[0] > 0])
    max_uses = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How many joins may use this code; after that it is refused. Empty means unlimited.",
    )
    uses = models.PositiveIntegerField(default=0, editable=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this time the code is refused. Empty means it never expires."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("queue", "code")
        constraints = [models.UniqueConstraint(fields=("queue", "code"), name="unique_priority_code_per_queue")]

    def __str__(self) -> str:
        return f"{self.queue.slug}: {self.code}"

    def clean(self) -> None:
        if self.max_uses == 0:
            raise ValidationError({"max_uses": "Leave empty for unlimited; 0 would never be usable."})
        # A new code, or one changed, must be strong; one kept from before the rule may still be edited.
        before = None if self._state.adding else PriorityCode.objects.filter(pk=self.pk).values_list("code").first()
        if before is None or before[0] != self.code:
            try:
                priority_code_strength_check(self.code)
            except ValidationError as exc:
                raise ValidationError({"code": exc.messages}) from exc


class QueueAPIKey(AbstractAPIKey):
    """A protected site's key for one queue: stored hashed (SHA-512), shown once on creation."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API key"
        verbose_name_plural = "API keys"


class ManagementKey(AbstractAPIKey):
    """A key for automation (Terraform, CI, a script): the management API without a staff login
    (`Authorization: Api-Key <key>`). It may do what its role's group may (README "Roles"): an operator
    key what Queue operators may, a viewer key what Queue viewers may. Stored hashed, shown once."""

    class Role(models.TextChoices):
        OPERATOR = "operator", "Operator (what the Queue operators group may do)"
        VIEWER = "viewer", "Viewer (reads only, as the Queue viewers group)"

    role = models.CharField(max_length=10, choices=Role.choices, default=Role.OPERATOR)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "management key"
        verbose_name_plural = "management keys"


class SigningKey(models.Model):
    """An Ed25519 key that signs access tokens, published at /.well-known/jwks.json.

    Rotation with overlap: a new key is published `WR_KEY_PUBLISH_LEAD` before it starts signing, and the
    key it replaces stays published until every token it signed has expired.
    """

    kid = models.CharField(max_length=40, unique=True)
    private_key_pem = models.TextField()
    public_jwk = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    signs_from = models.DateTimeField(default=timezone.now)
    retires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-signs_from",)

    def __str__(self) -> str:
        return self.kid
