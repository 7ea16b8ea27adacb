"""Reads for the console: runs, instances, timelines, history. No writes.

Every function that takes a `user` returns only what that user owns; a run or an
instance of someone else reads as absent (the pages turn that into a 404 and the
sockets into close code 4404).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, F, Max, Q, QuerySet, Sum
from django.utils import timezone

from budgets import money
from instances.models import Instance
from loops import event_kinds, outcomes
from loops.models import Event, Iteration, Run

# Outcomes that a person should look at: the loop stopped without doing the work.
TROUBLE_OUTCOMES = outcomes.TROUBLE
NEEDS_YOU_DAYS = 7
NEEDS_YOU_LIMIT = 20
TIMELINE_WINDOW = 150


# --- ownership -----------------------------------------------------------------------------


def instances_for(user: Any) -> QuerySet[Instance]:
    """Return the user's instances (not archived ones) with their active and total run counts."""
    return Instance.objects.filter(owner=user, archived_at__isnull=True).annotate(
        # A parent waiting for its children is at work (they work for it), not waiting for a person.
        active_runs=Count(
            "runs", filter=Q(runs__status__in=[Run.Status.QUEUED, Run.Status.RUNNING]) | Run.parked_on_children("runs__")
        ),
        waiting_runs=Count("runs", filter=Q(runs__status=Run.Status.WAITING) & ~Run.parked_on_children("runs__")),
        total_runs=Count("runs"),
        last_run_at=Max("runs__created_at"),
    )


def instance_for(user: Any, instance_id: int) -> Instance | None:
    if not getattr(user, "is_authenticated", False):
        return None
    return Instance.objects.filter(owner=user, pk=instance_id).first()


def run_for(user: Any, run_id: int) -> Run | None:
    """Return the user's run `run_id` (with its instance), or None."""
    if not getattr(user, "is_authenticated", False):
        return None
    return Run.objects.select_related("instance").filter(owner=user, pk=run_id).first()


def runs_for(user: Any) -> QuerySet[Run]:
    return Run.objects.filter(owner=user).select_related("instance")


# --- the fleet -------------------------------------------------------------------------------


def active_runs(user: Any) -> QuerySet[Run]:
    """Return the user's runs that the loop is working on (queued or running), newest first."""
    return runs_for(user).filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).order_by("-id")


@dataclass
class NeedsYou:
    waiting: list[Run]
    failed: list[Run]
    unverified: list[Run]
    since: datetime

    @property
    def count(self) -> int:
        return len(self.waiting) + len(self.failed) + len(self.unverified)


def needs_you(user: Any, now: datetime | None = None) -> NeedsYou:
    """Return what needs a person: waiting runs, and recent failed or done-but-unverified runs."""
    since = (now or timezone.now()) - timedelta(days=NEEDS_YOU_DAYS)
    runs = runs_for(user)
    # A finished run a person already continued is handled: its continuation is what they watch now.
    recent = (
        runs.filter(status=Run.Status.FINISHED, finished_at__gte=since, continuation__isnull=True)
        .order_by("-finished_at")
    )
    return NeedsYou(
        # A parent waiting for its children needs nobody; a child waiting for a person is listed itself.
        waiting=list(
            runs.filter(status=Run.Status.WAITING)
            .exclude(Run.parked_on_children())
            .order_by("-id")[:NEEDS_YOU_LIMIT]
        ),
        failed=list(recent.filter(outcome__in=TROUBLE_OUTCOMES)[:NEEDS_YOU_LIMIT]),
        unverified=list(recent.filter(outcome=Run.Outcome.DONE, verified=False)[:NEEDS_YOU_LIMIT]),
        since=since,
    )


def fleet_version(user: Any) -> tuple[int, int]:
    """Return a value that changes whenever any of the user's runs records an event or a run starts."""
    row = Run.objects.filter(owner=user).aggregate(events=Sum("last_seq"), runs=Count("id"))
    return (row["events"] or 0, row["runs"] or 0)


# --- a run as JSON ----------------------------------------------------------------------------
#
# The one mapping of a run's fields to JSON: the REST API and MCP answer `run_json(run)` (the
# `loops.schemas.Run` shape); receipts, webhooks and a trigger's answer take projections of it.


def origin_json(run: Run) -> dict[str, Any]:
    """Return how the run started: its kind, and which schedule and firing or trigger and delivery."""
    ref = run.origin_ref if isinstance(run.origin_ref, dict) else {}
    return {"kind": run.origin, **{key: ref[key] for key in ORIGIN_KEYS if key in ref}}


ORIGIN_KEYS = ("schedule", "firing", "trigger", "delivery", "parent")


def child_ids(run: Run) -> list[int]:
    """Return the ids of the runs `run` delegated to, oldest first (one query unless prefetched)."""
    cached = getattr(run, "_prefetched_objects_cache", {}).get("children")
    if cached is not None:
        return sorted(child.pk for child in cached)
    return list(Run.objects.filter(parent_id=run.pk).order_by("pk").values_list("pk", flat=True))


def continued_as(run: Run) -> int | None:
    """Return the id of the run that continues `run`, or None (one query unless select_related)."""
    later = getattr(run, "continuation", None)
    return later.pk if later is not None else None


def _at(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


RUN_FIELDS: dict[str, Callable[[Run], Any]] = {
    "id": lambda run: run.pk,
    "instance": lambda run: run.instance_id,
    "objective": lambda run: run.objective,
    "origin": origin_json,
    "status": lambda run: run.status,
    "outcome": lambda run: run.outcome or None,
    "outcome_detail": lambda run: run.outcome_detail or None,
    "verified": lambda run: run.verified,
    "iterations": lambda run: run.iterations_done,
    "max_iterations": lambda run: run.max_iterations,
    "spent_usd": lambda run: money.usd_string(run.spent_micros),
    "spent_micros": lambda run: run.spent_micros,
    "max_cost_usd": lambda run: None if run.max_cost_micros is None else money.usd_string(run.max_cost_micros),
    "stop_requested": lambda run: run.cancel_requested_at is not None,
    "last_seq": lambda run: run.last_seq,
    "created_at": lambda run: _at(run.created_at),
    "started_at": lambda run: _at(run.started_at),
    "finished_at": lambda run: _at(run.finished_at),
    "continued_from": lambda run: run.continued_from_id,
    "continued_as": continued_as,
    "parent": lambda run: run.parent_id,
    "children": child_ids,
}
# What the API and MCP answer for a run (`loops.schemas.Run`): every field but the raw micros.
API_FIELDS = tuple(name for name in RUN_FIELDS if name != "spent_micros")


def run_json(run: Run, fields: Sequence[str] = API_FIELDS) -> dict[str, Any]:
    """Return `run` as JSON: the API's shape, or the projection on `fields` (each mapped as in RUN_FIELDS)."""
    return {name: RUN_FIELDS[name](run) for name in fields}


# --- one run ----------------------------------------------------------------------------------


def event_iteration(event: Event) -> int | None:
    """Return the iteration `event` belongs to, or None for a run-level event (see loops.event_kinds)."""
    return event_kinds.in_iteration(event.kind, event.data or {})


@dataclass
class Window:
    """The part of a run's timeline a page shows: events with first <= seq <= last."""

    first: int
    last: int
    events: list[Event]

    @property
    def has_earlier(self) -> bool:
        return self.first > 1


def _window_start(run: Run, before: int, size: int) -> int:
    """Return the seq to start a window that ends before `before`: an iteration's first event when possible."""
    target = before - size
    if target <= 1:
        return 1
    start = (
        Event.objects.filter(run=run, kind="iteration.started", seq__lte=target)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return start or 1


def timeline(run: Run, before: int | None = None, size: int = TIMELINE_WINDOW) -> Window:
    """Return the latest events of `run` (or those before seq `before`), from an iteration's start.

    `last` is the run's last seq at the moment of reading, so a viewer can ask the socket
    for everything after it and miss nothing.
    """
    last = run.last_seq if before is None else before - 1
    if last < 1:
        return Window(first=1, last=0, events=[])
    first = _window_start(run, last + 1, size)
    found = list(Event.objects.filter(run=run, seq__gte=first, seq__lte=last).order_by("seq"))
    if found:
        last = found[-1].seq
    return Window(first=first, last=last, events=found)


@dataclass
class Tree:
    """A run's place in its delegation tree: its parent, its children, and the whole tree's spend."""

    root: Run
    parent: Run | None
    children: list[Run]
    runs: int
    spent_micros: int


def run_tree(run: Run) -> Tree | None:
    """Return the delegation tree around `run`, or None for a run that neither delegated nor was delegated.

    A few queries: one per level up to the root and one per level down from it (depth is bounded
    by TETHER_DELEGATION_MAX_DEPTH).
    """
    children = list(Run.objects.filter(parent_id=run.pk).select_related("instance").order_by("pk"))
    if run.parent_id is None and not children:
        return None
    chain = [run]
    while chain[-1].parent_id is not None:
        above = Run.objects.select_related("instance").filter(pk=chain[-1].parent_id).first()
        if above is None:
            break
        chain.append(above)
    root = chain[-1]
    runs, spent, frontier = 1, root.spent_micros, [root.pk]
    while frontier:
        level = list(Run.objects.filter(parent_id__in=frontier).values_list("pk", "spent_micros"))
        runs += len(level)
        spent += sum(micros for _, micros in level)
        frontier = [pk for pk, _ in level]
    return Tree(root=root, parent=chain[1] if len(chain) > 1 else None, children=children, runs=runs, spent_micros=spent)


def events_between(spans: dict[int, tuple[int, int]]) -> dict[int, list[Event]]:
    """Return, per run of `spans` (run -> (after, upto)), its events with a seq above `after` and up to
    `upto`, oldest first (seqs are gap-free): one query for every run, in the order `spans` names them."""
    found: dict[int, list[Event]] = {run_id: [] for run_id in spans}
    if not spans:
        return found
    where = Q()
    for run_id, (after, upto) in spans.items():
        where |= Q(run_id=run_id, seq__gt=after, seq__lte=upto)
    for event in Event.objects.filter(where).order_by("run_id", "seq"):
        found[event.run_id].append(event)
    return found


CHART_ITERATIONS = 60
CHART_ALL_ITERATIONS = 5000  # "show all": every iteration a sane run has


def chart_iterations(run: Run, limit: int = CHART_ITERATIONS) -> list[Iteration]:
    """Return the run's latest `limit` iterations, oldest first (only the fields the chart draws)."""
    latest = list(
        Iteration.objects.filter(run=run)
        .order_by("-number")
        .only("number", "cost_micros", "checks", "act_ok", "decision")[:limit]
    )
    latest.reverse()
    return latest


# --- history -------------------------------------------------------------------------------------


@dataclass
class HistoryFilter:
    instance: int | None = None
    outcome: str = ""
    origin: str = ""
    since: date | None = None
    until: date | None = None


@dataclass
class Totals:
    runs: int
    iterations: int
    spent_micros: int
    by_outcome: list[tuple[str, int]]


def history(user: Any, chosen: HistoryFilter) -> QuerySet[Run]:
    """Return the user's runs matching the filter, newest first."""
    runs = runs_for(user).order_by("-created_at", "-id")
    if chosen.instance is not None:
        runs = runs.filter(instance_id=chosen.instance)
    if chosen.origin:
        runs = runs.filter(origin=chosen.origin)
    if chosen.outcome == "active":
        runs = runs.exclude(status=Run.Status.FINISHED)
    elif chosen.outcome == "waiting":
        runs = runs.filter(status=Run.Status.WAITING)
    elif chosen.outcome == "stopped":
        runs = runs.filter(outcome__in=TROUBLE_OUTCOMES)
    elif chosen.outcome == "unverified":
        runs = runs.filter(outcome=Run.Outcome.DONE, verified=False)
    elif chosen.outcome == "verified":
        runs = runs.filter(outcome=Run.Outcome.DONE, verified=True)
    elif chosen.outcome:
        runs = runs.filter(outcome=chosen.outcome)
    tz = timezone.get_current_timezone()
    if chosen.since is not None:
        runs = runs.filter(created_at__gte=datetime.combine(chosen.since, time.min, tzinfo=tz))
    if chosen.until is not None and chosen.until < date.max:  # the last day has no day after it
        runs = runs.filter(
            created_at__lt=datetime.combine(chosen.until + timedelta(days=1), time.min, tzinfo=tz)
        )
    return runs


def totals(runs: QuerySet[Run]) -> Totals:
    """Return the count, iterations and spend of `runs`, and how many ended each way (done split by verified)."""
    row = runs.order_by().aggregate(
        runs=Count("id"), iterations=Sum(F("next_iteration") - 1), spent=Sum("spent_micros")
    )
    outcomes = (
        runs.order_by()
        .values("status", "outcome", "verified")
        .annotate(n=Count("id"))
        .order_by("status", "outcome", "verified")
    )
    counted: dict[str, int] = {}
    for item in outcomes:
        label = item["outcome"] or item["status"]
        if label == Run.Outcome.DONE:  # "done" alone mixes what was checked with what was not
            label = "done, verified" if item["verified"] else "done, not verified"
        counted[label] = counted.get(label, 0) + item["n"]
    return Totals(
        runs=row["runs"] or 0,
        iterations=row["iterations"] or 0,
        spent_micros=row["spent"] or 0,
        by_outcome=sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])),
    )
