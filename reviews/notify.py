"""Tell people when a run escalates, fails or exhausts a budget, a pool crosses its threshold, or a schedule cannot afford a firing.

Writes `Delivery` rows (one per configured `NotificationTarget` and event, idempotent by key)
and hands them to the worker queue after commit. Each delivery is then attempted with
`attempt`: an e-mail through Django's e-mail backend, or a webhook: a JSON POST signed with
HMAC-SHA256 under the target's secret. A failed attempt is recorded (`DeliveryAttempt`) and
retried with exponential backoff until `TETHER_NOTIFY_ATTEMPTS` attempts were made.

A webhook request carries:

- `X-Tether-Event` (`run.escalated`, `run.failed`, `run.budget_exhausted`, `run.child_result`,
  `pool.threshold`, `schedule.skipped`, `review.waiting` (see `reviews.watch`), `digest.sent` (see `reviews.digest`)),
- `X-Tether-Delivery` (the delivery's id: the same for every retry of one notification),
- `X-Tether-Timestamp` (Unix seconds) and
- `X-Tether-Signature: sha256=HEX`, the HMAC-SHA256 of `TIMESTAMP + "." + BODY` under the secret.

A receiver checks the signature with `signature(secret, timestamp, body)` (or its own copy of
those three lines) and refuses timestamps far from its clock. Redirects are not followed, and a
webhook whose host resolves to a loopback, link-local or private address is refused unless
`TETHER_WEBHOOK_ALLOW_PRIVATE` is set (people must not point the server at its own network).

Settings (all optional): TETHER_NOTIFY_ATTEMPTS (5), TETHER_NOTIFY_BACKOFF_SECONDS (2),
TETHER_NOTIFY_BACKOFF_MAX_SECONDS (300), TETHER_NOTIFY_TIMEOUT_SECONDS (10), TETHER_WEBHOOK_ALLOW_PRIVATE (False),
TETHER_PUBLIC_URL (prefix for links in messages), DEFAULT_FROM_EMAIL.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django_q.tasks import async_task

from budgets import money
from budgets.models import Pool
from loops import delegation, outcomes, selectors
from reviews.models import Delivery, DeliveryAttempt, NotificationTarget

log = logging.getLogger(__name__)

Event = NotificationTarget.Event
# Outcomes that count as "the run failed" for notifications: the work did not get done, and
# it was neither a person's choice (cancelled, escalated) nor money (budget_exhausted).
FAILED_OUTCOMES = outcomes.FAILED_FOR_NOTICE
USER_AGENT = "Tether-Webhook/1"


def max_attempts() -> int:
    return int(settings.TETHER_NOTIFY_ATTEMPTS)


def backoff(attempts: int) -> float:
    """Return the seconds to wait after the `attempts`-th failed attempt (1, 2, ...)."""
    base = float(settings.TETHER_NOTIFY_BACKOFF_SECONDS)
    return min(float(settings.TETHER_NOTIFY_BACKOFF_MAX_SECONDS), base * 2 ** max(attempts - 1, 0))


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Return the `X-Tether-Signature` value of a webhook body sent at `timestamp`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def public_url(path: str) -> str:
    return str(settings.TETHER_PUBLIC_URL).rstrip("/") + path


def _run_path(run_id: int) -> str:
    try:
        return reverse("loops:run-detail", kwargs={"run_id": run_id})
    except NoReverseMatch:
        return f"/runs/{run_id}/"


# --- what to send -------------------------------------------------------------------------------


def run_event(run: Any) -> str | None:
    """Return the notification event a run's state calls for, or None."""
    if run.status == "waiting":
        return Event.ESCALATED
    if run.status != "finished":
        return None
    if run.outcome == outcomes.Outcome.BUDGET_EXHAUSTED:
        return Event.BUDGET_EXHAUSTED
    if run.outcome in FAILED_OUTCOMES:
        return Event.FAILED
    return None


def run_payload(run: Any, event: str) -> dict[str, Any]:
    """Return a run's notification: a projection of `loops.selectors.run_json`, its texts cut short."""
    shown = selectors.run_json(run, PAYLOAD_FIELDS)
    return {
        "event": event,
        "run": {
            "id": shown["id"],
            "instance": shown["instance"],
            "instance_name": run.instance.name,
            "objective": shown["objective"][:500],
            "status": shown["status"],
            "outcome": shown["outcome"],
            "detail": (shown["outcome_detail"] or "")[:2000],
            "verified": shown["verified"],
            "iterations": shown["iterations"],
            "spent_usd": shown["spent_usd"],
            "url": public_url(_run_path(run.pk)),
        },
        "at": timezone.now().isoformat(),
    }


PAYLOAD_FIELDS = ("id", "instance", "objective", "status", "outcome", "outcome_detail", "verified", "iterations", "spent_usd")


def notify_run(run: Any) -> list[Delivery]:
    """Create the deliveries a run's escalation or finish calls for; send them after commit."""
    made = _child_result(run)
    event = run_event(run)
    if event is None:
        return made
    if event == Event.ESCALATED:
        key = f"{event}:run:{run.pk}:iteration:{run.next_iteration - 1}"
    else:
        key = _finish_key(event, run)
    return made + create(NotificationTarget.objects.filter(owner=run.owner_id), event, key, run_payload(run, event), run)


def _finish_key(event: str, run: Any) -> str:
    """Return the idempotency key of `event` about one finish of `run` (a resumed run that finishes again is told anew)."""
    finished = run.finished_at.isoformat() if run.finished_at else ""
    return f"{event}:run:{run.pk}:{finished}"


def _child_result(run: Any) -> list[Delivery]:
    """Tell the person the result of a continued child whose parent no longer waited for it (whatever it is).

    A child continued while its parent waits is the parent's child again, and the parent reads its
    result (`loops.delegation.replace_child`); otherwise nobody would hear it but the person.
    """
    if run.status != "finished" or (parent := delegation.delegated_by(run)) is None:
        return []
    payload = run_payload(run, Event.CHILD_RESULT)
    payload["parent"] = {"id": parent.pk, "status": parent.status, "outcome": parent.outcome or None,
                         "url": public_url(_run_path(parent.pk))}
    payload["continued_from"] = run.continued_from_id
    key = _finish_key(Event.CHILD_RESULT, run)
    return create(NotificationTarget.objects.filter(owner=run.owner_id), Event.CHILD_RESULT, key, payload, run)


def on_threshold_crossed(sender: Any, crossing: Any, **kwargs: Any) -> None:
    """Receiver of `budgets.signals.threshold_crossed`: tell the pool's people (sent after commit)."""
    pool = Pool.objects.select_related("instance", "run").filter(pk=crossing.pool_id).first()
    if pool is None:
        return
    owner_id = pool.owner_id or (pool.instance.owner_id if pool.instance else None)
    owner_id = owner_id or (pool.run.owner_id if pool.run else None)
    targets = NotificationTarget.objects.all()
    if owner_id is not None:
        targets = targets.filter(owner_id=owner_id)
    else:
        targets = targets.filter(owner__is_superuser=True)
    payload = {
        "event": Event.THRESHOLD,
        "pool": {
            "id": pool.pk,
            "name": pool.name,
            "kind": pool.kind,
            "spent_usd": money.usd_string(crossing.spent),
            "limit_usd": money.usd_string(crossing.limit),
            "threshold_percent": crossing.threshold_percent,
            "detail": crossing.detail,
        },
        "run": crossing.run_id,
        "at": timezone.now().isoformat(),
    }
    key = f"{Event.THRESHOLD}:pool:{pool.pk}:{pool.period_start.isoformat()}"
    try:
        create(targets, Event.THRESHOLD, key, payload, None)
    except Exception:  # a notice must never break the settling that triggered it
        log.exception("notifying the threshold crossing of pool %s failed", pool.pk)


def notify_firing_skipped(*, owner_id: int, key: str, schedule: dict[str, Any], reason: str) -> list[Delivery]:
    """Tell a schedule's owner that a firing started no run because its pools cannot cover it (sent after commit)."""
    payload = {"event": Event.SCHEDULE_SKIPPED, "schedule": schedule, "reason": reason, "at": timezone.now().isoformat()}
    return create(NotificationTarget.objects.filter(owner=owner_id), Event.SCHEDULE_SKIPPED, key, payload, None)


def create(targets: Iterable[NotificationTarget], event: str, key: str, payload: dict, run: Any) -> list[Delivery]:
    made = []
    with transaction.atomic():
        for target in targets:
            if not target.wants(event):
                continue
            try:
                with transaction.atomic():
                    delivery = Delivery.objects.create(
                        target=target, event=event, key=key, run=run, payload=payload, next_attempt_at=timezone.now()
                    )
            except IntegrityError:
                continue  # this notification was made before (the hook ran twice)
            made.append(delivery)
        if made:
            ids = [d.pk for d in made]
            transaction.on_commit(lambda: enqueue(ids))
    return made


def enqueue(delivery_ids: list[int]) -> None:
    """Hand deliveries to the worker queue (each becomes one `reviews.tasks.deliver` task)."""
    for delivery_id in delivery_ids:
        try:
            async_task("reviews.tasks.deliver", delivery_id, task_name=f"notify-{delivery_id}", group="notify")
        except Exception:  # the sweep (`manage.py notify_deliver`) picks up what could not be queued
            log.exception("queueing delivery %s failed", delivery_id)


# --- sending -----------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _private_host(url: str) -> str:
    """Return the private address `url` points at ("" if none): loopback, link-local, private ranges."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return ""  # the attempt itself reports that the host cannot be reached
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if address.is_private or address.is_loopback or address.is_link_local or address.is_reserved:
            return str(address)
    return ""


def _post(target: NotificationTarget, delivery: Delivery) -> tuple[bool, int | None, str]:
    if not settings.TETHER_WEBHOOK_ALLOW_PRIVATE and (private := _private_host(target.address)):
        return False, None, (
            f"refused: the webhook's host resolves to a private address ({private}); "
            "set TETHER_WEBHOOK_ALLOW_PRIVATE = True to allow it"
        )
    body = json.dumps(delivery.payload, sort_keys=True, separators=(",", ":")).encode()
    stamp = str(int(time.time()))
    request = urllib.request.Request(
        target.address,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Tether-Event": delivery.event,
            "X-Tether-Delivery": str(delivery.pk),
            "X-Tether-Timestamp": stamp,
            "X-Tether-Signature": signature(target.reveal_secret(), stamp, body),
        },
    )
    timeout = float(settings.TETHER_NOTIFY_TIMEOUT_SECONDS)
    try:
        with _opener.open(request, timeout=timeout) as response:
            response.read(65536)
            return True, response.status, ""
    except urllib.error.HTTPError as exc:
        return False, exc.code, f"the receiver answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, None, f"could not reach the receiver: {reason}"


def _email(target: NotificationTarget, delivery: Delivery) -> tuple[bool, int | None, str]:
    subject, body = render_email(delivery.payload)
    try:
        EmailMessage(subject, body, None, [target.address]).send()
    except Exception as exc:  # any backend failure is one failed attempt
        return False, None, f"sending the e-mail failed: {type(exc).__name__}: {exc}"[:1000]
    return True, None, ""


def render_email(payload: dict[str, Any]) -> tuple[str, str]:
    """Return the subject and plain-text body of a notification e-mail."""
    event = payload.get("event", "")
    if event == Event.DIGEST:
        return str(payload["subject"])[:200], str(payload["text"])
    if event == Event.REVIEW_WAITING:
        review = payload["review"]
        return f"[Tether] {review['waiting']} review item(s) wait", "\n".join([*review["alerts"], "", review["url"]])
    if event == Event.THRESHOLD:
        pool = payload["pool"]
        return f"[Tether] pool {pool['name']} crossed {pool['threshold_percent']}% of its limit", pool["detail"]
    if event == Event.SCHEDULE_SKIPPED:
        schedule = payload["schedule"]
        subject = f"[Tether] schedule {schedule['name']} of {schedule['instance_name']} skipped a firing"
        return subject[:200], f"{payload['reason']}\n\nScheduled for {schedule['scheduled_for']}."
    run = payload["run"]
    what = {
        Event.ESCALATED: "needs a person",
        Event.FAILED: f"failed ({run.get('outcome')})",
        Event.BUDGET_EXHAUSTED: "ran out of budget",
        Event.CHILD_RESULT: f"finished ({run.get('outcome')}); run {(payload.get('parent') or {}).get('id')}, "
        "which delegated the run it continues, no longer waited for it",
    }.get(event, event)
    subject = f"[Tether] run {run['id']} of {run['instance_name']} {what}"
    body = "\n".join(
        [
            f"Run {run['id']} of {run['instance_name']} {what}.",
            "",
            f"Objective: {run['objective']}",
            f"Detail: {run['detail']}",
            f"Iterations: {run['iterations']}, spent ${run['spent_usd']}",
            "",
            run["url"],
        ]
    )
    return subject[:200], body


SENDERS: dict[str, Callable[[NotificationTarget, Delivery], tuple[bool, int | None, str]]] = {
    NotificationTarget.Kind.WEBHOOK: _post,
    NotificationTarget.Kind.EMAIL: _email,
}


def attempt(delivery_id: int) -> Delivery | None:
    """Make one attempt at a pending delivery; record it; schedule the next or give up.

    Claims the attempt with a conditional update, so two workers never send the same attempt.
    Returns the delivery as it is afterwards (None if it does not exist).
    """
    delivery = Delivery.objects.select_related("target").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != Delivery.Status.PENDING:
        return delivery
    number = delivery.attempts + 1
    claimed = Delivery.objects.filter(pk=delivery.pk, status=Delivery.Status.PENDING, attempts=delivery.attempts).update(
        attempts=F("attempts") + 1
    )
    if not claimed:
        return Delivery.objects.get(pk=delivery.pk)
    began = time.monotonic()
    sender = SENDERS.get(delivery.target.kind)
    if sender is None:
        ok, code, error = False, None, f"unknown target kind {delivery.target.kind!r}"
    else:
        ok, code, error = sender(delivery.target, delivery)
    now = timezone.now()
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=delivery,
            number=number,
            at=now,
            ok=ok,
            status_code=code,
            error=error[:2000],
            duration_ms=int((time.monotonic() - began) * 1000),
        )
        if ok:
            fields: dict[str, Any] = {"status": Delivery.Status.DELIVERED, "delivered_at": now, "next_attempt_at": None}
        elif number >= max_attempts():
            fields = {"status": Delivery.Status.FAILED, "next_attempt_at": None, "last_error": error}
            log.warning("gave up delivering %s to %s after %d attempts: %s", delivery.event, delivery.target, number, error)
        else:
            fields = {"next_attempt_at": now + timedelta(seconds=backoff(number)), "last_error": error}
        Delivery.objects.filter(pk=delivery.pk).update(**fields)
    return Delivery.objects.select_related("target").get(pk=delivery.pk)


def deliver_now(delivery_id: int, *, sleep: Callable[[float], None] = time.sleep) -> Delivery | None:
    """Attempt a delivery until it is delivered or given up, sleeping out each backoff here."""
    while True:
        delivery = attempt(delivery_id)
        if delivery is None or delivery.status != Delivery.Status.PENDING:
            return delivery
        wait = (delivery.next_attempt_at - timezone.now()).total_seconds() if delivery.next_attempt_at else 0
        sleep(max(wait, 0.0))


def deliver_due(limit: int = 100) -> int:
    """Attempt every pending delivery whose next attempt is due; return how many were attempted."""
    due = list(
        Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=timezone.now())
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for delivery_id in due:
        attempt(delivery_id)
    return len(due)
