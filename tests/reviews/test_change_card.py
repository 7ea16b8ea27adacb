"""The change card: a scripted run's card shows exactly what it did, on every surface, and the receipt signs it.

The agent is a command-brain script driven through the real runner with the `checks` decider; the
check is `python -m pytest -q` (Tether's evidence plugin reports each test). Iteration 1 fixes `add`
(three failing tests → two); iteration 2 fixes `mul`, adds a test file and edits `setup.cfg`, which
the defaults protect (→ none failing). The card is computed from the stored trees and check results.
"""

import asyncio
import json

import pytest
from django.urls import reverse
from mcp.server.mcpserver.exceptions import ToolError

from reviews import changecard, receipts, snapshots
from reviews.models import Receipt, ReviewItem
from tests.loops.conftest import drive_in_thread
from web import mcp_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"
TESTS = (
    "from calc import add, mul\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n\n\n"
    "def test_mul_zero():\n    assert mul(0, 4) == 0\n"
)
SETUP = "[metadata]\nname = calc\n"
AGENT = """
calc = pathlib.Path('calc.py')
if 'a - b' in calc.read_text():
    calc.write_text(calc.read_text().replace('a - b', 'a + b'))
    print('Fixed add. mul next.')
else:
    calc.write_text(calc.read_text().replace('return a + b\\n', 'return a * b\\n').replace(
        'def add(a, b):\\n    return a * b', 'def add(a, b):\\n    return a + b'))
    pathlib.Path('test_extra.py').write_text('from calc import mul\\n\\n\\ndef test_mul_one():\\n    assert mul(1, 7) == 7\\n')
    cfg = pathlib.Path('setup.cfg')
    cfg.write_text(cfg.read_text() + 'version = 1\\n')
    print('Fixed add and mul, and added a test for mul.\\n\\nDetails nobody reads.')
"""


@pytest.fixture(autouse=True)
def card_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"
    settings.TETHER_REVIEW_SAMPLE_PERCENT = 0


@pytest.fixture
def finished(user, make_instance, script):
    from loops import services as loop_services

    inst = make_instance(
        user,
        command=script(AGENT),
        checks=[{"name": "tests", "command": ["python", "-m", "pytest", "-q"]}],
        max_iterations=3,
    )
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "calc.py").write_text(CALC)
    (workspace / "test_calc.py").write_text(TESTS)
    (workspace / "setup.cfg").write_text(SETUP)
    run = loop_services.run_start(instance=inst, user=user, objective="make add and mul right")
    return drive_in_thread(run)


def test_the_card_shows_exactly_what_the_run_did_and_the_receipt_signs_it(finished, client, user):
    run = finished
    assert (run.outcome, run.iterations_done) == ("done", 2), run.outcome_detail
    card = changecard.for_run(run)

    files = card["files"]
    assert [row["path"] for row in files["added"]] == ["test_extra.py"]
    assert [row["path"] for row in files["changed"]] == ["calc.py", "setup.cfg"]
    assert files["removed"] == [] and files["count"] == 3
    calc = next(row for row in files["changed"] if row["path"] == "calc.py")
    assert (calc["lines_added"], calc["lines_removed"]) == (2, 2)
    assert files["added"][0]["lines_added"] == 5
    assert (files["lines_added"], files["lines_removed"]) == (8, 2)

    tests = card["tests"]
    assert (tests["added"], tests["edited"], tests["removed"]) == (["test_extra.py"], [], [])
    assert tests["names_added"] == ["test_extra.py::test_mul_one"]
    assert tests["names_edited"] == tests["names_removed"] == []
    assert card["protected_touched"] == ["setup.cfg", "test_extra.py"]

    assert card["checks"]["lines"] == ["tests: failing tests 2 → 0"]
    assert [step["passed"] for step in card["checks"]["checks"][0]["steps"]] == [False, True]
    assert card["checks"]["checks"][0]["failing_at_end"] == []
    assert card["iterations"] == 2 and card["cost_usd"] == receipts.money.usd_string(run.spent_micros)
    assert card["agent_claim"]["text"] == "Fixed add and mul, and added a test for mul."
    assert "not verified" in card["agent_claim"]["note"]

    # The receipt carries the same card, and its signature covers it: a changed card fails verification.
    envelope = receipts.for_run(run)
    assert envelope["receipt"]["change_card"] == card
    assert receipts.verify(envelope).ok
    forged = json.loads(json.dumps(envelope))
    forged["receipt"]["change_card"]["protected_touched"] = []
    result = receipts.verify(forged)
    assert not result.ok and "change_card.protected_touched" in result.altered
    dropped = json.loads(json.dumps(envelope))
    del dropped["receipt"]["change_card"]
    assert not receipts.verify(dropped).ok

    # The run page, the review item, the REST API and MCP show it.
    client.force_login(user)
    page = client.get(reverse("loops:run-detail", args=[run.pk])).content.decode()
    assert "data-change-card" in page and "failing tests 2 → 0" in page and "The agent's claim" in page
    item = ReviewItem.objects.get(run=run)
    review = client.get(reverse("reviews:item", args=[item.pk])).content.decode()
    assert "data-change-card" in review and "test_extra.py::test_mul_one" in review
    answer = client.get(reverse("api:run-card", args=[run.instance_id, run.pk]))
    assert answer.status_code == 200 and answer.json() == card
    assert _mcp_card(user, run.pk) == card


def _mcp_card(user, run_id):
    server = mcp_server.build_server(mcp_server.stdio_caller(user.pk))
    result = asyncio.run(server.call_tool("change_card", {"run_id": run_id}))
    assert not result.is_error, result.content
    return result.structured_content or json.loads(result.content[0].text)


def test_another_user_cannot_read_the_card(finished, client, django_user_model):
    run = finished
    other = django_user_model.objects.create_user("mallory", password="x")
    client.force_login(other)
    assert client.get(reverse("api:run-card", args=[run.instance_id, run.pk])).status_code == 404
    assert client.get(reverse("loops:run-detail", args=[run.pk])).status_code == 404
    item = ReviewItem.objects.get(run=run)
    assert client.get(reverse("reviews:item", args=[item.pk])).status_code == 404
    server = mcp_server.build_server(mcp_server.stdio_caller(other.pk))
    with pytest.raises(ToolError, match=f"run {run.pk} not found"):
        asyncio.run(server.call_tool("change_card", {"run_id": run.pk}))


def test_an_old_receipt_without_a_card_still_verifies(finished):
    run = finished
    document = receipts.document(run)
    del document["change_card"]
    Receipt.objects.filter(run=run).update(envelope=receipts.sign(document))
    assert receipts.verify(Receipt.objects.get(run=run).envelope).ok


def test_the_card_is_computed_from_what_is_stored_not_the_workspace(finished):
    run = finished
    before = changecard.for_run(run)
    workspace = run.instance.workspace_path()
    (workspace / "calc.py").write_text("changed after the run\n")
    (workspace / "later.py").write_text("x = 1\n")
    assert changecard.for_run(run) == before
    assert snapshots.file_deltas(run)[2] == ""


DEEP_AGENT = """
pathlib.Path('test_deep.py').write_text('def test_a():\\n    x = 1' + '+1' * 300000)
print('Wrote a deep test.')
"""


def test_a_test_file_too_deep_to_parse_still_gets_its_card_and_receipt(user, make_instance, script, client):
    """An agent's test file nested too deep for ast.parse (RecursionError) names no tests; nothing answers 500."""
    from loops import services as loop_services

    inst = make_instance(user, command=script(DEEP_AGENT), checks=[], max_iterations=1)
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    run = drive_in_thread(loop_services.run_start(instance=inst, user=user, objective="write a test"))
    assert run.status == "finished", run.outcome_detail

    card = changecard.for_run(run)
    assert [row["path"] for row in card["files"]["added"]] == ["test_deep.py"]
    assert card["tests"]["added"] == ["test_deep.py"] and card["tests"]["names_added"] == []
    assert Receipt.objects.get(run=run).envelope["receipt"]["change_card"] == card

    client.force_login(user)
    assert client.get(reverse("loops:run-detail", args=[run.pk])).status_code == 200
    answer = client.get(reverse("api:run-card", args=[run.instance_id, run.pk]))
    assert answer.status_code == 200 and answer.json() == card


# --- the pure parts -----------------------------------------------------------------------------------


def test_test_names_see_added_removed_and_edited_tests_by_node_id():
    before = b"def test_a():\n    assert 1\n\n\nclass TestB:\n    def test_c(self):\n        assert 2\n"
    after = b"\n\ndef test_a():\n    assert 1\n\n\nclass TestB:\n    def test_c(self):\n        assert 3\n\ndef test_d():\n    pass\n"
    delta = snapshots.FileDelta("tests/test_x.py", "changed", 5, 1, False, before, after)
    card = changecard.card(deltas=[delta])
    assert card["tests"]["edited"] == ["tests/test_x.py"]
    assert card["tests"]["names_added"] == ["tests/test_x.py::test_d"]
    assert card["tests"]["names_edited"] == ["tests/test_x.py::TestB::test_c"]  # test_a only moved
    assert (
        changecard.test_names("tests/data.json", b"{}") == {}
        and changecard.test_names("t.py", b"def (") == {}
    )


def test_a_trajectory_without_test_reports_says_passed_or_failed():
    failing = {
        "ran": 3,
        "failed": 2,
        "failed_names": ["test_calc.py::test_mul", "test_calc.py::test_mul_zero"],
    }
    named = changecard.trajectory([(1, [{"name": "tests", "passed": False, "tests": failing}])])
    assert named["checks"][0]["failing_at_end"] == failing["failed_names"]
    steps = [(1, [{"name": "lint", "passed": False}]), (2, [{"name": "lint", "passed": True}])]
    assert changecard.trajectory(steps)["lines"] == ["lint: failed → passed"]
    long = [(n, [{"name": "t", "passed": False, "tests": {"failed": 30 - n}}]) for n in range(1, 31)]
    assert changecard.trajectory(long)["lines"] == [
        "t: failing tests 29 → 28 → 27 → 26 → 25 → 24 → … → 5 → 4 → 3 → 2 → 1 → 0"
    ]
    assert changecard.account("  " + "x" * 2000)[-1] == "…"
