from django.conf import settings
from django.db import models

from loops import outcomes
from loops.event_kinds import describe_origin


class Run(models.Model):
    """One pursuit of one objective by one instance.

    Run has the writers this docstring names, and no others (tests/ops/test_run_writers.py):
    `loops.services` (start, stop, message, resume, close, continue: what the surfaces ask for),
    `loops.leases` (claim, renew, hand back, release), `loops.runner` (an iteration's record, the
    evidence baseline), `loops.lifecycle` (a finish; what a lost attempt had reserved),
    `loops.delegation` (a parent waiting for its children, and resumed), `loops.driver` (the
    reaper), `loops.events` (the timeline's `last_seq`) and `reviews.services` (a person's
    acceptance verifies a run).
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        WAITING = "waiting"
        FINISHED = "finished"

    # The ways a run can end are stated once, in loops/outcomes.py (pure, so the policy reads them too).
    Outcome = models.TextChoices("Outcome", [(o.name, o.value) for o in outcomes.Outcome])

    class Origin(models.TextChoices):
        """How a run started: who or what asked for it (`origin_ref` says which schedule or trigger)."""

        CONSOLE = "console", "a person, in the console"
        API = "api", "the REST API"
        MCP = "mcp", "an MCP client"
        CLI = "cli", "the command line"
        DELEGATION = "delegation", "another run's delegate call"
        SCHEDULE = "schedule", "a schedule"
        TRIGGER = "trigger", "a webhook trigger"

    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="runs")
    # Delegation: a child run was started by its parent's `delegate` call; its pool is carved
    # from (nested under) the parent's, and the parent waits until its act's children finish.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    depth = models.PositiveSmallIntegerField(default=0, help_text="0 for a run a person started")
    delegation = models.JSONField(
        default=dict, blank=True, help_text="a child: the delegate call that started it; a parent: what it waits for"
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    origin = models.CharField(max_length=20, choices=Origin.choices, default=Origin.API, db_index=True)
    # Which schedule and firing, or which trigger and delivery, started it ({} for the other origins).
    origin_ref = models.JSONField(default=dict, blank=True)
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
    # Protected evidence (see instances.protected): the digests of the protected files as the run found
    # them (null until taken, before the first act), every protected path an act has changed since
    # (sticky), and whether a person's acceptance of the review makes the done verified (the checks
    # and graders verified it; only the changed evidence held it back).
    protected_baseline = models.JSONField(null=True, blank=True)
    # The tests each pytest check collected as the run started, by check name (instances.evidence).
    evidence_baseline = models.JSONField(null=True, blank=True)
    protected_changed = models.JSONField(default=list, blank=True)
    held_for_review = models.BooleanField(default=False)
    # The finished run this one continues (see loops.services.run_continue): it started from that
    # run's memory, in the same workspace. A run is continued at most once ("continued as" is one run).
    continued_from = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continuation"
    )

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
    def origin_text(self) -> str:
        """Return how the run started, for a person ("in the console", "by webhook trigger 3 (delivery …)")."""
        return describe_origin({"kind": self.origin, **(self.origin_ref or {})})

    @property
    def iterations_done(self) -> int:
        return self.next_iteration - 1

    # A parent parked on its children (starting them, or waiting for them): it waits, but for no person.
    PARKED_ON_CHILDREN = ("starting", "waiting")

    @property
    def waiting_for_children(self) -> bool:
        return self.status == Run.Status.WAITING and (self.delegation or {}).get("state") in Run.PARKED_ON_CHILDREN

    @staticmethod
    def parked_on_children(prefix: str = "") -> models.Q:
        """The runs `waiting_for_children`, as a filter (`prefix`: "runs__" from an instance).

        has_key first: a missing key's lookup is NULL, which a negation would drop.
        """
        return models.Q(**{
            f"{prefix}status": Run.Status.WAITING,
            f"{prefix}delegation__has_key": "state",
            f"{prefix}delegation__state__in": Run.PARKED_ON_CHILDREN,
        })


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
    """A bearer token for API clients; only its SHA-256 digest is stored.

    Revoking a token deletes it, so the next request that presents it is refused.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token {self.prefix}… of {self.user_id}"


class ToolCall(models.Model):
    """One tool call of a Claude-brain act, journaled before it runs and again with its result.

    Keyed by (run, iteration, turn, index): the act's tool turn (0: the calls a person approved,
    run before the first model call) and the call's place among the turn's `tool_use` blocks. A
    re-run of the iteration (after its worker died) replays finished calls instead of running
    them again and reports a call started but never finished as interrupted (see loops.journal).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tool_calls")
    iteration = models.PositiveIntegerField()
    turn = models.PositiveIntegerField()
    index = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=1, help_text="the attempt of the iteration that started the call")
    name = models.CharField(max_length=200)
    call = models.JSONField(default=dict, help_text="the tool_use block: id, name, input")
    # The model's whole answer for the turn (kept on the turn's first journaled call): redacted, with the
    # exact answer encrypted beside it when redaction changed it (see loops.journal).
    turn_content = models.JSONField(null=True, blank=True)
    result = models.TextField(blank=True)
    is_error = models.BooleanField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "iteration", "turn", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "iteration", "turn", "index"], name="tool_call_once_per_key")
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        return f"r{self.run_id}-i{self.iteration}-t{self.turn}-c{self.index}"
