"""Digests: what happened to a person's runs over a period, and what needs them — by e-mail and webhook.

`build(user, start, end)` reads only `user`'s own runs (and the review items of their runs):
- what finished, by outcome; verified against unverified dones;
- what needs them now: escalations and approvals (runs waiting for a person), review items waiting
  (samples among them), runs stopped by a bound (budget, iterations, time) in the period;
- the top spenders (instances, by what their runs that finished in the period spent);
- one line per finished run (outcome, cost, files changed);
- what differs from the period before (e.g. "unverified dones 2 → 9").

A person chooses daily or weekly on their account page, in their time zone (off by default:
`DigestPreference`). `send_due(now)` — run by the periodic task `reviews.tasks.watch_and_digest`, a django-q2
schedule — makes each person's digest once per period after the period ended (the day or the week,
Monday to Monday, in their time zone): an e-mail to the account's address through Django's e-mail
framework (`TETHER_EMAIL_BACKEND`; the console backend by default) and a `digest.sent` notification to their
notification targets (`reviews.notify`). An empty digest is not sent. The console page "since you
last looked" (`/reviews/digest/`) shows the same for the time since the person last marked it seen: a GET
only reads; its "Mark as seen" button (a POST, `mark_seen`) moves the person's own time forward.
"""

from __future__ import annotations

import logging
import zoneinfo
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any

from django.core.mail import EmailMessage
from django.db.models import Q, Sum
from django.utils import timezone

from budgets import money
from loops import outcomes
from loops.memory import Memory
from loops.models import Run
from reviews import notify, snapshots
from reviews.models import DigestPreference, NotificationTarget, ReviewItem, WorkspaceSnapshot

log = logging.getLogger(__name__)

BOUND_OUTCOMES = outcomes.BOUND
TOP_SPENDERS = 5
RUN_LINES = 200


@dataclass
class Counts:
    """The figures compared from one period to the next."""

    finished: int = 0
    verified_dones: int = 0
    unverified_dones: int = 0
    stopped_by_bound: int = 0
    spent_micros: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


@dataclass
class Digest:
    user_id: int
    start: datetime
    end: datetime
    counts: Counts
    previous: Counts
    escalations: list[str] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    review_waiting: int = 0
    review_samples: int = 0
    stopped_by_bound: list[str] = field(default_factory=list)
    top_spenders: list[tuple[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.counts.finished or self.escalations or self.approvals or self.review_waiting)

    @property
    def changes(self) -> list[str]:
        """What differs from the period before, as "name before → now"."""
        said = []
        for name, label in (
            ("finished", "finished runs"),
            ("verified_dones", "verified dones"),
            ("unverified_dones", "unverified dones"),
            ("stopped_by_bound", "runs stopped by a bound"),
        ):
            before, now = getattr(self.previous, name), getattr(self.counts, name)
            if before != now:
                said.append(f"{label} {before} → {now}")
        if self.previous.spent_micros != self.counts.spent_micros:
            said.append(
                f"spent {money.format_usd(self.previous.spent_micros)} → {money.format_usd(self.counts.spent_micros)}"
            )
        return said

    @property
    def outcomes(self) -> list[tuple[str, int]]:
        return sorted(self.counts.by_outcome.items(), key=lambda pair: (-pair[1], pair[0]))

    def as_json(self) -> dict[str, Any]:
        return {
            "from": self.start.isoformat(),
            "until": self.end.isoformat(),
            "finished": self.counts.finished,
            "by_outcome": dict(self.outcomes),
            "verified_dones": self.counts.verified_dones,
            "unverified_dones": self.counts.unverified_dones,
            "spent_usd": money.usd_string(self.counts.spent_micros),
            "needs_you": {
                "escalations": self.escalations,
                "approvals": self.approvals,
                "review_waiting": self.review_waiting,
                "review_samples": self.review_samples,
                "stopped_by_bound": self.stopped_by_bound,
            },
            "top_spenders": [{"instance": name, "spent": spent} for name, spent in self.top_spenders],
            "runs": self.lines,
            "changes": self.changes,
        }


def _counts(runs: Any) -> Counts:
    counts = Counts()
    outcomes: Counter[str] = Counter()
    for outcome, verified, spent in runs.values_list("outcome", "verified", "spent_micros"):
        counts.finished += 1
        outcomes[outcome or "?"] += 1
        counts.spent_micros += spent or 0
        if outcome == Run.Outcome.DONE:
            if verified:
                counts.verified_dones += 1
            else:
                counts.unverified_dones += 1
        if outcome in BOUND_OUTCOMES:
            counts.stopped_by_bound += 1
    counts.by_outcome = dict(outcomes)
    return counts


def _finished(user: Any, start: datetime, end: datetime) -> Any:
    return Run.objects.filter(
        owner=user, status=Run.Status.FINISHED, finished_at__gte=start, finished_at__lt=end
    )


def _about(run: Run, said: str) -> str:
    """Return a digest's line about one run: which run of which instance, then what is said of it."""
    return f"run {run.pk} · {run.instance.name}: {said}"


def _line(run: Run, snapshot: WorkspaceSnapshot | None) -> str:
    outcome = run.outcome or "?"
    if run.outcome == Run.Outcome.DONE:
        outcome = "done, verified" if run.verified else "done, NOT verified"
    changed = snapshots.files_changed(snapshot) if snapshot is not None else None
    files = (
        "files changed unknown" if changed is None else f"{changed} file{'s' if changed != 1 else ''} changed"
    )
    return _about(run, f"{outcome} · {money.format_usd(run.spent_micros)} · {files}")


def build(user: Any, start: datetime, end: datetime) -> Digest:
    """Return `user`'s digest of [start, end): only their own runs and review items."""
    finished = _finished(user, start, end)
    span = end - start
    digest = Digest(
        user_id=user.pk,
        start=start,
        end=end,
        counts=_counts(finished),
        previous=_counts(_finished(user, start - span, start)),
    )
    for run in (
        Run.objects.filter(owner=user, status=Run.Status.WAITING)
        .select_related("instance")
        .order_by("pk")[:50]
    ):
        said = _about(run, (run.outcome_detail or run.objective)[:160])
        (digest.approvals if Memory.of(run.history).pending_approval else digest.escalations).append(said)
    waiting = ReviewItem.objects.filter(run__owner=user, status=ReviewItem.Status.PENDING).exclude(
        reason=ReviewItem.Reason.ESCALATED
    )
    digest.review_waiting = waiting.count()
    digest.review_samples = waiting.filter(reason=ReviewItem.Reason.SAMPLED).count()
    listed = list(finished.select_related("instance").order_by("finished_at", "pk")[:RUN_LINES])
    shots = {s.run_id: s for s in WorkspaceSnapshot.objects.filter(run__in=[r.pk for r in listed])}
    for run in listed:
        digest.lines.append(_line(run, shots.get(run.pk)))
        if run.outcome in BOUND_OUTCOMES:
            digest.stopped_by_bound.append(_about(run, run.outcome))
    spenders = (
        finished.values("instance__name")
        .annotate(spent=Sum("spent_micros"))
        .order_by("-spent", "instance__name")
    )
    digest.top_spenders = [
        (row["instance__name"], money.format_usd(row["spent"] or 0))
        for row in spenders[:TOP_SPENDERS]
        if row["spent"]
    ]
    return digest


def render(digest: Digest, title: str) -> tuple[str, str]:
    """Return the subject and plain-text body of a digest."""
    c = digest.counts
    lines = [title, f"{digest.start:%Y-%m-%d %H:%M %Z} to {digest.end:%Y-%m-%d %H:%M %Z}", ""]
    lines.append(f"Finished: {c.finished} (" + ", ".join(f"{n} {o}" for o, n in digest.outcomes) + ")")
    lines.append(f"Dones: {c.verified_dones} verified, {c.unverified_dones} unverified")
    lines.append(f"Spent: {money.format_usd(c.spent_micros)}")
    lines += ["", "Needs you:"]
    lines += [f"- escalation: {e}" for e in digest.escalations]
    lines += [f"- approval: {a}" for a in digest.approvals]
    lines.append(f"- review items waiting: {digest.review_waiting} ({digest.review_samples} sampled)")
    lines += [f"- stopped by a bound: {s}" for s in digest.stopped_by_bound]
    if digest.top_spenders:
        lines += ["", "Top spenders:"] + [f"- {name}: {spent}" for name, spent in digest.top_spenders]
    if digest.changes:
        lines += ["", "Since the period before:"] + [f"- {change}" for change in digest.changes]
    lines += ["", "Runs:"] + [f"- {line}" for line in digest.lines]
    lines += ["", notify.public_url("/reviews/digest/")]
    subject = f"[Tether] {title}: {c.finished} finished, {c.unverified_dones} unverified"
    return subject[:200], "\n".join(lines)


# --- when, and sending --------------------------------------------------------------------------


def zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


def period(preference: DigestPreference, now: datetime) -> tuple[datetime, datetime]:
    """Return the last whole period [start, end) before `now` in the person's time zone."""
    tz = zone(preference.time_zone)
    today = now.astimezone(tz).date()
    if preference.frequency == DigestPreference.Frequency.WEEKLY:
        monday = today - timedelta(days=today.weekday())
        end = datetime.combine(monday, time.min, tzinfo=tz)
        return datetime.combine(monday - timedelta(days=7), time.min, tzinfo=tz), end
    end = datetime.combine(today, time.min, tzinfo=tz)
    return datetime.combine(today - timedelta(days=1), time.min, tzinfo=tz), end


def send_due(now: datetime | None = None) -> int:
    """Make every digest whose period ended and was not made yet; send the non-empty ones; return how many sent."""
    now = now or timezone.now()
    sent = 0
    due = DigestPreference.objects.exclude(frequency=DigestPreference.Frequency.OFF).select_related("user")
    for preference in due:
        start, end = period(preference, now)
        if preference.last_period_end is not None and preference.last_period_end >= end:
            continue
        claimed = DigestPreference.objects.filter(
            pk=preference.pk, last_period_end=preference.last_period_end
        ).update(last_period_end=end)
        if not claimed:
            continue  # another worker made this one
        try:
            sent += send(preference.user, build(preference.user, start, end), preference.frequency)
        except Exception:  # one person's digest must not stop the others'
            log.exception("the digest of user %s failed", preference.user_id)
    return sent


def send(user: Any, digest: Digest, frequency: str) -> int:
    """Send a non-empty digest by e-mail to the account's address and to the person's notification targets."""
    if digest.empty:
        return 0
    subject, body = render(digest, f"your {frequency} digest")
    targets = NotificationTarget.objects.filter(owner=user)
    addressed = {
        t.address.lower()
        for t in targets
        if t.kind == NotificationTarget.Kind.EMAIL and t.wants(notify.Event.DIGEST)
    }
    if user.email and user.email.lower() not in addressed:
        try:
            EmailMessage(subject, body, None, [user.email]).send()
        except Exception:  # a backend failure: logged; the targets still get theirs
            log.exception("e-mailing the digest of user %s failed", user.pk)
    payload = {"event": notify.Event.DIGEST, "subject": subject, "text": body, "digest": digest.as_json()}
    key = f"digest:user:{user.pk}:{digest.end.isoformat()}"
    notify.create(targets, notify.Event.DIGEST, key, payload, None)
    return 1


def since_last_looked(user: Any, now: datetime | None = None) -> Digest:
    """Return the digest of what happened since `user` last marked the page seen (a day at first); read-only."""
    now = now or timezone.now()
    looked = DigestPreference.objects.filter(user=user).values_list("last_looked_at", flat=True).first()
    return build(user, looked or now - timedelta(days=1), now)


def mark_seen(user: Any, until: datetime, now: datetime | None = None) -> None:
    """Move `user`'s own last-looked-at time forward to `until` (never past `now`, never backwards)."""
    until = min(until, now or timezone.now())
    preference, _ = DigestPreference.objects.get_or_create(user=user)
    DigestPreference.objects.filter(pk=preference.pk).filter(
        Q(last_looked_at__isnull=True) | Q(last_looked_at__lt=until)
    ).update(last_looked_at=until)
