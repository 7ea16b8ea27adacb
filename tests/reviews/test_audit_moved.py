"""The audit trail moved from `reviews` to its own app: the entries written before stay, in the same table."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from audit.models import AuditEntry

BEFORE = [("reviews", "0003_auditentry_via_mcp"), ("audit", None)]


@pytest.mark.django_db(transaction=True)
def test_entries_written_while_reviews_owned_the_trail_are_the_audit_apps_after_migrating():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)  # as an install was before the move: reviews 0003, no audit app
    old = executor.loader.project_state(BEFORE[0]).apps.get_model("reviews", "AuditEntry")
    old.objects.create(
        username="ada", action="run.start", via="cli", detail={"n": 1}, created_at=timezone.now()
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert AuditEntry._meta.db_table == "reviews_auditentry"
    assert list(AuditEntry.objects.values_list("username", "action", "via", "detail")) == [
        ("ada", "run.start", "cli", {"n": 1})
    ]


@pytest.mark.django_db(transaction=True)
def test_entries_with_an_instance_and_owner_keep_them_after_migrating(user):
    """An install that had the whole trail in `reviews` (0004: instance, owner) keeps them in the audit app."""
    before = [("reviews", "0004_audit_instance_owner"), ("audit", None)]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before[0]).apps.get_model("reviews", "AuditEntry")
    old.objects.create(
        username="ada", action="instance.update", via="console", owner_id=user.pk, instance_ref=41,
        detail={"before": {"name": "a"}, "after": {"name": "b"}}, created_at=timezone.now(),
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    entry = AuditEntry.objects.get()
    assert (entry.owner_id, entry.instance_ref, entry.instance_id) == (user.pk, 41, None)
    assert entry.changes() == [("name", "a", "b")]
