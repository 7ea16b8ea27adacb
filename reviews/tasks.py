"""django-q2 entry points for reviews: they take ids and call `reviews.notify`; nothing else."""

from __future__ import annotations

from reviews import notify
from reviews.models import Delivery


def deliver(delivery_id: int) -> None:
    """Make one attempt at a delivery; when it must be retried, schedule the retry at its backoff."""
    delivery = notify.attempt(delivery_id)
    if delivery is None or delivery.status != Delivery.Status.PENDING or delivery.next_attempt_at is None:
        return
    from django_q.models import Schedule
    from django_q.tasks import schedule

    schedule(
        "reviews.tasks.deliver",
        delivery_id,
        name=f"notify-{delivery_id}-{delivery.attempts + 1}",
        schedule_type=Schedule.ONCE,
        repeats=1,
        next_run=delivery.next_attempt_at,
    )
