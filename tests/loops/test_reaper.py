"""The reaper and the attempt counter: a run whose driver keeps dying ends `crashed`."""

from datetime import timedelta

import pytest
from django.utils import timezone

from loops import driver, leases, runner
from loops.models import Event, Run

pytestmark = pytest.mark.django_db(transaction=True)


def expire(run):
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_a_duplicate_or_stale_claim_takes_nothing(user, make_instance, start):
    run = start(make_instance(user))
    lease = leases.claim(run.pk, 1, "first")
    assert lease is not None
    assert leases.claim(run.pk, 1, "second") is None  # held
    assert leases.claim(run.pk, 2, "second") is None  # not at that iteration
    expire(run)
    stolen = leases.claim(run.pk, 1, "second")
    assert stolen is not None and stolen.token != lease.token
    with pytest.raises(leases.LeaseLost):
        runner.iterate(lease)  # the first driver's writes are fenced off


def test_reaper_reschedules_expired_runs_and_leaves_live_ones(user, make_instance, start):
    live = start(make_instance(user, name="live"))
    dead = start(make_instance(user, name="dead"))
    assert leases.claim(live.pk, 1, "w1") and leases.claim(dead.pk, 1, "w2")
    expire(dead)
    assert driver.reap() == 1
    dead.refresh_from_db()
    assert dead.lease_token is None and dead.lease_expires_at > timezone.now()
    assert Event.objects.filter(run=dead, kind="run.reaped", data__previous_worker="w2").exists()
    assert not Event.objects.filter(run=live, kind="run.reaped").exists()
    assert driver.reap() == 0  # the pickup deadline has not passed yet


def test_waiting_and_finished_runs_are_never_reaped(user, make_instance, start):
    from loops import services

    run = start(make_instance(user))
    services.run_cancel(run=run, user=user)
    expire(run)
    assert driver.reap() == 0


def test_attempts_exhausted_is_crashed(user, make_instance, start, settings):
    settings.TETHER_MAX_ATTEMPTS = 3
    run = start(make_instance(user))
    for attempt in range(3):
        assert leases.claim(run.pk, 1, f"doomed-{attempt}") is not None
        expire(run)  # its worker died mid-iteration
        assert driver.reap() == 1
    assert leases.claim(run.pk, 1, "last") is None
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("finished", "crashed")
    assert "3 attempts" in run.outcome_detail
    assert run.lease_token is None
