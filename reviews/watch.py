"""A review queue that watches its reviewer: backlog and age, alerts, rubber-stamp signals, missed reviews.

Trust is measured, not assumed, and that includes the person who reviews:

- **Backlog and age.** `backlog(items, now)`: how many items wait, the oldest, per template and per
  reviewer (a pending item's reviewer is its run's owner). `alerts(...)` says when the oldest waited
  longer than `TETHER_REVIEW_MAX_WAIT_HOURS` (24) or more than `TETHER_REVIEW_MAX_BACKLOG` (50) wait;
  the queue page shows it as a banner, and `notify_alerts(now)` (run by the periodic task) sends it
  through the notification targets (`review.waiting`), once per oldest item and once a day for a backlog.
- **Rubber stamps.** A verdict records the seconds it took (since the item entered the queue, the
  reviewer opened its diff, or their previous verdict, whichever is latest). A verdict in under
  `TETHER_REVIEW_QUICK_SECONDS` (10) on an item whose diff the reviewer never opened (the item page
  shows the diff; opening it records `diff_opened_at`) is a rubber stamp. `signals(reviewer)` looks at
  the reviewer's last `TETHER_REVIEW_STREAK` (20) verdicts: any rubber stamp among them, or all of
  them (a full window) approvals, fire a signal. While a signal fires for the reviewer of a
  template's runs, `sample_percent` raises that template's sampling rate by
  `TETHER_REVIEW_SAMPLE_BOOST_PERCENT` (25 points, at most 100); it falls back when the signal clears.
- **Missed in review.** `mark_missed(item, why)`: an accepted item that a person reopened, or whose
  run's workspace was rolled back, was missed in review; it counts against its template's trust.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.utils import timezone

from reviews import notify
from reviews.models import ReviewItem

NO_TEMPLATE = "(no template)"  # the group of runs made from no template (also `reviews.selectors`)
DECIDED = (ReviewItem.Status.ACCEPTED, ReviewItem.Status.REJECTED)
BACKLOG_SCAN = 5_000  # the oldest waiting items one watch reads; a backlog past it is already an alert


def max_wait() -> timedelta:
    return timedelta(hours=settings.TETHER_REVIEW_MAX_WAIT_HOURS)


def max_backlog() -> int:
    return int(settings.TETHER_REVIEW_MAX_BACKLOG)


def quick_seconds() -> float:
    return float(settings.TETHER_REVIEW_QUICK_SECONDS)


def streak() -> int:
    return max(int(settings.TETHER_REVIEW_STREAK), 1)


def boost() -> Decimal:
    return Decimal(str(settings.TETHER_REVIEW_SAMPLE_BOOST_PERCENT))


# --- backlog and age ---------------------------------------------------------------------------


@dataclass
class Waiting:
    """How many items wait in one group, and since when the oldest."""

    name: str
    count: int = 0
    oldest: datetime | None = None
    oldest_item: int | None = None
    age: str = "—"  # the oldest's wait, as a person reads it

    def add(self, item: ReviewItem) -> None:
        self.count += 1
        if self.oldest is None or item.created_at < self.oldest:
            self.oldest, self.oldest_item = item.created_at, item.pk


@dataclass
class Backlog:
    now: datetime
    total: Waiting = field(default_factory=lambda: Waiting("all"))
    per_template: list[Waiting] = field(default_factory=list)
    per_reviewer: list[Waiting] = field(default_factory=list)

    @property
    def oldest_age(self) -> timedelta | None:
        return self.now - self.total.oldest if self.total.oldest else None

    @property
    def alerts(self) -> list[str]:
        return alerts(self)


def _age(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 60} min"


def backlog(items: QuerySet[ReviewItem], now: datetime | None = None) -> Backlog:
    """Return the backlog of `items` (pending ones only): totals, per template and per reviewer."""
    now = now or timezone.now()
    found = Backlog(now=now)
    templates: dict[str, Waiting] = {}
    reviewers: dict[str, Waiting] = {}
    pending = items.filter(status=ReviewItem.Status.PENDING).select_related(
        "run__instance__template", "run__owner"
    )
    for item in pending.order_by("created_at", "id")[:BACKLOG_SCAN]:
        found.total.add(item)
        template = item.run.instance.template
        templates.setdefault(template.name if template else NO_TEMPLATE, Waiting("")).add(item)
        reviewers.setdefault(item.run.owner.get_username(), Waiting("")).add(item)
    for groups, into in ((templates, found.per_template), (reviewers, found.per_reviewer)):
        for name, waiting in sorted(groups.items()):
            waiting.name = name
            into.append(waiting)
    for waiting in (found.total, *found.per_template, *found.per_reviewer):
        if waiting.oldest is not None:
            waiting.age = _age(now - waiting.oldest)
    return found


def alerts(found: Backlog) -> list[str]:
    """Return what is wrong with a backlog, as sentences (empty: nothing)."""
    said = []
    age = found.oldest_age
    if age is not None and age > max_wait():
        said.append(
            f"The oldest review item (#{found.total.oldest_item}) has waited {_age(age)}, "
            f"longer than {_age(max_wait())}."
        )
    if found.total.count > max_backlog():
        said.append(f"{found.total.count} review items wait, more than {max_backlog()}.")
    return said


def notify_alerts(now: datetime | None = None) -> int:
    """Send the `review.waiting` notification to each person whose queue calls for it; return how many."""
    now = now or timezone.now()
    sent = 0
    owners = (
        ReviewItem.objects.filter(status=ReviewItem.Status.PENDING)
        .values_list("run__owner", flat=True)
        .distinct()
    )
    for owner in get_user_model().objects.filter(pk__in=list(owners)):
        found = backlog(ReviewItem.objects.filter(run__owner=owner), now)
        said = alerts(found)
        if not said:
            continue
        overdue = found.oldest_age is not None and found.oldest_age > max_wait()
        key = (
            f"review.waiting:item:{found.total.oldest_item}"
            if overdue
            else f"review.backlog:user:{owner.pk}:{now.date().isoformat()}"
        )
        payload = {
            "event": notify.Event.REVIEW_WAITING,
            "review": {
                "waiting": found.total.count,
                "oldest_item": found.total.oldest_item,
                "oldest_since": found.total.oldest.isoformat() if found.total.oldest else None,
                "alerts": said,
                "url": notify.public_url("/reviews/"),
            },
            "at": now.isoformat(),
        }
        sent += len(
            notify.create(owner.notification_targets.all(), notify.Event.REVIEW_WAITING, key, payload, None)
        )
    return sent


# --- rubber stamps -----------------------------------------------------------------------------


def record_opened(item: ReviewItem, user: Any, now: datetime | None = None) -> None:
    """Record that `user`, who may review `item`, opened its diff (the first time counts)."""
    if item.is_pending and getattr(user, "is_authenticated", False):
        ReviewItem.objects.filter(pk=item.pk, diff_opened_at__isnull=True).update(
            diff_opened_at=now or timezone.now()
        )


def judge_verdict(item: ReviewItem, user: Any, now: datetime) -> tuple[float, bool]:
    """Return the seconds a verdict on `item` by `user` at `now` took, and whether it is a rubber stamp."""
    began = max(item.created_at, item.diff_opened_at or item.created_at)
    previous = (
        ReviewItem.objects.filter(decided_by=user, status__in=DECIDED, decided_at__lte=now)
        .exclude(pk=item.pk)
        .order_by("-decided_at")
        .values_list("decided_at", flat=True)
        .first()
    )
    if previous is not None and previous > began:
        began = previous
    seconds = max((now - began).total_seconds(), 0.0)
    return seconds, item.diff_opened_at is None and seconds < quick_seconds()


@dataclass
class Signals:
    """A reviewer's rubber-stamp signals over their last verdicts."""

    reviews: int = 0
    rubber_stamps: int = 0
    approvals: int = 0
    window: int = 20

    @property
    def quick(self) -> bool:
        return self.rubber_stamps > 0

    @property
    def always_approves(self) -> bool:
        return self.reviews >= self.window and self.approvals == self.reviews

    @property
    def firing(self) -> bool:
        return self.quick or self.always_approves

    @property
    def sentences(self) -> list[str]:
        said = []
        if self.quick:
            said.append(
                f"{self.rubber_stamps} of the last {self.reviews} verdicts took under {quick_seconds():g} s "
                "without the diff opened"
            )
        if self.always_approves:
            said.append(f"the last {self.reviews} verdicts all approved")
        return said


def signals(reviewer: Any, template_id: int | None | str = "any") -> Signals:
    """Return `reviewer`'s signals over their last verdicts (on runs of `template_id` only, when given)."""
    window = streak()
    decided = ReviewItem.objects.filter(decided_by=reviewer, status__in=DECIDED)
    if template_id != "any":
        decided = decided.filter(run__instance__template_id=template_id)
    last = list(decided.order_by("-decided_at", "-id").values_list("status", "rubber_stamp")[:window])
    return Signals(
        reviews=len(last),
        rubber_stamps=sum(1 for _, stamp in last if stamp),
        approvals=sum(1 for status, _ in last if status == ReviewItem.Status.ACCEPTED),
        window=window,
    )


def reviewers_signals(items: QuerySet[ReviewItem]) -> list[tuple[str, Signals]]:
    """Return (name, signals) of everyone who decided any of `items` (the operator's view)."""
    ids = items.filter(decided_by__isnull=False).values_list("decided_by", flat=True).distinct()
    users = get_user_model().objects.filter(pk__in=list(ids)).order_by("username")
    return [(user.get_username(), signals(user)) for user in users]


def sample_percent(instance: Any, owner: Any, base: Decimal) -> Decimal:
    """Return the sampling rate for a run of `instance` owned (so reviewed) by `owner`: boosted while signals fire."""
    if not signals(owner, instance.template_id).firing:
        return base
    return min(Decimal(100), Decimal(base) + boost())


# --- missed in review --------------------------------------------------------------------------


def _mark_missed(items: QuerySet[ReviewItem], why: str) -> int:
    """Mark the accepted ones of `items` not marked yet as missed in review, saying `why`; return how many."""
    return items.filter(status=ReviewItem.Status.ACCEPTED, missed_in_review=False).update(
        missed_in_review=True, missed_detail=why[:500]
    )


def mark_missed(item: ReviewItem, why: str) -> bool:
    """Mark an accepted item as missed in review; return whether it was newly marked."""
    return bool(_mark_missed(ReviewItem.objects.filter(pk=item.pk), why))


def mark_run_missed(run_id: int, why: str) -> int:
    """Mark every accepted item of a run as missed in review (its work was found wrong); return how many."""
    return _mark_missed(ReviewItem.objects.filter(run_id=run_id), why)
