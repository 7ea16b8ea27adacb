"""A deactivated account starts nothing: its webhook triggers refuse deliveries, its schedules skip.

Deactivating a user (`is_active = False`) cuts off their API tokens, the console and MCP
(`web.auth`, `web.mcp_server._serve`). A trigger's hook is reached with the trigger's
secret, not the owner's session, so it must check its owner itself: otherwise whoever holds
the secret (the sender) keeps starting runs on the account's instance, its key and its budget. A schedule fires with
no session at all. `loops.services.ensure_startable` refuses both, in one place.
"""

import pytest

from loops.models import Run
from tests.triggers.conftest import deliver, fast_password_hashing, instance, made  # noqa: F401

pytestmark = pytest.mark.django_db


def test_a_deactivated_owners_trigger_starts_no_run(user, made, deliver):  # noqa: F811
    trigger, secret = made
    user.is_active = False
    user.save(update_fields=["is_active"])
    answer = deliver(trigger, secret=secret)
    assert answer.status_code < 500, answer.content
    assert not Run.objects.exists(), f"a deactivated account's trigger started a run ({answer.status_code})"
    assert answer.status_code in (403, 404, 409), answer.content


def test_a_deactivated_owners_schedule_starts_no_run_and_says_why(user, instance):  # noqa: F811
    from datetime import UTC, datetime, timedelta

    from triggers import scheduling
    from triggers.models import Firing

    t0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    schedule = scheduling.schedule_create(
        user=user,
        instance=instance,
        now=t0,
        name="nightly",
        objective_template="check the build",
        cron="* * * * *",
    )
    user.is_active = False
    user.save(update_fields=["is_active"])
    scheduling.tick(t0 + timedelta(minutes=1, seconds=5))
    assert not Run.objects.exists(), "a deactivated account's schedule started a run"
    firing = Firing.objects.get(schedule=schedule)
    assert firing.outcome == Firing.Outcome.SKIPPED and firing.run is None
    assert "deactivated" in firing.reason, firing.reason
