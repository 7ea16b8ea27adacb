"""Schedules fire on time, once, within their budget: the clock is passed in (`now`), never waited on."""

from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEntry
from budgets import limits
from budgets import services as budget_services
from loops import services
from loops.models import Run
from reviews.models import Delivery, NotificationTarget
from reviews.notify import render_email
from triggers import scheduling
from triggers.models import Firing, Schedule
from triggers.services import TriggerRefused

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # a Monday
MIN = timedelta(minutes=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def every_minute(user, instance):
    def make(**fields):
        fields.setdefault("name", "minutely")
        fields.setdefault("objective_template", "Check the build of {date} (last: {last_run.outcome})")
        fields.setdefault("cron", "* * * * *")
        return scheduling.schedule_create(user=user, instance=instance, now=T0, **fields)

    return make


def outcomes(schedule):
    return [f.outcome for f in Firing.objects.filter(schedule=schedule).order_by("scheduled_for", "pk")]


def finish(run, user):
    services.run_cancel(run=run, user=user)


def test_runs_start_on_time_and_name_their_firing(every_minute, user):
    schedule = every_minute()
    assert schedule.next_fire_at == at(1)
    assert scheduling.tick(at(0.5)) == 0  # not yet
    assert scheduling.tick(at(1) + timedelta(seconds=20)) == 1
    first = Firing.objects.get()
    assert first.outcome == "started" and first.scheduled_for == at(1)
    run = first.run
    assert run.origin == Run.Origin.SCHEDULE and run.origin_ref == {
        "schedule": schedule.pk,
        "firing": first.pk,
    }
    assert run.objective == "Check the build of 2026-03-02 (last: )"
    assert run.origin_text == f"by schedule {schedule.pk} (firing {first.pk})"
    finish(run, user)
    assert scheduling.tick(at(2) + timedelta(seconds=5)) == 1
    second = Firing.objects.filter(schedule=schedule).first()
    assert second.scheduled_for == at(2) and second.outcome == "started"
    assert second.run.objective == "Check the build of 2026-03-02 (last: cancelled)"
    # The same tick again (another cluster, a redelivered task): nothing more.
    assert scheduling.tick(at(2) + timedelta(seconds=6)) == 0
    assert scheduling.fire_due(schedule.pk, at(2) + timedelta(seconds=7)) == []
    assert Run.objects.count() == 2


def test_skip_records_the_overlapping_firing(every_minute):
    schedule = every_minute()
    scheduling.tick(at(1))
    live = Firing.objects.get().run
    scheduling.tick(at(2))
    skipped = Firing.objects.filter(schedule=schedule).first()
    assert skipped.outcome == "skipped" and skipped.run is None
    assert f"run {live.pk} of this schedule is still live (overlap: skip)" in skipped.reason
    assert Run.objects.count() == 1


def test_buffer_one_starts_one_run_after_the_live_one(every_minute, user):
    schedule = every_minute(overlap="buffer_one")
    scheduling.tick(at(1))
    live = Firing.objects.get().run
    scheduling.tick(at(2))
    scheduling.tick(at(3))
    assert outcomes(schedule) == ["started", "buffered", "skipped"]
    scheduling.tick(at(3.5))  # still live: the buffered one waits
    assert Run.objects.count() == 1
    finish(live, user)
    assert scheduling.tick(at(3.75)) == 1
    assert outcomes(schedule) == ["started", "started", "skipped"]
    released = Firing.objects.get(scheduled_for=at(2))
    assert released.run is not None and released.run.origin_ref["firing"] == released.pk
    assert "buffered until the previous run ended" in released.reason
    assert Run.objects.count() == 2


def test_cancel_other_stops_the_live_run_then_starts(every_minute):
    schedule = every_minute(overlap="cancel_other")
    scheduling.tick(at(1))
    first = Firing.objects.get().run
    scheduling.tick(at(2))
    first.refresh_from_db()
    assert first.cancel_requested_at is not None and first.status == Run.Status.FINISHED
    assert outcomes(schedule) == ["started", "started"]
    assert f"stopped run {first.pk}" in Firing.objects.get(scheduled_for=at(2)).reason


def test_allow_all_starts_beside_the_live_run(every_minute):
    schedule = every_minute(overlap="allow_all")
    scheduling.tick(at(1))
    scheduling.tick(at(2))
    assert outcomes(schedule) == ["started", "started"]
    assert Run.objects.exclude(status=Run.Status.FINISHED).count() == 2


def test_after_ten_minutes_down_one_catch_up_run_and_the_rest_missed(every_minute, user):
    schedule = every_minute(catch_up_minutes=3)
    scheduling.tick(at(1))
    finish(Firing.objects.get().run, user)
    # The workers are down from 08:01:30 to 08:11:30: ten firings (08:02 .. 08:11) are due at once.
    assert scheduling.tick(at(11.5)) == 10
    firings = list(Firing.objects.filter(schedule=schedule).order_by("scheduled_for"))[1:]
    assert [f.outcome for f in firings] == ["missed"] * 9 + ["started"]
    assert firings[-1].scheduled_for == at(11) and "catch-up" in firings[-1].reason
    assert "one catch-up run, never a burst" in firings[0].reason
    assert Run.objects.count() == 2
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at(12)


def test_a_firing_later_than_its_window_is_missed(every_minute):
    schedule = every_minute(cron="0 * * * *", catch_up_minutes=3)  # hourly
    scheduling.tick(T0 + timedelta(hours=1, minutes=10))
    assert outcomes(schedule) == ["missed"]
    assert "past the catch-up window of 3 minutes" in Firing.objects.get().reason
    assert Run.objects.count() == 0
    schedule.refresh_from_db()
    assert schedule.next_fire_at == T0 + timedelta(hours=2)


def test_a_long_outage_is_recorded_without_a_row_per_firing(every_minute):
    schedule = every_minute()
    scheduling.tick(at(60 * 24))  # a day down: 1,440 firings
    rows = Firing.objects.filter(schedule=schedule)
    assert (
        rows.count() == 62
    )  # the started one, the latest 60 missed, and one row for the older 1,379 and rows.filter(outcome="started").count() == 1
    assert "1379 firings from" in rows.order_by("scheduled_for").first().reason


def test_a_pool_without_headroom_skips_the_firing_and_tells_the_owner(every_minute, user, instance):
    target = NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    schedule = every_minute(max_cost_usd="1.00")
    pool = budget_services.user_pool(user)
    limits.set_limit(pool, 500_000, None)  # $0.50
    pool.refresh_from_db()
    pool.period = "daily"
    pool.save(update_fields=["period"])
    scheduling.tick(at(1))
    firing = Firing.objects.get()
    assert firing.outcome == "skipped" and firing.run is None
    assert "has $0.50 of its $0.50 daily period left" in firing.reason
    assert "may cost up to $1.00" in firing.reason
    assert Run.objects.count() == 0
    told = Delivery.objects.get(target=target)
    assert told.event == "schedule.skipped" and told.payload["schedule"]["id"] == schedule.pk
    assert "has $0.50" in told.payload["reason"]
    subject, body = render_email(told.payload)
    assert subject == "[Tether] schedule minutely of triage skipped a firing" and "has $0.50" in body


def test_paused_schedules_do_not_fire_and_resume_from_now(every_minute, user):
    schedule = every_minute()
    scheduling.schedule_change(user=user, schedule=schedule, changes={"active": False}, now=at(0.5))
    assert scheduling.tick(at(5)) == 0
    schedule = scheduling.schedule_change(user=user, schedule=schedule, changes={"active": True}, now=at(5.5))
    assert schedule.next_fire_at == at(6)
    assert scheduling.tick(at(6)) == 1 and outcomes(schedule) == ["started"]
    actions = list(
        AuditEntry.objects.filter(action__startswith="schedule.")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == ["schedule.create", "schedule.pause", "schedule.resume"]


def test_run_now_starts_a_run_whatever_the_overlap(every_minute, user):
    schedule = every_minute()
    scheduling.tick(at(1))
    firing = scheduling.run_now(user=user, schedule=schedule, now=at(1.5), via="console")
    assert firing.manual and firing.outcome == "started" and firing.run.origin_ref["firing"] == firing.pk
    assert AuditEntry.objects.filter(action="schedule.run_now").exists()


def test_interval_time_zone_and_dates(user, instance):
    schedule = scheduling.schedule_create(
        user=user,
        instance=instance,
        name="weekday mornings",
        objective_template="Triage for {date}",
        cron="0 9 * * 1-5",
        timezone="Europe/Paris",
        now=T0,
    )
    # 09:00 in Paris is 08:00 UTC in winter; at 08:00 sharp that firing is not after now: the next is Tuesday's.
    times = scheduling.next_firings(schedule, now=T0)
    assert [t.isoformat() for t in times[:2]] == ["2026-03-03T08:00:00+00:00", "2026-03-04T08:00:00+00:00"]
    assert len(times) == 5 and times[-1].weekday() == 0  # the next Monday
    summer = scheduling.preview(
        {"cron": "0 9 * * *", "timezone": "Europe/Paris"}, now=datetime(2026, 3, 27, 12, tzinfo=UTC)
    )
    assert summer[0].hour == 8 and summer[1].hour == 7  # clocks go forward on 29 March
    spaced = scheduling.preview(
        {"interval_minutes": 90, "starts_at": at(30), "ends_at": at(300)}, now=T0, count=10
    )
    assert spaced == [at(30), at(120), at(210), at(300)]


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "* * * * * *"}, "cron", "give five fields"),
        ({"cron": "* * * * *", "interval_minutes": 5}, "cron", "not both"),
        ({}, "cron", "not neither"),
        ({"interval_minutes": 0}, "interval_minutes", "from 1 to"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone", "not a time zone"),
        ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "timezone", "not a time zone"),
        ({"cron": "* * * * *", "starts_at": at(10), "ends_at": at(5)}, "ends_at", "after starts_at"),
    ],
)
def test_bad_timing_is_refused_with_a_sentence(user, instance, values, field, words):
    with pytest.raises(TriggerRefused) as refused:
        scheduling.schedule_create(user=user, instance=instance, name="x", objective_template="x", **values)
    assert refused.value.status == 400 and refused.value.field == field and words in refused.value.message
    assert not Schedule.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_tick_is_a_django_q_schedule_made_again_after_a_flush():
    from django.core.management import call_command
    from django_q.models import Schedule as QSchedule

    assert QSchedule.objects.filter(name="tether.schedules.tick").exists()
    call_command("flush", interactive=False, verbosity=0)
    tick = QSchedule.objects.get(name="tether.schedules.tick")
    assert (
        tick.func == "triggers.tasks.tick" and tick.schedule_type == QSchedule.MINUTES and tick.minutes == 1
    )


def test_one_broken_schedule_stops_no_other(every_minute, caplog):
    broken = every_minute(name="broken")
    fine = every_minute(name="fine")
    Schedule.objects.filter(pk=broken.pk).update(timezone="Mars/Olympus")  # a row no service would write
    assert scheduling.tick(at(1)) == 1
    assert outcomes(fine) == ["started"] and outcomes(broken) == []
    assert f"firing schedule {broken.pk} failed" in caplog.text
