"""The schedule API: the owner creates, previews, changes, pauses, fires and deletes; nobody else sees a thing."""

import json

import pytest

from audit.models import AuditEntry
from loops.models import Run
from triggers.models import Schedule
from web.auth import make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client):
    def call(user, method, path, body=None):
        headers = {"Authorization": f"Bearer {make_token(user)}"}
        data = json.dumps(body) if body is not None else None
        return getattr(client, method)(path, data=data, content_type="application/json", headers=headers)

    return call


BODY = {
    "name": "nightly",
    "objective_template": "Check the build of {date}",
    "cron": "0 3 * * *",
    "timezone": "Europe/Paris",
}


def test_the_owner_creates_previews_changes_fires_and_deletes(api, user, instance):
    base = f"/v1/instances/{instance.pk}/schedules"
    preview = api(user, "post", f"{base}/preview", {"interval_minutes": 15})
    assert preview.status_code == 200 and len(preview.json()["next_firings"]) == 5
    made = api(user, "post", base, BODY)
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["overlap"] == "skip" and body["timezone"] == "Europe/Paris" and len(body["next_firings"]) == 5
    assert all(t.endswith(("T02:00:00+00:00", "T01:00:00+00:00")) for t in body["next_firings"])
    one = f"{base}/{body['id']}"
    assert api(user, "get", base).json()["schedules"][0]["id"] == body["id"]
    paused = api(user, "patch", one, {"active": False})
    assert (
        paused.status_code == 200 and paused.json()["active"] is False and paused.json()["next_firings"] == []
    )
    changed = api(user, "patch", one, {"interval_minutes": 30, "overlap": "buffer_one", "active": True})
    assert changed.status_code == 200, changed.content
    assert changed.json()["cron"] is None and changed.json()["interval_minutes"] == 30
    back = api(user, "patch", one, {"cron": "*/5 * * * *", "interval_minutes": None})
    assert (back.json()["cron"], back.json()["interval_minutes"]) == ("*/5 * * * *", None)
    again = api(user, "patch", one, {"cron": None, "interval_minutes": 30})
    assert again.status_code == 200 and (again.json()["cron"], again.json()["interval_minutes"]) == (None, 30)
    fired = api(user, "post", f"{one}/run")
    assert (
        fired.status_code == 201 and fired.json()["outcome"] == "started" and fired.json()["manual"] is True
    )
    run = Run.objects.get(pk=fired.json()["run"])
    assert run.origin == "schedule" and run.origin_ref == {
        "schedule": body["id"],
        "firing": fired.json()["id"],
    }
    firings = api(user, "get", f"{one}/firings").json()["firings"]
    assert [f["id"] for f in firings] == [fired.json()["id"]]
    assert api(user, "delete", one).json() == {"deleted": body["id"]}
    assert not Schedule.objects.exists() and Run.objects.filter(pk=run.pk).exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="schedule.")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == [
        "schedule.create",
        "schedule.pause",
        "schedule.change",
        "schedule.change",
        "schedule.change",
        "schedule.run_now",
        "schedule.delete",
    ]
    assert set(AuditEntry.objects.filter(action__startswith="schedule.").values_list("via", flat=True)) == {
        "api"
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "every day"}, "cron"),
        ({"cron": "0 3 * * * *"}, "cron"),
        ({"cron": "0 25 * * *"}, "cron"),
        ({"timezone": "Nowhere/Atlantis"}, "timezone"),
        ({"timezone": "../../../etc/passwd"}, "timezone"),
        ({"cron": None, "interval_minutes": 0}, "interval_minutes"),
        ({"cron": None, "interval_minutes": "ten"}, "interval_minutes"),
        ({"cron": None, "interval_minutes": 10**9}, "interval_minutes"),
        ({"cron": None}, "cron"),
        ({"interval_minutes": 5}, "cron"),
        ({"overlap": "queue_all"}, "overlap"),
        ({"starts_at": "2026-01-01T00:00:00"}, "starts_at"),
        ({"starts_at": "tomorrow"}, "starts_at"),
        ({"objective_template": "{__class__}"}, "objective_template"),
        ({"catch_up_minutes": -1}, "catch_up_minutes"),
    ],
)
def test_bad_timing_is_a_400_naming_the_field(api, user, instance, change, field):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    answer = api(user, "post", f"/v1/instances/{instance.pk}/schedules", body)
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"].startswith("application/json")
    assert answer.json()["field"] == field and answer.json()["error"]
    preview = api(user, "post", f"/v1/instances/{instance.pk}/schedules/preview", body)
    assert preview.status_code in (200, 400) and preview["Content-Type"].startswith("application/json")
    assert not Schedule.objects.exists()


def test_another_users_schedules_are_404(api, user, other_user, instance, make_instance):
    base = f"/v1/instances/{instance.pk}/schedules"
    made = api(user, "post", base, BODY).json()
    one = f"{base}/{made['id']}"
    theirs = make_instance(other_user, name="theirs")
    for method, path, body in [
        ("get", base, None),
        ("post", base, BODY),
        ("post", f"{base}/preview", {"interval_minutes": 5}),
        ("get", one, None),
        ("patch", one, {"active": False}),
        ("patch", one, {"cron": "bad"}),
        ("delete", one, None),
        ("post", f"{one}/run", None),
        ("get", f"{one}/firings", None),
        ("get", f"/v1/instances/{theirs.pk}/schedules/{made['id']}", None),
    ]:
        answer = api(other_user, method, path, body)
        assert answer.status_code == 404, (method, path, answer.content)
        assert answer["Content-Type"].startswith("application/json")
    schedule = Schedule.objects.get()
    assert schedule.active and not Run.objects.exists() and Schedule.objects.count() == 1
    # Bob cannot schedule on his instance a schedule of Ada's either, nor see it from there.
    assert api(other_user, "get", f"/v1/instances/{theirs.pk}/schedules").json() == {"schedules": []}


def test_a_scheduled_run_reads_in_the_run_api_with_its_firing(api, user, instance):
    base = f"/v1/instances/{instance.pk}/schedules"
    made = api(user, "post", base, BODY).json()
    fired = api(user, "post", f"{base}/{made['id']}/run").json()
    listed = api(user, "get", f"/v1/instances/{instance.pk}/loop?origin=schedule")
    assert listed.status_code == 200, listed.content
    assert listed.json()["runs"][0]["origin"] == {
        "kind": "schedule",
        "schedule": made["id"],
        "firing": fired["id"],
        "trigger": None,
        "delivery": None,
        "parent": None,
    }
    one = api(user, "get", f"/v1/instances/{instance.pk}/loop/{fired['run']}")
    assert one.status_code == 200 and one.json()["origin"]["firing"] == fired["id"]
