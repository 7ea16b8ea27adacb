"""Rollback on every surface a person uses — REST, the run page, MCP, the CLI — and on none an agent has.

Each surface goes through `reviews.rollback`: the same refusal (a live run named, a bad point),
the same answer (what changed, what was left, the point that undoes it), the same owner rule
(another user's run is not found) and an audit entry with its interface.
"""

import json
import subprocess
import sys
from io import StringIO

import anyio
import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEntry
from instances import tools as agent_tools
from loops import services
from loops.models import Event, Run
from reviews import snapshots
from tests.support.mcp import call, refused
from web import mcp_act
from web.auth import make_token

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def snapshot_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"


def ended(instance, outcome=Run.Outcome.MAX_ITERATIONS):
    """A run whose start was snapshot, then changed the workspace and finished with `outcome`."""
    run = services.run_start(instance=instance, user=instance.owner, objective="change the workspace")
    snapshots.take(run)
    ws = instance.workspace_path()
    (ws / "app.py").write_text("broken = True\n")
    (ws / "junk.txt").write_text("junk\n")
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FINISHED, outcome=outcome, finished_at=timezone.now(), lease_expires_at=None
    )
    run.refresh_from_db()
    snapshots.finish(run)
    return run


@pytest.fixture
def mine(user, make_instance):
    inst = make_instance(user, name="ada-agent")
    ws = inst.workspace_path()
    ws.mkdir(parents=True)
    (ws / "app.py").write_text("working = True\n")
    return inst


def api(client, method, url, token, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "get":
        return client.get(url, **headers)
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers)


def url_of(run):
    return reverse("api:run-rollback", args=[run.instance_id, run.pk])


def test_rest_lists_previews_rolls_back_and_undoes(client, user, mine):
    run = ended(mine)
    token = make_token(user)
    listed = api(client, "get", url_of(run), token)
    assert listed.status_code == 200, listed.content
    assert [p["to"] for p in listed.json()["points"]] == ["start"]
    assert listed.json()["live_run"] is None

    preview = api(client, "post", url_of(run), token, {"to": "start", "dry_run": True})
    assert preview.status_code == 200 and preview.json()["rolled_back"] is False
    assert preview.json()["modified"]["paths"] == ["app.py"] and preview.json()["deleted"]["paths"] == [
        "junk.txt"
    ]
    assert (mine.workspace_path() / "junk.txt").exists()

    done = api(client, "post", url_of(run), token, {"to": "start"})
    assert done.status_code == 200, done.content
    body = done.json()
    assert body["rolled_back"] and body["exact"] and body["undo"] == "rollback-1"
    assert (mine.workspace_path() / "app.py").read_text() == "working = True\n"
    undone = api(client, "post", url_of(run), token, {"to": body["undo"]})
    assert undone.status_code == 200 and (mine.workspace_path() / "junk.txt").exists()
    assert list(AuditEntry.objects.filter(action="workspace.rollback").values_list("via", flat=True)) == [
        "api",
        "api",
    ]


def test_rest_refuses_a_live_workspace_with_a_409_naming_the_run(client, user, mine):
    run = ended(mine)
    live = services.run_start(instance=mine, user=user, objective="again")
    answer = api(client, "post", url_of(run), make_token(user), {"to": "start"})
    assert answer.status_code == 409
    assert f"run {live.pk}" in answer.json()["error"] and "ada-agent" in answer.json()["error"]
    listed = api(client, "get", url_of(run), make_token(user)).json()
    assert listed["live_run"] == live.pk
    assert (mine.workspace_path() / "junk.txt").exists()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"to": ""},
        {"to": "latest"},
        {"to": 3},
        {"to": "start", "dry_run": "yes"},
        {"to": "start", "force": True},
        {"to": "iteration-0"},
    ],
)
def test_rest_bad_input_is_a_clear_400(client, user, mine, body):
    run = ended(mine)
    answer = api(client, "post", url_of(run), make_token(user), body)
    assert answer.status_code == 400 and answer.json()["error"], answer.content
    assert not AuditEntry.objects.filter(action="workspace.rollback").exists()


def test_another_users_run_is_not_found_on_rest_and_the_console(client, user, other_user, mine):
    run = ended(mine)
    theirs = make_token(other_user)
    for method, body in (("get", None), ("post", {"to": "start"})):
        answer = api(client, method, url_of(run), theirs, body)
        assert answer.status_code == 404, answer.content
    client.force_login(other_user)
    assert client.get(reverse("loops:run-rollback", args=[run.pk]) + "?to=start").status_code == 404
    assert client.post(reverse("loops:run-rollback", args=[run.pk]), {"to": "start"}).status_code == 404
    assert (mine.workspace_path() / "junk.txt").exists()
    assert not AuditEntry.objects.filter(action="workspace.rollback").exists()


def test_an_agent_has_no_way_to_roll_back(client, user, mine):
    run = ended(mine)
    assert not any("rollback" in name for name in agent_tools.TOOLS)
    act_tools = {tool.name for tool in anyio.run(mcp_act.build_server().list_tools)}
    assert act_tools == {"delegate", "get_run"}
    from instances import gateway

    act_token = f"{gateway.TOKEN_PREFIX}not-a-person"  # an act's token is never an API token
    answer = api(client, "post", url_of(run), act_token, {"to": "start"})
    assert answer.status_code == 401
    assert (mine.workspace_path() / "junk.txt").exists()


def test_the_run_page_offers_the_last_verified_state_after_a_bound_and_rolls_back_on_confirmation(
    client, user, mine
):
    good = ended(mine, Run.Outcome.DONE)
    Run.objects.filter(pk=good.pk).update(verified=True)
    (mine.workspace_path() / "app.py").write_text("verified = True\n")
    (mine.workspace_path() / "junk.txt").unlink()
    snapshots.finish(good)  # its end: what was verified
    bad = ended(mine)
    (mine.workspace_path() / "node_modules").mkdir()
    (mine.workspace_path() / "node_modules" / "dep.js").write_text("kept\n")
    client.force_login(user)

    page = client.get(reverse("loops:run-detail", args=[bad.pk])).content.decode()
    assert "data-rollback-offer" in page and "Roll back to the last verified state" in page
    confirm = client.get(reverse("loops:run-rollback", args=[bad.pk]) + "?to=verified")
    text = confirm.content.decode()
    assert confirm.status_code == 200 and "data-rollback-kept" in text and "node_modules/" in text
    assert (mine.workspace_path() / "app.py").read_text() == "broken = True\n"  # nothing changed yet

    done = client.post(reverse("loops:run-rollback", args=[bad.pk]), {"to": "verified"}, follow=True)
    shown = done.content.decode()
    assert (
        done.status_code == 200
        and "To undo it, roll back to rollback-1" in shown
        and "node_modules/" in shown
    )
    assert (mine.workspace_path() / "app.py").read_text() == "verified = True\n"
    assert (mine.workspace_path() / "node_modules" / "dep.js").read_text() == "kept\n"
    assert AuditEntry.objects.get(action="workspace.rollback").via == "console"
    assert "Workspace rolled back to the last verified state" in shown  # the event in the timeline


def test_the_run_page_says_which_live_run_stops_a_rollback(client, user, mine):
    run = ended(mine, Run.Outcome.CANCELLED)
    live = services.run_start(instance=mine, user=user, objective="again")
    client.force_login(user)
    page = client.get(reverse("loops:run-detail", args=[run.pk])).content.decode()
    assert "data-rollback-live" in page and f'Run <a href="/runs/{live.pk}/">{live.pk}</a>' in page
    refused_page = client.post(reverse("loops:run-rollback", args=[run.pk]), {"to": "start"})
    assert refused_page.status_code == 409 and f"run {live.pk}" in refused_page.content.decode()
    bad = client.get(reverse("loops:run-rollback", args=[run.pk]) + "?to=nowhere")
    assert bad.status_code == 400 and "iteration-N" in bad.content.decode()
    assert (mine.workspace_path() / "junk.txt").exists()


def test_a_bound_without_a_verified_state_offers_none(client, user, mine):
    run = ended(mine)
    client.force_login(user)
    page = client.get(reverse("loops:run-detail", args=[run.pk])).content.decode()
    assert "data-rollback-offer" not in page and "data-rollback-choose" in page


def test_the_cli_lists_previews_and_rolls_back_as_the_runs_owner(user, mine):
    run = ended(mine)
    out = StringIO()
    call_command("loop", "rollback", str(run.pk), stdout=out)
    assert "start" in out.getvalue() and "before this run" in out.getvalue()
    out = StringIO()
    call_command("loop", "rollback", str(run.pk), "--to", "start", "--dry-run", stdout=out)
    assert "nothing was changed" in out.getvalue() and (mine.workspace_path() / "junk.txt").exists()
    out = StringIO()
    call_command("loop", "rollback", str(run.pk), "--to", "start", stdout=out)
    assert f"loop rollback {run.pk} --to rollback-1" in out.getvalue()
    assert not (mine.workspace_path() / "junk.txt").exists()
    entry = AuditEntry.objects.get(action="workspace.rollback")
    assert (entry.via, entry.username) == ("cli", "ada")
    with pytest.raises(CommandError, match="iteration-N"):
        call_command("loop", "rollback", str(run.pk), "--to", "yesterday")


@pytest.mark.slow
def test_mcp_rolls_back_for_the_owner_and_not_for_another_user(
    user, other_user, mine, make_instance, settings, tmp_path
):
    from django.conf import settings as conf
    from mcp import Client, StdioServerParameters

    from tests.support.cluster import worker_env

    home = tmp_path / "home"  # the server process's TETHER_HOME: its snapshots are this test's
    settings.TETHER_SNAPSHOTS = home / "snapshots"

    def stdio_client(username):
        env = worker_env(TETHER_HOME=str(home))
        args = [str(conf.BASE_DIR / "manage.py"), "mcp", "--user", username]
        return Client(
            StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(conf.BASE_DIR))
        )

    run = ended(mine)
    theirs_inst = make_instance(other_user, name="bob-agent")
    theirs_inst.workspace_path().mkdir(parents=True)
    theirs = ended(theirs_inst)

    async def session():
        async with stdio_client("ada") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            points = await call(client, "rollback_points", run_id=run.pk)
            preview = await call(client, "rollback", run_id=run.pk, to="start", dry_run=True)
            hidden = await refused(client, "rollback", run_id=theirs.pk, to="start")
            bad = await refused(client, "rollback", run_id=run.pk, to="latest")
            loose = await refused(client, "rollback", run_id=run.pk, to="start", dry_run="yes")
            done = await call(client, "rollback", run_id=run.pk, to="start")
            return names, points, preview, hidden, bad, loose, done

    names, points, preview, hidden, bad, loose, done = anyio.run(session)
    assert {"rollback", "rollback_points"} <= names
    assert "start" in [p["to"] for p in points["points"]]
    assert preview["rolled_back"] is False and preview["deleted"]["paths"] == ["junk.txt"]
    assert f"run {theirs.pk} not found" in hidden and (theirs_inst.workspace_path() / "junk.txt").exists()
    assert "iteration-N" in bad
    assert "must be true or false" in loose  # REST's words for REST's refusal
    assert done["rolled_back"] and done["undo"] == "rollback-1"
    assert not (mine.workspace_path() / "junk.txt").exists()
    entry = AuditEntry.objects.get(action="workspace.rollback")
    assert (entry.via, entry.username, entry.run_ref) == ("mcp", "ada", run.pk)
    assert Event.objects.filter(run=run, kind="workspace.rolled_back").count() == 1


def test_the_management_command_help_names_rollback():
    done = subprocess.run(
        [sys.executable, "manage.py", "loop", "rollback", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "--to" in done.stdout and "--dry-run" in done.stdout


def test_a_workspace_too_large_to_snapshot_now_is_not_rolled_back_and_says_why(client, user, mine, settings):
    run = ended(mine)
    for n in range(5):
        (mine.workspace_path() / f"big{n}.bin").write_bytes(b"x" * 1024)
    settings.TETHER_SNAPSHOT_MAX_FILES = 4  # the workspace as it is now is over the limit
    answer = api(client, "post", url_of(run), make_token(user), {"to": "start"})
    assert answer.status_code == 409
    assert "could not be snapshot" in answer.json()["error"] and "more than 4 files" in answer.json()["error"]
    assert (mine.workspace_path() / "junk.txt").exists() and (mine.workspace_path() / "big0.bin").exists()
    assert not AuditEntry.objects.filter(action="workspace.rollback").exists()
