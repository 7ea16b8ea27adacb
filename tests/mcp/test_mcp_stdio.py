"""`python manage.py mcp --user USERNAME`: the MCP tools over stdio, started by the client SDK as a subprocess."""

import subprocess
import sys

import anyio
import pytest
from django.conf import settings

from audit.models import AuditEntry
from instances.services import instance_archive
from loops import services
from loops.models import Run
from tests.support.cluster import worker_env
from tests.support.mcp import TOOLS, call, refused, stdio_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_local_client_lists_tools_reads_runs_and_acts_as_the_named_user(user, other_user, make_instance, script):
    mine = make_instance(user, name="ada-agent", command=script("print('hi')"))
    theirs = make_instance(other_user, name="bob-agent", command=script("print('hi')"))
    shelved = make_instance(user, name="shelved", command=script("print('hi')"))
    instance_archive(instance=shelved, user=user)
    my_run = services.run_start(instance=mine, user=user, objective="Ada's objective")
    their_run = services.run_start(instance=theirs, user=other_user, objective="Bob's objective")

    async def session():
        async with stdio_client("ada") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            got = await call(client, "get_run", run_id=my_run.pk)
            events = await call(client, "run_events", run_id=my_run.pk, after=0)
            hidden = await refused(client, "get_run", run_id=their_run.pk)
            bad = await refused(client, "run_events", run_id=my_run.pk, after="soon")
            started = await call(client, "start_run", instance=mine.pk, objective="Another one", max_iterations=2)
            stopped = await call(client, "cancel", run_id=started["id"])
            again = await call(client, "continue_run", run_id=started["id"], message="Try the other way")
            twice = await refused(client, "continue_run", run_id=started["id"])
            archived = await refused(client, "start_run", instance="shelved", objective="x")
            return names, got, events, hidden, bad, started, stopped, again, twice, archived

    names, got, events, hidden, bad, started, stopped, again, twice, archived = anyio.run(session)
    assert "is archived" in archived
    assert TOOLS <= names
    assert got["id"] == my_run.pk and got["objective"] == "Ada's objective" and got["status"] == "queued"
    assert [e["kind"] for e in events["events"]] == ["run.started"] and events["last_seq"] == 1
    assert f"run {their_run.pk} not found" in hidden and "Bob" not in hidden
    assert bad.startswith("bad arguments for run_events: after:")
    assert started["max_iterations"] == 2 and stopped["outcome"] == "cancelled"
    new = Run.objects.get(pk=started["id"])
    assert new.owner == user and new.instance == mine
    assert again["continued_from"] == new.pk and again["status"] == "queued" and "already continued" in twice
    audited = AuditEntry.objects.filter(run_ref__in=[new.pk, again["id"]]).order_by("id")
    assert [(a.action, a.via, a.username) for a in audited] == [
        ("run.start", "mcp", "ada"), ("run.stop", "mcp", "ada"), ("run.continue", "mcp", "ada")
    ]
    assert all("manage.py mcp (stdio)" in a.user_agent for a in audited)


def test_an_unknown_or_inactive_user_is_refused_before_serving(user):
    user.is_active = False
    user.save()
    for name, why in (("nobody", "no user 'nobody'"), ("ada", "user 'ada' is not active")):
        done = subprocess.run(
            [sys.executable, "manage.py", "mcp", "--user", name],
            cwd=settings.BASE_DIR, env=worker_env(), input="", capture_output=True, text=True, timeout=60,
        )
        assert done.returncode != 0 and why in done.stderr and done.stdout == ""
