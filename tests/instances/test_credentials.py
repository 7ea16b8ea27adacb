"""Bring-your-own-key credentials: encrypted at rest, write-only, resolved per instance."""

import pytest

from instances import credentials
from instances.models import Credential
from tests.instances.conftest import KEY

pytestmark = pytest.mark.django_db


def test_a_key_is_encrypted_at_rest_and_shown_by_its_last_four(user):
    credential = Credential.create_for(user, label="work", secret=f"  {KEY}\n")
    stored = Credential.objects.get(pk=credential.pk)
    assert KEY not in stored.secret_encrypted
    assert stored.last4 == KEY[-4:]
    assert stored.reveal() == KEY
    assert KEY not in str(stored) and KEY not in repr(stored)
    assert str(stored) == f"work (…{KEY[-4:]})"


def test_an_empty_key_is_refused(user):
    with pytest.raises(ValueError, match="empty"):
        Credential.create_for(user, label="blank", secret="   ")


def test_rotation_through_secret_key_fallbacks(user, settings):
    settings.SECRET_KEY = "old-secret-" + "x" * 40
    credential = Credential.create_for(user, label="rotating", secret=KEY)
    settings.SECRET_KEY = "new-secret-" + "y" * 40
    with pytest.raises(credentials.CredentialUnreadable):
        Credential.objects.get(pk=credential.pk).reveal()
    settings.SECRET_KEY_FALLBACKS = ["old-secret-" + "x" * 40]
    assert Credential.objects.get(pk=credential.pk).reveal() == KEY
    assert credentials.rotate() == 1
    settings.SECRET_KEY_FALLBACKS = []
    assert Credential.objects.get(pk=credential.pk).reveal() == KEY


def test_key_resolution_order(user, make_instance, monkeypatch):
    inst = make_instance(user, brain="anthropic")
    assert credentials.resolve_api_key(inst) is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env-1234")
    assert credentials.resolve_api_key(inst) == "sk-ant-from-env-1234"
    assert credentials.describe_source(inst) == "the server's ANTHROPIC_API_KEY"
    inst.credential = Credential.create_for(user, label="own", secret=KEY)
    inst.save()
    assert credentials.resolve_api_key(inst) == KEY
    assert KEY not in credentials.describe_source(inst)


def test_someone_elses_credential_is_never_used(user, other_user, make_instance):
    theirs = Credential.create_for(other_user, label="theirs", secret=KEY)
    inst = make_instance(user, brain="anthropic", credential=theirs)
    assert credentials.resolve_api_key(inst) is None
    with pytest.raises(ValueError, match="belongs to someone else"):
        credentials.ensure_usable(inst)


def test_ensure_usable_says_how_to_add_a_key(user, make_instance):
    inst = make_instance(user, brain="anthropic", name="builder")
    with pytest.raises(ValueError) as caught:
        credentials.ensure_usable(inst)
    message = str(caught.value)
    assert "'builder' has no Anthropic API key" in message
    assert "Credentials" in message and "ANTHROPIC_API_KEY" in message
    credentials.ensure_usable(make_instance(user, brain="command", decider="checks"))  # never calls Claude
    with pytest.raises(ValueError, match="no Anthropic API key"):
        credentials.ensure_usable(make_instance(user, brain="command", decider="llm"))  # its decider does


def test_base_url_resolution_order(user, make_instance, monkeypatch):
    inst = make_instance(user, brain="anthropic")
    assert credentials.resolve_base_url(inst) == "https://api.anthropic.com"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://gateway.internal:8080/")
    assert credentials.resolve_base_url(inst) == "http://gateway.internal:8080"
    inst.base_url = "http://127.0.0.1:9999"
    assert credentials.resolve_base_url(inst) == "http://127.0.0.1:9999"


def test_admin_takes_a_key_and_never_renders_it(admin_client, admin_user):
    response = admin_client.post(
        "/admin/instances/credential/add/", {"owner": admin_user.pk, "label": "admin-key", "secret": KEY}
    )
    assert response.status_code == 302, response.content[:2000]
    credential = Credential.objects.get(label="admin-key")
    assert credential.reveal() == KEY
    for url in ["/admin/instances/credential/", f"/admin/instances/credential/{credential.pk}/change/"]:
        page = admin_client.get(url).content.decode()
        assert KEY not in page and credential.secret_encrypted not in page
        assert f"…{KEY[-4:]}" in page
    # Saving without a new key keeps the old one.
    admin_client.post(
        f"/admin/instances/credential/{credential.pk}/change/",
        {"owner": admin_user.pk, "label": "renamed", "secret": ""},
    )
    credential.refresh_from_db()
    assert credential.label == "renamed" and credential.reveal() == KEY


def test_admin_refuses_a_credential_without_a_key(admin_client, admin_user):
    response = admin_client.post("/admin/instances/credential/add/", {"owner": admin_user.pk, "label": "x"})
    assert response.status_code == 200 and not Credential.objects.filter(label="x").exists()
