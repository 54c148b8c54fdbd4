"""The dashboard's control form: one form for every control, told apart by `action`."""

from __future__ import annotations

from typing import Any

from django import forms


class ControlForm(forms.Form):
    action = forms.ChoiceField(
        choices=[("pause", "Pause"), ("resume", "Resume"), ("update", "Save"), ("revoke", "Revoke")]
    )
    # The bounds the queue itself keeps (models.Queue), so the browser refuses what the server would.
    capacity = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000_000,
        label="Capacity (sessions)",
        error_messages={"min_value": "at least 1 session.", "max_value": "at most 10,000,000 sessions."},
    )
    outflow_per_minute = forms.FloatField(
        required=False,
        min_value=0.1,
        max_value=1_000_000,
        label="Outflow (admissions a minute)",
        error_messages={
            "min_value": "at least 0.1 a minute (to let nobody in, pause the queue).",
            "max_value": "at most 1,000,000 a minute.",
        },
    )

    def errors_in_words(self, errors: dict[str, list[dict[str, str]]]) -> str:
        """ "Outflow (admissions a minute): at least 0.1 a minute …", not "outflow_per_minute: Ensure …"."""
        labels = {name: str(field.label) for name, field in self.fields.items()}
        return "; ".join(
            item["message"]
            if name == "__all__"
            else f"{labels.get(name, name.replace('_', ' ')).capitalize()}: {item['message']}"
            for name, items in errors.items()
            for item in items
        )

    ticket_id = forms.CharField(required=False, max_length=64)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        action = data.get("action")
        if action == "update":
            for field in ("capacity", "outflow_per_minute"):
                if data.get(field) is None and field not in self.errors:
                    self.add_error(field, "Required to save.")
        if action == "revoke" and not data.get("ticket_id"):
            self.add_error("ticket_id", "Which ticket?")
        return data
