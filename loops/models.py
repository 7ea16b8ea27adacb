from django.conf import settings
from django.db import models


class Run(models.Model):
    """One pursuit of one objective by one instance."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        WAITING = "waiting"
        FINISHED = "finished"

    class Outcome(models.TextChoices):
        DONE = "done"
        ESCALATED = "escalated"
        FAILED = "failed"
        CANCELLED = "cancelled"
        BUDGET_EXHAUSTED = "budget_exhausted"
        MAX_ITERATIONS = "max_iterations"
        NO_PROGRESS = "no_progress"
        CREDENTIAL_ERROR = "credential_error"
        PROVIDER_ERROR = "provider_error"
        TIMED_OUT = "timed_out"
        CRASHED = "crashed"

    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="runs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    objective = models.TextField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices, blank=True)
    outcome_detail = models.TextField(blank=True)
    verified = models.BooleanField(null=True)
    max_iterations = models.PositiveIntegerField()
    max_cost_micros = models.BigIntegerField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)

    # The loop's position: the number of the next iteration to run, and what it is told.
    next_iteration = models.PositiveIntegerField(default=1)
    next_instruction = models.TextField(blank=True)
    # Bookkeeping the no-progress rule reads: recent instructions and (fingerprint, checks) pairs.
    history = models.JSONField(default=dict, blank=True)

    # The lease: who drives the run, until when. A null token with an expiry means
    # "handed to the queue; if nobody claims it by then, the reaper re-schedules it".
    lease_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 (null = free)
    lease_holder = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    attempt = models.PositiveIntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    last_seq = models.PositiveIntegerField(default=0)
    spent_micros = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status="finished") | models.Q(outcome=""),
                name="run_outcome_only_when_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk}"

    @property
    def iterations_done(self) -> int:
        return self.next_iteration - 1


class Iteration(models.Model):
    """One recorded turn of the loop. Recorded at most once per (run, number)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="iterations")
    number = models.PositiveIntegerField()
    instruction = models.TextField()
    response = models.TextField(blank=True)
    act_ok = models.BooleanField(default=False)
    act_detail = models.TextField(blank=True)
    checks = models.JSONField(default=list)
    decision = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64, blank=True)
    cost_micros = models.BigIntegerField(default=0)
    usage = models.JSONField(default=dict)
    worker = models.CharField(max_length=100, blank=True)
    lease_token = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="iteration_once_per_run")]

    def __str__(self) -> str:
        return f"run {self.run_id} iteration {self.number}"


class Event(models.Model):
    """An append-only, per-run numbered record. `seq` is gap-free per run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_seq_once_per_run")]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.kind}"

    def as_json(self) -> dict:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "at": self.created_at.isoformat(),
            "data": self.data,
        }


class Interjection(models.Model):
    """A human message queued into a live run, consumed at the next iteration boundary."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="interjections")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_in_iteration = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"message to run {self.run_id}"


class ApiToken(models.Model):
    """A bearer token for API clients; only its SHA-256 digest is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token {self.prefix}… of {self.user_id}"
