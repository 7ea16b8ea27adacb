"""The worker's side of schedules: django-q2's scheduler calls `tick` every minute (`ensure_tick` makes that Schedule)."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.utils import timezone
from django_q.models import Schedule

from triggers import scheduling

TICK = "tether.schedules.tick"


def tick() -> int:
    """Handle every due schedule (`triggers.scheduling.tick`); return how many firings were recorded."""
    return scheduling.tick()


def ensure_tick(sender: Any = None, *, app_config: Any = None, using: str = "default", **kwargs: Any) -> None:
    """A post_migrate receiver: make django-q2's Schedule that calls `tick` every minute, if it is missing
    (a fresh or flushed database). An operator's edit of it (its cadence) is kept."""
    if app_config is None or app_config.label != "triggers":
        return

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return
    Schedule.objects.using(using).get_or_create(
        name=TICK,
        defaults={
            "func": "triggers.tasks.tick",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )
