"""A trigger's secret is stored like a credential: encrypted, rotated with the server's key, redacted."""

import pytest

from instances import credentials
from tether import redaction
from triggers.models import Trigger

pytestmark = pytest.mark.django_db


def test_the_secret_is_encrypted_and_follows_a_key_rotation(user, instance, settings, deliver):
    from triggers import services

    settings.SECRET_KEY = "old-secret-" + "x" * 40
    trigger, secret = services.trigger_create(
        user=user, instance=instance, name="t", objective_template="#{n}"
    )
    assert secret not in trigger.secret_encrypted
    settings.SECRET_KEY = "new-secret-" + "y" * 40
    with pytest.raises(credentials.CredentialUnreadable):
        Trigger.objects.get(pk=trigger.pk).reveal()
    unreadable = deliver(trigger, secret=secret)
    assert unreadable.status_code == 409 and "rotate it" in unreadable.json()["error"]
    settings.SECRET_KEY_FALLBACKS = ["old-secret-" + "x" * 40]
    assert credentials.rotate() == 1  # `manage.py rotate_keys` re-encrypts it with the credentials
    settings.SECRET_KEY_FALLBACKS = []
    assert Trigger.objects.get(pk=trigger.pk).reveal() == secret
    assert deliver(trigger, {"n": 1}, secret=secret).status_code == 201


def test_the_secret_is_redacted_from_any_text_like_a_stored_key(user, instance):
    from triggers import services

    trigger, secret = services.trigger_create(
        user=user, instance=instance, name="t", objective_template="#{n}"
    )
    assert secret not in redaction.redact(f"the hook secret is {secret}!")
    rotated = services.trigger_rotate(user=user, trigger=trigger)
    assert rotated not in redaction.redact(f"now {rotated}")
