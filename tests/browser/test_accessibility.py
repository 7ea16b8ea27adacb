"""axe-core finds nothing on any console page a person reaches, on a phone and on a laptop (issue #26).

One test per device signs in once and visits, in headless Chromium against daphne: the sign-in
page, the fleet, an instance (page, new, create form, edit, budget and pools), a pool's page and the
person's account page (each with its audit trail), a run page while its
socket is live and events arrive (its stop confirm open), a run waiting for an answer (its confirm
open), a run out of budget (its resume form), a finished run and its receipt, history, keys, tokens
(and the page that shows a new one once), notifications (with a Remove button), the review queue
and an item, a refused form with its error summary, and the error pages (404, and the 403 a stale
form gets). Each page is checked once it has settled; a violation is reported with its nodes.
"""

from decimal import Decimal

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import Permission
from django.utils import timezone

from loops import services
from loops.models import Run
from reviews import services as review_services
from reviews import snapshots
from reviews.models import Grading, ReviewItem
from tests.browser.test_run_page import PASSWORD, ada, sign_in  # noqa: F401 - ada: a fixture
from tests.console.conftest import ONE_ITERATION, record
from tests.loops.conftest import drive_in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

AXE = Axe()


def violations(page) -> list[str]:
    """What axe-core finds on the page as it is now: one line per rule, then the nodes it failed on."""
    found = AXE.run(page).response["violations"]
    lines = []
    for rule in found:
        lines.append(f"{rule['id']} ({rule['impact']}): {rule['help']}")
        for node in rule["nodes"]:
            lines.append(f"    {', '.join(map(str, node['target']))}: {node['html'][:160]}")
            lines.append(f"      {node['failureSummary']}".replace("\n", " "))
    return lines


def iteration(n: int) -> list[tuple[str, dict]]:
    """ONE_ITERATION's events, as iteration `n`."""
    return [(kind, {**data, "iteration": n}) for kind, data in ONE_ITERATION]


@pytest.fixture
def console(ada, make_instance, script):  # noqa: F811
    """What a person has after a while: an instance with a finished, receipted and reviewed run, a live
    run, a key, a token and a notification target."""
    from instances.models import Credential
    from reviews.models import NotificationTarget
    from web.auth import make_token

    ada.user_permissions.add(Permission.objects.get(codename="run_programs"))
    agent = script("pathlib.Path('answer.txt').write_text('42'); print('wrote 42')")
    check = script("print('1 passed'); sys.exit(0 if pathlib.Path('answer.txt').read_text() == '42' else 1)")
    instance = make_instance(
        ada, name="answerer", command=agent, checks=[{"name": "answer", "command": check, "required": True}]
    )
    Grading.objects.create(instance=instance, sample_percent=Decimal(100))
    finished = services.run_start(
        instance=instance, user=ada, objective="write 42 to answer.txt", max_cost_usd="5"
    )
    snapshots.take(finished)
    finished = drive_in_thread(finished)
    assert finished.outcome == "done"
    review_services.on_run_finished(finished)
    item = ReviewItem.objects.get(run=finished)

    live = services.run_start(instance=instance, user=ada, objective="keep going", max_cost_usd="5")
    Run.objects.filter(pk=live.pk).update(status=Run.Status.RUNNING)
    record(live, [("run.claimed", {"iteration": 1, "worker": "w1", "attempt": 1})])
    for n in range(1, 4):
        record(live, iteration(n)[1:])

    waiting = services.run_start(instance=instance, user=ada, objective="ask me first", max_cost_usd="5")
    Run.objects.filter(pk=waiting.pk).update(status=Run.Status.WAITING)
    exhausted = services.run_start(instance=instance, user=ada, objective="spend it all", max_cost_usd="5")
    record(exhausted, iteration(1))
    Run.objects.filter(pk=exhausted.pk).update(
        status=Run.Status.FINISHED, outcome=Run.Outcome.BUDGET_EXHAUSTED, finished_at=timezone.now()
    )

    from budgets import services as budget_services

    pool = budget_services.instance_pool(instance)
    budget_services.pool_set_limit(pool, 50_000_000, user=ada, via="admin")  # the pool page's audit has a change
    Credential.create_for(ada, label="work key", secret="sk-ant-api03-" + "a" * 40)
    make_token(ada, name="laptop")
    from triggers import services as trigger_services

    trigger, _ = trigger_services.trigger_create(
        user=ada, instance=instance, name="issues", objective_template="Triage #{issue.number}"
    )
    trigger_services.receive(trigger_id=trigger.pk, headers={}, body=b"{}", body_bytes=2, content_type="application/json")
    NotificationTarget.objects.create(owner=ada, kind="email", address="ada@example.com")
    return {
        "instance": instance,
        "finished": finished,
        "live": live,
        "item": item,
        "waiting": waiting,
        "exhausted": exhausted,
        "pool": pool,
    }


def test_every_console_page_is_clean_under_axe(browser, server, console, device):
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    found: dict[str, list[str]] = {}

    def check(label: str) -> None:
        page.wait_for_load_state("load")
        lines = violations(page)
        if lines:
            found[label] = lines

    instance, finished, live, item = (
        console["instance"],
        console["finished"],
        console["live"],
        console["item"],
    )
    page.goto(server.url + "/login/")
    check("sign-in")
    sign_in(page, server.url, "/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    check("fleet")

    for label, path in [
        ("instance page", f"/instances/{instance.pk}/"),
        ("new instance", "/instances/new/"),
        ("create form", "/instances/new/program/"),
        ("edit form", f"/instances/{instance.pk}/edit"),
        ("budget and pools", f"/instances/{instance.pk}/budget"),
        ("webhook triggers", f"/instances/{instance.pk}/triggers/"),
        ("pool page", f"/pools/{console['pool'].pk}/"),
        ("account", "/account/"),
        ("finished run", f"/runs/{finished.pk}/"),
        ("receipt", f"/runs/{finished.pk}/receipt"),
        ("rollback confirmation", f"/runs/{finished.pk}/rollback?to=start"),
        ("history", "/history/"),
        ("keys", "/credentials/"),
        ("tokens", "/tokens/"),
        ("notifications", "/reviews/notifications/"),
        ("review queue", "/reviews/"),
        ("since you last looked", "/reviews/digest/"),
        ("review item", f"/reviews/{item.pk}/"),
        ("404", "/runs/999999/"),
        ("run out of budget", f"/runs/{console['exhausted'].pk}/"),
        ("run waiting for an answer", f"/runs/{console['waiting'].pk}/"),
    ]:
        page.goto(server.url + path)
        check(label)
        if label == "rollback confirmation":
            assert page.locator("button", has_text="Yes, roll it back").count() == 1
        if label == "run out of budget":
            assert page.locator("form.resume").count() == 1  # "Resume with a cap of $…"
    # Each destructive action asks first: its confirm, open.
    for summary in page.locator(".stop-confirm > summary").all():
        summary.click()
    assert page.locator(".stop-confirm[open]").count() >= 1
    assert page.locator("[data-actions] button", has_text="Send answer").is_visible()
    check("run waiting for an answer, confirms open")

    # A live run, after events arrived over its socket (what a live swap draws is checked too).
    page.goto(f"{server.url}/runs/{live.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    last = record(live, iteration(4)[1:])
    page.wait_for_function(
        f"() => +document.querySelector('[ws-connect]').dataset.lastSeq >= {last}", timeout=20_000
    )
    check("live run")

    page.locator(f"#run-{live.pk}-actions .stop-confirm > summary").click()
    check("live run, stop asked")

    # A refused form: its error summary at the top, the field outlined.
    page.goto(server.url + "/instances/new/program/")
    page.evaluate("() => document.querySelectorAll('form').forEach((f) => { f.noValidate = true; })")
    page.fill("input[name=name]", "")
    with page.expect_navigation():
        page.locator("form:has(input[name=name]) button[type=submit]").last.click()
    page.wait_for_selector("[data-error-summary]")
    check("refused create form")

    # The page that shows a new token once.
    page.goto(server.url + "/tokens/")
    page.fill("#id_name", "phone")
    page.click("text=Make token")
    page.wait_for_selector("[data-new-token]")
    check("new token")

    # A form whose CSRF token went stale: Django's 403.
    page.goto(server.url + "/tokens/")
    page.evaluate(
        "() => document.querySelectorAll('input[name=csrfmiddlewaretoken]').forEach((i) => { i.value = 'stale'; })"
    )
    page.fill("#id_name", "tablet")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click("text=Make token")
    assert posted.value.status == 403
    check("403")

    context.close()
    report = "\n".join(f"{label}:\n  " + "\n  ".join(lines) for label, lines in found.items())
    assert not found, f"axe-core on the {name}: {len(found)} page(s) with violations\n{report}"
    assert errors == []
