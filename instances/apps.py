from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "instances"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from instances import credentials
        from instances.models import Credential
        from tether import redaction

        # The stored credentials' keys are redacted from every text.
        redaction.stored_keys_from(credentials.stored_rows, credentials.stored_keys)
        # A key added, changed or removed is redacted (or no longer) from the next text on.
        post_save.connect(redaction.credentials_changed, sender=Credential, dispatch_uid="redaction-credential-saved")
        post_delete.connect(redaction.credentials_changed, sender=Credential, dispatch_uid="redaction-credential-deleted")
