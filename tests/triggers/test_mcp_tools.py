"""MCP tools for triggers and schedules: the owner lists, creates, pauses, fires and deletes; others find nothing."""

import json

import anyio
import pytest
from mcp import Client

from audit.models import AuditEntry
from loops.models import Run
from tests.triggers.conftest import TEMPLATE
from triggers.models import Schedule, Trigger
from web.mcp_server import build_server, stdio_caller

pytestmark = pytest.mark.django_db(transaction=True)


def mcp(user, tool, **arguments):
    """Call `tool` as `user`; return (is_error, the structured answer or the error text)."""

    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            result = await client.call_tool(tool, arguments)
            if result.is_error:
                return True, result.content[0].text
            return False, result.structured_content or json.loads(result.content[0].text)

    return anyio.run(go)


def ok(user, tool, **arguments):
    failed, answer = mcp(user, tool, **arguments)
    assert not failed, answer
    return answer


def test_triggers_the_secret_shown_once_then_never(user, instance, deliver):
    made = ok(user, "create_trigger", instance=instance.name, name="issues", objective_template=TEMPLATE)
    secret = made["secret"]
    assert made["url"].endswith(f"/v1/hooks/{made['id']}")
    listed = ok(user, "list_triggers", instance=instance.pk)
    assert [t["id"] for t in listed["triggers"]] == [made["id"]] and secret not in json.dumps(listed)
    paused = ok(user, "pause_trigger", trigger_id=made["id"])
    assert paused["active"] is False and secret not in json.dumps(paused)
    assert ok(user, "pause_trigger", trigger_id=made["id"], paused=False)["active"] is True
    assert deliver(Trigger.objects.get(), secret=secret).status_code == 201
    assert ok(user, "delete_trigger", trigger_id=made["id"]) == {"deleted": made["id"]}
    assert not Trigger.objects.exists()
    entries = AuditEntry.objects.filter(action__startswith="trigger.")
    assert set(entries.values_list("via", flat=True)) == {"mcp"}
    assert all(secret not in json.dumps(e.detail) for e in entries)


def test_schedules_create_pause_run_now_firings_delete(user, instance):
    made = ok(
        user,
        "create_schedule",
        instance=instance.pk,
        name="nightly",
        objective_template="Night of {date}",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        overlap="buffer_one",
    )
    assert made["overlap"] == "buffer_one" and len(made["next_firings"]) == 5
    assert ok(user, "list_schedules", instance=instance.name)["schedules"][0]["id"] == made["id"]
    assert ok(user, "pause_schedule", schedule_id=made["id"])["next_firings"] == []
    fired = ok(user, "run_schedule", schedule_id=made["id"])
    assert fired["outcome"] == "started" and Run.objects.get().origin_ref["firing"] == fired["id"]
    assert [f["id"] for f in ok(user, "schedule_firings", schedule_id=made["id"])["firings"]] == [fired["id"]]
    assert ok(user, "delete_schedule", schedule_id=made["id"]) == {"deleted": made["id"]}
    assert set(AuditEntry.objects.filter(action__startswith="schedule.").values_list("via", flat=True)) == {
        "mcp"
    }


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"cron": "61 * * * *"}, "not a valid cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "not a time zone"),
        ({"interval_minutes": 0}, "interval_minutes"),
        ({}, "not neither"),
        ({"cron": "* * * * *", "overlap": "queue_all"}, "overlap"),
    ],
)
def test_bad_schedules_are_refused_in_a_sentence(user, instance, arguments, says):
    failed, text = mcp(
        user, "create_schedule", instance=instance.pk, name="s", objective_template="x", **arguments
    )
    assert failed and says in text
    assert not Schedule.objects.exists()


def test_another_users_triggers_and_schedules_are_not_found(user, other_user, instance):
    trigger = ok(user, "create_trigger", instance=instance.pk, name="t", objective_template="#{n}")
    schedule = ok(
        user, "create_schedule", instance=instance.pk, name="s", objective_template="x", cron="* * * * *"
    )
    for tool, arguments in [
        ("list_triggers", {"instance": instance.pk}),
        ("create_trigger", {"instance": instance.pk, "name": "t2", "objective_template": "x"}),
        ("pause_trigger", {"trigger_id": trigger["id"]}),
        ("delete_trigger", {"trigger_id": trigger["id"]}),
        ("list_schedules", {"instance": instance.pk}),
        (
            "create_schedule",
            {"instance": instance.pk, "name": "s2", "objective_template": "x", "cron": "* * * * *"},
        ),
        ("pause_schedule", {"schedule_id": schedule["id"]}),
        ("delete_schedule", {"schedule_id": schedule["id"]}),
        ("run_schedule", {"schedule_id": schedule["id"]}),
        ("schedule_firings", {"schedule_id": schedule["id"]}),
    ]:
        failed, text = mcp(other_user, tool, **arguments)
        assert failed and "not found" in text, (tool, text)
    assert Trigger.objects.get().active and Schedule.objects.get().active
    assert Trigger.objects.count() == 1 and Schedule.objects.count() == 1 and not Run.objects.exists()
