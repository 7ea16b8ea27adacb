"""Console forms: they parse what a person typed; the rules live in loops.services."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from loops.models import Run


def fresh_nonce() -> str:
    return uuid.uuid4().hex


def normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _max_iterations_field(**extra):
    return forms.IntegerField(
        min_value=1,
        max_value=10_000,
        error_messages={
            "required": "Give a maximum number of iterations (1 to 10,000).",
            "invalid": "Max iterations must be a whole number, like 10.",
            "min_value": "Max iterations must be at least 1.",
            "max_value": "Max iterations can be at most 10,000.",
        },
        **extra,
    )


def _cost_cap_field():
    return forms.DecimalField(
        required=False,
        min_value=0,
        decimal_places=6,
        max_digits=12,
        label="Cost cap (USD)",
        widget=forms.NumberInput(attrs={"step": "0.01", "placeholder": "no cap", "inputmode": "decimal"}),
        error_messages={
            "invalid": "The cost cap must be an amount of dollars, like 2.50 (or empty for no cap).",
            "max_decimal_places": "The cost cap has at most 6 decimal places (a micro-dollar).",
        },
    )


class StartRunForm(forms.Form):
    objective = forms.CharField(
        strip=True,
        widget=forms.Textarea(attrs={"rows": 5, "data-count": "objective"}),
        error_messages={"required": "Say what the agent should achieve: the objective is empty."},
    )
    max_iterations = _max_iterations_field()
    max_cost_usd = _cost_cap_field()
    max_minutes = forms.IntegerField(
        required=False,
        min_value=1,
        label="Time limit (minutes)",
        widget=forms.NumberInput(attrs={"placeholder": "none"}),
        error_messages={"invalid": "The time limit must be a whole number of minutes (or empty for none)."},
    )
    nonce = forms.CharField(widget=forms.HiddenInput, required=False, max_length=64)

    def __init__(self, *args: Any, instance: Any, **kwargs: Any) -> None:
        kwargs.setdefault("initial", {})
        kwargs["initial"].setdefault("max_iterations", instance.max_iterations)
        kwargs["initial"].setdefault("nonce", fresh_nonce())
        super().__init__(*args, **kwargs)
        self.instance = instance
        self.fields["objective"].widget.attrs["data-max-chars"] = str(instance.objective_max_chars)

    def clean_objective(self) -> str:
        # Browsers send a textarea's line breaks as CRLF; count them as the page's counter does.
        return normalise_newlines(self.cleaned_data["objective"])


class InterjectForm(forms.Form):
    text = forms.CharField(
        strip=True,
        label="Message to the agent",
        widget=forms.Textarea(attrs={"rows": 3}),
        error_messages={"required": "The message is empty: write what the agent should know."},
    )
    nonce = forms.CharField(widget=forms.HiddenInput, required=False, max_length=64)

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        kwargs.setdefault("initial", {}).setdefault("nonce", fresh_nonce())
        super().__init__(*args, **kwargs)
        self.run = run
        self.fields["text"].label = (
            "Your answer" if run.status == Run.Status.WAITING and not run.waiting_for_children else "Message to the agent"
        )

    def clean_text(self) -> str:
        return normalise_newlines(self.cleaned_data["text"])


class ContinueRunForm(forms.Form):
    """Continue a finished run as a new one: a message for its first iteration, and its limits."""

    message = forms.CharField(
        required=False,
        strip=True,
        label="Message for the new run",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "optional: what to do differently"}),
    )
    max_iterations = _max_iterations_field(label="Max iterations")
    max_cost_usd = _cost_cap_field()

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        from budgets import money

        initial = kwargs.setdefault("initial", {})
        initial.setdefault("max_iterations", run.max_iterations)
        if run.max_cost_micros is not None:
            initial.setdefault("max_cost_usd", money.format_usd(run.max_cost_micros).lstrip("$").replace(",", ""))
        super().__init__(*args, **kwargs)
        self.run = run
        if run.max_cost_micros is not None:
            self.fields["max_cost_usd"].widget.attrs["placeholder"] = "same cap as before"
        for name in ("message", "max_iterations", "max_cost_usd"):
            self.fields[name].widget.attrs["id"] = f"run-{run.pk}-continue-{name.replace('_', '-')}"

    def clean_message(self) -> str:
        return normalise_newlines(self.cleaned_data["message"])


class ResumeRunForm(forms.Form):
    """Resume a budget_exhausted run with a new cap, within what its pools can grant (see live.ResumeOffer)."""

    max_cost_usd = _cost_cap_field()

    def __init__(self, *args: Any, run: Run, offer: Any, **kwargs: Any) -> None:
        from budgets import money

        initial = kwargs.setdefault("initial", {})
        if offer.suggested is not None:
            initial.setdefault("max_cost_usd", money.format_usd(offer.suggested).lstrip("$").replace(",", ""))
        super().__init__(*args, **kwargs)
        self.run, self.offer = run, offer
        field = self.fields["max_cost_usd"]
        field.label = "Resume with a cap of $"
        attrs = field.widget.attrs
        attrs["id"] = f"run-{run.pk}-resume-cap"
        attrs["placeholder"] = "no cap" if offer.cap is None else "a new cap"
        attrs["step"] = "any"  # the bounds are said in words, and checked here with what to give instead

    def clean_max_cost_usd(self) -> Any:
        from budgets import money

        value = self.cleaned_data["max_cost_usd"]
        micros = None if value is None else money.usd_to_micros(value)
        why = self.offer.refusal(micros)
        if why:
            raise forms.ValidationError(why)
        return value


class HistoryFilterForm(forms.Form):
    instance = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    outcome = forms.ChoiceField(required=False)
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, instances: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["instance"].choices = [("", "all instances"), *instances]
        self.fields["outcome"].choices = [
            ("", "any outcome"),
            ("active", "not finished"),
            ("waiting", "waiting for you"),
            ("stopped", "stopped without finishing"),
            ("verified", "done, verified"),
            ("unverified", "done, not verified"),
            *[(value, value.replace("_", " ")) for value in Run.Outcome.values],
        ]


class TokenForm(forms.Form):
    """A new API token: what uses it, and how long it lives."""

    LIFETIMES = [("", "never (until revoked)"), ("7", "7 days"), ("30", "30 days"), ("90", "90 days"), ("365", "1 year")]

    name = forms.CharField(
        max_length=100,
        strip=True,
        error_messages={
            "required": "Name the token after what will use it, like 'ci' or 'laptop'.",
            "max_length": "A token's name can be at most %(limit_value)d characters; this one has %(show_value)d.",
        },
    )
    days = forms.TypedChoiceField(
        choices=LIFETIMES,
        coerce=int,
        empty_value=None,
        required=False,
        label="Expires after",
        error_messages={"invalid_choice": "Choose one of the listed lifetimes."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No maxlength: a browser would cut a longer name silently; the server refuses it, saying so.
        self.fields["name"].widget.attrs.pop("maxlength", None)

    def clean_name(self) -> str:
        from instances.validation import invisible

        name = self.cleaned_data["name"]
        if why := invisible(name):
            raise forms.ValidationError(f"The name {why}.")
        return name
