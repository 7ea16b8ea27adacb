"""Small builders shared by the whole suite."""

import pytest


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("ada", password="pw-ada-123")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


@pytest.fixture
def make_instance(tmp_path):
    from instances.models import Instance

    def build(owner, **fields):
        fields.setdefault("name", "test-instance")
        fields.setdefault("command", ["true"])
        fields.setdefault("workspace", str(tmp_path / f"ws-{Instance.objects.count()}"))
        return Instance.objects.create(owner=owner, **fields)

    return build
