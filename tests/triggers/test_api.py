"""The trigger API: the owner creates, lists, changes, rotates and deletes; nobody else sees a thing."""

import json

import pytest

from audit.models import AuditEntry
from tests.triggers.conftest import TEMPLATE
from triggers.models import Trigger
from web.auth import make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client):
    def call(user, method, path, body=None):
        headers = {"Authorization": f"Bearer {make_token(user)}"}
        data = json.dumps(body) if body is not None else None
        return getattr(client, method)(path, data=data, content_type="application/json", headers=headers)

    return call


def test_create_shows_the_secret_once_then_never(api, user, instance, deliver):
    made = api(
        user,
        "post",
        f"/v1/instances/{instance.pk}/triggers",
        {"name": "issues", "objective_template": TEMPLATE},
    )
    assert made.status_code == 201, made.content
    body = made.json()
    secret = body["secret"]
    assert made["Cache-Control"] == "no-store"
    assert body["url"].endswith(f"/v1/hooks/{body['id']}") and body["url"].startswith("http")
    listed = api(user, "get", f"/v1/instances/{instance.pk}/triggers")
    one = api(user, "get", f"/v1/instances/{instance.pk}/triggers/{body['id']}")
    deliveries = api(user, "get", f"/v1/instances/{instance.pk}/triggers/{body['id']}/deliveries")
    for answer in (listed, one, deliveries):
        assert answer.status_code == 200 and secret not in answer.content.decode()
    trigger = Trigger.objects.get()
    assert deliver(trigger, secret=secret).status_code == 201
    got = api(user, "get", f"/v1/instances/{instance.pk}/triggers/{body['id']}/deliveries").json()[
        "deliveries"
    ]
    assert [d["outcome"] for d in got] == ["started"] and got[0]["run"] is not None
    assert "X-Hub-Signature-256" not in got[0]["headers"] and secret not in json.dumps(got)


def test_rotate_change_and_delete_are_audited(api, user, instance):
    base = f"/v1/instances/{instance.pk}/triggers"
    made = api(user, "post", base, {"name": "t", "objective_template": "#{n}"}).json()
    rotated = api(user, "post", f"{base}/{made['id']}/rotate")
    assert rotated.status_code == 200 and rotated.json()["secret"] != made["secret"]
    assert rotated["Cache-Control"] == "no-store"
    paused = api(user, "patch", f"{base}/{made['id']}", {"active": False})
    assert paused.status_code == 200 and paused.json()["active"] is False
    changed = api(
        user, "patch", f"{base}/{made['id']}", {"objective_template": "Fix {x.y}", "max_per_minute": 5}
    )
    assert changed.json()["objective_template"] == "Fix {x.y}" and changed.json()["max_per_minute"] == 5
    assert api(user, "delete", f"{base}/{made['id']}").json() == {"deleted": made["id"]}
    assert not Trigger.objects.exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="trigger.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "trigger.create",
        "trigger.rotate",
        "trigger.pause",
        "trigger.change",
        "trigger.delete",
    ]
    assert all(
        e.username == "ada" and e.via == "api"
        for e in AuditEntry.objects.filter(action__startswith="trigger.")
    )
    assert made["secret"] not in json.dumps(list(AuditEntry.objects.values("detail")))


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name": "t", "objective_template": "{__class__}"}, "objective_template", "'__'"),
        ({"name": "t", "objective_template": "{x!r}"}, "objective_template", "conversions"),
        ({"name": "t", "objective_template": "{x:>99999}"}, "objective_template", "format specifications"),
        ({"name": "t", "objective_template": "   "}, "objective_template", "missing required"),
        ({"name": "t"}, "objective_template", "missing required"),
        ({"name": "t", "objective_template": "x", "max_per_minute": 0}, "max_per_minute", "from 1 to 600"),
        ({"name": "t", "objective_template": "x", "max_cost_usd": "0"}, "max_cost_usd", "US dollars"),
        ({"name": "t", "objective_template": "x", "events": "issues"}, "events", "a list"),
        ({"name": "t", "objective_template": "x", "instance": 2}, None, "unknown field"),
        ({"name": "t", "objective_template": "x", "secret": "mine"}, None, "unknown field"),
    ],
)
def test_bad_input_is_a_clear_400(api, user, instance, body, field, says):
    answer = api(user, "post", f"/v1/instances/{instance.pk}/triggers", body)
    assert answer.status_code == 400, answer.content
    assert says in answer.json()["error"]
    assert answer.json().get("field") == field
    assert not Trigger.objects.exists()


def test_another_user_can_neither_see_nor_change_nor_fire_a_trigger(
    api, user, other_user, instance, made, deliver
):
    trigger, secret = made
    base = f"/v1/instances/{instance.pk}/triggers"
    for method, path, body in [
        ("get", base, None),
        ("post", base, {"name": "mine now", "objective_template": "x"}),
        ("get", f"{base}/{trigger.pk}", None),
        ("patch", f"{base}/{trigger.pk}", {"active": False}),
        ("patch", f"{base}/{trigger.pk}", {"max_per_minute": "many"}),
        ("post", f"{base}/{trigger.pk}/rotate", None),
        ("get", f"{base}/{trigger.pk}/deliveries", None),
        ("delete", f"{base}/{trigger.pk}", None),
    ]:
        answer = api(other_user, method, path, body)
        assert answer.status_code == 404, (method, path, answer.content)
        assert secret not in answer.content.decode()
    # Bob's own instance does not reach Ada's trigger either.
    from instances.models import Instance

    bobs = Instance.objects.create(
        owner=other_user, name="bobs", command=["true"], workspace=instance.workspace + "-b"
    )
    assert api(other_user, "get", f"/v1/instances/{bobs.pk}/triggers/{trigger.pk}").status_code == 404
    trigger.refresh_from_db()
    assert trigger.active and trigger.reveal() == secret
    assert not AuditEntry.objects.filter(username="bob").exists()
    # Firing it takes its secret: Bob signing with anything else starts nothing.
    assert deliver(trigger, secret="bobs-guess").status_code == 401


def test_an_archived_instance_gets_no_new_trigger_and_its_triggers_start_nothing(
    api, user, instance, made, deliver
):
    from instances import services as instance_services

    trigger, secret = made
    instance_services.instance_archive(instance=instance, user=user)
    refused = api(
        user, "post", f"/v1/instances/{instance.pk}/triggers", {"name": "t", "objective_template": "x"}
    )
    assert refused.status_code == 409
    answer = deliver(trigger, secret=secret)
    assert answer.status_code == 409 and "archived" in answer.json()["error"]
