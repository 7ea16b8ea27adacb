"""Every run records how it started, shows it, and the history filters by it."""

import json

import pytest

from loops import services
from loops.models import Event, Run
from web.auth import make_token

pytestmark = pytest.mark.django_db


def _said(origin):
    return {key: value for key, value in origin.items() if value is not None}


@pytest.fixture
def instance(user, make_instance):
    return make_instance(user, name="scribe")


def test_each_surface_records_its_own_origin(client, user, instance):
    by_cli = services.run_start(instance=instance, user=user, objective="a", via="cli")
    by_mcp = services.run_start(instance=instance, user=user, objective="b", via="mcp")
    token = make_token(user)
    answer = client.post(
        f"/v1/instances/{instance.pk}/loop",
        data=json.dumps({"objective": "c"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 201
    assert _said(answer.json()["origin"]) == {"kind": "api"}
    client.force_login(user)
    page = client.post(f"/instances/{instance.pk}/start", {"objective": "d", "max_iterations": 1})
    assert page.status_code in (200, 302, 303)
    by_console = Run.objects.get(objective="d")
    assert [by_cli.origin, by_mcp.origin, Run.objects.get(objective="c").origin, by_console.origin] == [
        "cli",
        "mcp",
        "api",
        "console",
    ]


def test_a_child_run_says_it_was_delegated(user, instance):
    parent = services.run_start(instance=instance, user=user, objective="lead")
    child = services.run_start(
        instance=instance, user=user, objective="help", via="system", parent=parent, max_cost_usd="1"
    )
    assert child.origin == "delegation" and child.origin_ref == {"parent": parent.pk}
    assert "delegate" in child.origin_text


def test_a_trigger_origin_names_the_trigger_and_delivery_everywhere(client, user, instance):
    origin = services.Origin(Run.Origin.TRIGGER, {"trigger": 7, "delivery": "72d3162e"})
    run = services.run_start(instance=instance, user=user, objective="triage", via="system", origin=origin)
    run.refresh_from_db()
    assert (run.origin, run.origin_ref) == ("trigger", {"trigger": 7, "delivery": "72d3162e"})
    started = Event.objects.get(run=run, kind="run.started").data
    assert started["origin"] == {"kind": "trigger", "trigger": 7, "delivery": "72d3162e"}
    token = make_token(user)
    got = client.get(
        f"/v1/instances/{instance.pk}/loop/{run.pk}", headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert _said(got["origin"]) == {"kind": "trigger", "trigger": 7, "delivery": "72d3162e"}
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-run-origin="trigger"' in page
    assert "by webhook trigger 7 (delivery 72d3162e)" in page
    assert f'href="/instances/{instance.pk}/triggers/#trigger-7"' in page


def test_an_unknown_origin_is_refused_by_the_service(user, instance):
    with pytest.raises(ValueError, match="unknown run origin"):
        services.Origin("carrier-pigeon")


def test_the_history_and_the_api_filter_by_origin(client, user, instance):
    services.run_start(instance=instance, user=user, objective="by hand", via="console")
    hooked = services.run_start(
        instance=instance,
        user=user,
        objective="by hook",
        via="system",
        origin=services.Origin(Run.Origin.TRIGGER, {"trigger": 1, "delivery": "d1"}),
    )
    client.force_login(user)
    page = client.get("/history/", {"origin": "trigger"}).content.decode()
    assert f"history-row-{hooked.pk}" in page and "by hand" not in page
    everything = client.get("/history/").content.decode()
    assert "by hand" in everything and "by hook" in everything
    token = make_token(user)
    auth = {"Authorization": f"Bearer {token}"}
    listed = client.get(f"/v1/instances/{instance.pk}/loop", {"origin": "trigger"}, headers=auth).json()[
        "runs"
    ]
    assert [r["id"] for r in listed] == [hooked.pk]
    refused = client.get(f"/v1/instances/{instance.pk}/loop", {"origin": "pigeon"}, headers=auth)
    assert refused.status_code == 400 and "origin" in refused.json()["error"]


def test_the_history_refuses_an_unknown_origin_clearly(client, user, instance):
    client.force_login(user)
    page = client.get("/history/", {"origin": "pigeon"})
    assert page.status_code == 200
    assert "Select a valid choice" in page.content.decode()
