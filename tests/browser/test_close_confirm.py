"""A run waiting for a person: "Close without answering" asks first, as Stop does (issue #26, item 7).

A run waits for a person; its actions are redrawn live over the websocket, so the Close offered is
the live-drawn one (its form carries the viewer's CSRF token from the socket). A first press opens a
confirmation that says what happens; "Keep it waiting" closes it and sends nothing; "Yes, close it"
ends the run escalated, and the page says so without a reload. On a phone and on a laptop.
"""

import pytest
from playwright.sync_api import expect

from loops import services
from loops.models import Run
from tests.browser.conftest import wait_live, wait_until_shown_finished
from tests.browser.test_run_page import ada, keeps_its_page, sign_in, still_same  # noqa: F401 (ada: a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_close_without_answering_asks_first(browser, server, worker, ada, make_instance, script, artifacts, device):  # noqa: F811
    agent = script(
        """
        for _ in range(300):  # the test opens the page first, then lets the agent ask
            if pathlib.Path('go').exists():
                break
            time.sleep(0.1)
        print('TETHER_ESCALATE: Which colour should the button be?', file=sys.stderr)
        sys.exit(3)
        """
    )
    instance = make_instance(ada, name="painter", command=agent)
    run = services.run_start(instance=instance, user=ada, objective="Paint the button", max_iterations=4)
    errors: list[str] = []
    closes: list[str] = []
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: closes.append(request.method) if request.url.endswith("/close") else None)
    sign_in(page, server.url, f"/runs/{run.pk}/")
    actions = page.locator(f"#run-{run.pk}-actions")
    wait_live(page, errors)
    keeps_its_page(page)
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="act.started"]', state="attached", timeout=30_000)
    expect(actions).not_to_contain_text("Close without answering")
    (instance.workspace_path() / "go").write_text("go")

    # The agent asks: Close arrives in the actions block drawn over the websocket, not by a reload.
    close = actions.locator("details.close-confirm > summary")
    expect(close).to_have_text("Close without answering…", timeout=30_000)
    assert Run.objects.get(pk=run.pk).status == Run.Status.WAITING
    assert still_same(page)
    confirm = actions.locator("details.close-confirm form")
    expect(confirm).to_be_hidden()

    # A first press asks, and says what happens.
    close.click()
    expect(confirm).to_be_visible()
    expect(confirm).to_contain_text(f"Close run {run.pk} without answering? It ends at once as escalated")
    expect(confirm).to_contain_text("cannot be answered or resumed later, only continued as a new run")
    page.screenshot(path=str(artifacts / f"{name}-close-confirm.png"), full_page=True)

    # "Keep it waiting": the confirmation closes, nothing is sent, the run still waits.
    confirm.get_by_role("button", name="Keep it waiting").click()
    expect(confirm).to_be_hidden()
    expect(actions.get_by_role("button", name="Send answer")).to_be_visible()
    assert closes == []
    run.refresh_from_db()
    assert (run.status, run.finished_at) == (Run.Status.WAITING, None)
    expect(page.locator(f"#run-{run.pk}-summary")).to_have_attribute("data-status", "waiting")

    # Close, then "Yes, close it": the run ends escalated and the page shows it.
    close.click()
    with page.expect_response(lambda r: r.url.endswith(f"/runs/{run.pk}/close")) as posted:
        confirm.get_by_role("button", name="Yes, close it").click()
    assert posted.value.status == 200, posted.value.text()[:500]
    wait_until_shown_finished(page, run.pk, errors)
    run.refresh_from_db()
    assert (run.status, run.outcome) == (Run.Status.FINISHED, Run.Outcome.ESCALATED)
    summary = page.locator(f"#run-{run.pk}-summary")
    expect(summary.locator("[data-run-status]")).to_have_text("escalated")
    expect(summary).to_contain_text("closed by ada without an answer")
    expect(actions.locator("details.close-confirm")).to_have_count(0)
    expect(actions).to_contain_text("Start another run of painter")
    assert closes == ["POST"]
    assert still_same(page)
    assert errors == []
    context.close()
