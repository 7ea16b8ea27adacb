"""django-q2 entry points for reviews: they call `reviews.notify`, `reviews.watch` and `reviews.digest`; nothing else."""

from __future__ import annotations

from django_q.models import Schedule
from django_q.tasks import schedule

from reviews import digest, notify, watch
from reviews.models import Delivery


def deliver(delivery_id: int) -> None:
    """Make one attempt at a delivery; when it must be retried, schedule the retry at its backoff."""
    delivery = notify.attempt(delivery_id)
    if delivery is None or delivery.status != Delivery.Status.PENDING or delivery.next_attempt_at is None:
        return
    schedule(
        "reviews.tasks.deliver",
        delivery_id,
        name=f"notify-{delivery_id}-{delivery.attempts + 1}",
        schedule_type=Schedule.ONCE,
        repeats=1,
        next_run=delivery.next_attempt_at,
    )


def watch_and_digest() -> None:
    """The periodic task (django-q2 schedule `tether-review-watch`, every 5 minutes): alerts, then digests."""
    watch.notify_alerts()
    digest.send_due()
