"""Console forms: they parse what a person typed; the rules are `loops.schemas`' (bounds: `tether.limits`).

A form's fields turn the typed text into values (a number, an amount); `clean` then checks them
with the same schema the REST API and MCP use, and words a refusal for the person at the form
(its field's name, a bound as a bound). What depends on the run or the instance (an objective's
cap, a budget) is `loops.services`'.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django import forms
from pydantic import ValidationError

from budgets import money
from instances.validation import invisible
from loops import continuation, schemas
from loops.models import Run
from tether import limits
from tether.schema import Body, describe


def fresh_nonce() -> str:
    return uuid.uuid4().hex


def normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def said(label: str, error: Mapping[str, Any]) -> str:
    """One pydantic `error` of a schema, as a sentence about the field a person calls `label`."""
    context = error.get("ctx") or {}
    got, low, high = context.get("got"), context.get("low"), context.get("high")
    if isinstance(got, int) and high is not None and got > high:
        return f"{label} can be at most {high:,}."
    if isinstance(got, int) and low is not None and got < low:
        return f"{label} must be at least {low:,}."
    sentence, field = describe([error])
    if field and sentence.startswith(field):
        sentence = sentence[len(field) :]
    sentence = sentence if sentence[:1] in (":", ",", "[") else f" {sentence.lstrip()}"
    return f"{label}{sentence}".rstrip(".") + "."


class Checked(forms.Form):
    """A form whose values a `loops.schemas` body checks: one rule for every surface, worded for a person.

    `SCHEMA`: the body; `FIELDS`: form field -> (the body's field, its name in a sentence).
    """

    SCHEMA: type[Body]
    FIELDS: dict[str, tuple[str, str]]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        present = {name: (field, label) for name, (field, label) in self.FIELDS.items() if name in data}
        try:
            body = self.SCHEMA.model_validate({field: data[name] for name, (field, _) in present.items()})
        except ValidationError as exc:
            by_field = {field: (name, label) for name, (field, label) in self.FIELDS.items()}
            for error in exc.errors(include_url=False):
                loc = error["loc"]
                name, label = by_field.get(str(loc[0]), (None, "")) if loc else (None, "")
                if name is None or self.has_error(name):
                    continue  # a field the form refused already (or a rule of the whole body: the service says it)
                self.add_error(name, said(label, error))
            return data
        for name, (field, _) in present.items():
            data[name] = getattr(body, field)
        return data


def _max_iterations_field(**extra):
    return forms.IntegerField(
        widget=forms.NumberInput(attrs={"min": 1, "max": limits.MAX_ITERATIONS}),
        error_messages={
            "required": f"Give a maximum number of iterations (1 to {limits.MAX_ITERATIONS:,}).",
            "invalid": "Max iterations must be a whole number, like 10.",
        },
        **extra,
    )


def _cost_cap_field():
    return forms.DecimalField(
        required=False,
        label="Cost cap (USD)",
        widget=forms.NumberInput(
            attrs={"min": limits.CAP_MIN_USD, "step": "0.01", "placeholder": "no cap", "inputmode": "decimal"}
        ),
        error_messages={
            "invalid": "The cost cap must be an amount of dollars, like 2.50 (or empty for no cap).",
        },
    )


# The limits a new run is given, as `Checked.FIELDS` names them (`_max_iterations_field`, `_cost_cap_field`).
_RUN_LIMITS = {
    "max_iterations": ("max_iterations", "Max iterations"),
    "max_cost_usd": ("max_cost_usd", "The cost cap"),
}


class StartRunForm(Checked):
    SCHEMA = schemas.RunIn
    FIELDS = {
        "objective": ("objective", "The objective"),
        **_RUN_LIMITS,
        "max_minutes": ("max_minutes", "The time limit"),
    }

    objective = forms.CharField(
        strip=True,
        widget=forms.Textarea(attrs={"rows": 5, "data-count": "objective"}),
        error_messages={"required": "Say what the agent should achieve: the objective is empty."},
    )
    max_iterations = _max_iterations_field()
    max_cost_usd = _cost_cap_field()
    max_minutes = forms.IntegerField(
        required=False,
        label="Time limit (minutes)",
        widget=forms.NumberInput(attrs={"min": 1, "max": limits.MAX_MINUTES, "placeholder": "none"}),
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


class InterjectForm(Checked):
    SCHEMA = schemas.Interjection
    FIELDS = {"text": ("message", "The message")}

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


class ContinueRunForm(Checked):
    """Continue a finished run as a new one: a message for its first iteration, and its limits."""

    SCHEMA = schemas.RunContinueIn
    FIELDS = {"message": ("message", "The message"), **_RUN_LIMITS}

    message = forms.CharField(
        required=False,
        strip=True,
        label="Message for the new run",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "optional: what to do differently"}),
    )
    max_iterations = _max_iterations_field(label="Max iterations")
    max_cost_usd = _cost_cap_field()

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        initial = kwargs.setdefault("initial", {})
        initial.setdefault("max_iterations", run.max_iterations)
        if run.max_cost_micros is not None:
            initial.setdefault("max_cost_usd", money.format_usd(run.max_cost_micros).lstrip("$").replace(",", ""))
        super().__init__(*args, **kwargs)
        self.run = run
        if continuation.follows_up(outcome=run.outcome, verified=run.verified):  # the message is the new objective
            self.fields["message"].required = True
            self.fields["message"].label = "What to do next (the new run's objective)"
            self.fields["message"].widget.attrs["placeholder"] = "the follow-up: what to do now that this is done"
        if run.max_cost_micros is not None:
            self.fields["max_cost_usd"].widget.attrs["placeholder"] = "same cap as before"
        for name in ("message", "max_iterations", "max_cost_usd"):
            self.fields[name].widget.attrs["id"] = f"run-{run.pk}-continue-{name.replace('_', '-')}"

    def clean_message(self) -> str:
        return normalise_newlines(self.cleaned_data["message"])


class ResumeRunForm(Checked):
    """Resume a budget_exhausted run with a new cap, within what its pools can grant (see live.ResumeOffer)."""

    SCHEMA = schemas.ResumeIn
    FIELDS = {"max_cost_usd": ("max_cost_usd", "The cap")}

    max_cost_usd = _cost_cap_field()

    def __init__(self, *args: Any, run: Run, offer: Any, **kwargs: Any) -> None:
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

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if "max_cost_usd" in data and not self.has_error("max_cost_usd"):  # a cap the schema took
            value = data["max_cost_usd"]
            why = self.offer.refusal(None if value is None else money.usd_to_micros(value))
            if why:
                self.add_error("max_cost_usd", why)
        return data


class HistoryFilterForm(forms.Form):
    instance = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    outcome = forms.ChoiceField(required=False)
    origin = forms.ChoiceField(
        required=False, label="Started", choices=[("", "any way"), *Run.Origin.choices]
    )
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
        max_length=limits.NAME_MAX_CHARS,
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
        name = self.cleaned_data["name"]
        if why := invisible(name):
            raise forms.ValidationError(f"The name {why}.")
        return name
