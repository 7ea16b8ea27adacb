"""Webhook triggers: an instance's `POST /v1/hooks/<id>` that starts a run from a signed payload.

A `Trigger` belongs to one instance (and so to its owner). Its secret is encrypted as a stored
key is (`instances.credentials`), shown once when made or rotated, and never rendered again. A
`Delivery` is one request to the hook, kept whether it started a run or was refused: its headers
without secrets, an excerpt of its body, what Tether answered and the run it started.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils import timezone as clock

from instances import credentials

SECRET_BYTES = 32


class Trigger(models.Model):
    """An instance's webhook: a signed delivery starts a run whose objective is filled from its payload."""

    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="triggers")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="triggers")
    name = models.CharField(max_length=100)
    objective_template = models.TextField(help_text="e.g. Triage issue #{issue.number}: {issue.title}")
    # Which deliveries start a run: the event names (X-GitHub-Event / X-Tether-Event) and the payload's
    # `action` values it answers; empty: any.
    events = models.JSONField(default=list, blank=True)
    actions = models.JSONField(default=list, blank=True)
    max_iterations = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the instance's")
    max_cost_micros = models.BigIntegerField(
        null=True, blank=True, help_text="empty: no cap of the run's own"
    )
    max_per_minute = models.PositiveIntegerField(default=30)
    active = models.BooleanField(default=True)
    secret_encrypted = models.TextField(editable=False)
    secret_set_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"trigger {self.pk} ({self.name})"

    def __repr__(self) -> str:
        return f"<Trigger {self.pk} {self.name!r}>"

    def new_secret(self) -> str:
        """Set a fresh random secret (encrypted); return it in plain text, to show once."""


        secret = secrets.token_urlsafe(SECRET_BYTES)
        self.secret_encrypted = credentials.encrypt(secret)
        self.secret_set_at = timezone.now()
        return secret

    def reveal(self) -> str:
        """Return the secret in plain text, to check a signature with (never to show)."""

        return credentials.decrypt(self.secret_encrypted)


class Delivery(models.Model):
    """One request to a trigger's hook, accepted or refused."""

    class Outcome(models.TextChoices):
        STARTED = "started", "started a run"
        REPEATED = "repeated", "a redelivery: answered with the first run"
        IGNORED = "ignored", "not an event or action the trigger answers"
        REFUSED = "refused", "refused"

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=200, blank=True)
    event = models.CharField(max_length=100, blank=True)
    received_at = models.DateTimeField(db_index=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    status = models.PositiveSmallIntegerField()
    reason = models.TextField(blank=True)
    headers = models.JSONField(default=dict, blank=True)
    body_excerpt = models.TextField(blank=True)
    body_bytes = models.PositiveIntegerField(default=0)
    run = models.ForeignKey("loops.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            # Exactly one run per delivery id: a redelivery finds this row and starts nothing.
            models.UniqueConstraint(
                fields=["trigger", "delivery_id"],
                condition=models.Q(outcome="started"),
                name="delivery_starts_once",
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.delivery_id or self.pk} to trigger {self.trigger_id}"


class Schedule(models.Model):
    """An instance's recurring run: a cron expression or an interval, in a time zone, within its budget.

    `next_fire_at` is the earliest firing not yet handled; the tick (`triggers.scheduling.tick`,
    on django-q2's scheduler) handles every schedule whose time has come. A firing is recorded as a
    `Firing`, unique per (schedule, scheduled time): that row, made in the same transaction as the
    run, is what makes each firing start at most one run whichever worker cluster gets there.
    """

    class Overlap(models.TextChoices):
        SKIP = "skip", "skip: record the firing as skipped"
        BUFFER_ONE = "buffer_one", "buffer one: start it when the live run ends"
        CANCEL_OTHER = "cancel_other", "cancel the other: stop the live run, then start"
        ALLOW_ALL = "allow_all", "allow all: start it anyway"

    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="schedules")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=100)
    objective_template = models.TextField(
        help_text="e.g. Daily triage for {date}; last run: {last_run.outcome}"
    )
    cron = models.CharField(max_length=100, blank=True, help_text="five fields, read in the time zone")
    interval_minutes = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    max_iterations = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the instance's")
    max_cost_micros = models.BigIntegerField(
        null=True, blank=True, help_text="empty: no cap of the run's own"
    )
    overlap = models.CharField(max_length=12, choices=Overlap.choices, default=Overlap.SKIP)
    catch_up_minutes = models.PositiveIntegerField(
        default=0, help_text="after downtime, the latest missed firing this recent still runs (once)"
    )
    active = models.BooleanField(default=True)
    next_fire_at = models.DateTimeField(null=True, blank=True, db_index=True, editable=False)
    created_at = models.DateTimeField(default=clock.now)  # an interval counts from here (or starts_at)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"schedule {self.pk} ({self.name})"

    def when(self) -> str:
        """How often it fires, for a person: "cron 0 9 * * 1-5 (Europe/Paris)" or "every 15 minutes"."""
        if self.cron:
            return f"cron {self.cron} ({self.timezone})"
        return f"every {self.interval_minutes} minute{'s' if self.interval_minutes != 1 else ''}"


class Firing(models.Model):
    """One firing of a schedule: the run it started, or why it started none."""

    class Outcome(models.TextChoices):
        STARTED = "started", "started a run"
        SKIPPED = "skipped", "skipped"
        MISSED = "missed", "missed"
        BUFFERED = "buffered", "buffered until the live run ends"

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    scheduled_for = models.DateTimeField()
    fired_at = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    reason = models.TextField(blank=True)
    manual = models.BooleanField(default=False, help_text="a person pressed run now")
    run = models.ForeignKey("loops.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            # Exactly once per firing: whichever worker cluster handles a firing first makes this row in
            # the transaction that starts its run; any other finds it taken and starts nothing.
            models.UniqueConstraint(fields=["schedule", "scheduled_for"], name="firing_once"),
        ]

    def __str__(self) -> str:
        return f"firing {self.pk} of schedule {self.schedule_id} ({self.outcome})"
