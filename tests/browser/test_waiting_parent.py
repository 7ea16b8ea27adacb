"""A parent waiting for its children (issue 26, item 4), in headless Chromium against daphne.

The parent's page, open while it runs, turns live to "waiting for 2 children", with no answer box
and no "Close without answering"; its stop confirmation says its children stop too. The fleet shows
it under "Working now" with its children nested under it. No CSP violation on any live swap.
Each runs on a phone and on a laptop (the `device` fixture). The runs' states are written by the
test (no worker), as the runner writes them; the pages learn of them through the websocket.
"""

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from loops import events, services
from loops.models import Run
from tests.browser.test_run_page import ada, keeps_its_page, sign_in, still_same  # noqa: F401 - ada: a fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

VIOLATIONS_JS = """() => {
  window.tetherViolations = [];
  document.addEventListener("securitypolicyviolation", (e) => window.tetherViolations.push(e.violatedDirective + " " + e.blockedURI));
}"""


def open_page(browser, device, server, path):
    context = browser.new_context(**device[1])
    page = context.new_page()
    page.add_init_script(f"({VIOLATIONS_JS})()")
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: "Content Security Policy" in m.text and errors.append(m.text))
    sign_in(page, server.url, path)
    page.wait_for_selector('.live-bar[data-state="live"]')
    keeps_its_page(page)
    return page, context, errors


def park_on_children(parent, helper, user):
    """Do what the runner and delegation do when an act delegates to two runs: park the parent, start them."""
    kids = [services.run_start(instance=helper, user=user, objective=f"help with part {n}", max_cost_usd="0.5")
            for n in (1, 2)]
    ids = [k.pk for k in kids]
    Run.objects.filter(pk__in=ids).update(parent=parent, depth=1)
    Run.objects.filter(pk=parent.pk).update(
        status="waiting", next_iteration=2, lease_token=None, lease_holder="", lease_expires_at=None,
        outcome_detail=f"children running: runs {ids[0]}, {ids[1]}",
        delegation={"state": "waiting", "iteration": 1, "children": ids},
    )
    events.append(parent.pk, "run.delegated", {"iteration": 1, "children": ids, "refused": []})
    return kids


def test_a_parent_waiting_for_its_children_asks_nobody(browser, server, ada, make_instance, artifacts,  # noqa: F811
                                                       device):
    lead = make_instance(ada, name="lead")
    helper = make_instance(ada, name="helper")
    parent = services.run_start(instance=lead, user=ada, objective="get help", max_cost_usd="2")
    Run.objects.filter(pk=parent.pk).update(status="running", lease_token="t", lease_holder="w",
                                            lease_expires_at=timezone.now() + timezone.timedelta(minutes=5))
    page, context, errors = open_page(browser, device, server, f"/runs/{parent.pk}/")
    actions = page.locator(f"#run-{parent.pk}-actions")
    expect(actions.get_by_role("button", name="Send message")).to_be_attached()

    first, second = park_on_children(parent, helper, ada)
    summary = page.locator(f"#run-{parent.pk}-summary")
    expect(summary.locator("[data-run-status]")).to_have_text("waiting for 2 children", timeout=15_000)
    expect(summary.locator("[data-now]")).to_have_text("Now: iteration 1 — waiting for 2 children")
    expect(summary).to_contain_text("Waiting for its children")
    expect(actions).not_to_contain_text("Your answer")
    expect(actions).not_to_contain_text("Close without answering")
    expect(actions.get_by_role("button", name="Send answer")).to_have_count(0)
    actions.locator(".stop-confirm > summary").click()
    expect(actions.locator("[data-stop-children]")).to_have_text(
        f"Its 2 children (runs {first.pk}, {second.pk}) stop too.")
    assert still_same(page)
    page.screenshot(path=str(artifacts / f"{device[0]}-waiting-parent.png"), full_page=True)

    # The fleet: the parent is at work, its children under it.
    page.goto(server.url + "/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    working = page.locator("#fleet-active")
    row = working.locator(f'[data-run="{parent.pk}"]').first
    expect(row).to_contain_text("waiting for 2 children")
    nested = row.locator(f'[data-children-of="{parent.pk}"]')
    expect(nested.locator(f'[data-run="{first.pk}"]')).to_be_visible()
    expect(nested.locator(f'[data-run="{second.pk}"]')).to_be_visible()
    expect(page.locator("#fleet-needs")).not_to_contain_text("waiting for 2 children")
    # A child nests below its parent: drawn to the right of it. Both boxes are read in one script, as
    # the fleet's live updates may redraw the list between two reads.
    page.wait_for_function(
        """([parent, child]) => {
            const row = document.querySelector(`#fleet-active [data-run="${parent}"]`);
            const kid = row && row.querySelector(`[data-children-of="${parent}"] [data-run="${child}"]`);
            return !!kid && kid.getBoundingClientRect().left > row.getBoundingClientRect().left;
        }""",
        arg=[parent.pk, first.pk],
        timeout=10_000,
    )

    # One child starts asking a person, live: it moves to "Needs you" and names its parent there.
    Run.objects.filter(pk=first.pk).update(status="waiting", outcome_detail="Which source should I trust?")
    events.append(first.pk, "run.waiting", {"iteration": 1, "question": "Which source should I trust?"})
    needs = page.locator(f'#fleet-needs [data-run="{first.pk}"]')
    expect(needs).to_contain_text(f"delegated by run #{parent.pk}", timeout=15_000)
    expect(working.locator(f'[data-run="{parent.pk}"]').first).to_contain_text("waiting for 2 children")
    page.screenshot(path=str(artifacts / f"{device[0]}-fleet-nested-children.png"), full_page=True)
    assert page.evaluate("() => window.tetherViolations") == []
    assert errors == []
    context.close()
