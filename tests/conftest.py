"""Small builders shared by the whole suite."""

import stat
import sys
import textwrap

import pytest


@pytest.fixture(scope="session", autouse=True)
def quick_password_hashing():
    """Every test's users get a cheap hash (tests.support.hashers); the suite makes thousands."""
    from django.conf import settings
    from django.contrib.auth import hashers

    settings.PASSWORD_HASHERS = ["tests.support.hashers.QuickPBKDF2"]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


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


@pytest.fixture(scope="session", autouse=True)
def sandbox_programs(tmp_path_factory):
    """A directory of programs every sandbox sees read-only (TETHER_SANDBOX_PROGRAMS), for the whole session.

    Exported too, so worker and web processes a test starts see the same directory.
    """
    import os

    from django.conf import settings

    programs = tmp_path_factory.mktemp("programs")
    programs.chmod(0o755)  # readable by the sandbox users, as an operator's program directory is
    os.environ["TETHER_SANDBOX_PROGRAMS"] = str(programs)
    settings.TETHER_SANDBOX_PROGRAMS = [str(programs)]
    return programs


@pytest.fixture
def script(sandbox_programs, request):
    """Write an executable Python script (a scripted agent or check); return its argv.

    Scripts live in the directory of programs every sandbox sees (an operator's agent CLIs).
    """
    import hashlib

    counter = {"n": 0}
    prefix = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]

    def build(body: str) -> list[str]:
        counter["n"] += 1
        path = sandbox_programs / f"{prefix}-script{counter['n']}.py"
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


@pytest.fixture
def shipped_prices():
    """The prices a fresh install ships (the budgets migration seeds them; a transactional test
    that ran before this one may have flushed the rows)."""
    import importlib

    from django.apps import apps

    importlib.import_module("budgets.migrations.0004_price_shipped_models").seed(apps, None)


def pytest_collection_modifyitems(config, items):
    """Mark what the fast lane leaves out.

    A test that needs committed data (`django_db(transaction=True)`) does so because another thread or
    process reads it: a driver, a worker cluster, a server. It is `slow` like those that say so.
    (Collection order is kept: starting every slow test first put all the clusters side by side.)
    """
    for item in items:
        db = item.get_closest_marker("django_db")
        if db is not None and db.kwargs.get("transaction"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def clusters(tmp_path):
    """Start real worker clusters by name (`clusters("w1", **env)`); each is stopped as serve stops it."""
    from tests.support.cluster import Cluster

    started = []

    def start(name, **env):
        cluster = Cluster(name, tmp_path, **env)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
        print(f"--- {cluster.name} log (tail) ---\n{cluster.tail()}")  # shown when the test fails
