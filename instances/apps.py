from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save

from instances import credentials
from tether import redaction


class InstancesConfig(AppConfig):
    name = "instances"

    def ready(self) -> None:
        from instances.models import Credential  # lazy: models load after the app configs, before ready()

        # The stored credentials' keys are redacted from every text.
        redaction.stored_keys_from(credentials.stored_rows, credentials.stored_keys)
        # A key added, changed or removed is redacted (or no longer) from the next text on.
        post_save.connect(redaction.credentials_changed, sender=Credential, dispatch_uid="redaction-credential-saved")
        post_delete.connect(redaction.credentials_changed, sender=Credential, dispatch_uid="redaction-credential-deleted")
