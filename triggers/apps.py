from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "triggers"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_migrate, post_save

        from instances import credentials
        from tether import redaction
        from triggers.models import Trigger
        from triggers.tasks import ensure_tick

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
