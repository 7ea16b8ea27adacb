"""A driver renews its leases in one short transaction, however many runs it holds."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from loops import leases
from loops.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def held(user, make_instance, start, count):
    runs = [start(make_instance(user, name=f"i{i}")) for i in range(count)]
    held_leases = [lease for lease, _ in leases.claim_due("w1", count)]
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    return held_leases


def expiry(lease):
    return Run.objects.get(pk=lease.run_id).lease_expires_at


def test_renewing_many_leases_is_one_transaction_of_a_few_statements(user, make_instance, start):
    mine = held(user, make_instance, start, 12)
    soon = timezone.now() + timedelta(seconds=5)
    with CaptureQueriesContext(connection) as queries:
        renewed = leases.renew(mine)
    assert renewed == {lease.run_id for lease in mine}
    assert all(expiry(lease) > soon for lease in mine)  # TETHER_LEASE_SECONDS (30 s) from now
    sent = [q["sql"] for q in queries.captured_queries]
    # BEGIN, the read (and lock) of the rows still under their tokens, one UPDATE for all, COMMIT
    assert len([sql for sql in sent if sql.startswith("UPDATE")]) == 1, sent
    assert len(sent) == 4, sent


def test_a_lease_lost_meanwhile_is_not_renewed_and_the_rest_are(user, make_instance, start):
    mine = held(user, make_instance, start, 3)
    taken, finished, kept = mine
    Run.objects.filter(pk=taken.run_id).update(lease_token="another drivers", lease_holder="w2")
    Run.objects.filter(pk=finished.run_id).update(lease_token=None, status="finished")
    before = {lease.run_id: expiry(lease) for lease in mine}
    assert leases.renew(mine) == {kept.run_id}
    assert expiry(taken) == before[taken.run_id] and expiry(finished) == before[finished.run_id]
    assert expiry(kept) > before[kept.run_id]
    assert leases.renew([]) == set()


def test_a_run_whose_row_another_transaction_holds_is_renewed_once_it_lets_go(user, make_instance, start):
    mine = held(user, make_instance, start, 2)
    busy, other = mine
    locked, release = threading.Event(), threading.Event()

    def iteration_in_flight():  # as the run's own iteration transaction holds its row
        try:
            with transaction.atomic():
                Run.objects.select_for_update().filter(pk=busy.run_id).update(next_iteration=1)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=iteration_in_flight)
    holder.start()
    assert locked.wait(10)
    threading.Timer(0.5, release.set).start()
    try:
        renewed = leases.renew(mine)
    finally:
        release.set()
        holder.join(10)
    assert renewed == {busy.run_id, other.run_id}
    assert all(expiry(lease) > timezone.now() + timedelta(seconds=5) for lease in mine)


def test_a_driver_full_of_runs_renews_them_in_one_statement_a_database_can_parse(user, make_instance, start):
    # More leases than SQLite's expression depth (1000) allows in an OR of (id, token) pairs.
    real = held(user, make_instance, start, 2)
    gone = [leases.Lease(run_id=10_000_000 + i, token=f"t{i}", holder="w1") for i in range(1500)]
    assert leases.renew([*gone, *real]) == {lease.run_id for lease in real}
