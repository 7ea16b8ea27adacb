"""What triggers hears and registers, connected once by `TriggersConfig.ready` (`connect`).

A trigger's secret is encrypted, rotated and redacted as a stored key is; the schedules' tick is
made after migrate.
"""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save

from instances import credentials
from tether import redaction
from triggers.models import Trigger
from triggers.tasks import ensure_tick


def connect(config: AppConfig) -> None:
    """Connect the receivers (`config` is the triggers app, the sender of its own post_migrate)."""
    # A trigger's secret is encrypted as a stored key is, rotated with them (`rotate_keys`), and
    # redacted from every text like them; a secret made, rotated or deleted is picked up at once.
    credentials.register_encrypted("triggers.Trigger", "secret_encrypted")
    post_save.connect(redaction.credentials_changed, sender=Trigger, dispatch_uid="redaction-trigger-saved")
    post_delete.connect(redaction.credentials_changed, sender=Trigger, dispatch_uid="redaction-trigger-deleted")
    # The tick of schedules, django-q2's Schedule: made after migrate and after a test flush.
    post_migrate.connect(ensure_tick, sender=config, dispatch_uid="triggers.ensure_tick")
