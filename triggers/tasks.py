"""The worker's side of schedules: django-q2's scheduler calls `tick` every minute (migration 0003)."""

from __future__ import annotations

from triggers import scheduling


def tick() -> int:
    """Handle every due schedule (`triggers.scheduling.tick`); return how many firings were recorded."""
    return scheduling.tick()
