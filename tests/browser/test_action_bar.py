"""The run page's actions, redrawn live, always work: in headless Chromium against daphne and a real worker.

- A run watched until it finishes live is continued from the form the websocket drew (it carries the
  viewer's CSRF token: no 403).
- A refused message (too long) does not spend the form's nonce: the next one is sent, not "sent already".
- A run out of budget offers "Resume with a cap of $…", pre-filled; a resume that would stop at once says
  so and adds nothing to the timeline; one with a higher cap goes on.
Each runs on a phone and on a laptop (the `device` fixture).
"""

import re

import pytest
from playwright.sync_api import expect

from loops import services
from loops.models import Event, Interjection, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
WAIT_FOR_GO = """
for _ in range(600):  # the test opens the page first, then lets the agent go on
    if pathlib.Path('go').exists():
        break
    time.sleep(0.05)
"""


@pytest.fixture
def ada(django_user_model):
    return django_user_model.objects.create_user("ada", password=PASSWORD)


def sign_in(page, base_url, next_path):
    page.goto(base_url + next_path)
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base_url + next_path) + "$"))


def watch(browser, server, device, run):
    """Open `run`'s page on `device`, live; return (page, context, the page errors seen)."""
    errors = []
    context = browser.new_context(**device[1])
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    page.evaluate("() => { window.tetherSamePage = 1; }")
    return page, context, errors


def let_go(page, run, instance):
    """Once the agent is acting (its workspace exists), let it go on."""
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="act.started"]', state="attached",
                           timeout=20_000)
    (instance.workspace_path() / "go").write_text("go")


def same_page(page):
    return page.evaluate("() => window.tetherSamePage === 1")


def test_continue_after_watching_a_run_finish_live(browser, server, worker, ada, make_instance, script, device):
    agent = script(WAIT_FOR_GO + "print('did a part')\n")
    check = script("sys.exit(1)\n")
    instance = make_instance(ada, name="parts", command=agent, checks=[{"name": "never", "command": check}],
                             max_iterations=1)
    run = services.run_start(instance=instance, user=ada, objective="Write the parts")
    page, context, errors = watch(browser, server, device, run)
    assert page.locator(f"#run-{run.pk}-continue").count() == 0  # not finished yet: nothing to continue
    let_go(page, run, instance)

    # It finishes while watched: the websocket draws the continue form.
    form = page.locator(f"#run-{run.pk}-continue")
    expect(form).to_be_visible(timeout=30_000)
    assert same_page(page)
    assert Run.objects.get(pk=run.pk).outcome == "max_iterations"
    token = form.locator("input[name=csrfmiddlewaretoken]")
    expect(token).to_have_count(1)
    assert len(token.input_value()) == 64  # a token of this sign-in, drawn into the swapped form
    page.fill(f"#run-{run.pk}-continue-message", "Go on with the next part")
    form.get_by_role("button", name="Continue as a new run").click()

    page.wait_for_url(re.compile(rf"/runs/(?!{run.pk}/)\d+/$"), timeout=15_000)
    assert "Forbidden" not in page.content()
    new = Run.objects.get(continued_from=run)
    assert page.url.endswith(f"/runs/{new.pk}/")
    expect(page.locator(f"#run-{new.pk}-summary")).to_contain_text(f"Continued from run {run.pk}.")
    assert errors == []
    context.close()


def test_a_refused_message_leaves_the_form_able_to_send(browser, server, worker, ada, make_instance, script, device):
    agent = script(WAIT_FOR_GO + "print('done waiting')\n")
    instance = make_instance(ada, name="listener", command=agent, max_iterations=1)
    run = services.run_start(instance=instance, user=ada, objective="Listen")
    page, context, errors = watch(browser, server, device, run)
    actions = page.locator(f"#run-{run.pk}-actions")
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="act.started"]', state="attached",
                           timeout=20_000)

    actions.locator("textarea").fill("x" * 9000)
    actions.get_by_role("button", name="Send message").click()
    expect(actions.locator("[role=alert]")).to_contain_text("at most 8,000", timeout=10_000)  # by the field
    assert not Interjection.objects.filter(run=run).exists()

    actions.locator("textarea").fill("A real message after an error")
    actions.get_by_role("button", name="Send message").click()
    expect(actions.locator(".notice")).to_contain_text("Sent: the agent reads it", timeout=10_000)
    assert "sent already" not in actions.inner_text()
    assert list(Interjection.objects.filter(run=run).values_list("text", flat=True)) == [
        "A real message after an error"
    ]
    assert same_page(page) and errors == []
    (instance.workspace_path() / "go").write_text("go")
    context.close()


SPENDER = WAIT_FOR_GO + """
p = pathlib.Path('n'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
json.dump({'cost_usd': 0.03}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print('step', n)
"""


def test_budget_exhausted_offers_a_resume_with_a_new_cap(browser, server, worker, ada, make_instance, script, device):
    # $0.05 reserved per iteration (the default for a program), $0.03 spent: a $0.12 cap ends after 3.
    check = script("print('n is', pathlib.Path('n').read_text()); sys.exit(1)\n")
    instance = make_instance(ada, name="spender", command=script(SPENDER),
                             checks=[{"name": "never", "command": check}], max_iterations=20)
    run = services.run_start(instance=instance, user=ada, objective="Spend", max_cost_usd="0.12")
    page, context, errors = watch(browser, server, device, run)
    let_go(page, run, instance)

    cap = page.locator(f"#run-{run.pk}-resume-cap")
    expect(cap).to_be_visible(timeout=30_000)  # drawn live when the budget runs out
    form = page.locator(f"#run-{run.pk}-resume")
    assert Run.objects.get(pk=run.pk).outcome == "budget_exhausted"
    expect(form.locator("label")).to_have_text("Resume with a cap of $")
    assert cap.input_value() == "0.24"
    expect(form.locator("[data-resume-left]")).to_contain_text("It has used $0.09 of its $0.12 cap.")
    expect(form.locator("[data-resume-left]")).to_contain_text("Left in the pools above it:")
    assert page.locator("text=Resume (budget raised)").count() == 0

    # Pressed with no new cap, it would stop at once: it says so, and nothing is added.
    events = Event.objects.filter(run=run).count()
    cap.fill("")
    form.get_by_role("button", name="Resume with this cap").click()
    expect(page.locator(f"#run-{run.pk}-resume .field-error")).to_contain_text(
        "resuming would stop it again at once", timeout=10_000
    )
    assert Event.objects.filter(run=run).count() == events
    assert not Event.objects.filter(run=run, kind="run.resumed").exists()

    # With a higher cap it goes on, and stops again at the new cap, offering more.
    page.locator(f"#run-{run.pk}-resume-cap").fill("0.24")
    page.locator(f"#run-{run.pk}-resume").get_by_role("button", name="Resume with this cap").click()
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="run.resumed"]', state="attached",
                           timeout=15_000)
    expect(page.locator(f"#run-{run.pk}-resume-cap")).to_have_value("0.48", timeout=30_000)
    resumed = Run.objects.get(pk=run.pk)
    assert (resumed.outcome, resumed.max_cost_micros, resumed.spent_micros) == ("budget_exhausted", 240_000, 210_000)
    assert Event.objects.filter(run=run, kind="run.resumed").count() == 1
    assert same_page(page) and errors == []
    context.close()
