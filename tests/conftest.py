"""Small builders shared by the whole suite."""

import stat
import sys
import textwrap

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


@pytest.fixture
def script(tmp_path):
    """Write an executable Python script (a scripted agent or check); return its argv."""
    counter = {"n": 0}

    def build(body: str) -> list[str]:
        counter["n"] += 1
        path = tmp_path / f"script{counter['n']}.py"
        path.write_text("import os, sys, json, time, pathlib\n" + textwrap.dedent(body))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
        return [sys.executable, str(path)]

    return build


TEST_MODEL = "claude-test-1"


@pytest.fixture
def price():
    """The price of the model the local Messages server plays (Sonnet-like rates)."""
    from decimal import Decimal

    from django.utils import timezone

    from budgets.models import Price

    return Price.objects.create(
        model=TEST_MODEL,
        input_usd_per_mtok=Decimal("3"),
        output_usd_per_mtok=Decimal("15"),
        cache_write_usd_per_mtok=Decimal("3.75"),
        cache_read_usd_per_mtok=Decimal("0.30"),
        effective_from=timezone.now().date().replace(year=2020),
    )
