"""A review queue that watches its reviewer: backlog alerts, rubber-stamp signals, missed reviews (reviews.watch)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from instances.models import AgentTemplate
from loops.models import Run
from reviews import selectors, services, watch
from reviews.models import Delivery, Grading, NotificationTarget, ReviewItem

pytestmark = pytest.mark.django_db


@pytest.fixture
def template():
    return AgentTemplate.objects.create(name="fixer", brain="command", command=["true"])


@pytest.fixture
def queued(user, make_instance, template):
    """`queued(n)` puts n sampled verified dones of a `fixer` instance in `user`'s queue; returns the items."""
    inst = make_instance(user, name="fixer-1", template=template)

    def build(n, owner=None, instance=None):
        items = []
        for _ in range(n):
            run = Run.objects.create(
                instance=instance or inst,
                owner=owner or user,
                objective="fix it",
                max_iterations=3,
                status=Run.Status.FINISHED,
                outcome=Run.Outcome.DONE,
                verified=True,
                finished_at=timezone.now(),
            )
            items.append(
                ReviewItem.objects.create(run=run, reason=ReviewItem.Reason.SAMPLED, detail="sampled")
            )
        return items

    build.instance = inst
    return build


def test_a_sample_left_unreviewed_past_the_setting_raises_the_alert(
    queued, user, other_user, client, settings
):
    [item] = queued(1)
    t0 = timezone.now() - timedelta(hours=30)
    ReviewItem.objects.filter(pk=item.pk).update(created_at=t0)
    webhook = NotificationTarget.objects.create(
        owner=user, kind="webhook", address="https://example.com/hook"
    )
    NotificationTarget.objects.create(owner=other_user, kind="webhook", address="https://example.com/bob")

    mine = ReviewItem.objects.filter(run__owner=user)
    assert watch.backlog(mine, now=t0 + timedelta(hours=23)).alerts == []
    assert watch.notify_alerts(now=t0 + timedelta(hours=23)) == 0
    late = watch.backlog(mine, now=t0 + timedelta(hours=25))
    assert late.total.count == 1 and late.total.oldest_item == item.pk
    assert [w.name for w in late.per_template] == ["fixer"] and [w.name for w in late.per_reviewer] == ["ada"]
    assert len(late.alerts) == 1 and "has waited 25 h 0 min, longer than 24 h 0 min" in late.alerts[0]

    assert watch.notify_alerts(now=t0 + timedelta(hours=25)) == 1
    assert watch.notify_alerts(now=t0 + timedelta(hours=26)) == 0  # once per overdue item
    [sent] = Delivery.objects.all()
    assert sent.target == webhook and sent.event == "review.waiting"
    assert sent.payload["review"]["oldest_item"] == item.pk

    settings.TETHER_REVIEW_MAX_WAIT_HOURS = 48
    assert watch.backlog(mine, now=t0 + timedelta(hours=25)).alerts == []
    settings.TETHER_REVIEW_MAX_BACKLOG = 0
    assert watch.backlog(mine, now=t0 + timedelta(hours=25)).alerts == ["1 review items wait, more than 0."]

    # The console banner, and the backlog per template and reviewer, for the owner only.
    settings.TETHER_REVIEW_MAX_WAIT_HOURS = 24
    settings.TETHER_REVIEW_MAX_BACKLOG = 50
    client.force_login(user)
    html = client.get("/reviews/").content.decode()
    assert "data-review-alert" in html and f"(#{item.pk}) has waited 30 h" in html
    assert 'data-backlog-template="fixer"' in html and 'data-backlog-reviewer="ada"' in html
    client.force_login(other_user)
    html = client.get("/reviews/").content.decode()
    assert "data-review-alert" not in html and "data-waiting>0<" in html and "fixer" not in html


def test_ten_quick_approvals_without_the_diff_raise_the_signal_and_the_sampling_rate(
    queued, user, template, client, settings
):
    Grading.objects.create(template=template, sample_percent=Decimal(10))
    assert watch.sample_percent(queued.instance, user, Decimal(10)) == Decimal(10)
    items = queued(10)
    t0 = max(i.created_at for i in items)
    for n, item in enumerate(items, start=1):
        services.review_decide(item=item, user=user, verdict="accept", now=t0 + timedelta(seconds=3 * n))
    decided = ReviewItem.objects.filter(pk__in=[i.pk for i in items])
    assert {round(i.seconds_taken) for i in decided} == {3} and all(i.rubber_stamp for i in decided)

    found = watch.signals(user)
    assert found.firing and found.rubber_stamps == 10 and not found.always_approves  # 10 < a window of 20
    assert watch.sample_percent(queued.instance, user, Decimal(10)) == Decimal(35)
    # The sampling itself: with a rate of 0 and a boost of 100, the next verified done is sampled.
    Grading.objects.filter(template=template).update(sample_percent=Decimal(0))
    settings.TETHER_REVIEW_SAMPLE_BOOST_PERCENT = 100
    run = Run.objects.create(
        instance=queued.instance,
        owner=user,
        objective="again",
        max_iterations=3,
        status=Run.Status.FINISHED,
        outcome=Run.Outcome.DONE,
        verified=True,
        finished_at=timezone.now(),
    )
    assert [reason for reason, _ in services.reasons_for(run)] == ["sampled"]

    client.force_login(user)
    html = client.get("/reviews/").content.decode()
    assert "data-rubber-stamp" in html and "10 of the last 10 verdicts took under 10 s" in html


def test_a_verdict_after_opening_the_diff_is_no_rubber_stamp_and_the_signal_clears(
    queued, user, template, client
):
    items = queued(10)
    client.force_login(user)
    t0 = max(i.created_at for i in items)
    for n, item in enumerate(items, start=1):
        assert client.get(f"/reviews/{item.pk}/").status_code == 200  # the page shows the diff
        item.refresh_from_db()
        assert item.diff_opened_at is not None
        services.review_decide(item=item, user=user, verdict="accept", now=t0 + timedelta(seconds=3 * n))
    assert not any(ReviewItem.objects.values_list("rubber_stamp", flat=True))
    assert not watch.signals(user).firing
    assert watch.sample_percent(queued.instance, user, Decimal(10)) == Decimal(10)


def test_approving_everything_over_the_window_fires_until_a_rejection_clears_it(queued, user, settings):
    settings.TETHER_REVIEW_STREAK = 5
    items = queued(6)
    t0 = max(i.created_at for i in items)
    for n, item in enumerate(items[:5], start=1):  # a minute each: read, not stamped
        services.review_decide(item=item, user=user, verdict="accept", now=t0 + timedelta(minutes=n))
    assert watch.signals(user).always_approves and not watch.signals(user).quick
    services.review_decide(
        item=items[5], user=user, verdict="reject", note="wrong", now=timezone.now() + timedelta(hours=1)
    )
    assert not watch.signals(user).firing


def test_the_operator_sees_every_reviewer_signals(queued, user, django_user_model, client):
    staff = django_user_model.objects.create_user("op", password="pw-op-12345", is_staff=True)
    items = queued(2)
    t0 = max(i.created_at for i in items)
    for n, item in enumerate(items, start=1):
        services.review_decide(item=item, user=user, verdict="accept", now=t0 + timedelta(seconds=n))
    client.force_login(staff)
    html = client.get("/reviews/").content.decode()
    assert 'data-reviewer-signal="ada"' in html and "2 of the last 2 verdicts took under 10 s" in html
    assert "data-backlog-reviewer" not in html or 'data-backlog-reviewer="ada"' not in html  # nothing waits


def test_opening_another_persons_item_records_nothing(queued, other_user, client):
    [item] = queued(1)
    client.force_login(other_user)
    assert client.get(f"/reviews/{item.pk}/").status_code == 404
    item.refresh_from_db()
    assert item.diff_opened_at is None


def test_a_reopened_approval_counts_as_missed_in_review(queued, user, other_user, client):
    [item] = queued(1)
    services.review_decide(item=item, user=user, verdict="accept", note="looks fine")
    [row] = selectors.fleet_stats(user)
    assert (row.accepted, row.missed, row.accepted_results) == (1, 0, 1)

    client.force_login(other_user)  # not theirs: refused, nothing changes
    assert client.post(f"/reviews/{item.pk}/reopen", {"note": "bad"}).status_code == 404
    item.refresh_from_db()
    assert item.status == "accepted" and not item.missed_in_review

    client.force_login(user)
    client.post(f"/reviews/{item.pk}/reopen", {"note": ""})  # a reopening says why
    item.refresh_from_db()
    assert item.status == "accepted" and not item.missed_in_review
    assert client.post(f"/reviews/{item.pk}/reopen", {"note": "it broke the build"}).status_code == 302
    item.refresh_from_db()
    assert item.status == "pending" and item.missed_in_review and "it broke the build" in item.missed_detail
    entry = AuditEntry.objects.get(action="review.reopen")
    assert entry.detail["before"]["status"] == "accepted" and entry.via == "console"
    [row] = selectors.fleet_stats(user)
    assert (row.template, row.accepted, row.missed, row.accepted_results, row.pending) == (
        "fixer",
        0,
        1,
        0,
        1,
    )
    html = client.get("/reviews/").content.decode()
    assert "data-missed-in-review>1<" in html
    assert "data-missed" in client.get(f"/reviews/{item.pk}/").content.decode()
    # Only an accepted item can be reopened.
    assert client.post(f"/reviews/{item.pk}/reopen", {"note": "again"}).status_code == 302
    item.refresh_from_db()
    assert item.status == "pending"


def test_a_rolled_back_run_marks_its_accepted_review_missed(queued, user):
    [item] = queued(1)
    services.review_decide(item=item, user=user, verdict="accept")
    assert watch.mark_run_missed(item.run_id, "its work was rolled back to the start") == 1
    item.refresh_from_db()
    assert item.missed_in_review and item.missed_detail == "its work was rolled back to the start"


def test_one_django_q_schedule_drives_the_watch_and_the_digests(queued, user):
    """The periodic work runs from one django-q2 schedule the workers' cluster already runs."""
    import importlib

    from django.apps import apps
    from django_q.models import Schedule

    from reviews import tasks

    migration = importlib.import_module("reviews.migrations.0007_review_watch_schedule")
    Schedule.objects.filter(name=migration.NAME).delete()  # a transactional test before may have flushed it
    migration.add(apps, None)
    migration.add(apps, None)  # idempotent
    [schedule] = Schedule.objects.filter(name=migration.NAME)
    assert (schedule.func, schedule.schedule_type, schedule.minutes) == (
        "reviews.tasks.watch_and_digest",
        "I",
        5,
    )
    [item] = queued(1)
    ReviewItem.objects.filter(pk=item.pk).update(created_at=timezone.now() - timedelta(days=2))
    NotificationTarget.objects.create(owner=user, kind="webhook", address="https://example.com/hook")
    tasks.watch_and_digest()
    assert Delivery.objects.filter(event="review.waiting").count() == 1
