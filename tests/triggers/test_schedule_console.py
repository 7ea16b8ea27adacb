"""The console's schedules page: preview, make, edit, pause, run now, delete, firing history; others get 404."""

import pytest

from audit.models import AuditEntry
from loops.models import Run
from triggers import scheduling
from triggers.models import Firing, Schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client, user):
    client.force_login(user)
    return client


FORM = {
    "name": "weekday triage",
    "objective_template": "Triage the issues of {date}",
    "cron": "0 9 * * 1-5",
    "interval_minutes": "",
    "timezone": "Europe/Paris",
    "overlap": "skip",
    "catch_up_minutes": "5",
}


def test_preview_then_make_pause_run_now_and_see_the_firings(signed_in, instance):
    page = f"/instances/{instance.pk}/schedules/"
    preview = signed_in.post(page, {**FORM, "action": "preview"})
    assert preview.status_code == 200 and not Schedule.objects.exists()
    shown = preview.content.decode()
    assert "data-preview" in shown and shown.count("<li><time") == 5
    made = signed_in.post(page, {**FORM, "action": "save"}, follow=True)
    assert made.redirect_chain == [(page, 303)]
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.catch_up_minutes) == ("0 9 * * 1-5", "Europe/Paris", 5)
    assert "data-schedule-state>active" in made.content.decode()
    paused = signed_in.post(f"/schedules/{schedule.pk}/pause", {"active": "0"}, follow=True)
    assert "data-schedule-state>paused" in paused.content.decode()
    fired = signed_in.post(f"/schedules/{schedule.pk}/run", follow=True).content.decode()
    firing = Firing.objects.get()
    assert firing.manual and firing.run_id and f"run {firing.run_id}" in fired
    assert 'data-outcome="started"' in fired
    run_page = signed_in.get(f"/runs/{firing.run_id}/").content.decode()
    assert (
        f"by schedule {schedule.pk} (firing {firing.pk})" in run_page
        and f"#schedule-{schedule.pk}" in run_page
    )
    edit = signed_in.get(f"/schedules/{schedule.pk}/edit")
    assert edit.status_code == 200 and "0 9 * * 1-5" in edit.content.decode()
    saved = signed_in.post(
        f"/schedules/{schedule.pk}/edit", {**FORM, "cron": "", "interval_minutes": "30", "action": "save"}
    )
    assert saved.status_code == 303
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.interval_minutes) == ("", 30)
    deleted = signed_in.post(f"/schedules/{schedule.pk}/delete")
    assert deleted.status_code == 303 and not Schedule.objects.exists() and Run.objects.exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="schedule.").order_by("pk").values_list("action", "via")
    )
    assert actions == [
        ("schedule.create", "console"),
        ("schedule.pause", "console"),
        ("schedule.run_now", "console"),
        ("schedule.change", "console"),
        ("schedule.delete", "console"),
    ]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"cron": "61 * * * *"}, "not a valid cron expression"),
        ({"cron": "", "interval_minutes": ""}, "not neither"),
        ({"interval_minutes": "5"}, "not both"),
        ({"timezone": "Mars/Olympus"}, "not a time zone"),
        ({"objective_template": "{__class__}"}, "are not looked up"),
        ({"overlap": "queue_all"}, "Select a valid choice"),
    ],
)
@pytest.mark.parametrize("action", ["preview", "save"])
def test_a_bad_schedule_is_refused_with_a_clear_message(signed_in, instance, change, says, action):
    answer = signed_in.post(f"/instances/{instance.pk}/schedules/", {**FORM, **change, "action": action})
    assert answer.status_code == 400
    assert says in answer.content.decode()
    assert not Schedule.objects.exists()


def test_another_users_schedules_are_404(client, user, other_user, instance):
    schedule = scheduling.schedule_create(
        user=user, instance=instance, name="s", objective_template="x", cron="* * * * *"
    )
    client.force_login(other_user)
    assert client.get(f"/instances/{instance.pk}/schedules/").status_code == 404
    assert client.post(f"/instances/{instance.pk}/schedules/", {**FORM, "action": "save"}).status_code == 404
    for path in ("edit", "pause", "run", "delete"):
        assert client.post(f"/schedules/{schedule.pk}/{path}", {"active": "0", **FORM}).status_code == 404, (
            path
        )
    assert client.get(f"/schedules/{schedule.pk}/edit").status_code == 404
    schedule.refresh_from_db()
    assert schedule.active and schedule.cron == "* * * * *" and not Firing.objects.exists()
    assert Schedule.objects.filter(instance__owner=other_user).count() == 0


def test_pausing_and_deleting_in_the_admin_is_audited(client, django_user_model, user, instance):
    schedule = scheduling.schedule_create(
        user=user, instance=instance, name="s", objective_template="x", cron="* * * * *"
    )
    root = django_user_model.objects.create_superuser("root", email="")
    client.force_login(root)
    assert client.get("/admin/triggers/schedule/").status_code == 200
    assert client.get(f"/admin/triggers/schedule/{schedule.pk}/change/").status_code == 200
    inline = {"firings-TOTAL_FORMS": "0", "firings-INITIAL_FORMS": "0", "firings-MAX_NUM_FORMS": "0"}
    page = client.post(f"/admin/triggers/schedule/{schedule.pk}/change/", inline)  # `active` unticked
    assert page.status_code == 302, page.content.decode()[-2000:]
    schedule.refresh_from_db()
    assert not schedule.active and schedule.next_fire_at is None
    entry = AuditEntry.objects.get(action="schedule.change", via="admin")
    assert entry.user == root and entry.detail["after"]["active"] is False
    assert client.post(f"/admin/triggers/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 302
    assert AuditEntry.objects.filter(action="schedule.delete", via="admin").exists()
    assert not Schedule.objects.exists()
