"""The console's trigger form: checked by the API's own schema (`triggers.schemas.TriggerIn`)."""

from __future__ import annotations

from typing import Any

from django import forms

from loops.console.forms import Checked, normalise_newlines
from tether import limits
from triggers import schemas


def _names(text: str) -> list[str]:
    return [word.strip() for word in (text or "").split(",") if word.strip()]


class TriggerForm(Checked):
    SCHEMA = schemas.TriggerIn
    FIELDS = {
        "name": ("name", "The name"),
        "objective_template": ("objective_template", "The objective template"),
        "events": ("events", "The events"),
        "actions": ("actions", "The actions"),
        "max_per_minute": ("max_per_minute", "Runs a minute"),
    }

    name = forms.CharField(max_length=limits.NAME_MAX_CHARS, strip=True)
    objective_template = forms.CharField(
        strip=True,
        label="Objective template",
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Fields in braces are paths into the delivery's JSON, e.g. Triage issue #{issue.number}: {issue.title}",
    )
    events = forms.CharField(
        required=False, label="Events", help_text="comma-separated, e.g. issues (empty: any event)"
    )
    actions = forms.CharField(
        required=False,
        label="Actions",
        help_text="the payload's action, comma-separated, e.g. opened (empty: any)",
    )
    max_per_minute = forms.IntegerField(
        label="Runs a minute, at most",
        initial=limits.HOOK_RATE_DEFAULT,
        widget=forms.NumberInput(attrs={"min": limits.HOOK_RATE[0], "max": limits.HOOK_RATE[1]}),
    )

    def clean_objective_template(self) -> str:
        return normalise_newlines(self.cleaned_data["objective_template"])

    def clean_events(self) -> list[str]:
        return _names(self.cleaned_data["events"])

    def clean_actions(self) -> list[str]:
        return _names(self.cleaned_data["actions"])

    def values(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in self.FIELDS}
