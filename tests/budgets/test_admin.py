"""Admin: every money change made there is a ledger entry naming the person; the ledger is read-only."""

import pytest
from django.urls import reverse

from budgets import ledger, limits, services
from budgets.models import LedgerEntry, Pool, Price

pytestmark = pytest.mark.django_db


@pytest.fixture
def instance_pool(make_run):
    run = make_run()
    services.open_run_pools(run)
    ledger.settle(ledger.hold(run=run, iteration=1, amount=500_000).pk, actual=400_000)
    ledger.return_run_lease(run.pk)  # the run finished: its lease books what it spent up the chain
    return services.instance_pool(run.instance)


def change(admin_client, pool, **fields):
    data = {"name": pool.name, "threshold_percent": 80, "limit_usd": "", "top_up_usd": ""}
    data.update(fields)
    return admin_client.post(reverse("admin:budgets_pool_change", args=[pool.pk]), data)


def test_the_pool_page_shows_balances_and_the_ledger(admin_client, instance_pool):
    page = admin_client.get(reverse("admin:budgets_pool_change", args=[instance_pool.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "$0.40" in body and "settle" in body and "all entries" in body
    listing = admin_client.get(reverse("admin:budgets_pool_changelist"))
    assert listing.status_code == 200 and instance_pool.name in listing.content.decode()
    entries = admin_client.get(
        reverse("admin:budgets_ledgerentry_changelist") + f"?pool__exact={instance_pool.pk}"
    )
    assert entries.status_code == 200


def test_a_limit_set_in_admin_goes_through_the_ledger(admin_client, admin_user, instance_pool):
    response = change(admin_client, instance_pool, limit_usd="2.5")
    assert response.status_code == 302
    instance_pool.refresh_from_db()
    assert instance_pool.limit == 2_500_000
    entry = LedgerEntry.objects.get(pool=instance_pool, kind="limit")
    assert entry.actor == admin_user and entry.limit_after == 2_500_000


def test_a_top_up_in_admin_is_logged(admin_client, admin_user, instance_pool):
    limits.set_limit(instance_pool, 1_000_000, "setup")
    assert change(admin_client, instance_pool, limit_usd="1", top_up_usd="0.75").status_code == 302
    instance_pool.refresh_from_db()
    assert instance_pool.limit == 1_750_000
    assert LedgerEntry.objects.get(pool=instance_pool, kind="top_up").actor == admin_user


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"limit_usd": "0.10"}, "already spent $0.40"),
        ({"limit_usd": "-1"}, "greater than or equal to 0"),
        ({"limit_usd": "lots"}, "Enter a number"),
        ({"top_up_usd": "1"}, "cannot be topped up"),
    ],
)
def test_bad_limits_in_admin_are_clear_errors_and_change_nothing(admin_client, instance_pool, fields, error):
    entries = LedgerEntry.objects.count()
    response = change(admin_client, instance_pool, **fields)
    assert response.status_code == 200
    assert error in response.content.decode()
    instance_pool.refresh_from_db()
    assert instance_pool.limit is None and LedgerEntry.objects.count() == entries


def test_a_team_pool_created_in_admin_logs_its_first_limit(admin_client, admin_user, instance_pool):
    root = services.root_pool()
    data = {
        "name": "platform team",
        "kind": "team",
        "parent": root.pk,
        "period": "monthly",
        "threshold_percent": 80,
        "limit_usd": "100",
    }
    response = admin_client.post(reverse("admin:budgets_pool_add"), data)
    assert response.status_code == 302
    team = Pool.objects.get(kind="team")
    assert team.limit == 100_000_000 and team.path == f"{root.path}{team.pk}/"
    assert LedgerEntry.objects.get(pool=team, kind="limit").actor == admin_user


def test_a_second_root_pool_is_refused(admin_client, instance_pool):
    data = {"name": "another", "kind": "root", "period": "none", "threshold_percent": 80, "limit_usd": ""}
    response = admin_client.post(reverse("admin:budgets_pool_add"), data)
    assert response.status_code == 200
    assert Pool.objects.filter(kind="root").count() == 1


def test_the_reset_period_action(admin_client, admin_user, instance_pool):
    Pool.objects.filter(pk=instance_pool.pk).update(period="monthly")
    url = reverse("admin:budgets_pool_changelist")
    admin_client.post(url, {"action": "reset_period", "_selected_action": [instance_pool.pk]})
    instance_pool.refresh_from_db()
    assert instance_pool.spent == 0
    assert LedgerEntry.objects.get(pool=instance_pool, kind="period_reset").actor == admin_user


def test_the_ledger_cannot_be_edited_in_admin(admin_client, instance_pool):
    entry = LedgerEntry.objects.filter(pool=instance_pool).first()
    url = reverse("admin:budgets_ledgerentry_change", args=[entry.pk])
    assert admin_client.get(url).status_code == 200  # view only
    before = entry.amount
    admin_client.post(url, {"amount": 1})
    entry.refresh_from_db()
    assert entry.amount == before
    assert admin_client.get(reverse("admin:budgets_ledgerentry_add")).status_code == 403
    assert admin_client.get(reverse("admin:budgets_ledgerentry_delete", args=[entry.pk])).status_code == 403


def test_prices_are_editable_in_admin(admin_client):
    price = Price.objects.get(model="claude-haiku-4-5")
    page = admin_client.get(reverse("admin:budgets_price_change", args=[price.pk]))
    assert page.status_code == 200 and "claude-haiku-4-5" in page.content.decode()
