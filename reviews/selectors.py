"""Reads for the review queue, the item page and the fleet's trust figures. No writes.

A user sees the review items of the runs they own (staff see every item).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce

from audit import trail
from audit.models import AuditEntry
from budgets import money
from loops import event_kinds
from loops.models import Iteration, Run
from reviews import changecard, snapshots
from reviews.models import GradeRecord, ReviewItem, WorkspaceSnapshot
from reviews.watch import NO_TEMPLATE

DIFF_LINES = 5000


def items_for(user: Any) -> QuerySet[ReviewItem]:
    items = ReviewItem.objects.select_related("run", "run__instance", "run__instance__template", "decided_by")
    if getattr(user, "is_staff", False):
        return items
    return items.filter(run__owner=user)


def queue(user: Any, *, pending: bool = True) -> QuerySet[ReviewItem]:
    """Return the user's pending review items, oldest first (or the decided ones, newest first)."""
    items = items_for(user)
    if pending:
        return items.filter(status=ReviewItem.Status.PENDING).order_by("created_at", "id")
    return items.exclude(status=ReviewItem.Status.PENDING).order_by("-decided_at", "-id")


def pending_count(user: Any) -> int:
    """Return how many review items wait for the user (for a badge in the console's navigation)."""
    if not getattr(user, "is_authenticated", False):
        return 0
    return items_for(user).filter(status=ReviewItem.Status.PENDING).count()


def item_for(user: Any, item_id: int) -> ReviewItem | None:
    if not getattr(user, "is_authenticated", False):
        return None
    return items_for(user).filter(pk=item_id).first()


@dataclass
class ItemView:
    """Everything the item page shows, diff first."""

    item: ReviewItem
    run: Run
    diff: str  # the changes to files .gitignore does not hide
    snapshot: WorkspaceSnapshot | None
    final: Iteration | None
    checks: list[dict[str, Any]]
    decider_reason: str
    grade: GradeRecord | None
    judge_reasons: list[str]
    cost_micros: int
    iterations: int
    audit: list[AuditEntry] = field(default_factory=list)
    # The protected files the run changed (what grades it), and their diff: shown before the rest.
    protected_paths: list[str] = field(default_factory=list)
    protected_diff: str = ""
    # Attempts whose worker died mid-iteration, as a person reads them (what each changed, what was closed).
    lost_attempts: list[str] = field(default_factory=list)
    # The changes to files .gitignore hides: shown under their own heading, never left out.
    hidden_diff: str = ""
    hidden_heading: str = snapshots.HIDDEN_HEADING
    change_card: dict[str, Any] | None = None  # reviews.changecard: what the run changed, at a glance

    @property
    def cost_text(self) -> str:
        return money.format_usd(self.cost_micros)

    @property
    def diff_lines(self) -> list[tuple[str, str]]:
        """Return the diff as (kind, line) pairs; kind is add, del, hunk, file or ''."""
        return diff_lines(self.diff)

    @property
    def hidden_diff_lines(self) -> list[tuple[str, str]]:
        return diff_lines(self.hidden_diff)

    @property
    def protected_diff_lines(self) -> list[tuple[str, str]]:
        return diff_lines(self.protected_diff)

    @property
    def judge_verdict(self) -> str:
        return str((self.grade.judge or {}).get("verdict") or "") if self.grade else ""


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """Return a diff as (kind, line) pairs; kind is add, del, hunk, file or ''."""
    lines = []
    for line in diff.splitlines()[:DIFF_LINES]:
        if line.startswith(("+++", "---", "diff --git", "index ")):
            kind = "file"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("@@"):
            kind = "hunk"
        else:
            kind = ""
        lines.append((kind, line))
    return lines


def item_view(item: ReviewItem) -> ItemView:
    run = item.run
    final = Iteration.objects.filter(run=run).order_by("-number").first()
    grade = GradeRecord.latest_for(run)
    judged = (grade.judge or {}) if grade else {}
    judge_reasons = list(judged.get("reasons") or [])
    if judged.get("error"):
        judge_reasons.append(judged["error"])
    diff, hidden_diff = snapshots.diff_sections(run)
    return ItemView(
        item=item,
        run=run,
        diff=diff,
        hidden_diff=hidden_diff,
        snapshot=WorkspaceSnapshot.objects.filter(run=run).first(),
        final=final,
        checks=list(final.checks or []) if final else [],
        decider_reason=str((final.decision or {}).get("reason", "")) if final else "",
        grade=grade,
        judge_reasons=judge_reasons,
        cost_micros=run.spent_micros,
        iterations=run.next_iteration - 1,
        audit=list(trail.audit_for_run(run)),
        protected_paths=list(run.protected_changed or []),
        protected_diff=snapshots.diff(run, paths=run.protected_changed) if run.protected_changed else "",
        lost_attempts=[
            event_kinds.describe("attempt.lost", data).text
            for data in run.events.filter(kind="attempt.lost").order_by("seq").values_list("data", flat=True)
        ],
        change_card=changecard.for_run(run),
    )


# --- trust, per template ------------------------------------------------------------------------


@dataclass
class TemplateStats:
    """How far one template's runs can be trusted.

    verified rate: finished runs that ended done and verified, over finished runs;
    acceptance rate: review verdicts that accepted, over all verdicts (an acceptance later found
    wrong, missed in review, counts as a rejection);
    cost per accepted result: everything its finished runs spent, over its accepted results —
    dones a reviewer accepted, or verified dones no reviewer rejected.
    """

    template: str
    finished: int = 0
    done: int = 0
    verified: int = 0
    accepted: int = 0
    rejected: int = 0
    pending: int = 0
    missed: int = 0  # accepted, then found wrong (reviews.watch): counted as a rejection
    accepted_results: int = 0
    spent_micros: int = 0

    @property
    def verified_rate(self) -> float | None:
        return self.verified / self.finished if self.finished else None

    @property
    def acceptance_rate(self) -> float | None:
        decided = self.accepted + self.rejected
        return self.accepted / decided if decided else None

    @property
    def cost_per_accepted_micros(self) -> int | None:
        return self.spent_micros // self.accepted_results if self.accepted_results else None

    # What the page prints.
    @property
    def verified_text(self) -> str:
        rate = self.verified_rate
        return "—" if rate is None else f"{rate:.0%} ({self.verified} of {self.finished})"

    @property
    def acceptance_text(self) -> str:
        rate = self.acceptance_rate
        return "—" if rate is None else f"{rate:.0%} ({self.accepted} of {self.accepted + self.rejected})"

    @property
    def cost_per_accepted_text(self) -> str:
        cost = self.cost_per_accepted_micros
        return "—" if cost is None else money.format_usd(cost)


def fleet_stats(user: Any) -> list[TemplateStats]:
    """Return the trust figures of the user's finished runs, one row per agent template."""
    runs = Run.objects.filter(owner=user, status=Run.Status.FINISHED).annotate(
        template_name=Coalesce("instance__template__name", Value(NO_TEMPLATE))
    )
    rows: dict[str, TemplateStats] = {}

    def row(name: str) -> TemplateStats:
        return rows.setdefault(name, TemplateStats(template=name))

    for found in runs.values("template_name").annotate(
        finished=Count("id"),
        done=Count("id", filter=Q(outcome=Run.Outcome.DONE)),
        verified=Count("id", filter=Q(outcome=Run.Outcome.DONE, verified=True)),
        spent=Sum("spent_micros"),
    ):
        stats = row(found["template_name"])
        stats.finished, stats.done, stats.verified = found["finished"], found["done"], found["verified"]
        stats.spent_micros = found["spent"] or 0

    items = ReviewItem.objects.filter(run__owner=user).annotate(
        template_name=Coalesce("run__instance__template__name", Value(NO_TEMPLATE)), missed=F("missed_in_review")
    )
    for found in items.values("template_name", "status", "missed").annotate(n=Count("id")):
        stats = row(found["template_name"])
        if found["missed"]:
            stats.missed += found["n"]
            if found["status"] != ReviewItem.Status.PENDING:
                stats.rejected += found["n"]
                continue
        if found["status"] == ReviewItem.Status.ACCEPTED:
            stats.accepted += found["n"]
        elif found["status"] == ReviewItem.Status.REJECTED:
            stats.rejected += found["n"]
        elif found["status"] == ReviewItem.Status.PENDING:
            stats.pending += found["n"]

    verdicts = ReviewItem.objects.filter(run=OuterRef("pk"))
    accepted = Exists(verdicts.filter(status=ReviewItem.Status.ACCEPTED, missed_in_review=False))
    rejected = Exists(verdicts.filter(Q(status=ReviewItem.Status.REJECTED) | Q(missed_in_review=True)))
    good = runs.filter(outcome=Run.Outcome.DONE).filter((Q(verified=True) & ~rejected) | accepted)
    for found in good.values("template_name").annotate(n=Count("id")):
        row(found["template_name"]).accepted_results = found["n"]
    return sorted(rows.values(), key=lambda s: (s.template == NO_TEMPLATE, s.template))
