"""Money in the loop: reserve before the act, settle at the measured cost, stop at the cap."""

import pytest

from budgets.models import Pool, Reservation
from loops import services
from loops.models import Event, Run

pytestmark = pytest.mark.django_db(transaction=True)

SPENDER = """
p = pathlib.Path('n'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
json.dump({'cost_usd': 0.03}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print('step', n)
"""


@pytest.fixture
def spender(user, make_instance, script, settings):
    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = "0.05"
    check = script("print('n is', pathlib.Path('n').read_text()); sys.exit(1)\n")
    return make_instance(user, command=script(SPENDER), checks=[{"name": "never", "command": check}], max_iterations=20)


def test_run_cap_stops_before_spending_past_it(spender, start, drive):
    run = drive(start(spender, max_cost_usd="0.12"))
    assert run.outcome == "budget_exhausted"
    assert "run" in run.outcome_detail.lower()  # names the pool that refused
    # 0.05 reserved per iteration: after three acts at 0.03 (0.09 spent) the fourth cannot fit.
    assert run.iterations_done == 3
    assert run.spent_micros == 90_000 <= 120_000
    pool = Pool.objects.get(kind="run", run=run)
    assert (pool.spent, pool.reserved) == (90_000, 0)
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    assert not Event.objects.filter(run=run, kind="iteration.started", data__iteration=4).exists()


def test_raise_the_cap_and_resume_keeps_history(spender, start, drive, user):
    run = drive(start(spender, max_cost_usd="0.12", max_iterations=5))
    assert run.outcome == "budget_exhausted"
    with pytest.raises(services.Refused, match="above the run's current cap"):
        services.run_resume(run=run, user=user, max_cost_usd="0.10")
    run = services.run_resume(run=run, user=user, max_cost_usd="1.00")
    assert (run.status, run.outcome, run.next_iteration) == ("queued", "", 4)
    run = drive(run)
    assert run.outcome == "max_iterations"
    assert list(run.iterations.values_list("number", flat=True)) == [1, 2, 3, 4, 5]
    assert run.spent_micros == 150_000


def test_resume_is_only_for_budget_exhausted(spender, start, user):
    run = start(spender)
    with pytest.raises(services.Refused, match="only a run that ended budget_exhausted"):
        services.run_resume(run=run, user=user)


def test_a_dead_attempts_reservation_is_closed_by_the_reaper(spender, start, user):
    from datetime import timedelta

    from django.utils import timezone

    from loops import driver, leases, runner

    run = start(spender, max_iterations=3)
    lease = leases.claim(run.pk, 1, "doomed")
    begun = runner._begin(lease)  # the iteration started and reserved; its worker dies here
    assert begun is not None and Reservation.objects.get(run_id=run.pk).status == "held"
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert driver.reap() == 1
    held = Reservation.objects.get(run_id=run.pk, iteration=1)
    assert held.status == "abandoned" and held.actual == held.amount  # settled conservatively
    run.refresh_from_db()
    assert run.spent_micros == held.amount


def test_a_bad_cap_is_refused_up_front(spender, user):
    with pytest.raises(services.Refused, match="max_cost_usd must be"):
        services.run_start(instance=spender, user=user, objective="x", max_cost_usd="-1")
    assert Run.objects.count() == 0


LIAR = """
json.dump({'cost_usd': 50}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print('spent a lot')
"""


def test_a_report_above_the_reservation_ends_the_run_at_once_and_blocks_the_pool(
    user, make_instance, script, settings, start, drive
):
    from budgets import limits
    from budgets.services import instance_pool, open_run_pools

    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = "0.05"
    check = script("sys.exit(1)\n")
    inst = make_instance(user, command=script(LIAR), checks=[{"name": "never", "command": check}], max_iterations=20)
    run = start(inst, max_cost_usd="0.20")
    open_run_pools(run)
    limits.set_limit(instance_pool(inst), 1_000_000, "admin")  # $1 for the instance
    run = drive(run)
    assert run.outcome == "budget_exhausted" and run.iterations_done == 1
    assert "$50" in run.outcome_detail and "only metered spend is hard-capped" in run.outcome_detail
    reservation = Reservation.objects.get(run_id=run.pk, iteration=1)
    assert (reservation.actual, reservation.overdraft) == (50_000_000, 49_950_000)
    assert Pool.objects.get(kind="instance", instance=inst).spent == 50_000_000
    # The overdrawn instance pool grants nothing more until a person covers it.
    with pytest.raises(services.Refused, match=r"has left \(\$0\.00\)"):
        start(inst, max_cost_usd="0.20")


ASKER = """
json.dump({'cost_usd': 0.01}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print("TETHER_ESCALATE: Which colour?", file=sys.stderr)
sys.exit(3)
"""


def test_a_run_that_asks_a_person_books_what_it_spent_up_the_chain_not_what_it_reserved(
    user, make_instance, script, start, drive, settings
):
    from budgets import services as budget_services

    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = "0.05"
    run = drive(start(make_instance(user, command=script(ASKER), checks=[])))
    assert run.status == "waiting"  # parked: its lease went back after the iteration settled
    assert run.spent_micros == 10_000
    for pool in Pool.objects.filter(pk__in=budget_services.user_pool(user).chain_ids()):
        assert (pool.spent, pool.reserved) == (10_000, 0), pool.name  # $0.01, not the $0.05 reserved
    assert not Reservation.objects.filter(status="held").exists()
