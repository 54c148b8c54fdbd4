"""The dashboard's control form: one form for every control, told apart by `action`."""

from __future__ import annotations

from typing import Any

from django import forms


class ControlForm(forms.Form):
    action = forms.ChoiceField(
        choices=[("pause", "Pause"), ("resume", "Resume"), ("update", "Save"), ("revoke", "Revoke")]
    )
    capacity = forms.IntegerField(required=False, min_value=1, label="Capacity (sessions)")
    outflow_per_minute = forms.FloatField(required=False, min_value=0, label="Outflow (admissions a minute)")
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
