"""Continue a finished run from its page, in headless Chromium against daphne and a real worker.

A run that stopped at its iteration limit is continued from the console button (on a phone, and
on a laptop), with a message: the new run opens, its worker drives it to `done` in the workspace
the old run left, its first instruction carries the old run's history and the message, and both
pages link to each other (the old one read on the other device). The old run is unchanged.
"""

import re

import pytest
from django.forms.models import model_to_dict

from loops.models import Event, Run
from tests.browser.conftest import DEVICES
from tests.loops.conftest import drive_in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
MESSAGE = "Number the parts, please"
NO_SIDEWAYS_SCROLL_JS = "() => document.documentElement.scrollWidth <= window.innerWidth"


@pytest.fixture
def stopped_at_its_limit(django_user_model, make_instance, script):
    """A run of a counting agent that ended max_iterations after 2 of the 4 parts its check wants."""
    from loops import services

    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        instruction = sys.stdin.read()
        numbered = ' (numbered)' if 'Number the parts' in instruction else ''
        print(f'wrote part {n} of the report{numbered}')
        """
    )
    check = script("n = int(pathlib.Path('count').read_text()); print('parts', n); sys.exit(0 if n >= 4 else 1)")
    instance = make_instance(
        user, name="reporter", command=agent, checks=[{"name": "parts", "command": check}], max_iterations=2
    )
    run = services.run_start(instance=instance, user=user, objective="Write the four-part report")
    return drive_in_thread(run)


def sign_in(page, base_url, next_path):
    page.goto(base_url + next_path)
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base_url + next_path) + "$"))


def test_a_max_iterations_run_is_continued_from_its_page(browser, stopped_at_its_limit, server, worker, artifacts,
                                                          device):
    # The run is driven here before the worker starts (fixtures set up in this order): a worker
    # up first would take the run from under `drive_in_thread`.
    old = stopped_at_its_limit
    assert (old.outcome, old.iterations_done) == ("max_iterations", 2)
    before = (model_to_dict(Run.objects.get(pk=old.pk)), list(Event.objects.filter(run=old).values_list("seq", "kind")))
    errors = []

    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{old.pk}/")
    form = page.locator(f"#run-{old.pk}-continue")
    form.scroll_into_view_if_needed()
    assert form.is_visible() and "This run stays as it is." in form.inner_text()
    assert page.input_value(f"#run-{old.pk}-continue-max-iterations") == "2"
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), f"the run page scrolls sideways on a {name}"
    page.fill(f"#run-{old.pk}-continue-message", MESSAGE)
    page.fill(f"#run-{old.pk}-continue-max-iterations", "5")
    page.screenshot(path=str(artifacts / f"{name}-continue-form.png"), full_page=True)
    page.click("text=Continue as a new run")

    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    new_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
    assert new_id != old.pk
    summary = page.locator(f"#run-{new_id}-summary")
    assert f"Continued from run {old.pk}." in summary.inner_text()
    # The worker drives it; the page follows live until it is done.
    page.wait_for_selector(f'#run-{new_id}-summary[data-status="finished"]', timeout=60_000)
    new = Run.objects.get(pk=new_id)
    assert (new.continued_from_id, new.outcome, new.verified, new.iterations_done, new.max_iterations) == (
        old.pk, "done", True, 2, 5,
    ), new.outcome_detail
    first = page.locator(f'#run-{new_id}-timeline article[data-kind="iteration.started"][data-iteration="1"]')
    first.locator("summary").first.click()
    shown = first.inner_text()
    assert f"This run continues run {old.pk}, which ended max iterations" in shown
    assert "it answered: wrote part 2 of the report" in shown and MESSAGE in shown
    answered = page.locator(f'#run-{new_id}-timeline article[data-kind="act.finished"]').first.inner_text()
    assert "wrote part 3 of the report (numbered)" in answered  # the agent read the message, in the old workspace
    page.screenshot(path=str(artifacts / f"{name}-continued-run.png"), full_page=True)

    # The old run's page, on the other device, links to its continuation and offers no second one.
    (elsewhere,) = (opts for other_name, opts in DEVICES.items() if other_name != name)
    other = browser.new_context(**elsewhere).new_page()
    other.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(other, server.url, f"/runs/{old.pk}/")
    link = other.locator(f"#run-{old.pk}-summary a", has_text=f"run {new_id}")
    assert "Continued as" in other.locator(f"#run-{old.pk}-summary").inner_text()
    link.click()
    other.wait_for_url(f"{server.url}/runs/{new_id}/")
    other.go_back()
    assert other.locator(f"#run-{old.pk}-continue").count() == 0
    assert (model_to_dict(Run.objects.get(pk=old.pk)), list(Event.objects.filter(run=old).values_list("seq", "kind"))) == before
    assert errors == []
