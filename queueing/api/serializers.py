"""Request shapes (responses: responses.py). Requests are strict: unknown fields and wrong JSON types are refused
(DRF would otherwise read 123 as "123" and "5" as 5), so a client's mistake is a clear 400."""

from __future__ import annotations

import unicodedata
from typing import Any

from django.utils.translation import gettext_noop
from rest_framework import serializers
from rest_framework_simplejwt.serializers import TokenObtainPairSerializer, TokenRefreshSerializer

from .. import health, policy_table
from .errors import ApiError, unknown_fields


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class BoundedListField(serializers.ListField):
    """A list whose length is checked before its items are (a huge list is refused at once)."""

    def to_internal_value(self, data: Any) -> list[Any]:
        if isinstance(data, list) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return list(super().to_internal_value(data))


class RefusesUnknownFields:
    """Refuses a body that is not an object, or that has fields the operation does not know."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": [gettext_noop("The body must be a JSON object.")]}, code="invalid"
            )
        unknown = set(data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {name: ["This field is not accepted here."] for name in sorted(unknown)}, code="unknown_field"
            )
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictSerializer(RefusesUnknownFields, serializers.Serializer):
    """A request body: an object with only the fields the operation knows (400 unknown_fields otherwise)."""


class StaffTokenObtainSerializer(RefusesUnknownFields, TokenObtainPairSerializer):
    """POST /api/v1/auth/token: username and password, nothing else (settings.SIMPLE_JWT)."""


class StaffTokenRefreshSerializer(RefusesUnknownFields, TokenRefreshSerializer):
    """POST /api/v1/auth/token/refresh: the refresh token, nothing else."""


def _clean_display_name(value: str) -> str:
    # Shown to other visitors later (the line around you): no control or format characters.
    cleaned = "".join(ch for ch in value if unicodedata.category(ch)[0] != "C").strip()
    return " ".join(cleaned.split())


PRIORITY_CODE_MAX = 64
DISPLAY_NAME_MAX = 40
POW_FIELD_MAX = 200


# The join body's fields: each one's name, longest length and help. The schema's JoinRequestSerializer and
# join_request_validate, which every join runs (no per-request deep copy of serializer fields: joins come
# in by the thousand per second), are both made from it; tests/test_join_body.py checks that they agree.
JOIN_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("priority_code", PRIORITY_CODE_MAX, "An invite or priority code for this queue (case counts)."),
    ("display_name", DISPLAY_NAME_MAX, "A name the visitor's neighbours in line may see (GET .../neighbours)."),
    ("pow_challenge", POW_FIELD_MAX, "A challenge from POST .../challenge (gate on)."),
    ("pow_nonce", 64, "A nonce such that SHA-256(pow_challenge + ':' + pow_nonce) starts with `difficulty` zero bits."),
)


class JoinRequestSerializer(StrictSerializer):
    """The join body, for the schema (joins are checked by join_request_validate: JOIN_FIELDS)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            name: StrictCharField(
                required=False, allow_blank=True, trim_whitespace=False, max_length=limit, help_text=about
            )
            for name, limit, about in JOIN_FIELDS
        }


def _text_problem(value: str) -> str | None:
    """What DRF's CharField refuses besides length: NUL (which PostgreSQL cannot store) and lone
    surrogates (which cannot be encoded, so would fail deep in hashing, signing or SQL)."""
    if "\x00" in value:
        return "Null characters are not allowed."
    try:
        value.encode()
    except UnicodeEncodeError:
        return "Surrogate characters are not allowed."
    return None


def join_request_validate(data: Any) -> dict[str, str]:
    """The join body's fields, or an ApiError as StrictSerializer would raise it (unknown_fields, invalid_request)."""
    if not isinstance(data, dict):
        raise ApiError(
            "invalid_request",
            gettext_noop("The body must be a JSON object."),
            fields={"non_field_errors": [gettext_noop("The body must be a JSON object.")]},
        )
    unknown = sorted(set(data) - {name for name, _, _ in JOIN_FIELDS})
    if unknown:
        raise ApiError("unknown_fields", unknown_fields(unknown), fields=unknown)
    problems: dict[str, list[str]] = {}
    for name, limit, _ in JOIN_FIELDS:
        value = data.get(name, "")
        if not isinstance(value, str):
            problems[name] = ["Not a valid string."]
        elif len(value) > limit:
            problems[name] = [f"Ensure this field has no more than {limit} characters."]
        elif problem := _text_problem(value):
            problems[name] = [problem]
    if problems:
        raise ApiError("invalid_request", gettext_noop("The request has invalid fields."), fields=problems)
    return {
        "priority_code": data.get("priority_code", ""),
        "display_name": _clean_display_name(data.get("display_name", "")),
        "pow_challenge": data.get("pow_challenge", ""),
        "pow_nonce": data.get("pow_nonce", ""),
    }


class CodeRequestSerializer(StrictSerializer):
    code = StrictCharField(max_length=PRIORITY_CODE_MAX, help_text="The invite or priority code (case counts).")


def _one_text_field(data: Any, name: str, limit: int) -> str:
    """A body of one required text field, or an ApiError as StrictSerializer would raise it (the waiting
    page's forms answer through these outside DRF)."""
    if not isinstance(data, dict):
        raise ApiError(
            "invalid_request",
            gettext_noop("The body must be a JSON object."),
            fields={"non_field_errors": [gettext_noop("The body must be a JSON object.")]},
        )
    unknown = sorted(set(data) - {name})
    if unknown:
        raise ApiError("unknown_fields", unknown_fields(unknown), fields=unknown)
    value = data.get(name)
    if value is None or value == "":
        problem: str | None = "This field is required."
    elif not isinstance(value, str):
        problem = "Not a valid string."
    elif len(value) > limit:
        problem = f"Ensure this field has no more than {limit} characters."
    else:
        problem = _text_problem(value)
    if problem:
        raise ApiError("invalid_request", gettext_noop("The request has invalid fields."), fields={name: [problem]})
    return str(value)


def code_request_validate(data: Any) -> str:
    """The code a waiting visitor entered."""
    return _one_text_field(data, "code", PRIORITY_CODE_MAX)


EMAIL_MAX = 254


class NotifyRequestSerializer(StrictSerializer):
    email = StrictCharField(
        max_length=EMAIL_MAX, help_text="Where to tell the visitor that their turn is near, and come."
    )


def notify_request_validate(data: Any) -> str:
    """The address a waiting visitor left for its turn notices (checked as an address by the service)."""
    return _one_text_field(data, "email", EMAIL_MAX)


class AccessTokenSerializer(StrictSerializer):
    access_token = StrictCharField(max_length=4096)


class VerifyRequestSerializer(AccessTokenSerializer):
    browser = StrictCharField(
        max_length=200,
        required=False,
        help_text=(
            "A secret of the browser presenting the token (e.g. a random value the site keeps in an HttpOnly "
            "cookie). The first verify that sends one binds the session to that browser; afterwards the "
            "token is valid only with it (reason `bound_elsewhere`, also for a verify without it that is not "
            "`server`), so one admission lets in one browser."
        ),
    )
    server = StrictBooleanField(
        required=False,
        default=False,
        help_text=(
            "A check the site makes on its own, with no visitor's browser behind it (a back-office job): the "
            "token alone is checked, bound or not. Without `browser` and without this, a bound session's token "
            "is refused (`bound_elsewhere`)."
        ),
    )
    rebind = StrictBooleanField(
        required=False,
        default=False,
        help_text="Hand the session over to `browser` on purpose (e.g. the visitor signed in on another device).",
    )


class RevokeSerializer(StrictSerializer):
    ticket_id = StrictCharField(max_length=100)


class CapacitySerializer(StrictSerializer):
    in_use = StrictIntegerField(min_value=0, max_value=1_000_000_000)


class HealthReportSerializer(StrictSerializer):
    requests = StrictIntegerField(
        min_value=0, max_value=health.REPORT_MAX_REQUESTS, help_text="Responses served since the last report."
    )
    # DRF's metaclass takes declared fields off the class, so `.errors` stays the serializer's property.
    errors = StrictIntegerField(  # type: ignore[assignment]
        min_value=0,
        max_value=health.REPORT_MAX_REQUESTS,
        help_text="Of those, server errors (HTTP 5xx, or the request failed). At most `requests`.",
    )
    latency_ms = BoundedListField(
        child=StrictFloatField(min_value=0, max_value=health.LATENCY_MAX_MS),
        required=False,
        max_length=health.REPORT_MAX_SAMPLES,
        help_text=(
            "Their response times in milliseconds: all of them, or a random sample (at most "
            f"{health.REPORT_MAX_SAMPLES:,}) that then stands for all `requests`. At most `requests` entries."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["errors"] > attrs["requests"]:
            raise serializers.ValidationError({"errors": ["Cannot be more than requests."]})
        if len(attrs.get("latency_ms", [])) > attrs["requests"]:
            raise serializers.ValidationError({"latency_ms": ["At most one response time per request."]})
        return attrs


def _setting_field(setting: policy_table.Setting) -> serializers.Field:
    """A setting of the policy as a request body takes it: its type, its bounds, none where it may be none."""
    common: dict[str, Any] = {"required": False, "help_text": setting.brief}
    if setting.kind == "moment":
        return serializers.DateTimeField(allow_null=True, **common)
    if setting.kind == "choice":
        assert setting.choices is not None
        return serializers.ChoiceField(choices=setting.choices.choices, **common)
    if setting.kind == "bool":
        return StrictBooleanField(**common)
    common["allow_null"] = setting.default is None
    whole = setting.kind != "float"
    for option, bound in (("min_value", setting.low), ("max_value", setting.high)):
        if bound is not None:
            common[option] = int(bound) if whole else bound
    return StrictIntegerField(**common) if whole else StrictFloatField(**common)


class QueuePatchSerializer(StrictSerializer):
    name = StrictCharField(required=False, max_length=120)
    target_url = StrictCharField(required=False, max_length=500, help_text="Where admitted visitors are sent.")
    intro = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="Words of yours under the queue's name."
    )
    time_zone = StrictCharField(
        required=False,
        max_length=64,
        help_text="The zone of clock times shown without the browser's (e.g. Europe/Berlin).",
    )
    closed_message = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="What visitors read once the line is closed."
    )
    closed_link_url = StrictCharField(
        required=False, allow_blank=True, max_length=500, help_text="A page to send them on to from there."
    )
    closed_link_text = StrictCharField(required=False, allow_blank=True, max_length=100, help_text="That link's words.")

    def get_fields(self) -> dict[str, serializers.Field]:
        """The words above, and every setting of the policy (queueing/policy_table.py)."""
        return {**super().get_fields(), **{setting.name: _setting_field(setting) for setting in policy_table.SETTINGS}}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Give at least one of: " + ", ".join(self.fields) + ".")
        return attrs


class QueueCreateSerializer(QueuePatchSerializer):
    """A new queue: its slug, name and target, and any of the settings QueuePatchSerializer takes, and
    its first state (the rest take their defaults, as in admin)."""

    slug = StrictCharField(max_length=64, help_text="Lowercase letters, digits and '-'; the queue's address.")
    name = StrictCharField(max_length=120)
    target_url = StrictCharField(max_length=500, help_text="Where admitted visitors are sent.")
    state = serializers.ChoiceField(choices=["open", "paused", "closed"], required=False)


class CodesRequestSerializer(StrictSerializer):
    count = StrictIntegerField(min_value=1, max_value=10_000)
    level = StrictIntegerField(min_value=1, max_value=3, help_text="1 elevated, 2 VIP, 3 premium.")
    max_uses = StrictIntegerField(required=False, min_value=1, help_text="Joins per code; absent: unlimited.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class CodesResponseSerializer(serializers.Serializer):
    codes = serializers.ListField(child=serializers.CharField(), help_text="Shown this once: hand them out.")
    level = serializers.IntegerField()
    max_uses = serializers.IntegerField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)


class LevelChangeSerializer(StrictSerializer):
    level = StrictIntegerField(min_value=0, max_value=3, help_text="0 normal, 1 elevated, 2 VIP, 3 premium.")
    name = serializers.CharField(required=False, max_length=50)
    placement_fraction = serializers.FloatField(
        required=False, min_value=0.0, max_value=1.0, help_text="Share of the line a joiner is placed ahead of."
    )
    group = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=150, help_text="A group's name; null: none."
    )


class LevelsPatchSerializer(StrictSerializer):
    levels = LevelChangeSerializer(many=True, allow_empty=False, help_text="The levels to change; others stay.")


class LevelSerializer(serializers.Serializer):
    level = serializers.IntegerField()
    name = serializers.CharField()
    placement_fraction = serializers.FloatField()
    group = serializers.CharField(allow_null=True)


class ApiKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=50, help_text="Which site or service holds it.")
    expiry_date = serializers.DateTimeField(required=False, allow_null=True, help_text="Absent: never expires.")


class ApiKeySerializer(serializers.Serializer):
    prefix = serializers.CharField(help_text="Names the key without revealing it (the start of the key).")
    name = serializers.CharField()
    created = serializers.DateTimeField()
    expiry_date = serializers.DateTimeField(allow_null=True)
    revoked = serializers.BooleanField()


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="Shown this once: the site sends it as `Authorization: Api-Key <key>`.")
