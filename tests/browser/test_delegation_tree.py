"""A parent's run page draws its delegation tree live, in headless Chromium against daphne and a worker.

The parent is a `command` agent that delegates to two helpers through its act's MCP endpoint
(the worker's gateway socket); each helper finishes only when the test lets it. The page, opened
before anything happened and never reloaded, shows the children appear and start, then one
finish while the other still runs, then both finished and the parent done.
"""

import re

import pytest

from loops import services
from loops.models import Run
from tests.browser.conftest import LAPTOP
from tests.browser.test_run_page import ada, keeps_its_page, sign_in, still_same  # noqa: F401 - ada: a fixture
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

LEAD = """
import asyncio, httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

instruction = sys.stdin.read()
if "The runs you delegated have finished" in instruction:
    print("both helpers are done")
    sys.exit(0)

async def main():
    headers = {"Authorization": "Bearer " + os.environ["TETHER_TOKEN"]}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(os.environ["TETHER_MCP_URL"], http_client=http)) as client:
            for name in ("helper-a", "helper-b"):
                result = await client.call_tool("delegate", {"to": name, "objective": "help " + name,
                                                             "max_cost_usd": 0.2})
                assert not result.is_error, result.content[0].text

asyncio.run(main())
print("delegated to two helpers")
"""

HELPER = """
for _ in range(2400):  # the test says when this child may finish
    if pathlib.Path('go').exists():
        break
    time.sleep(0.05)
print('helped')
"""


def child_status(page, child):
    return page.get_attribute(f'[data-child="{child.pk}"]', "data-child-status")


def test_the_tree_updates_live_as_children_start_and_finish(
    browser,
    server,
    worker,
    ada,  # noqa: F811 - the fixture imported above
    make_instance,
    script,
    artifacts,
):
    helpers = [make_instance(ada, name=name, command=script(HELPER)) for name in ("helper-a", "helper-b")]
    lead = make_instance(ada, name="lead", command=script(LEAD), tools=["delegate"], max_iterations=3)
    run = services.run_start(
        instance=lead, user=ada, objective="get help from two helpers", max_cost_usd="1.00"
    )
    errors = []
    page = browser.new_context(**LAPTOP).new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    keeps_its_page(page)

    # The children appear on the parent's page as they start.
    page.wait_for_selector("[data-child]", state="attached", timeout=60_000)
    page.wait_for_function("() => document.querySelectorAll('[data-child]').length === 2", timeout=30_000)
    first, second = wait_for(
        lambda: list(Run.objects.filter(parent=run).order_by("pk")) or None, 10, "children"
    )
    assert {first.instance_id, second.instance_id} == {h.pk for h in helpers}
    # Both start (their first acts wait for the test): the page says so as it happens.
    for child in (first, second):
        page.wait_for_selector(f'[data-child="{child.pk}"][data-child-status="running"]', timeout=60_000)
    # The first child's event redraws the tree from the database, where the second may already run
    # before its own event is on the timeline: both events arrive, in either order.
    page.wait_for_function(
        f"""() => document.querySelectorAll('#run-{run.pk}-timeline article[data-kind="run.child_started"]').length === 2""",
        timeout=30_000,
    )
    page.wait_for_selector(f"#run-{run.pk}-summary .children-running", timeout=30_000)

    # One finishes: the page says so while the other still runs.
    (first.instance.workspace_path() / "go").write_text("go")
    page.wait_for_selector(f'[data-child="{first.pk}"][data-child-status="finished"]', timeout=60_000)
    assert child_status(page, second) != "finished"
    assert page.locator(f'#run-{run.pk}-timeline article[data-kind="run.child_finished"]').count() == 1
    page.screenshot(path=str(artifacts / "delegation-tree-one-finished.png"), full_page=True)

    # The other finishes: both read finished, and the parent goes on to done.
    (second.instance.workspace_path() / "go").write_text("go")
    page.wait_for_selector(f'[data-child="{second.pk}"][data-child-status="finished"]', timeout=60_000)
    wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").exists(), 60, "the parent to finish")
    page.wait_for_selector(f'#run-{run.pk}-summary[data-status="finished"]', timeout=30_000)
    tree = page.inner_text(f"#run-{run.pk}-tree")
    assert re.search(r"The whole tree \(3 runs\) spent", tree), tree
    assert still_same(page), "the page reloaded"
    assert errors == []
    assert Run.objects.get(pk=run.pk).outcome == "done"
