"""The audit trail: who did what, when, from which device and interface; visible per run; CSV export."""

import csv
import io

import pytest
from django.test import RequestFactory

from audit import trail
from audit.models import AuditEntry

pytestmark = pytest.mark.django_db


def browser_request(agent="Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) Mobile/15E148"):
    return RequestFactory().post("/runs/1/stop", HTTP_USER_AGENT=agent, REMOTE_ADDR="192.0.2.7")


def test_an_action_from_the_console_keeps_the_device(user, make_instance, start):
    run = start(make_instance(user))
    entry = trail.record(user=user, action="run.stop", run=run, detail={"why": "wrong objective"}, request=browser_request(), via="console")
    assert (entry.username, entry.action, entry.via, entry.run_id, entry.run_ref) == ("ada", "run.stop", "console", run.pk, run.pk)
    assert "iPhone" in entry.user_agent and entry.ip_address == "192.0.2.7"
    assert entry.detail == {"why": "wrong objective"}
    assert entry.created_at is not None


def test_an_action_from_the_cli_names_the_machine(user, make_instance, start):
    run = start(make_instance(user))
    entry = trail.record(user=user, action="run.interject", run=run, detail={}, via="cli")
    assert entry.user_agent.startswith("manage.py on ")


def test_an_unknown_interface_is_refused(user):
    with pytest.raises(ValueError, match="unknown interface"):
        trail.record(user=user, action="run.start", detail={}, via="fax")


def test_a_run_shows_its_own_actions_in_order_and_keeps_them_after_deletion(user, make_instance, start):
    run, other = start(make_instance(user)), start(make_instance(user, name="other"))  # run_start audits itself
    assert [e.action for e in trail.audit_for_run(other)] == ["run.start"]
    trail.record(user=user, action="run.interject", run=run, detail={"text": "use tabs"}, via="console")
    assert [e.action for e in trail.audit_for_run(run)] == ["run.start", "run.interject"]
    run_id = run.pk
    run.delete()
    entries = AuditEntry.objects.filter(run_ref=run_id)
    assert entries.count() == 2 and all(e.run_id is None for e in entries)


def test_a_pool_shows_its_budget_changes(user):
    from budgets.services import user_pool

    pool = user_pool(user)
    trail.record(user=user, action="pool.limit", pool=pool, detail={"from": None, "to": "5.00"}, via="admin")
    assert [e.action for e in trail.audit_for_pool(pool)] == ["pool.limit"]


def test_the_csv_export_lists_what_the_user_may_read(user, other_user, make_instance, start, client):
    mine = start(make_instance(user))
    theirs = start(make_instance(other_user, name="theirs"))
    # run_start audits each start itself (via api); add a console action with a hostile detail.
    trail.record(user=user, action="run.interject", run=mine, detail={"text": "=HYPERLINK(\"http://evil\")"}, request=browser_request(), via="console")
    trail.record(user=other_user, action="run.interject", run=theirs, detail={}, via="api")
    client.force_login(user)
    response = client.get("/reviews/audit.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == list(trail.CSV_COLUMNS)
    assert [r[2] for r in rows[1:]] == ["run.start", "run.interject"]  # nothing of the other user's
    time, who, action, run, pool, via, device, address, detail = rows[2]
    assert (who, action, run, via, address) == ("ada", "run.interject", str(mine.pk), "console", "192.0.2.7")
    assert "iPhone" in device
    assert "HYPERLINK" in detail and not detail.startswith("=")

    # filtered to one run
    trail.record(user=user, action="run.stop", run=start(make_instance(user, name="third")), detail={}, via="cli")
    rows = list(csv.reader(io.StringIO(client.get(f"/reviews/audit.csv?run={mine.pk}").content.decode())))
    assert [r[2] for r in rows[1:]] == ["run.start", "run.interject"]
    assert client.get("/reviews/audit.csv?run=abc").status_code == 400


def test_a_formula_in_a_username_stays_text(django_user_model, client):
    sneaky = django_user_model.objects.create_user("=cmd|calc", password="pw-x-123")
    trail.record(user=sneaky, action="run.start", detail={}, via="api")
    client.force_login(sneaky)
    rows = list(csv.reader(io.StringIO(client.get("/reviews/audit.csv").content.decode())))
    assert rows[1][1] == "'=cmd|calc"


def test_staff_export_everything_and_signed_out_people_nothing(user, other_user, client, django_user_model):
    trail.record(user=user, action="run.start", detail={}, via="api")
    trail.record(user=other_user, action="run.start", detail={}, via="api")
    assert client.get("/reviews/audit.csv").status_code == 302
    boss = django_user_model.objects.create_user("boss", password="pw-boss-123", is_staff=True)
    client.force_login(boss)
    rows = list(csv.reader(io.StringIO(client.get("/reviews/audit.csv").content.decode())))
    assert {r[1] for r in rows[1:]} == {"ada", "bob"}
