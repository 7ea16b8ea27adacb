from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


class TriggersConfig(AppConfig):
    name = "triggers"

    def ready(self) -> None:
        from instances import credentials  # lazy: the app registry is not ready when apps.py is read
        from tether import redaction  # lazy: the app registry is not ready when apps.py is read
        from triggers.models import Trigger  # lazy: the app registry is not ready when apps.py is read
        from triggers.tasks import ensure_tick  # lazy: the app registry is not ready when apps.py is read

        # A trigger's secret is encrypted as a stored key is, rotated with them (`rotate_keys`), and
        # redacted from every text like them; a secret made, rotated or deleted is picked up at once.
        credentials.register_encrypted("triggers.Trigger", "secret_encrypted")
        post_save.connect(
            redaction.credentials_changed, sender=Trigger, dispatch_uid="redaction-trigger-saved"
        )
        post_delete.connect(
            redaction.credentials_changed, sender=Trigger, dispatch_uid="redaction-trigger-deleted"
        )
        # The tick of schedules, django-q2's Schedule: made after migrate and after a test flush.
        post_migrate.connect(ensure_tick, sender=self, dispatch_uid="triggers.ensure_tick")
