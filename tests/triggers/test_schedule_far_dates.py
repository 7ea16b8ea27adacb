"""Far-future schedule dates: a clear 400 naming the field, never a 500, and a stored one breaks no list.

`Timing.checked` (REST, console form and MCP go through it) refuses a start or end date more than
`SCHEDULE_HORIZON_DAYS` ahead; `Timing.times_after` stops at the last date a calendar can hold, so a
row stored before the check still lists.
"""

import json
from datetime import UTC, datetime, timedelta

import pytest

from triggers import scheduling
from triggers.models import Schedule
from web.auth import make_token

pytestmark = pytest.mark.django_db

FAR = [
    pytest.param({"interval_minutes": 1440, "starts_at": "9999-12-31T23:00:00Z"}, "starts_at", id="interval"),
    pytest.param({"cron": "0 0 * * *", "starts_at": "9999-12-31T23:00:00Z"}, "starts_at", id="cron"),
    pytest.param(
        {"interval_minutes": 1440, "starts_at": "9999-12-31T23:58:00Z"}, "starts_at", id="last-minutes"
    ),
    pytest.param({"cron": "0 0 * * *", "ends_at": "9999-12-31T23:58:00Z"}, "ends_at", id="ends-at"),
]


@pytest.fixture
def api(client):
    client.raise_request_exception = False

    def call(user, method, path, body=None):
        headers = {"Authorization": f"Bearer {make_token(user)}"}
        data = json.dumps(body) if body is not None else None
        return getattr(client, method)(path, data=data, content_type="application/json", headers=headers)

    return call


@pytest.mark.parametrize("route", ["preview", "create"])
@pytest.mark.parametrize(("timing", "field"), FAR)
def test_a_far_future_date_is_a_400_naming_the_field(api, user, instance, route, timing, field):
    base = f"/v1/instances/{instance.pk}/schedules"
    body = timing if route == "preview" else {"name": "far", "objective_template": "check", **timing}
    answer = api(user, "post", f"{base}/preview" if route == "preview" else base, body)
    assert answer.status_code < 500, answer.content
    assert answer.status_code == 400, answer.content
    assert field in answer.content.decode(), answer.content
    assert not Schedule.objects.exists()
    assert api(user, "get", base).status_code == 200


def test_a_date_within_the_horizon_is_accepted(api, user, instance):
    soon = (datetime.now(UTC) + timedelta(days=365 * 9)).strftime("%Y-%m-%dT%H:%M:%SZ")
    answer = api(
        user,
        "post",
        f"/v1/instances/{instance.pk}/schedules/preview",
        {"interval_minutes": 60, "starts_at": soon},
    )
    assert answer.status_code == 200, answer.content
    assert len(answer.json()["next_firings"]) == 5


def test_a_stored_far_future_schedule_still_lists(api, user, instance):
    schedule = scheduling.schedule_create(
        user=user, instance=instance, name="old row", objective_template="check", interval_minutes=1440
    )
    edge = datetime(9999, 12, 31, 23, 58, tzinfo=UTC)  # stored before the horizon check existed
    Schedule.objects.filter(pk=schedule.pk).update(starts_at=edge, next_fire_at=edge)
    listed = api(user, "get", f"/v1/instances/{instance.pk}/schedules")
    assert listed.status_code == 200, listed.content
    assert [row["id"] for row in listed.json()["schedules"]] == [schedule.pk]
    assert listed.json()["schedules"][0]["next_firings"] == [edge.isoformat()]
    one = api(user, "get", f"/v1/instances/{instance.pk}/schedules/{schedule.pk}")
    assert one.status_code == 200, one.content
    assert scheduling.tick() == 0  # not due, and nothing raises


CONSOLE_FORM = {
    "name": "far",
    "objective_template": "check",
    "cron": "0 0 * * *",
    "interval_minutes": "",
    "timezone": "UTC",
    "overlap": "skip",
    "catch_up_minutes": "5",
    "starts_at": "9999-12-31T23:00",
}


@pytest.mark.parametrize("action", ["preview", "save"])
def test_the_console_form_refuses_a_far_future_date(client, user, instance, action):
    client.raise_request_exception = False
    client.force_login(user)
    answer = client.post(f"/instances/{instance.pk}/schedules/", {**CONSOLE_FORM, "action": action})
    assert answer.status_code == 400, answer.status_code
    assert "starts_at must be at most 10 years from now" in answer.content.decode()
    assert not Schedule.objects.exists()


def test_the_console_lists_a_stored_far_future_schedule(client, user, instance):
    schedule = scheduling.schedule_create(
        user=user, instance=instance, name="old row", objective_template="check", interval_minutes=1440
    )
    edge = datetime(9999, 12, 31, 23, 58, tzinfo=UTC)
    Schedule.objects.filter(pk=schedule.pk).update(starts_at=edge, next_fire_at=edge)
    client.raise_request_exception = False
    client.force_login(user)
    page = client.get(f"/instances/{instance.pk}/schedules/")
    assert page.status_code == 200 and "old row" in page.content.decode()
