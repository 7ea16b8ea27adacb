"""One function turns a run into JSON (`loops.selectors.run_json`), one turns a grade into JSON (`Grade.as_json`).

The REST API and MCP answer it whole; a receipt, a webhook's payload and a trigger's answer are
projections of it; a recorded grade reads back what the grade wrote, and the receipt holds that.
"""

import json

import anyio
import pytest
from mcp import Client

from loops import schemas, selectors
from reviews import graders, notify, receipts
from reviews.models import GradeRecord
from triggers import services as trigger_services
from web.mcp_server import build_server, stdio_caller

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished(user, make_instance, script, start, drive):
    agent = script("print('wrote it')\n")
    check = script("sys.exit(0)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "ok", "command": check, "required": True}])
    run = drive(start(inst, objective="write it"))
    assert (run.status, run.outcome) == ("finished", "done")
    return run


def mcp_get_run(user, run_id):
    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            result = await client.call_tool("get_run", {"run_id": run_id})
            assert not result.is_error, result.content
            return result.structured_content or json.loads(result.content[0].text)

    return anyio.run(go)


def test_the_api_and_mcp_answer_the_one_run_json(finished, client, user):
    shown = selectors.run_json(finished)
    assert list(shown) == list(selectors.API_FIELDS)
    assert shown["id"] == finished.pk and shown["outcome"] == "done" and shown["iterations"] == 1

    client.force_login(user)
    rest = client.get(f"/v1/instances/{finished.instance_id}/loop/{finished.pk}").json()
    as_schema = schemas.Run.model_validate(shown).model_dump()  # the schema names every origin key
    assert {key: value for key, value in rest.items() if key != "budget"} == as_schema
    listed = client.get(f"/v1/instances/{finished.instance_id}/loop").json()["runs"]
    assert listed == [as_schema]

    over_mcp = mcp_get_run(user, finished.pk)
    assert {key: value for key, value in over_mcp.items() if key != "budget"} == shown


def test_receipts_webhooks_and_triggers_project_the_one_run_json(finished):
    every = selectors.run_json(finished, tuple(selectors.RUN_FIELDS))

    document = receipts.document(finished)
    for name in ("objective", "outcome", "verified", "parent", "created_at", "started_at", "finished_at"):
        assert document[name] == every[name], name
    assert document["cost"]["spent_usd"] == every["spent_usd"]
    assert document["cost"]["spent_micros"] == every["spent_micros"]

    payload = notify.run_payload(finished, "run.finished")["run"]
    for name in ("id", "instance", "status", "outcome", "verified", "iterations", "spent_usd"):
        assert payload[name] == every[name], name
    assert payload["detail"] == every["outcome_detail"]

    assert trigger_services._run_answer(finished) == {
        name: every[name] for name in ("id", "instance", "status", "outcome")
    }


def test_a_projection_names_only_fields_there_are():
    with pytest.raises(KeyError):
        selectors.run_json(object(), ("no such field",))


def test_a_recorded_grade_and_the_receipt_hold_the_grades_own_json(finished):
    final = graders.FinalAct(1, "done")
    grade = graders.grade(finished, final, [])
    recorded = GradeRecord.objects.get(run=finished, iteration=1)
    assert recorded.as_json() == {"iteration": 1, **grade.as_json()}
    assert grade.as_event(1) == ("grade.finished", {"iteration": 1, **grade.as_json()})

    held = receipts.document(finished)["grade"]
    assert held == {key: recorded.as_json()[key] for key in receipts.GRADE_FIELDS}
