"""A parent waiting for its children (issue 26, items 4, 5 and 13), seen without a browser.

Its page says "waiting for N children" and offers no answer box and no "Close without answering";
its stop confirmation says its children stop too. The fleet lists it under "Working now" with its
children nested under it. A live run's page says what it does now ("Now: iteration N — …"), and the
live state message carries the receipt link once the run finished.
"""

import re

import pytest
from django.utils import timezone

from loops import services
from loops.models import Run
from tests.console.conftest import record
from web.console import live

pytestmark = pytest.mark.django_db


@pytest.fixture
def family(user, instance, make_instance, start_run):
    """A parent parked on two children: one running, one queued."""
    helper = make_instance(user, name="helper")
    parent = start_run(instance, max_cost_usd="2")
    first = services.run_start(instance=helper, user=user, objective="plan it", max_cost_usd="0.5")
    second = services.run_start(instance=helper, user=user, objective="check it", max_cost_usd="0.5")
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(parent=parent, depth=1)
    Run.objects.filter(pk=first.pk).update(status="running", next_iteration=2)
    Run.objects.filter(pk=parent.pk).update(
        status="waiting", next_iteration=2,
        outcome_detail=f"children running: runs {first.pk}, {second.pk}",
        delegation={"state": "waiting", "iteration": 1, "children": [first.pk, second.pk]},
    )
    return [Run.objects.get(pk=r.pk) for r in (parent, first, second)]


def actions_of(html, run):
    return re.search(rf'<section id="run-{run.pk}-actions".*?</section>', html, re.S).group(0)


def test_a_parent_waiting_for_its_children_offers_no_answer(signed_in, family):
    parent, first, second = family
    html = signed_in.get(f"/runs/{parent.pk}/").content.decode()
    summary = re.search(rf'<section id="run-{parent.pk}-summary".*?</section>', html, re.S).group(0)
    assert "waiting for 2 children" in summary
    assert "waiting for you" not in summary
    actions = actions_of(html, parent)
    assert "Your answer resumes the run" not in actions
    assert "Close without answering" not in actions
    assert "Send answer" not in actions and "Your answer" not in actions
    assert "Send message" in actions  # a message is still read once it goes on
    assert f"Its 2 children (runs {first.pk}, {second.pk}) stop too." in actions


def test_a_live_state_push_of_a_waiting_parent_has_no_answer_box(family):
    parent, *_ = family
    message = live.render_state(Run.objects.get(pk=parent.pk))
    assert "Close without answering" not in message and "Your answer resumes the run" not in message
    assert "waiting for 2 children" in message


def test_a_run_waiting_for_a_person_still_offers_its_answer(signed_in, instance, start_run):
    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="Which colour?")
    actions = actions_of(signed_in.get(f"/runs/{run.pk}/").content.decode(), run)
    assert "Your answer resumes the run" in actions and "Close without answering" in actions
    assert "stop too" not in actions


def test_the_fleet_puts_a_waiting_parent_under_working_now_with_its_children_nested(signed_in, family):
    parent, first, second = family
    html = signed_in.get("/").content.decode()
    working = re.search(r'<section id="fleet-active".*?</section>', html, re.S).group(0)
    needs = re.search(r'<section id="fleet-needs".*?</section>', html, re.S).group(0)
    assert f'data-run="{parent.pk}"' in working and f'data-run="{parent.pk}"' not in needs
    nested = re.search(rf'<ul class="runs nested" data-children-of="{parent.pk}".*?</ul>', working, re.S).group(0)
    assert f'data-run="{first.pk}"' in nested and f'data-run="{second.pk}"' in nested
    assert "waiting for 2 children" in working
    assert '<span class="count-badge">3</span>' in working


def test_a_child_listed_apart_from_its_parent_names_it(signed_in, family):
    parent, first, _ = family
    Run.objects.filter(pk=first.pk).update(status="waiting", outcome_detail="Which source should I trust?")
    needs = re.search(r'<section id="fleet-needs".*?</section>', signed_in.get("/").content.decode(), re.S).group(0)
    assert f'data-run="{first.pk}"' in needs
    assert f"delegated by run #{parent.pk}" in needs


def test_a_live_run_says_what_it_does_now(signed_in, instance, start_run):
    run = start_run(instance)
    record(run, [("run.claimed", {"iteration": 1, "worker": "w1", "attempt": 1}),
                 ("iteration.started", {"iteration": 1, "instruction": "go", "interjections": 0}),
                 ("act.started", {"iteration": 1})])
    Run.objects.filter(pk=run.pk).update(status="running", lease_token="t", lease_holder="w1",
                                         lease_expires_at=timezone.now() + timezone.timedelta(seconds=60))
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert re.search(r'<p class="now" data-now>Now: iteration 1 — acting</p>', html)
    record(run, [("act.finished", {"iteration": 1, "ok": True})])
    assert "Now: iteration 1 — checking" in live.render_summary(Run.objects.get(pk=run.pk))


def test_a_waiting_parent_says_now_it_waits_for_its_children(family):
    parent, *_ = family
    assert "Now: iteration 1 — waiting for 2 children" in live.render_summary(parent)


def test_a_finished_run_has_no_now_line(signed_in, run):
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="done", finished_at=timezone.now())
    assert "data-now" not in signed_in.get(f"/runs/{run.pk}/").content.decode()


def test_the_receipt_link_arrives_live_when_the_run_finishes(run):
    assert "signed receipt" not in live.render_state(Run.objects.get(pk=run.pk))
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="done", finished_at=timezone.now())
    message = live.render_state(Run.objects.get(pk=run.pk))
    links = re.search(rf'<span class="small" id="run-{run.pk}-links" hx-swap-oob="true">.*?</span>', message, re.S)
    assert links and f'href="/runs/{run.pk}/receipt"' in links.group(0) and "signed receipt" in links.group(0)


def test_live_swapped_html_carries_no_inline_style(signed_in, family, user):
    parent, *_ = family
    for message in (live.render_state(parent), live.render_summary(parent), live.render_fleet(user)):
        assert not re.search(r"<[^>]*\sstyle\s*=", message), "an inline style the CSP blocks"


def test_the_fleets_instance_counts_a_waiting_parent_as_working_not_waiting(user, instance, family, start_run):
    from loops import selectors

    asking = start_run(instance)
    Run.objects.filter(pk=asking.pk).update(status="waiting", next_iteration=2)  # waits for a person
    counts = {i.name: (i.active_runs, i.waiting_runs) for i in selectors.instances_for(user)}
    assert counts[instance.name] == (1, 1)  # the parent works (through its children); the asker waits
    assert counts["helper"] == (2, 0)  # one child running, one queued


def test_the_message_box_of_a_waiting_parent_is_not_an_answer(family):
    from web.console.forms import InterjectForm

    parent = family[0]
    assert InterjectForm(run=parent).fields["text"].label == "Message to the agent"
    Run.objects.filter(pk=parent.pk).update(delegation={})
    assert InterjectForm(run=Run.objects.get(pk=parent.pk)).fields["text"].label == "Your answer"
