"""Workspaces never nest: no instance's workspace lies inside another's or holds one.

An agent may rename or swap anything in its own workspace; were another instance's workspace
inside it, that agent could swap the directory the other instance works in (and that Tether,
running as root, mounts and chowns). So a nesting workspace is refused when an instance is
saved — through the API, the console and admin alike, whoever owns the other instance — and
again at run time, for a nesting that came about another way (here: a direct database edit).
Only instances of one owner share the very same workspace (delegation's `shared` mode).
"""

import json

import pytest
from django.contrib.auth.models import Permission

from instances.models import AgentTemplate, Instance
from tests.loops.conftest import drive_in_thread
from web.auth import make_token

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def areas(settings, tmp_path):
    """Workspaces of this test only: the users' areas and one operator-allowed root."""
    settings.TETHER_WORKSPACES = tmp_path / "workspaces"
    settings.TETHER_WORKSPACE_ROOTS = [tmp_path / "srv"]
    return tmp_path / "srv"


def grant(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs", content_type__app_label="instances"))
    return type(user).objects.get(pk=user.pk)  # a fresh object: permissions are cached per object


@pytest.fixture
def api(client):
    def call(user, body, method="post", path="/v1/instances"):
        return getattr(client, method)(
            path, data=json.dumps(body), content_type="application/json",
            headers={"Authorization": f"Bearer {make_token(user)}"},
        )

    return call


def by_hand(name, workspace, **fields):
    return {"name": name, "brain": "command", "command": ["true"], "workspace": str(workspace), **fields}


# --- at save: the API ------------------------------------------------------------------------


def test_a_workspace_inside_your_other_instances_default_one_is_refused(api, user, price):
    first = Instance.objects.create(owner=user, name="first", command=["true"])  # its default workspace
    inside = first.workspace_path() / "sub"
    answer = api(user, {"name": "second", "template": "coder", "model": "claude-test-1", "workspace": str(inside)})
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert str(first.workspace_path()) in error and "'first'" in error and "never nest" in error
    assert list(Instance.objects.values_list("name", flat=True)) == ["first"]


def test_a_workspace_holding_another_is_refused(api, user, areas):
    user = grant(user)
    assert api(user, by_hand("inner", areas / "project" / "inner")).status_code == 201
    answer = api(user, by_hand("outer", areas / "project"))
    assert answer.status_code == 400, answer.content
    assert "holds" in answer.json()["error"] and str(areas / "project" / "inner") in answer.json()["error"]
    assert not Instance.objects.filter(name="outer").exists()


def test_a_new_default_workspace_holding_an_existing_one_is_refused(api, user, settings, price):
    """A workspace named where the next instance's default one will be: that next instance is refused."""
    early = Instance.objects.create(owner=user, name="early", command=["true"])
    ahead = settings.TETHER_WORKSPACES / str(user.pk) / str(early.pk + 1)
    Instance.objects.filter(pk=early.pk).update(workspace=str(ahead / "sub"))
    answer = api(user, {"name": "next", "template": "coder", "model": "claude-test-1"})  # gets early.pk + 1
    assert answer.status_code == 400, answer.content
    assert "holds" in answer.json()["error"] and "'early'" in answer.json()["error"]
    assert not Instance.objects.filter(name="next").exists()


def test_an_edit_moving_a_workspace_inside_another_is_refused(api, user, areas):
    user = grant(user)
    api(user, by_hand("one", areas / "one"))
    api(user, by_hand("two", areas / "two"))
    two = Instance.objects.get(name="two")
    answer = api(user, {"workspace": str(areas / "one" / "nested")}, method="patch", path=f"/v1/instances/{two.pk}")
    assert answer.status_code == 400, answer.content
    assert "'one'" in answer.json()["error"]
    two.refresh_from_db()
    assert two.workspace == str(areas / "two")
    # Editing anything else of an instance is not held up, nor is keeping its workspace.
    assert api(user, {"name": "two-b", "workspace": str(areas / "two")}, method="patch",
               path=f"/v1/instances/{two.pk}").status_code == 200


def test_another_users_workspace_is_never_nested_nor_shared(api, user, other_user, areas):
    user, other_user = grant(user), grant(other_user)
    assert api(other_user, by_hand("bobs-secret-project", areas / "team" / "bob")).status_code == 201
    for where, said in [(areas / "team" / "bob" / "x", "lies inside"), (areas / "team", "holds"),
                        (areas / "team" / "bob", "only instances of one owner share")]:
        answer = api(user, by_hand("mine", where))
        assert answer.status_code == 400, (where, answer.content)
        error = answer.json()["error"]
        assert said in error and "another instance's workspace" in error and str(areas / "team" / "bob") in error
        assert "bobs-secret-project" not in error
    assert not Instance.objects.filter(owner=user).exists()


def test_a_nesting_through_a_symlink_is_refused_by_its_real_path(api, user, areas):
    user = grant(user)
    (areas / "real").mkdir(parents=True)
    (areas / "alias").symlink_to(areas / "real")
    assert api(user, by_hand("real", areas / "real")).status_code == 201
    answer = api(user, by_hand("via-alias", areas / "alias" / "sub"))
    assert answer.status_code == 400, answer.content


def test_one_owners_instances_share_the_very_same_workspace(api, user, areas):
    user = grant(user)
    assert api(user, by_hand("a", areas / "shared")).status_code == 201
    assert api(user, by_hand("b", areas / "shared")).status_code == 201
    assert api(user, by_hand("c", areas / "shared" / ".")).status_code == 201  # the same path, written otherwise


# --- at save: the console and admin --------------------------------------------------------------


def test_the_console_form_refuses_a_nested_workspace(client, user, price):
    client.force_login(user)
    first = Instance.objects.create(owner=user, name="first", command=["true"])
    template = AgentTemplate.objects.get(name="coder")
    form = {
        "name": "second", "model": "claude-test-1", "credential": "", "max_iterations": 3,
        "objective_max_chars": 8000, "max_tool_turns": template.max_tool_turns,
        "max_output_tokens": template.max_output_tokens, "workspace": str(first.workspace_path() / "sub"),
    }
    answer = client.post("/instances/new/coder/", form)
    assert answer.status_code == 400
    assert "never nest" in answer.content.decode() and "instance &#x27;first&#x27;" in answer.content.decode()
    assert not Instance.objects.filter(name="second").exists()
    # An edit moving an existing instance's workspace inside is refused the same way.
    made = client.post("/instances/new/coder/", {**form, "workspace": ""})
    assert made.status_code == 302, made.content.decode()[:2000]
    second = Instance.objects.get(name="second")
    moved = client.post(f"/instances/{second.pk}/edit", {**form, "workspace": str(first.workspace_path() / "x")})
    assert moved.status_code == 400 and "never nest" in moved.content.decode()
    second.refresh_from_db()
    assert second.workspace == ""


def admin_form(owner, **fields):
    data = {
        "owner": owner.pk, "name": "via-admin", "brain": "command", "decider": "checks", "max_iterations": 3,
        "workspace": "", "model": "", "system_prompt": "", "base_url": "", "tools": "[]", "command_allow": "[]",
        "command_deny": "[]", "approval_tools": "[]", "max_tool_turns": 20, "max_output_tokens": 16000,
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "objective_max_chars": 8000,
        "command": '["true"]', "env": "{}", "checks": "[]", "protected_paths": "[]",
    }
    data.update(fields)
    return data


def test_admin_refuses_a_nested_workspace(client, django_user_model, other_user, areas):
    staff = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="instances", codename__in=["add_instance", "change_instance", "view_instance"]
    ))
    staff = grant(staff)
    client.force_login(staff)
    Instance.objects.create(owner=other_user, name="bobs", command=["true"], workspace=str(areas / "bob"))
    answer = client.post("/admin/instances/instance/add/", admin_form(staff, workspace=str(areas / "bob" / "in")))
    assert answer.status_code == 400
    assert "another instance&#x27;s workspace" in answer.content.decode()
    assert not Instance.objects.filter(owner=staff).exists()
    # A change that gives an instance another owner's workspace is refused as well.
    mine = Instance.objects.create(owner=staff, name="mine", command=["true"], workspace=str(areas / "mine"))
    answer = client.post(f"/admin/instances/instance/{mine.pk}/change/",
                         admin_form(staff, name="mine", workspace=str(areas / "bob")))
    assert answer.status_code == 400
    mine.refresh_from_db()
    assert mine.workspace == str(areas / "mine")


# --- at run time ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_nesting_made_in_the_database_is_refused_at_run_time(user, other_user, script, areas):
    from instances import sandbox
    from loops import services

    outer = Instance.objects.create(owner=other_user, name="outer", command=["true"], workspace=str(areas / "o"))
    agent = script("pathlib.Path('touched').write_text('yes')\n")
    inner = Instance.objects.create(owner=user, name="inner", command=agent, workspace=str(areas / "i"),
                                    max_iterations=1)
    Instance.objects.filter(pk=inner.pk).update(workspace=str(areas / "o" / "i"))  # past every form
    inner.refresh_from_db()
    (areas / "o" / "i").mkdir(parents=True)

    with pytest.raises(sandbox.WorkspaceRefused, match="another instance's workspace"):
        sandbox.checked_workspace(inner.workspace_path(), instance_id=inner.pk)
    with pytest.raises(sandbox.WorkspaceRefused, match="holds"):
        sandbox.checked_workspace(outer.workspace_path(), instance_id=outer.pk)
    run = drive_in_thread(services.run_start(instance=inner, user=user, objective="work"))
    assert run.outcome == "failed", run.outcome_detail
    assert "lies inside" in run.outcome_detail and str(areas / "o") in run.outcome_detail
    assert "outer" not in run.outcome_detail.replace(str(areas / "o"), "")
    assert not (areas / "o" / "i" / "touched").exists()  # nothing ran there


@pytest.mark.django_db(transaction=True)
def test_one_owners_instances_sharing_a_workspace_both_run(user, script, areas):
    from loops import services

    shared = areas / "shared"
    shared.mkdir(parents=True)
    agent = script("p = pathlib.Path('count'); p.write_text(str(int(p.read_text()) + 1 if p.exists() else 1))\n")
    runs = []
    for name in ("a", "b"):
        inst = Instance.objects.create(owner=user, name=name, command=agent, workspace=str(shared), max_iterations=1)
        runs.append(drive_in_thread(services.run_start(instance=inst, user=user, objective="count")))
    assert [r.outcome for r in runs] == ["done", "done"], [r.outcome_detail for r in runs]
    assert (shared / "count").read_text() == "2"


@pytest.mark.django_db(transaction=True)
def test_the_check_holds_no_connection_it_did_not_hold(user, areas):
    from django.db import connection

    from instances import sandbox

    mine = Instance.objects.create(owner=user, name="mine", command=["true"], workspace=str(areas / "m"))
    (areas / "m").mkdir(parents=True)
    connection.close()
    assert sandbox.checked_workspace(mine.workspace_path(), instance_id=mine.pk) == (areas / "m").resolve()
    assert connection.connection is None
