"""A delegation tree seen from the run page and the API: the parent link, the children with their
live status and spend, and the whole tree's spend against the root's cap."""

import re

import pytest
from django.utils import timezone

from loops import services
from loops.models import Run
from web.auth import make_token
from web.console import live

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(user, instance, make_instance, start_run):
    """A root (cap $2) that delegated to two children; the first delegated once more."""
    helper = make_instance(user, name="helper")
    root = start_run(instance, max_cost_usd="2")
    Run.objects.filter(pk=root.pk).update(
        status="waiting", spent_micros=300_000, outcome_detail="children running: runs …",
        delegation={"state": "waiting", "iteration": 1},
    )
    first = services.run_start(instance=helper, user=user, objective="plan it", max_cost_usd="0.5")
    second = services.run_start(instance=helper, user=user, objective="check it", max_cost_usd="0.5")
    grandchild = services.run_start(instance=helper, user=user, objective="look it up", max_cost_usd="0.1")
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(parent=root, depth=1, delegation={"workspace": "copy"})
    Run.objects.filter(pk=grandchild.pk).update(parent=first, depth=2)
    Run.objects.filter(pk=first.pk).update(status="running", spent_micros=120_000, next_iteration=2)
    Run.objects.filter(pk=second.pk).update(
        status="finished", outcome="done", verified=True, spent_micros=80_000, next_iteration=3,
        finished_at=timezone.now(),
    )
    Run.objects.filter(pk=grandchild.pk).update(spent_micros=5_000)
    return [Run.objects.get(pk=r.pk) for r in (root, first, second, grandchild)]


def test_a_parent_shows_its_children_live_and_the_trees_spend(signed_in, tree):
    root, first, second, grandchild = tree
    html = signed_in.get(f"/runs/{root.pk}/").content.decode()
    block = re.search(rf'<div class="tree" id="run-{root.pk}-tree".*?</div>', html, re.S).group(0)
    children = re.findall(r'data-child="(\d+)" data-child-status="(\w+)"', block)
    assert children == [(str(first.pk), "running"), (str(second.pk), "finished")]
    assert f'<a href="/runs/{first.pk}/">run {first.pk}</a>' in block
    assert "iteration 2 of" in block and "$0.12 of $0.50" in block and "verified" in block
    assert "The whole tree (4 runs) spent <strong>$0.505</strong> of the root&#x27;s $2.00 cap" in block or \
        "The whole tree (4 runs) spent <strong>$0.505</strong> of the root's $2.00 cap" in block
    assert "Waiting for its children:" in html and "The agent needs you" not in html


def test_a_child_shows_its_parent_and_the_root(signed_in, tree):
    root, first, second, grandchild = tree
    html = signed_in.get(f"/runs/{grandchild.pk}/").content.decode()
    assert f'Delegated by <a href="/runs/{first.pk}/">run {first.pk}</a>' in html
    assert f'(root: <a href="/runs/{root.pk}/">run {root.pk}</a>)' in html
    assert "The whole tree (4 runs)" in html
    middle = signed_in.get(f"/runs/{first.pk}/").content.decode()
    assert f'data-child="{grandchild.pk}"' in middle and f'Delegated by <a href="/runs/{root.pk}/">' in middle


def test_a_child_that_asks_a_person_shows_on_its_parent(signed_in, tree):
    root, first, *_ = tree
    Run.objects.filter(pk=first.pk).update(status="waiting", outcome_detail="Which source should I trust?")
    html = signed_in.get(f"/runs/{root.pk}/").content.decode()
    assert f'A child needs you: <a href="/runs/{first.pk}/">run {first.pk}</a> asks “Which source should I trust?”' in html


def test_a_state_push_redraws_the_children(tree):
    root, first, *_ = tree
    before = live.render_summary(Run.objects.get(pk=root.pk))
    Run.objects.filter(pk=first.pk).update(status="finished", outcome="failed", finished_at=timezone.now())
    after = live.render_summary(Run.objects.get(pk=root.pk))
    assert f'data-child="{first.pk}" data-child-status="running"' in before
    assert f'data-child="{first.pk}" data-child-status="finished"' in after


def test_a_run_outside_any_tree_draws_no_tree(signed_in, instance, start_run):
    run = start_run(instance)
    assert 'class="tree"' not in signed_in.get(f"/runs/{run.pk}/").content.decode()


def test_the_api_returns_parent_and_children(client, user, tree):
    root, first, second, grandchild = tree
    headers = {"Authorization": f"Bearer {make_token(user)}"}
    one = client.get(f"/v1/instances/{root.instance_id}/loop/{root.pk}", headers=headers).json()
    assert (one["parent"], one["children"]) == (None, [first.pk, second.pk])
    child = client.get(f"/v1/instances/{first.instance_id}/loop/{first.pk}", headers=headers).json()
    assert (child["parent"], child["children"]) == (root.pk, [grandchild.pk])
    listed = client.get(f"/v1/instances/{first.instance_id}/loop", headers=headers).json()["runs"]
    assert {r["id"]: (r["parent"], r["children"]) for r in listed} == {
        first.pk: (root.pk, [grandchild.pk]), second.pk: (root.pk, []), grandchild.pk: (first.pk, []),
    }


def test_a_child_that_delegated_in_turn_still_shows_the_workspace_it_was_given(signed_in, tree):
    root, first, *_ = tree
    # Parked on its own child, `first` keeps its own state; what it was asked lives on the root.
    Run.objects.filter(pk=first.pk).update(status="waiting", delegation={"state": "waiting", "iteration": 2})
    Run.objects.filter(pk=root.pk).update(delegation={
        "state": "waiting", "iteration": 1, "placed": {str(first.pk): {"call": "toolu_1", "workspace": "copy"}},
    })
    html = signed_in.get(f"/runs/{first.pk}/").content.decode()
    assert f'Delegated by <a href="/runs/{root.pk}/">run {root.pk}</a>' in html and "· workspace: copy" in html
