"""The console's trigger and schedule forms: checked by the API's own schemas (`triggers.schemas`)."""

from __future__ import annotations

from typing import Any

from django import forms

from budgets import money
from tether import limits
from triggers import schemas, timing
from triggers.models import Schedule
from web.console.forms import Checked, _cost_cap_field, _max_iterations_field, normalise_newlines


def _names(text: str) -> list[str]:
    return [word.strip() for word in (text or "").split(",") if word.strip()]


def _labelled(**labels: str) -> dict[str, tuple[str, str]]:
    """`Checked.FIELDS` where each form field is the schema's field of its name: name -> (name, label)."""
    return {name: (name, label) for name, label in labels.items()}


def _template_field(rows: int, help_text: str) -> forms.CharField:
    return forms.CharField(
        strip=True, label="Objective template", widget=forms.Textarea(attrs={"rows": rows}), help_text=help_text
    )


class _Named(Checked):
    """What a trigger's and a schedule's forms share: a name, and an objective template (its newlines as one)."""

    FIELDS = _labelled(name="The name", objective_template="The objective template")
    MORE: tuple[str, ...] = ()  # what the service also takes, read by the form itself (not through the schema)

    name = forms.CharField(max_length=limits.NAME_MAX_CHARS, strip=True)

    def clean_objective_template(self) -> str:
        return normalise_newlines(self.cleaned_data["objective_template"])

    def values(self) -> dict[str, Any]:
        """The valid form as its service's arguments."""
        return {name: self.cleaned_data.get(name) for name in (*self.FIELDS, *self.MORE)}


class TriggerForm(_Named):
    SCHEMA = schemas.TriggerIn
    FIELDS = {
        **_Named.FIELDS,
        **_labelled(events="The events", actions="The actions", max_per_minute="Runs a minute"),
    }

    objective_template = _template_field(
        4, "Fields in braces are paths into the delivery's JSON, e.g. Triage issue #{issue.number}: {issue.title}"
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

    def clean_events(self) -> list[str]:
        return _names(self.cleaned_data["events"])

    def clean_actions(self) -> list[str]:
        return _names(self.cleaned_data["actions"])


class ScheduleForm(_Named):
    """A schedule, made or changed: checked by the API's schema; the timing and the budget by the service."""

    SCHEMA = schemas.ScheduleIn
    FIELDS = {
        **_Named.FIELDS,
        **_labelled(
            cron="The cron expression",
            interval_minutes="The interval",
            timezone="The time zone",
            max_iterations="Max iterations",
            max_cost_usd="The cost cap",
            overlap="The overlap policy",
            catch_up_minutes="The catch-up window",
        ),
    }
    MORE = ("starts_at", "ends_at")  # wall-clock times in the schedule's time zone

    objective_template = _template_field(
        3, "Fields in braces: {date}, {time}, {schedule.name}, {last_run.id}, {last_run.outcome}"
    )
    cron = forms.CharField(
        required=False,
        label="Cron expression",
        help_text="five fields, read in the time zone, e.g. 0 9 * * 1-5 (weekdays at 09:00); or give an interval",
    )
    interval_minutes = forms.IntegerField(
        required=False,
        label="Or every … minutes",
        widget=forms.NumberInput(
            attrs={"min": limits.SCHEDULE_INTERVAL_MINUTES[0], "max": limits.SCHEDULE_INTERVAL_MINUTES[1]}
        ),
    )
    timezone = forms.CharField(initial="UTC", label="Time zone", help_text="an IANA name, e.g. Europe/Paris")
    starts_at = forms.DateTimeField(
        required=False,
        label="Starts",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="optional, in the time zone",
    )
    ends_at = forms.DateTimeField(
        required=False,
        label="Ends",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="optional, in the time zone",
    )
    max_iterations = _max_iterations_field(
        required=False, label="Max iterations", help_text="empty: the instance's"
    )
    max_cost_usd = _cost_cap_field()
    overlap = forms.ChoiceField(
        choices=Schedule.Overlap.choices,
        initial=Schedule.Overlap.SKIP,
        label="When the previous run is still live",
    )
    catch_up_minutes = forms.IntegerField(
        initial=0,
        label="Catch-up window (minutes)",
        help_text="after downtime, the latest missed firing this recent still runs, once; older ones are recorded missed",
        widget=forms.NumberInput(
            attrs={"min": limits.SCHEDULE_CATCH_UP_MINUTES[0], "max": limits.SCHEDULE_CATCH_UP_MINUTES[1]}
        ),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # The dates are typed as wall-clock times in the schedule's time zone.
        try:
            zone = timing.check_time_zone(data.get("timezone") or "UTC")
        except timing.TimingError:
            return data  # the service names the time zone
        for name in self.MORE:
            if data.get(name) is not None:
                data[name] = data[name].replace(tzinfo=None).replace(tzinfo=zone)
        return data

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleForm:
        """The form filled with a saved schedule, to edit."""
        zone = timing.check_time_zone(schedule.timezone)
        initial = {name: getattr(schedule, name) for name in cls.FIELDS if hasattr(schedule, name)}
        initial["max_cost_usd"] = (
            None if schedule.max_cost_micros is None else money.micros_to_decimal(schedule.max_cost_micros)
        )
        for name in cls.MORE:
            value = getattr(schedule, name)
            initial[name] = value.astimezone(zone).replace(tzinfo=None) if value else None
        return cls(initial=initial)
