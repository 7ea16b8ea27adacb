"""What grades a finished run and what a person sees of it afterwards.

`Grading` is configuration (per instance, or per agent template as a default); the rest is
written by `reviews.graders`, `reviews.snapshots`, `reviews.services`, `reviews.receipts`,
and `reviews.notify`, never by the loop itself. The audit trail is the `audit` app's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import jsonschema
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from budgets import selectors as budget_selectors
from budgets.pricing import UnpricedModel
from instances import credentials


class Grading(models.Model):
    """How a `done` is graded and how often a verified one is sampled for review.

    Keyed by an instance, or by an agent template (the default for the instances made from it);
    an instance's own row wins over its template's. Fields left empty fall back the same way, and
    then to the settings (`TETHER_REVIEW_SAMPLE_PERCENT`, 10 %).
    """

    instance = models.OneToOneField(
        "instances.Instance", null=True, blank=True, on_delete=models.CASCADE, related_name="grading"
    )
    template = models.OneToOneField(
        "instances.AgentTemplate", null=True, blank=True, on_delete=models.CASCADE, related_name="grading"
    )
    response_schema = models.JSONField(
        null=True, blank=True, help_text="a JSON Schema the final answer (parsed as JSON) must satisfy"
    )
    response_pattern = models.TextField(
        blank=True, help_text="a regular expression the final answer must match (searched, multi-line)"
    )
    judge = models.BooleanField(
        null=True, blank=True, help_text="ask an independent Claude prompt to grade the final result"
    )
    judge_criteria = models.TextField(
        blank=True, help_text="acceptance criteria the judge grades against, besides the objective itself"
    )
    judge_model = models.CharField(max_length=100, blank=True, help_text="blank: the instance's model")
    sample_percent = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(100))],
        help_text="share of verified dones sent to review; blank: the template's, else the setting (10)",
    )
    expects_changes = models.BooleanField(
        null=True,
        blank=True,
        help_text="a done must change the workspace; blank: yes when the instance has checks or is a coder",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(instance__isnull=False) & Q(template__isnull=True))
                | (Q(instance__isnull=True) & Q(template__isnull=False)),
                name="grading_for_an_instance_or_a_template",
            ),
        ]

    def __str__(self) -> str:
        return f"grading of {self.instance or self.template}"

    def clean(self) -> None:
        if self.response_pattern:
            try:
                re.compile(self.response_pattern)
            except re.error as exc:
                raise ValidationError({"response_pattern": f"not a regular expression: {exc}"}) from None
        if self.response_schema is not None:
            try:
                jsonschema.validators.validator_for(self.response_schema).check_schema(self.response_schema)
            except jsonschema.SchemaError as exc:
                raise ValidationError({"response_schema": f"not a JSON Schema: {exc.message}"}) from None
        if self.judge_model:
            # A judge call that cannot be priced could not be metered: it would never be made.
            try:
                budget_selectors.price_for_model(self.judge_model)
            except UnpricedModel as exc:
                raise ValidationError({"judge_model": str(exc)}) from None


class GradeRecord(models.Model):
    """The graders' verdict on one iteration whose decider proposed `done`."""

    run = models.ForeignKey("loops.Run", on_delete=models.CASCADE, related_name="grades")
    iteration = models.PositiveIntegerField()
    verified = models.BooleanField(null=True)
    review = models.BooleanField(default=False, help_text="the graders want a person to look")
    outcome = models.CharField(max_length=20, help_text="what the graders made of the done")
    reasons = models.JSONField(default=list)
    response_check = models.JSONField(null=True, blank=True)
    judge = models.JSONField(null=True, blank=True)
    unchanged_workspace = models.BooleanField(null=True)
    usage = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "iteration"]
        constraints = [models.UniqueConstraint(fields=["run", "iteration"], name="grade_once_per_iteration")]

    def __str__(self) -> str:
        return f"grade of run {self.run_id} iteration {self.iteration}"

    def as_json(self) -> dict[str, Any]:
        """Return the recorded grade as JSON: its iteration and what `reviews.graders.Grade.as_json` wrote."""
        return {"iteration": self.iteration, **{name: getattr(self, name) for name in self.JSON_FIELDS}}

    # The columns `reviews.graders.Grade.as_json` fills, by the same names (the grade's JSON, stored).
    JSON_FIELDS = ("verified", "outcome", "review", "reasons", "response_check", "judge", "unchanged_workspace")

    @classmethod
    def latest_for(cls, run: Any) -> GradeRecord | None:
        """Return the grade of the run's last graded iteration (None when no done was graded)."""
        return cls.objects.filter(run=run).order_by("-iteration").first()



class WorkspaceSnapshot(models.Model):
    """The workspace at a run's start (and end): a tree in a shadow git directory, and a fingerprint."""

    class Method(models.TextChoices):
        GIT = "git"
        NONE = "none"

    run = models.OneToOneField("loops.Run", on_delete=models.CASCADE, related_name="workspace_snapshot")
    method = models.CharField(max_length=10, choices=Method.choices)
    workspace = models.CharField(max_length=500)
    start_tree = models.CharField(max_length=64, blank=True)
    end_tree = models.CharField(max_length=64, blank=True)
    start_fingerprint = models.CharField(max_length=64, blank=True)
    end_fingerprint = models.CharField(max_length=64, blank=True)
    # The workspace's own git HEAD at the start, when it is a repository (shown to reviewers).
    workspace_head = models.CharField(max_length=64, blank=True)
    note = models.TextField(blank=True, help_text="why there is no diff, when there is none")
    taken_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"workspace of run {self.run_id}"


class ReviewItem(models.Model):
    """A finished (or waiting) run that needs a person's eyes, and that person's verdict."""

    class Reason(models.TextChoices):
        UNVERIFIED = "unverified", "done, unverified"
        EVIDENCE = "evidence", "changed what grades it"
        NEEDS_HUMAN = "needs_human", "the judge asks for a person"
        ESCALATED = "escalated", "escalated"
        FAILED = "failed", "failed"
        SAMPLED = "sampled", "sampled verified done"

    class Status(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        REJECTED = "rejected"
        RESOLVED = "resolved", "resolved without a verdict"

    run = models.ForeignKey("loops.Run", on_delete=models.CASCADE, related_name="review_items")
    reason = models.CharField(max_length=20, choices=Reason.choices)
    detail = models.TextField(blank=True)
    # Which finish (or escalation) of the run raised the item: a repeated hook call changes nothing,
    # a later finish of a resumed run reopens it.
    occasion = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    note = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # How the verdict was reached (see `reviews.watch`): when a reviewer first opened the item's diff,
    # the seconds the verdict took, and whether it was a rubber stamp (quick, the diff never opened).
    diff_opened_at = models.DateTimeField(null=True, blank=True)
    seconds_taken = models.FloatField(null=True, blank=True)
    rubber_stamp = models.BooleanField(default=False)
    # An accepted item that a person reopened or whose run was rolled back: the review missed it.
    missed_in_review = models.BooleanField(default=False, db_index=True)
    missed_detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["run", "reason"], name="review_once_per_run_and_reason")]

    def __str__(self) -> str:
        return f"review of run {self.run_id} ({self.reason})"

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING


class Receipt(models.Model):
    """The signed summary of a finished run (see `reviews.receipts`)."""

    run = models.OneToOneField("loops.Run", on_delete=models.CASCADE, related_name="receipt")
    envelope = models.JSONField()
    signed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"receipt of run {self.run_id}"


class NotificationTarget(models.Model):
    """Where a user wants to be told about runs and pools: an e-mail address or a webhook URL."""

    class Kind(models.TextChoices):
        EMAIL = "email", "e-mail"
        WEBHOOK = "webhook"

    class Event(models.TextChoices):
        """What a target can be told about; the labels are what the console shows a person."""

        ESCALATED = "run.escalated", "A run needs you"
        FAILED = "run.failed", "A run failed or hit a limit"
        BUDGET_EXHAUSTED = "run.budget_exhausted", "A run ran out of budget"
        CHILD_RESULT = "run.child_result", "A continued child run finished after its parent stopped waiting"
        THRESHOLD = "pool.threshold", "A pool crossed its soft threshold"
        REVIEW_WAITING = "review.waiting", "Review items wait too long or pile up"
        DIGEST = "digest.sent", "Your daily or weekly summary"
        SCHEDULE_SKIPPED = "schedule.skipped", "A schedule skipped a firing: its pools cannot cover it"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_targets"
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    address = models.CharField(max_length=500, help_text="an e-mail address, or the webhook's https URL")
    # The webhook's HMAC key, encrypted like an API key (see instances.credentials); write-only.
    secret_encrypted = models.TextField(blank=True, editable=False)
    events = models.JSONField(default=list, blank=True, help_text="event names; empty: all of them")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.address}"

    @classmethod
    def unknown_events(cls, events: Iterable[str]) -> list[str]:
        """Return the names among `events` that are no event a target can be told about, sorted."""
        return sorted(set(events) - set(cls.Event.values))

    def event_labels(self) -> list[str]:
        """Return the events this target wants as a person reads them (unknown keys as they are)."""
        labels = dict(self.Event.choices)
        return [str(labels.get(event, event)) for event in self.events]

    def wants(self, event: str) -> bool:
        return self.active and (not self.events or event in self.events)

    def set_secret(self, secret: str) -> None:
        self.secret_encrypted = credentials.encrypt(secret)

    def reveal_secret(self) -> str:
        return credentials.decrypt(self.secret_encrypted) if self.secret_encrypted else ""


class Delivery(models.Model):
    """One notification to one target; retried with backoff; every attempt is kept."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed", "gave up"

    target = models.ForeignKey(NotificationTarget, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40)
    key = models.CharField(max_length=200, help_text="one delivery per target and key (idempotency)")
    run = models.ForeignKey("loops.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["target", "key"], name="delivery_once_per_target_and_key")]

    def __str__(self) -> str:
        return f"{self.event} to {self.target}"


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="delivery_attempt_numbered_once")
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery}"


class DigestPreference(models.Model):
    """A person's digest: how often (off by default), in which time zone, and what was already sent or seen."""

    class Frequency(models.TextChoices):
        OFF = "off"
        DAILY = "daily"
        WEEKLY = "weekly"

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="digest_preference")
    frequency = models.CharField(max_length=10, choices=Frequency.choices, default=Frequency.OFF)
    time_zone = models.CharField(max_length=64, default="UTC", help_text="an IANA time zone, e.g. Europe/Paris")
    # The end of the last period a digest was made for (sent, or found empty): never made twice.
    last_period_end = models.DateTimeField(null=True, blank=True)
    # When the person last opened the "since you last looked" page.
    last_looked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"digest of {self.user} ({self.frequency})"
