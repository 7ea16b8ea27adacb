"""What happens after a run stops, and a reviewer's verdict — the writers of the review queue.

`on_run_finished(run)` is called by the loop after a run finishes or starts waiting for a person,
once the transaction that did it has committed. It snapshots the workspace's end state (git, a
subprocess: never inside a transaction), then in short transactions: resolves an escalation that
was answered or closed, puts the run in the review queue when it needs a person, signs its
receipt, and creates its notifications. It never raises: a failure is logged and the rest still
happens. Calling it twice for the same finish changes nothing.

A run enters the review queue when it is
- `done` after an act changed one of its protected paths (`evidence`: it changed what grades
  it; never verified by the machine — accepting the item makes the done verified when the checks
  and graders had verified it);
- `done` but not verified (`unverified`), or the judge asked for a person (`needs_human`);
- waiting after an escalation (`escalated`);
- `failed`, `no_progress` or `max_iterations` (`failed`);
- `done` and verified, and drawn in the per-template sample (`sampled`; see `reviews.sampling`).

`review_decide(item=..., user=..., verdict="accept"|"reject", note=...)` records a verdict, audits
it and re-signs the receipt with it.
"""

from __future__ import annotations

import logging
import secrets
import unicodedata
import zoneinfo
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator, URLValidator
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from loops import event_kinds, outcomes
from loops.models import Run
from loops.services import Refused
from reviews import graders, notify, receipts, sampling, snapshots, watch
from reviews.models import DigestPreference, GradeRecord, NotificationTarget, ReviewItem
from tether import keys

log = logging.getLogger(__name__)

REVIEW_FAILED_OUTCOMES = outcomes.GAVE_UP
VERDICTS = {"accept": ReviewItem.Status.ACCEPTED, "reject": ReviewItem.Status.REJECTED}
NOTE_MAX_CHARS = 4000
# An item back in the queue, as it was before any verdict (reopened, or raised again by a new finish).
UNDECIDED: dict[str, Any] = {
    "status": ReviewItem.Status.PENDING, "note": "", "decided_by": None, "decided_at": None,
}


def sample_seed() -> bytes:
    """Return the review-sampling seed: `TETHER_REVIEW_SAMPLE_SEED`, else derived from the secret key."""
    if seed := settings.TETHER_REVIEW_SAMPLE_SEED:
        return str(seed).encode()
    return keys.derive(b"tether.reviews", b"tether review sampling v1")


def reasons_for(run: Run) -> list[tuple[str, str]]:
    """Return why a finished run needs a person, as [(ReviewItem.Reason, detail)]; [] when it does not."""
    if run.outcome == Run.Outcome.DONE:
        if run.protected_changed:
            paths = ", ".join(run.protected_changed[:20])
            more = f" and {len(run.protected_changed) - 20} more" if len(run.protected_changed) > 20 else ""
            return [(ReviewItem.Reason.EVIDENCE, f"changed what grades it: {paths}{more}. {run.outcome_detail}")]
        grade = GradeRecord.latest_for(run)
        judged = (grade.judge or {}) if grade else {}
        if judged.get("verdict") == "needs-human":
            said = "; ".join(judged.get("reasons") or []) or judged.get("error") or "no reasons given"
            return [(ReviewItem.Reason.NEEDS_HUMAN, f"the judge asks for a person: {said}")]
        if not run.verified:
            return [(ReviewItem.Reason.UNVERIFIED, run.outcome_detail)]
        # Raised while the reviewer's rubber-stamp signals fire (reviews.watch).
        percent = watch.sample_percent(run.instance, run.owner, graders.config_for(run.instance).sample_percent)
        if sampling.is_sampled(run.pk, percent, sample_seed()):
            return [(ReviewItem.Reason.SAMPLED, f"drawn in the {percent.normalize():f} % sample of verified dones")]
        return []
    if run.outcome in REVIEW_FAILED_OUTCOMES:
        return [(ReviewItem.Reason.FAILED, event_kinds.outcome_sentence(run.outcome, run.outcome_detail))]
    return []


def _open(run: Run, reason: str, detail: str, occasion: str) -> ReviewItem:
    """Put the run in the queue for `reason` (once per occasion; a new occasion reopens a decided item)."""
    try:
        with transaction.atomic():
            item, made = ReviewItem.objects.get_or_create(
                run=run, reason=reason, defaults={"detail": detail[:8000], "occasion": occasion}
            )
    except IntegrityError:
        item, made = ReviewItem.objects.get(run=run, reason=reason), False
    if not made and item.occasion != occasion:
        ReviewItem.objects.filter(pk=item.pk).update(
            **UNDECIDED, detail=detail[:8000], occasion=occasion, created_at=timezone.now()
        )
        item.refresh_from_db()
    return item


def _step(what: str, run_id: int, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # one failing part must not stop the others (see the module docstring)
        log.exception("run %s: %s failed", run_id, what)
        return None


def on_run_finished(run: Any) -> None:
    """Review, receipt and notifications for a run that finished or waits (see the module docstring).

    Takes a run or a run id. Call it after the commit that finished the run (or made it wait).
    """
    run_id = getattr(run, "pk", run)
    found = Run.objects.select_related("instance__template", "owner").filter(pk=run_id).first()
    if found is None or found.status not in (Run.Status.FINISHED, Run.Status.WAITING):
        return
    run = found
    _step("the end-of-run workspace snapshot", run.pk, snapshots.finish, run)
    if run.status == Run.Status.WAITING:
        occasion = f"waiting after iteration {run.next_iteration - 1}"
        _step("queueing the escalation", run.pk, _open, run, ReviewItem.Reason.ESCALATED, run.outcome_detail, occasion)
    else:
        _step("review", run.pk, _review_finished, run)
        _step("the receipt", run.pk, receipts.issue, run)
    _step("notifications", run.pk, notify.notify_run, run)


def _review_finished(run: Run) -> None:
    occasion = f"finished {run.finished_at.isoformat() if run.finished_at else ''}"[:64]
    with transaction.atomic():
        how = "closed without an answer" if run.outcome == Run.Outcome.ESCALATED else f"answered; it ended {run.outcome}"
        ReviewItem.objects.filter(run=run, reason=ReviewItem.Reason.ESCALATED, status=ReviewItem.Status.PENDING).update(
            status=ReviewItem.Status.RESOLVED, note=how, decided_at=timezone.now()
        )
    for reason, detail in reasons_for(run):
        _open(run, reason, detail, occasion)


def can_review(user: Any, run: Run) -> bool:
    return bool(getattr(user, "is_authenticated", False)) and (run.owner_id == user.pk or user.is_staff)


def _kept_note(note: str) -> str:
    """Return a reviewer's note stripped; Refused when it is longer than what is kept."""
    note = (note or "").strip()
    if len(note) > NOTE_MAX_CHARS:
        raise Refused(f"the note is {len(note):,} characters; at most {NOTE_MAX_CHARS:,} are kept")
    return note


def _locked_for(user: Any, item: ReviewItem) -> ReviewItem:
    """Return `item` read again and locked (inside the caller's transaction); Refused (404) unless `user` may review it."""
    item = ReviewItem.objects.select_for_update().select_related("run").get(pk=item.pk)
    if not can_review(user, item.run):
        raise Refused("no such review item", 404)
    return item


def review_decide(
    *,
    item: ReviewItem,
    user: Any,
    verdict: str,
    note: str = "",
    request: Any = None,
    via: str = "console",
    now: Any = None,
) -> ReviewItem:
    """Accept or reject a review item with a note; audit it; re-sign the run's receipt with the verdict.

    Records how long the verdict took and whether it was a rubber stamp (`reviews.watch`).
    """
    status = VERDICTS.get(verdict)
    if status is None:
        raise Refused(f"a verdict is 'accept' or 'reject', not {verdict!r}")
    note = _kept_note(note)
    with transaction.atomic():
        item = _locked_for(user, item)
        if item.status != ReviewItem.Status.PENDING:
            raise Refused(f"this item was already {item.get_status_display()}; reload the queue", 409)
        if item.reason == ReviewItem.Reason.ESCALATED and item.run.status == Run.Status.WAITING:
            raise Refused("this run waits for an answer: answer it (or close it) on the run page", 409)
        if status == ReviewItem.Status.REJECTED and not note:
            raise Refused("say why in the note: a rejection without a reason teaches nobody anything")
        now = now or timezone.now()
        seconds, stamp = watch.judge_verdict(item, user, now)
        ReviewItem.objects.filter(pk=item.pk).update(
            status=status, note=note, decided_by=user, decided_at=now, seconds_taken=seconds, rubber_stamp=stamp
        )
        item.refresh_from_db()
        detail: dict[str, Any] = {
            "item": item.pk,
            "reason": item.reason,
            "note": note[:2000],
            "seconds": round(seconds, 1),
            "diff_opened": item.diff_opened_at is not None,
            "rubber_stamp": stamp,
        }
        if _verifies(item, status):
            # The machine verified everything but the changed evidence; a person has now looked at it.
            Run.objects.filter(pk=item.run_id).update(verified=True, held_for_review=False)
            item.run.refresh_from_db()
            detail["verified"] = True
        trail.record(
            user=user,
            action=f"review.{verdict}",
            run=item.run,
            detail=detail,
            request=request,
            via=via,
        )
        if item.run.status == Run.Status.FINISHED:
            receipts.issue(item.run)
    return item


def review_reopen(*, item: ReviewItem, user: Any, note: str, request: Any = None, via: str = "console") -> ReviewItem:
    """Reopen an accepted item a person found wrong after all: it was missed in review, and waits again."""
    note = _kept_note(note)
    if not note:
        raise Refused("say what was wrong in the note: a reopened review is counted as missed")
    with transaction.atomic():
        item = _locked_for(user, item)
        if item.status != ReviewItem.Status.ACCEPTED:
            raise Refused(f"only an accepted item can be reopened; this one is {item.get_status_display()}", 409)
        was = {"status": item.status, "decided_by": item.decided_by_id, "note": item.note[:2000]}
        ReviewItem.objects.filter(pk=item.pk).update(
            **UNDECIDED,
            missed_in_review=True,
            missed_detail=f"reopened by {user.get_username()}: {note}"[:500],
            diff_opened_at=None,
        )
        item.refresh_from_db()
        trail.record(
            user=user,
            action="review.reopen",
            run=item.run,
            detail={"item": item.pk, "reason": item.reason, "note": note[:2000], "before": was},
            request=request,
            via=via,
        )
    return item


def _verifies(item: ReviewItem, status: str) -> bool:
    run = item.run
    return (
        status == ReviewItem.Status.ACCEPTED
        and item.reason == ReviewItem.Reason.EVIDENCE
        and run.status == Run.Status.FINISHED
        and run.outcome == Run.Outcome.DONE
        and run.held_for_review
    )


def _ascii_stand_in(address: str) -> str:
    """Return `address` with each letter or digit beyond ASCII in its local part as an `x` (RFC 6531).

    An internationalised address (`josé@exemple.fr`, `用户@例子.广告`) is then checked as any other;
    its domain is checked in its IDNA form by the validator itself. Spaces, controls and other
    invisible characters stay, so they are still refused.
    """
    local, at, domain = address.rpartition("@")
    if not at:
        return address
    local = "".join(
        "x" if ord(c) > 127 and unicodedata.category(c)[0] in "LNM" else c for c in local
    )
    return f"{local}@{domain}"


def notification_target_add(
    *, user: Any, kind: str, address: str, events: list[str] | None = None, request: Any = None, via: str = "console"
) -> tuple[Any, str]:
    """Add an e-mail or webhook target for `user`; return it and, for a webhook, its new secret (shown once)."""
    address = (address or "").strip()
    events = [e for e in (events or []) if e]
    if unknown := NotificationTarget.unknown_events(events):
        raise Refused(f"unknown events: {', '.join(unknown)}")
    try:
        if kind == NotificationTarget.Kind.EMAIL:
            EmailValidator()(_ascii_stand_in(address))
        elif kind == NotificationTarget.Kind.WEBHOOK:
            URLValidator(schemes=["http", "https"])(address)
        else:
            raise Refused(f"a target is 'email' or 'webhook', not {kind!r}")
    except ValidationError:
        raise Refused(f"{address!r} is not a valid {'e-mail address' if kind == 'email' else 'http(s) URL'}") from None
    secret = secrets.token_urlsafe(32) if kind == NotificationTarget.Kind.WEBHOOK else ""
    with transaction.atomic():
        target = NotificationTarget(owner=user, kind=kind, address=address[:500], events=events)
        if secret:
            target.set_secret(secret)
        target.save()
        trail.record(
            user=user,
            action="notification.add",
            detail={"target": target.pk, "kind": kind, "address": target.address, "events": events},
            request=request,
            via=via,
        )
    return target, secret


def notification_target_remove(*, user: Any, target: Any, request: Any = None, via: str = "console") -> None:
    """Remove one of `user`'s notification targets (its delivery history goes with it)."""
    with transaction.atomic():
        if target.owner_id != user.pk:
            raise Refused("no such notification target", 404)
        detail = {"target": target.pk, "kind": target.kind, "address": target.address}
        target.delete()
        trail.record(user=user, action="notification.remove", detail=detail, request=request, via=via)


def digest_preference_set(*, user: Any, frequency: str, time_zone: str) -> Any:
    """Set how often `user` gets a digest (off, daily, weekly) and in which IANA time zone."""
    if frequency not in DigestPreference.Frequency.values:
        raise Refused(f"a digest is {', '.join(DigestPreference.Frequency.values)}; not {frequency[:40]!r}")
    time_zone = (time_zone or "UTC").strip()
    if time_zone not in zoneinfo.available_timezones():
        raise Refused(f"{time_zone[:64]!r} is not a time zone (an IANA name such as Europe/Paris)")
    preference, _ = DigestPreference.objects.update_or_create(
        user=user, defaults={"frequency": frequency, "time_zone": time_zone}
    )
    return preference
